#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace transmuter
