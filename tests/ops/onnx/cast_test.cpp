#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "support/op_test_support.h"
#include "transmuter/dtype.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::int_attr;
using testing::run_compiled;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;
using testing::to_ints;

constexpr float kInf = std::numeric_limits<float>::infinity();

Attribute to(OnnxType type) { return int_attr("to", static_cast<int64_t>(type)); }

mx::array cast(const mx::array& x, OnnxType type, std::vector<Attribute> extra = {}) {
  extra.push_back(to(type));
  return run_op("Cast", 21, {x}, extra)[0].tensor();
}

/** Compares element-wise; NaN matches NaN. */
void expect_values(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(actual[i])) << "at " << i << ": " << actual[i];
    } else {
      EXPECT_EQ(actual[i], expected[i]) << "at " << i;
    }
  }
}

TEST(Cast, NumericTargetsGetTheExactOnnxDtype) {
  mx::array x = mx::array({-1.7f, 0.f, 2.5f});
  EXPECT_EQ(cast(x, OnnxType::kInt64).dtype(), mx::int64);
  EXPECT_EQ(to_ints(cast(x, OnnxType::kInt64)), (std::vector<int64_t>{-1, 0, 2}));  // truncation
  EXPECT_EQ(cast(x, OnnxType::kFloat16).dtype(), mx::float16);
  EXPECT_EQ(cast(x, OnnxType::kBfloat16).dtype(), mx::bfloat16);
  EXPECT_EQ(cast(x, OnnxType::kDouble).dtype(), mx::float64);
  EXPECT_EQ(cast(x, OnnxType::kUint16).dtype(), mx::uint16);
  mx::array b = cast(mx::array({-0.f, 0.5f, NAN}), OnnxType::kBool);
  EXPECT_EQ(b.dtype(), mx::bool_);
  EXPECT_EQ(to_ints(b), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(to_doubles(cast(mx::array({true, false}), OnnxType::kFloat)), (std::vector<double>{1, 0}));
}

TEST(Cast, IntegersWrapWhenNarrowed) {
  mx::array x = mx::astype(mx::array({200, -129}), mx::int16);
  EXPECT_EQ(to_ints(cast(x, OnnxType::kInt8)), (std::vector<int64_t>{-56, 127}));
}

TEST(Cast, Float8RoundsToNearestEvenAndSaturates) {
  mx::array x = mx::array({0.47892547f, 0.81910545f, 1e6f, 1e-7f, kInf, -kInf, NAN, -1e6f});
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E4M3FN)),
                {0.46875, 0.8125, 448, 0, 448, -448, NAN, -448});
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E4M3FNUZ)),
                {0.46875, 0.8125, 240, 0, 240, -240, NAN, -240});
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E5M2)),
                {0.5, 0.875, 57344, 0, 57344, -57344, NAN, -57344});
  EXPECT_EQ(cast(x, OnnxType::kFloat8E5M2).dtype(), mx::float32);  // float8 is held widened
}

TEST(Cast, Float8WithoutSaturationOverflowsToInfOrNan) {
  mx::array x = mx::array({1e6f, kInf, 0.5f});
  auto no_saturate = int_attr("saturate", 0);
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E5M2, {no_saturate})), {kInf, kInf, 0.5});
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E4M3FN, {no_saturate})), {NAN, NAN, 0.5});
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E5M2FNUZ, {no_saturate})), {NAN, NAN, 0.5});
}

TEST(Cast, Float8KeepsSubnormals) {
  // Smallest E4M3FN subnormal is 2^-9; 3 * 2^-10 is a tie between 2^-9 and
  // 2 * 2^-9 and goes to the even one.
  mx::array x = mx::array({std::ldexp(1.f, -9), 3 * std::ldexp(1.f, -10), std::ldexp(1.f, -11)});
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E4M3FN)), {std::ldexp(1.0, -9), std::ldexp(1.0, -8), 0});
}

TEST(Cast, Float4E2M1SaturatesAndMapsNanToZero) {
  mx::array x = mx::array({0.48f, 0.25f, 1.05f, -3.5f, 9.f, 5.f, 0.75f, NAN, -kInf});
  expect_values(to_doubles(cast(x, OnnxType::kFloat4E2M1)), {0.5, 0, 1, -4, 6, 4, 1, 0, -6});
}

TEST(Cast, Float8E8M0RoundsTheExponent) {
  mx::array x = mx::array({0.f, 0.124f, 0.25f, 1.1f, -3.f, NAN});
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E8M0)), {std::ldexp(1.0, -127), 0.125, 0.25, 2, 4, NAN});
  expect_values(to_doubles(cast(x, OnnxType::kFloat8E8M0, {string_attr("round_mode", "down")})),
                {std::ldexp(1.0, -127), 0.0625, 0.25, 1, 2, NAN});
}

TEST(Cast, SubByteIntegersWrap) {
  mx::array x = mx::array({-9.f, -8.f, 7.f, 8.f, 15.f, 2.7f});
  mx::array i4 = cast(x, OnnxType::kInt4);
  EXPECT_EQ(i4.dtype(), mx::int8);
  EXPECT_EQ(to_ints(i4), (std::vector<int64_t>{7, -8, 7, -8, -1, 2}));
  mx::array u4 = cast(x, OnnxType::kUint4);
  EXPECT_EQ(u4.dtype(), mx::uint8);
  EXPECT_EQ(to_ints(u4), (std::vector<int64_t>{7, 8, 7, 8, 15, 2}));
  EXPECT_EQ(to_ints(cast(mx::array({-3.f, 2.f, 3.f}), OnnxType::kInt2)), (std::vector<int64_t>{1, -2, -1}));
  EXPECT_EQ(to_ints(cast(mx::array({-3.f, 2.f, 3.f}), OnnxType::kUint2)), (std::vector<int64_t>{1, 2, 3}));
}

TEST(Cast, StringsParseToNumbers) {
  StringTensor s{{2, 2}, {"3.5", "-INF", "nan", "1e-5"}};
  mx::array f = run_op("Cast", 13, {s}, {to(OnnxType::kFloat)})[0].tensor();
  EXPECT_EQ(f.shape(), (mx::Shape{2, 2}));
  expect_values(to_doubles(f), {3.5, -kInf, NAN, 1e-5f});
  StringTensor big{{1}, {"9007199254740993"}};  // 2^53 + 1: not a double
  mx::array i = run_op("Cast", 13, {big}, {to(OnnxType::kInt64)})[0].tensor();
  EXPECT_EQ(i.dtype(), mx::int64);
  EXPECT_EQ(to_ints(i), (std::vector<int64_t>{9007199254740993}));
}

TEST(Cast, NumbersFormatAsStrings) {
  Value out =
      run_op("Cast", 13, {mx::array({0.5f, 1e-7f, 1e6f, NAN, -kInf, 0.1f})}, {to(OnnxType::kString)})[0];
  ASSERT_TRUE(out.is_strings());
  // numpy's spelling: float32 turns scientific from 1e6 (float64 from 1e16).
  EXPECT_EQ(out.strings().data, (std::vector<std::string>{"0.5", "1e-07", "1e+06", "nan", "-inf", "0.1"}));
  Value f64 = run_op("Cast", 13, {mx::array({1e6, 123456789.0, 1e-4, -0.0}, mx::float64)},
                     {to(OnnxType::kString)})[0];
  EXPECT_EQ(f64.strings().data, (std::vector<std::string>{"1000000.0", "123456789.0", "0.0001", "-0.0"}));
  Value f16 = run_op("Cast", 13, {mx::astype(mx::array({0.00012345f, 999.f, 1000.f}), mx::float16)},
                     {to(OnnxType::kString)})[0];
  EXPECT_EQ(f16.strings().data, (std::vector<std::string>{"0.0001235", "999.0", "1e+03"}));
  Value ints = run_op("Cast", 13, {mx::array({-3, 12})}, {to(OnnxType::kString)})[0];
  EXPECT_EQ(ints.strings().data, (std::vector<std::string>{"-3", "12"}));
}

TEST(Cast, Opset1NamesTheTypeWithAString) {
  mx::array out = run_op("Cast", 1, {mx::array({1.5f})}, {string_attr("to", "INT32")})[0].tensor();
  EXPECT_EQ(out.dtype(), mx::int32);
  EXPECT_EQ(run_op("Cast", 5, {mx::array({1})}, {string_attr("to", "DOUBLE")})[0].tensor().dtype(),
            mx::float64);
}

TEST(Cast, UnknownTargetsAreErrors) {
  try {
    run_op("Cast", 1, {mx::array({1.5f})}, {string_attr("to", "QUATERNION")});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[Cast v1] node 'test_Cast': unknown type name 'QUATERNION'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(run_op("Cast", 21, {mx::array({1.5f})}, {to(OnnxType::kComplex128)}), OpError);
  EXPECT_THROW(run_op("Cast", 21, {mx::array({1.5f})}), OpError);  // `to` is required
}

TEST(CastLike, TakesTheTypeOfTheSecondInput) {
  mx::array out =
      run_op("CastLike", 15, {mx::array({2.9f}), mx::astype(mx::array({0}), mx::uint8)})[0].tensor();
  EXPECT_EQ(out.dtype(), mx::uint8);
  EXPECT_EQ(to_ints(out), (std::vector<int64_t>{2}));
  Value strings = run_op("CastLike", 19, {mx::array({2}), StringTensor{{1}, {"x"}}})[0];
  ASSERT_TRUE(strings.is_strings());
  EXPECT_EQ(strings.strings().data, (std::vector<std::string>{"2"}));
}

TEST(CastLike, NarrowTargetsComeFromTheSecondInputsElementType) {
  mx::array x = mx::array({0.47892547f, 1e6f, 9.f});
  Value like_f8(mx::array({0.0f}), OnnxType::kFloat8E4M3FN);  // float8 held as float32
  Value f8 = run_op("CastLike", 19, {x, like_f8})[0];
  EXPECT_EQ(f8.element_type(), OnnxType::kFloat8E4M3FN);
  expect_values(to_doubles(f8.tensor()), {0.46875, 448, 9});
  Value u4 = run_op("CastLike", 19, {x, Value(mx::array({0}, mx::uint8), OnnxType::kUint4)})[0];
  EXPECT_EQ(u4.element_type(), OnnxType::kUint4);
  EXPECT_EQ(to_ints(u4.tensor()), (std::vector<int64_t>{0, 0, 9}));  // 1e6 = 0xF4240: low nibble 0
  // Cast marks its result too; a wide target stays unmarked.
  EXPECT_EQ(run_op("Cast", 21, {x}, {to(OnnxType::kInt2)})[0].element_type(), OnnxType::kInt2);
  EXPECT_FALSE(run_op("Cast", 21, {x}, {to(OnnxType::kInt8)})[0].is_widened());
}

TEST(Cast, NarrowTargetsWorkUnderCompile) {
  mx::array x = mx::array({0.47892547f, 1e6f, -kInf, NAN, 3 * std::ldexp(1.f, -10), -9.f});
  for (OnnxType type : {OnnxType::kFloat8E4M3FN, OnnxType::kFloat8E5M2FNUZ, OnnxType::kFloat4E2M1,
                        OnnxType::kFloat8E8M0, OnnxType::kInt4, OnnxType::kBfloat16}) {
    mx::array eager = cast(x, type);
    mx::array compiled = run_compiled("Cast", 21, {x}, {0}, {to(type)})[0];
    EXPECT_EQ(compiled.dtype(), eager.dtype()) << onnx_type_name(type);
    expect_values(to_doubles(compiled), to_doubles(eager));
  }
}

}  // namespace
}  // namespace transmuter
