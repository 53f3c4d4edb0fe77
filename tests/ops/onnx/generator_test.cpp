#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/dtype.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::float_attr;
using testing::floats_attr;
using testing::i64;
using testing::int_attr;
using testing::ints_attr;
using testing::run_compiled;
using testing::run_op;
using testing::string_attr;
using testing::tensor_attr;
using testing::to_doubles;
using testing::to_ints;

TEST(Constant, ValueTensorIsReturnedAsIs) {
  mx::array t = mx::array({1.f, 2.f}, {2, 1});
  mx::array out = run_op("Constant", 1, {}, {tensor_attr("value", t)})[0].tensor();
  EXPECT_EQ(out.shape(), (mx::Shape{2, 1}));
  EXPECT_EQ(to_doubles(out), (std::vector<double>{1, 2}));
  Value strings = run_op("Constant", 9, {}, {tensor_attr("value", StringTensor{{1}, {"x"}})})[0];
  ASSERT_TRUE(strings.is_strings());
}

TEST(Constant, TypedValueAttributes) {
  mx::array f = run_op("Constant", 12, {}, {float_attr("value_float", 2.5f)})[0].tensor();
  EXPECT_EQ(f.dtype(), mx::float32);
  EXPECT_EQ(f.ndim(), 0u);
  mx::array fs = run_op("Constant", 12, {}, {floats_attr("value_floats", {1.f, 2.f})})[0].tensor();
  EXPECT_EQ(fs.shape(), (mx::Shape{2}));
  mx::array i = run_op("Constant", 13, {}, {int_attr("value_int", 7)})[0].tensor();
  EXPECT_EQ(i.dtype(), mx::int64);
  EXPECT_EQ(i.ndim(), 0u);
  mx::array is = run_op("Constant", 13, {}, {ints_attr("value_ints", {4, 5, 6})})[0].tensor();
  EXPECT_EQ(is.dtype(), mx::int64);
  EXPECT_EQ(to_ints(is), (std::vector<int64_t>{4, 5, 6}));
  Value s = run_op("Constant", 13, {}, {string_attr("value_string", "hi")})[0];
  ASSERT_TRUE(s.is_strings());
  EXPECT_TRUE(s.strings().shape.empty());
  EXPECT_EQ(s.strings().data, (std::vector<std::string>{"hi"}));
}

TEST(Constant, WithoutAValueIsAnError) {
  try {
    run_op("Constant", 13, {});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(
        std::string(e.what()).find("[Constant v1] node 'test_Constant': has none of the value attributes"),
        std::string::npos)
        << e.what();
  }
}

TEST(ConstantOfShape, DefaultsToFloatZero) {
  mx::array out = run_op("ConstantOfShape", 9, {i64({2, 3})})[0].tensor();
  EXPECT_EQ(out.dtype(), mx::float32);
  EXPECT_EQ(out.shape(), (mx::Shape{2, 3}));
  EXPECT_EQ(to_doubles(out), std::vector<double>(6, 0));
}

TEST(ConstantOfShape, ValueAttributeGivesValueAndDtype) {
  mx::array out = run_op("ConstantOfShape", 20, {i64({3})}, {tensor_attr("value", i64({7}))})[0].tensor();
  EXPECT_EQ(out.dtype(), mx::int64);
  EXPECT_EQ(to_ints(out), (std::vector<int64_t>{7, 7, 7}));
  mx::array empty = run_op("ConstantOfShape", 20, {i64({0})}, {tensor_attr("value", i64({7}))})[0].tensor();
  EXPECT_EQ(empty.shape(), (mx::Shape{0}));
  mx::array scalar = run_op("ConstantOfShape", 20, {i64({})})[0].tensor();
  EXPECT_EQ(scalar.ndim(), 0u);
}

TEST(Range, CountsCeilOfSpanOverDelta) {
  auto i32 = [](int v) { return mx::array(v, mx::int32); };
  mx::array down = run_op("Range", 11, {i32(10), i32(4), i32(-2)})[0].tensor();
  EXPECT_EQ(down.dtype(), mx::int32);
  EXPECT_EQ(to_ints(down), (std::vector<int64_t>{10, 8, 6}));
  mx::array up = run_op("Range", 27, {i32(3), i32(10), i32(3)})[0].tensor();
  EXPECT_EQ(to_ints(up), (std::vector<int64_t>{3, 6, 9}));
  mx::array none = run_op("Range", 11, {i32(5), i32(1), i32(1)})[0].tensor();
  EXPECT_EQ(none.size(), 0u);
}

TEST(Range, FloatAndInt64Types) {
  mx::array f = run_op("Range", 11, {mx::array(1.f), mx::array(2.f), mx::array(0.25f)})[0].tensor();
  EXPECT_EQ(f.dtype(), mx::float32);
  EXPECT_EQ(to_doubles(f), (std::vector<double>{1, 1.25, 1.5, 1.75}));
  mx::array h =
      run_op("Range", 27,
             {mx::array(0.f, mx::float16), mx::array(1.f, mx::float16), mx::array(0.5f, mx::float16)})[0]
          .tensor();
  EXPECT_EQ(h.dtype(), mx::float16);
  int64_t base = int64_t{1} << 60;
  mx::array big = run_op("Range", 11,
                         {mx::array(base, mx::int64), mx::array(base + 3, mx::int64),
                          mx::array(int64_t{1}, mx::int64)})[0]
                      .tensor();
  EXPECT_EQ(big.dtype(), mx::int64);
  EXPECT_EQ(to_ints(big), (std::vector<int64_t>{base, base + 1, base + 2}));
}

TEST(Range, ZeroDeltaIsAnError) {
  try {
    run_op("Range", 11, {mx::array(0.f), mx::array(1.f), mx::array(0.f)});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[Range v11] node 'test_Range': delta must not be zero"),
              std::string::npos)
        << e.what();
  }
}

TEST(Range, HostInputsMayBeCapturedConstantsUnderCompile) {
  // The runtime hands host inputs in as concrete arrays while tracing.
  std::vector<Value> in = {mx::array(2, mx::int32), mx::array(11, mx::int32), mx::array(3, mx::int32)};
  mx::array out = run_compiled("Range", 11, in, {})[0];
  EXPECT_EQ(out.dtype(), mx::int32);
  EXPECT_EQ(to_ints(out), (std::vector<int64_t>{2, 5, 8}));
  mx::array filled = run_compiled("ConstantOfShape", 20, {i64({2})}, {}, {tensor_attr("value", i64({4}))})[0];
  EXPECT_EQ(to_ints(filled), (std::vector<int64_t>{4, 4}));
}

TEST(EyeLike, DiagonalOffsetAndDtype) {
  mx::array out = run_op("EyeLike", 9, {mx::zeros({2, 3})},
                         {int_attr("k", 1), int_attr("dtype", static_cast<int64_t>(OnnxType::kInt32))})[0]
                      .tensor();
  EXPECT_EQ(out.dtype(), mx::int32);
  EXPECT_EQ(to_ints(out), (std::vector<int64_t>{0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(run_op("EyeLike", 22, {mx::zeros({2, 2}, mx::float16)})[0].tensor().dtype(), mx::float16);
}

// --- Bad values (docs/architecture.md, "Bad values") ------------------------------------

TEST(ConstantOfShape, ShapesThatWrapOrLeaveInt32AreErrors) {
  // 65536^4 wraps to 0 elements in 64 bits.
  const int64_t d = 65536;
  EXPECT_EQ(testing::error_of<OpError>([&] { run_op("ConstantOfShape", 9, {i64({d, d, d, d})}); }),
            "[ConstantOfShape v9] node 'test_ConstantOfShape': shape [65536, 65536, 65536, 65536] has more "
            "elements than int64 can count in bytes");
  EXPECT_EQ(
      testing::error_of<OpError>([] { run_op("ConstantOfShape", 9, {i64({(int64_t{1} << 32) + 1})}); }),
      "[ConstantOfShape v9] node 'test_ConstantOfShape': dimension 4294967297 is negative or exceeds int32");
  EXPECT_NE(testing::error_of<OpError>([] {
              run_compiled("ConstantOfShape", 9, {i64({-1})}, {});
            }).find("dimension -1 is negative"),
            std::string::npos);
}

TEST(Range, HugeOrInfiniteCountsAreErrors) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto i64s = [](int64_t v) { return mx::array(v, mx::int64); };
  EXPECT_NE(testing::error_of<OpError>([&] {
              run_op("Range", 11, {i64s(0), i64s(kMax), i64s(1)});
            }).find("[Range v11] node 'test_Range': would produce more than 2^31 - 1 elements"),
            std::string::npos);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_NE(testing::error_of<OpError>([&] {
              run_op("Range", 11, {mx::array(0.f), mx::array(inf), mx::array(1.f)});
            }).find("would produce inf elements"),
            std::string::npos);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(run_op("Range", 11, {mx::array(0.f), mx::array(nan), mx::array(1.f)}), OpError);
}

TEST(Range, ExtremeInt64BoundsStayExact) {
  // limit - start = 2^64 - 1 does not fit int64; the count is 3 and each
  // element fits even where i * delta does not.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  mx::array out =
      run_op("Range", 11,
             {mx::array(kMin, mx::int64), mx::array(kMax, mx::int64), mx::array(kMax, mx::int64)})[0]
          .tensor();
  EXPECT_EQ(to_ints(out), (std::vector<int64_t>{kMin, -1, kMax - 1}));
}

TEST(EyeLike, DiagonalsBeyondTheMatrixGiveZeros) {
  for (int64_t k :
       {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), int64_t{1} << 32}) {
    mx::array out = run_op("EyeLike", 9, {mx::zeros({2, 3})}, {int_attr("k", k)})[0].tensor();
    EXPECT_EQ(to_doubles(out), std::vector<double>(6, 0)) << k;
  }
}

}  // namespace
}  // namespace transmuter
