#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::int_attr;
using testing::ints_attr;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;
using testing::to_ints;

using testing::i64;
using testing::iota;
using testing::out0;
using testing::run_compiled;

TEST(Transpose, DefaultPermReversesDims) {
  auto out = run_op("Transpose", 21, {iota({2, 3, 4})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{4, 3, 2}));
  EXPECT_EQ(to_doubles(out0(out))[1], 12);  // out[0][0][1] = x[1][0][0]
}

TEST(Transpose, ExplicitPermKeepsDtype) {
  auto out = run_op("Transpose", 13, {iota({2, 3}, mx::int64)}, {ints_attr("perm", {1, 0})});
  EXPECT_EQ(out0(out).dtype(), mx::int64);
  EXPECT_EQ(to_ints(out0(out)), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
}

TEST(Reshape, ZeroCopiesDimAndMinusOneInfers) {
  auto out = run_op("Reshape", 13, {iota({2, 3, 4}), i64({2, 0, 1, -1})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 3, 1, 4}));
}

TEST(Reshape, AllowZeroKeepsRealZero) {
  auto out = run_op("Reshape", 14, {mx::zeros({0, 3, 4}), i64({3, 4, 0})}, {int_attr("allowzero", 1)});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{3, 4, 0}));
}

TEST(Reshape, Opset1ReadsShapeAttribute) {
  auto out = run_op("Reshape", 4, {iota({2, 3})}, {ints_attr("shape", {3, -1})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{3, 2}));
}

TEST(Reshape, SizeMismatchIsAnOpError) {
  EXPECT_THROW(run_op("Reshape", 14, {iota({2, 3}), i64({4, 2})}), OpError);
}

TEST(Flatten, NegativeAxisGives2D) {
  auto out = run_op("Flatten", 13, {iota({2, 3, 4, 5})}, {int_attr("axis", -1)});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{24, 5}));
  auto zero = run_op("Flatten", 13, {iota({2, 3})}, {int_attr("axis", 0)});
  EXPECT_EQ(out0(zero).shape(), (mx::Shape{1, 6}));
}

TEST(Squeeze, NoAxesRemovesAllOnes) {
  auto out = run_op("Squeeze", 13, {mx::zeros({1, 3, 1, 2})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{3, 2}));
}

TEST(Squeeze, AxesInputAndAttribute) {
  auto v13 = run_op("Squeeze", 13, {mx::zeros({1, 3, 1, 2}), i64({-2})});
  EXPECT_EQ(out0(v13).shape(), (mx::Shape{1, 3, 2}));
  auto v11 = run_op("Squeeze", 11, {mx::zeros({1, 3, 1, 2})}, {ints_attr("axes", {0})});
  EXPECT_EQ(out0(v11).shape(), (mx::Shape{3, 1, 2}));
  EXPECT_THROW(run_op("Squeeze", 13, {mx::zeros({1, 3}), i64({1})}), OpError);
}

TEST(Squeeze, EmptyAxesRemoveAllOnes) {
  auto out = run_op("Squeeze", 13, {mx::zeros({1, 3, 1}), i64({})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{3}));
}

TEST(Shape, StringTensorsAreAnOpErrorNotACrash) {
  EXPECT_THROW(run_op("Reshape", 14, {StringTensor{{2}, {"a", "b"}}, i64({2, 1})}), OpError);
}

TEST(Unsqueeze, UnsortedAndNegativeAxesIndexTheOutput) {
  auto out = run_op("Unsqueeze", 13, {mx::zeros({3, 4, 5}), i64({5, 4, 2})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{3, 4, 1, 5, 1, 1}));
  auto neg = run_op("Unsqueeze", 11, {mx::zeros({3, 4})}, {ints_attr("axes", {-1})});
  EXPECT_EQ(out0(neg).shape(), (mx::Shape{3, 4, 1}));
}

TEST(Concat, NegativeAxisAndEmptyInput) {
  auto out =
      run_op("Concat", 13, {iota({2, 2}), mx::zeros({2, 0}), mx::ones({2, 1})}, {int_attr("axis", -1)});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 3}));
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{0, 1, 1, 2, 3, 1}));
}

TEST(Concat, Opset1DefaultsToAxis1) {
  auto out = run_op("Concat", 3, {iota({2, 2}), iota({2, 2})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 4}));
}

TEST(Split, SizesFromInputOrAttribute) {
  auto v13 = run_op("Split", 13, {iota({6}), i64({2, 4})}, {}, 2);
  EXPECT_EQ(to_doubles(v13[1].tensor()), (std::vector<double>{2, 3, 4, 5}));
  auto v11 = run_op("Split", 11, {iota({2, 6})}, {int_attr("axis", -1), ints_attr("split", {1, 5})}, 2);
  EXPECT_EQ(v11[1].tensor().shape(), (mx::Shape{2, 5}));
}

TEST(Split, Opset18UnevenNumOutputs) {
  auto out = run_op("Split", 18, {iota({7})}, {int_attr("num_outputs", 4)}, 4);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2}));
  EXPECT_EQ(to_doubles(out[3].tensor()), (std::vector<double>{6}));
}

TEST(Split, Opset18WithoutSizesOrCountUsesOutputs) {
  auto out = run_op("Split", 18, {iota({5})}, {}, 2);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3}));
  EXPECT_EQ(out[1].tensor().shape(), (mx::Shape{2}));
  EXPECT_THROW(run_op("Split", 18, {iota({6})}, {int_attr("num_outputs", 3)}, 2), OpError);
}

TEST(Split, UnevenBeforeOpset18IsAnError) { EXPECT_THROW(run_op("Split", 13, {iota({7})}, {}, 2), OpError); }

TEST(Split, ZeroSizeParts) {
  auto out = run_op("Split", 18, {mx::zeros({0}), i64({0, 0, 0})}, {}, 3);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].tensor().shape(), (mx::Shape{0}));
}

TEST(Shape, ReturnsInt64WithStartEnd) {
  auto out = run_op("Shape", 21, {mx::zeros({3, 4, 5})});
  EXPECT_EQ(out0(out).dtype(), mx::int64);
  EXPECT_EQ(to_ints(out0(out)), (std::vector<int64_t>{3, 4, 5}));
  auto part = run_op("Shape", 15, {mx::zeros({3, 4, 5})}, {int_attr("start", 1), int_attr("end", -1)});
  EXPECT_EQ(to_ints(out0(part)), (std::vector<int64_t>{4}));
  auto clipped = run_op("Shape", 15, {mx::zeros({3, 4, 5})}, {int_attr("start", -10)});
  EXPECT_EQ(to_ints(out0(clipped)), (std::vector<int64_t>{3, 4, 5}));
  auto empty = run_op("Shape", 15, {mx::zeros({3, 4, 5})}, {int_attr("start", 2), int_attr("end", 1)});
  EXPECT_EQ(out0(empty).shape(), (mx::Shape{0}));
}

TEST(Size, ReturnsInt64Scalar) {
  auto out = run_op("Size", 21, {mx::zeros({3, 4}, mx::bool_)});
  EXPECT_EQ(out0(out).dtype(), mx::int64);
  EXPECT_EQ(out0(out).ndim(), 0u);
  EXPECT_EQ(to_ints(out0(out)), (std::vector<int64_t>{12}));
}

TEST(Expand, BroadcastsBothWays) {
  auto out = run_op("Expand", 13, {iota({3, 1}), i64({2, 1, 6})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 3, 6}));
  auto keep = run_op("Expand", 13, {iota({3, 1}), i64({1, 1})});
  EXPECT_EQ(out0(keep).shape(), (mx::Shape{3, 1}));
}

TEST(Tile, RepeatsAndOpset1Axis) {
  auto out = run_op("Tile", 13, {iota({2, 2}, mx::uint8), i64({1, 2})});
  EXPECT_EQ(out0(out).dtype(), mx::uint8);
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{0, 1, 0, 1, 2, 3, 2, 3}));
  auto v1 = run_op("Tile", 1, {iota({2, 2}), i64({3}), i64({0})});
  EXPECT_EQ(out0(v1).shape(), (mx::Shape{6, 2}));
}

TEST(Pad, ConstantWithValueInputAndAxes) {
  auto out = run_op("Pad", 18, {iota({2, 2}), i64({1, 2}), mx::array(7.f), i64({-1})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 5}));
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{7, 0, 1, 7, 7, 7, 2, 3, 7, 7}));
}

TEST(Pad, ReflectEdgeWrap) {
  const mx::array x = mx::array({1, 2, 3}, mx::int32);
  auto reflect = run_op("Pad", 19, {x, i64({2, 2})}, {string_attr("mode", "reflect")});
  EXPECT_EQ(to_ints(out0(reflect)), (std::vector<int64_t>{3, 2, 1, 2, 3, 2, 1}));
  auto edge = run_op("Pad", 19, {x, i64({2, 1})}, {string_attr("mode", "edge")});
  EXPECT_EQ(to_ints(out0(edge)), (std::vector<int64_t>{1, 1, 1, 2, 3, 3}));
  auto wrap = run_op("Pad", 19, {x, i64({1, 4})}, {string_attr("mode", "wrap")});
  EXPECT_EQ(to_ints(out0(wrap)), (std::vector<int64_t>{3, 1, 2, 3, 1, 2, 3, 1}));
  EXPECT_EQ(out0(wrap).dtype(), mx::int32);
}

TEST(Pad, NegativePadsCropAndOpset2Attribute) {
  auto crop = run_op("Pad", 13, {iota({4}), i64({-1, 1})});
  EXPECT_EQ(to_doubles(out0(crop)), (std::vector<double>{1, 2, 3, 0}));
  auto v2 = run_op("Pad", 2, {iota({2})}, {ints_attr("pads", {1, 0}), testing::float_attr("value", 5.f)});
  EXPECT_EQ(to_doubles(out0(v2)), (std::vector<double>{5, 0, 1}));
}

TEST(DepthToSpace, DcrAndCrdModes) {
  // x[0, c, 0, 0] = c for 4 channels, blocksize 2 -> 1 channel, 2x2.
  auto dcr = run_op("DepthToSpace", 13, {iota({1, 4, 1, 1})}, {int_attr("blocksize", 2)});
  EXPECT_EQ(out0(dcr).shape(), (mx::Shape{1, 1, 2, 2}));
  EXPECT_EQ(to_doubles(out0(dcr)), (std::vector<double>{0, 1, 2, 3}));
  auto crd = run_op("DepthToSpace", 13, {iota({1, 8, 1, 1})},
                    {int_attr("blocksize", 2), string_attr("mode", "CRD")});
  EXPECT_EQ(out0(crd).shape(), (mx::Shape{1, 2, 2, 2}));
  EXPECT_EQ(to_doubles(out0(crd)), (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}));
  auto dcr8 = run_op("DepthToSpace", 13, {iota({1, 8, 1, 1})}, {int_attr("blocksize", 2)});
  EXPECT_EQ(to_doubles(out0(dcr8)), (std::vector<double>{0, 2, 4, 6, 1, 3, 5, 7}));
}

TEST(SpaceToDepth, InvertsDepthToSpace) {
  mx::array x = iota({1, 8, 2, 2});
  for (const char* mode : {"DCR", "CRD"}) {
    auto down = run_op("DepthToSpace", 13, {x}, {int_attr("blocksize", 2), string_attr("mode", mode)});
    auto up = run_op("SpaceToDepth", 28, {out0(down)}, {int_attr("blocksize", 2), string_attr("mode", mode)});
    EXPECT_EQ(out0(up).shape(), x.shape());
    EXPECT_EQ(to_doubles(out0(up)), to_doubles(x)) << mode;
  }
}

TEST(ShapeCompiled, HostInputsAsConstantsDataTraced) {
  auto reshaped = run_compiled("Reshape", 14, {iota({2, 3}), i64({3, -1})}, {0});
  EXPECT_EQ(reshaped[0].shape(), (mx::Shape{3, 2}));
  // Pad's constant_value is a tensor input: traced here, never read on the host.
  auto padded = run_compiled("Pad", 18, {iota({2}), i64({1, 1}), mx::array(9.f), Value()}, {0, 2});
  EXPECT_EQ(to_doubles(padded[0]), (std::vector<double>{9, 0, 1, 9}));
  auto reflected = run_compiled("Pad", 19, {iota({3}), i64({2, 0})}, {0}, {string_attr("mode", "reflect")});
  EXPECT_EQ(to_doubles(reflected[0]), (std::vector<double>{2, 1, 0, 1, 2}));
  auto parts = run_compiled("Split", 18, {iota({5}), i64({2, 3})}, {0}, {}, 2);
  EXPECT_EQ(to_doubles(parts[1]), (std::vector<double>{2, 3, 4}));
  auto expanded = run_compiled("Expand", 13, {iota({1, 2}), i64({2, 2})}, {0});
  EXPECT_EQ(to_doubles(expanded[0]), (std::vector<double>{0, 1, 0, 1}));
  auto dims = run_compiled("Shape", 15, {mx::zeros({3, 4})}, {0}, {int_attr("start", -1)});
  EXPECT_EQ(to_ints(dims[0]), (std::vector<int64_t>{4}));
  auto unsqueezed = run_compiled("Unsqueeze", 13, {iota({2}), i64({0})}, {0});
  EXPECT_EQ(unsqueezed[0].shape(), (mx::Shape{1, 2}));
}

TEST(ShapeCompiled, TracedHostInputIsAnOpError) {
  // A shape computed from traced data cannot be read while tracing; the
  // runtime turns such a node into a graph break instead.
  EXPECT_THROW(run_compiled("Reshape", 14, {iota({2, 3}), i64({3, 2})}, {0, 1}), OpError);
}

// --- Bad values: int64 shape math never wraps (docs/architecture.md, "Bad values") ------

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t k2To32 = int64_t{1} << 32;

std::string op_error(const std::string& op, int opset, const std::vector<Value>& inputs,
                     const std::vector<Attribute>& attributes = {}, int num_outputs = 1) {
  return testing::error_of<OpError>([&] { run_op(op, opset, inputs, attributes, num_outputs); });
}

TEST(ShapeBadValues, DepthToSpaceHugeBlocksizeIsAnErrorNotSigfpe) {
  // 65536^2 is 0 in int32: the divisibility check used to divide by it.
  EXPECT_EQ(
      op_error("DepthToSpace", 13, {mx::zeros({1, 4, 1, 1})}, {int_attr("blocksize", 65536)}),
      "[DepthToSpace v1] node 'test_DepthToSpace': channels 4 not divisible by blocksize^2 = 4294967296");
  EXPECT_EQ(op_error("DepthToSpace", 13, {mx::zeros({1, 4, 1, 1})}, {int_attr("blocksize", kMax)}),
            "[DepthToSpace v1] node 'test_DepthToSpace': blocksize 9223372036854775807 is invalid");
  // c * b * b = 2^32 output channels (the input is a lazy broadcast, never allocated).
  mx::array wide = mx::broadcast_to(mx::zeros({1, 1, 1, 1}), {1, 1, 65536, 65536});
  EXPECT_EQ(op_error("SpaceToDepth", 13, {wide}, {int_attr("blocksize", 65536)}),
            "[SpaceToDepth v1] node 'test_SpaceToDepth': output channels 4294967296 does not fit in int32");
}

TEST(ShapeBadValues, PadBeyondInt32IsAnErrorNotTruncated) {
  // 2^32 + 1 used to become 1.
  EXPECT_EQ(op_error("Pad", 13, {iota({2}), i64({k2To32 + 1, 0})}),
            "[Pad v11] node 'test_Pad': padded size of axis 0 4294967299 does not fit in int32");
  EXPECT_NE(op_error("Pad", 13, {iota({2}), i64({kMax, kMax})}).find("overflows int64"), std::string::npos);
  EXPECT_EQ(
      op_error("Pad", 13, {iota({2}), i64({kMin, 0})}),
      "[Pad v11] node 'test_Pad': pads -9223372036854775808, 0 remove more than axis 0 of size 2 holds");
  EXPECT_NE(op_error("Pad", 13, {iota({2}), i64({-1, -2})}).find("remove more than axis 0"),
            std::string::npos);
  EXPECT_EQ(out0(run_op("Pad", 13, {iota({2}), i64({-1, -1})})).shape(), (mx::Shape{0}));
  EXPECT_NE(
      op_error("Pad", 2, {iota({2})}, {ints_attr("pads", {k2To32 + 1, 0})}).find("does not fit in int32"),
      std::string::npos);
}

TEST(ShapeBadValues, TileRepeatsBeyondInt32) {
  EXPECT_EQ(op_error("Tile", 13, {iota({2}), i64({int64_t{1} << 31})}),
            "[Tile v6] node 'test_Tile': tiled dim 4294967296 does not fit in int32");
  EXPECT_EQ(op_error("Tile", 13, {iota({2}), i64({int64_t{1} << 62})}),
            "[Tile v6] node 'test_Tile': tiled dim 2 * 4611686018427387904 overflows int64");
  EXPECT_NE(op_error("Tile", 1, {iota({2}), i64({k2To32}), i64({0})}).find("does not fit in int32"),
            std::string::npos);
}

TEST(ShapeBadValues, ReshapeDimsOutsideInt32AndWrappingProducts) {
  // 65536^4 wraps to 0 in int64, which matched an empty input.
  const int64_t d = 65536;
  EXPECT_EQ(op_error("Reshape", 14, {mx::zeros({0}), i64({d, d, d, d, 0})}, {int_attr("allowzero", 1)}),
            "[Reshape v5] node 'test_Reshape': shape product 281474976710656 * 65536 overflows int64");
  EXPECT_EQ(op_error("Reshape", 14, {mx::zeros({0}), i64({k2To32, 0})}, {int_attr("allowzero", 1)}),
            "[Reshape v5] node 'test_Reshape': dimension 4294967296 is negative or exceeds int32");
  EXPECT_NE(op_error("Reshape", 14, {mx::zeros({2}), i64({-1, k2To32})}).find("cannot infer"),
            std::string::npos);
}

TEST(ShapeBadValues, SplitSizesThatWrapAroundAreAnError) {
  // kMax + kMax + 4 wraps to 2, the axis size.
  EXPECT_EQ(
      op_error("Split", 13, {iota({2}), i64({kMax, kMax, 4})}, {}, 3),
      "[Split v13] node 'test_Split': split size 9223372036854775807 is out of range for axis 0 of size 2");
  EXPECT_NE(op_error("Split", 13, {iota({2}), i64({-1, 3})}, {}, 2).find("split size -1"), std::string::npos);
}

TEST(ShapeBadValues, ExpandBeyondInt32OrTheRankLimit) {
  EXPECT_EQ(op_error("Expand", 13, {iota({1}), i64({k2To32 + 1})}),
            "[Expand v8] node 'test_Expand': dimension 4294967297 is negative or exceeds int32");
  const int64_t d = 65536;
  EXPECT_EQ(
      op_error("Expand", 13, {iota({1}), i64({d, d, d, d})}),
      "[Expand v8] node 'test_Expand': shape [65536, 65536, 65536, 65536] has more elements than int64 can "
      "count in bytes");
  EXPECT_EQ(op_error("Expand", 13, {iota({1}), i64(std::vector<int64_t>(65, 1))}),
            "[Expand v8] node 'test_Expand': shape has 65 dims, more than 64");
  EXPECT_EQ(out0(run_op("Expand", 13, {iota({1}), i64(std::vector<int64_t>(64, 1))})).ndim(), 64u);
}

TEST(ShapeBadValues, UnsqueezeBeyondTheRankLimit) {
  EXPECT_EQ(op_error("Unsqueeze", 13, {iota({1}), i64(std::vector<int64_t>(64, 0))}),
            "[Unsqueeze v13] node 'test_Unsqueeze': 64 axes would give rank 65, more than 64");
}

TEST(ShapeBadValues, CheckedUnderCompileToo) {
  // Host inputs are captured constants under compile: the same checks apply.
  std::string message =
      testing::error_of<OpError>([] { run_compiled("Pad", 13, {iota({2}), i64({k2To32 + 1, 0})}, {0}); });
  EXPECT_NE(message.find("[Pad v11] node 'test_Pad': padded size of axis 0"), std::string::npos) << message;
}

}  // namespace
}  // namespace transmuter
