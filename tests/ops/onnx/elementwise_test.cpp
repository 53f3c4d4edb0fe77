#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::i64;
using testing::int_attr;
using testing::run_compiled;
using testing::run_op;
using testing::to_doubles;
using testing::to_ints;

mx::array ints(std::vector<int64_t> v, mx::Dtype dtype = mx::int64) {
  return mx::astype(i64(std::move(v)), dtype);
}

/** Runs an op that must throw OpError and returns its message. */
std::string error_of(const std::string& op, int opset, const std::vector<Value>& inputs,
                     const std::vector<Attribute>& attributes = {}) {
  try {
    run_op(op, opset, inputs, attributes);
  } catch (const OpError& e) {
    return e.what();
  }
  ADD_FAILURE() << op << " did not throw";
  return "";
}

TEST(Elementwise, AddBroadcastsNumpyStyle) {
  auto out = run_op("Add", 14, {mx::array({1.f, 2.f, 3.f}, {3, 1}), mx::array({10.f, 20.f}, {1, 2})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3, 2}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{11, 21, 12, 22, 13, 23}));
}

TEST(Elementwise, AddLegacyBroadcastAlignsAtAxis) {
  // Opset 6: B of shape [3] aligned to axis 0 of A [3, 2].
  auto out = run_op("Add", 6, {mx::zeros({3, 2}), mx::array({1.f, 2.f, 3.f})},
                    {testing::int_attr("broadcast", 1), testing::int_attr("axis", 0)});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{1, 1, 2, 2, 3, 3}));
}

TEST(Elementwise, MissingInputNamesTheNode) {
  try {
    run_op("Add", 14, {mx::array(1.f)});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[Add v7] node 'test_Add'"), std::string::npos) << e.what();
  }
}

TEST(Elementwise, SubAndMulLegacyBroadcastAtAxis) {
  auto sub = run_op("Sub", 1, {mx::ones({2, 3}), mx::array({1.f, 2.f})},
                    {int_attr("broadcast", 1), int_attr("axis", 0)});
  EXPECT_EQ(to_doubles(sub[0].tensor()), (std::vector<double>{0, 0, 0, -1, -1, -1}));
  auto mul = run_op("Mul", 6, {mx::ones({2, 3}), mx::array({1.f, 2.f, 3.f})}, {int_attr("broadcast", 1)});
  EXPECT_EQ(to_doubles(mul[0].tensor()), (std::vector<double>{1, 2, 3, 1, 2, 3}));
}

TEST(Elementwise, IntegerDivTruncatesTowardZero) {
  auto out = run_op("Div", 14, {ints({-7, 7, -7, 7, 6}, mx::int32), ints({2, 2, -2, -2, -3}, mx::int32)});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int32);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{-3, 3, 3, -3, -2}));
}

TEST(Elementwise, DivKeepsInt64AndUnsignedTypes) {
  auto big = run_op("Div", 14, {ints({int64_t{1} << 60}), ints({3})});
  EXPECT_EQ(big[0].tensor().dtype(), mx::int64);
  EXPECT_EQ(to_ints(big[0].tensor()), (std::vector<int64_t>{(int64_t{1} << 60) / 3}));
  auto u8 = run_op("Div", 14, {ints({200}, mx::uint8), ints({3}, mx::uint8)});
  EXPECT_EQ(u8[0].tensor().dtype(), mx::uint8);
  EXPECT_EQ(to_ints(u8[0].tensor()), (std::vector<int64_t>{66}));
}

TEST(Elementwise, FloatDivIsTrueDivision) {
  auto out = run_op("Div", 7, {mx::array({1.f, -3.f}), mx::array({2.f, 2.f})});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{0.5, -1.5}));
}

TEST(Elementwise, PowKeepsTheBaseType) {
  // int base, float exponent: computed in float, converted back to int64.
  auto int_base = run_op("Pow", 15, {ints({2, 3, 4}), mx::array({0.5f, 2.f, 1.5f})});
  EXPECT_EQ(int_base[0].tensor().dtype(), mx::int64);
  EXPECT_EQ(to_ints(int_base[0].tensor()), (std::vector<int64_t>{1, 9, 8}));
  auto float_base = run_op("Pow", 15, {mx::array({2.f, 4.f}), ints({3, -1}, mx::int32)});
  EXPECT_EQ(float_base[0].tensor().dtype(), mx::float32);
  EXPECT_EQ(to_doubles(float_base[0].tensor()), (std::vector<double>{8, 0.25}));
  auto f16 = run_op("Pow", 15, {mx::astype(mx::array({3.f}), mx::float16), mx::array({2.f})});
  EXPECT_EQ(f16[0].tensor().dtype(), mx::float16);
}

TEST(Elementwise, ModFollowsPythonByDefaultAndCWithFmod) {
  auto python = run_op("Mod", 13, {ints({-7, 7, -7, 7}, mx::int32), ints({3, -3, -3, 3}, mx::int32)});
  EXPECT_EQ(to_ints(python[0].tensor()), (std::vector<int64_t>{2, -2, -1, 1}));
  auto c = run_op("Mod", 13, {ints({-7, 7, -7, 7}, mx::int32), ints({3, -3, -3, 3}, mx::int32)},
                  {int_attr("fmod", 1)});
  EXPECT_EQ(to_ints(c[0].tensor()), (std::vector<int64_t>{-1, 1, -1, 1}));
  auto cf = run_op("Mod", 13, {mx::array({-4.3f, 5.5f}), mx::array({2.1f, -2.f})}, {int_attr("fmod", 1)});
  std::vector<double> v = to_doubles(cf[0].tensor());
  EXPECT_FLOAT_EQ(v[0], std::fmod(-4.3f, 2.1f));
  EXPECT_FLOAT_EQ(v[1], 1.5);
}

TEST(Elementwise, FloatModZeroTakesTheDivisorSign) {
  // Mod-28: an exact zero result carries the sign of B; x % inf keeps x when
  // the signs agree, else gives B.
  float inf = std::numeric_limits<float>::infinity();
  auto out = run_op("Mod", 28, {mx::array({4.f, 3.f, -3.f, inf}), mx::array({-2.f, inf, inf, 2.f})});
  std::vector<double> v = to_doubles(out[0].tensor());
  EXPECT_EQ(v[0], 0.0);
  EXPECT_TRUE(std::signbit(v[0]));
  EXPECT_EQ(v[1], 3.0);
  EXPECT_EQ(v[2], inf);
  EXPECT_TRUE(std::isnan(v[3]));
}

TEST(Elementwise, ModRejectsBadFmod) {
  std::string msg = error_of("Mod", 13, {mx::array(1.f), mx::array(1.f)}, {int_attr("fmod", 2)});
  EXPECT_NE(msg.find("[Mod v10]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fmod' must be 0 or 1, got 2"), std::string::npos) << msg;
}

TEST(Elementwise, BitShiftHandlesOutOfRangeAmounts) {
  auto right = run_op("BitShift", 28, {ints({-8, -8, 16, 16}, mx::int8), ints({1, 9, 2, -1}, mx::int8)},
                      {testing::string_attr("direction", "RIGHT")});
  EXPECT_EQ(right[0].tensor().dtype(), mx::int8);
  EXPECT_EQ(to_ints(right[0].tensor()), (std::vector<int64_t>{-4, -1, 4, 0}));
  auto left = run_op("BitShift", 28, {ints({1, 1, 3}, mx::uint8), ints({7, 8, 2}, mx::uint8)},
                     {testing::string_attr("direction", "LEFT")});
  EXPECT_EQ(left[0].tensor().dtype(), mx::uint8);
  EXPECT_EQ(to_ints(left[0].tensor()), (std::vector<int64_t>{128, 0, 12}));
}

TEST(Elementwise, BitShiftNeedsADirection) {
  std::string msg =
      error_of("BitShift", 11, {ints({1}), ints({1})}, {testing::string_attr("direction", "UP")});
  EXPECT_NE(msg.find("'direction' must be"), std::string::npos) << msg;
}

TEST(Elementwise, ComparisonsReturnBool) {
  mx::array a = mx::array({1.f, 2.f, 3.f});
  mx::array b = mx::array({2.f});
  struct Case {
    const char* op;
    std::vector<int64_t> expected;
  };
  for (const Case& c : {Case{"Less", {1, 0, 0}}, Case{"LessOrEqual", {1, 1, 0}}, Case{"Greater", {0, 0, 1}},
                        Case{"GreaterOrEqual", {0, 1, 1}}, Case{"Equal", {0, 1, 0}}}) {
    auto out = run_op(c.op, 16, {a, b});
    EXPECT_EQ(out[0].tensor().dtype(), mx::bool_) << c.op;
    EXPECT_EQ(to_ints(out[0].tensor()), c.expected) << c.op;
  }
}

TEST(Elementwise, LegacyComparisonBroadcastsAtAxis) {
  auto out = run_op("Greater", 1, {mx::array({1.f, 5.f, 1.f, 5.f}, {2, 2}), mx::array({2.f, 0.f})},
                    {int_attr("broadcast", 1), int_attr("axis", 0)});
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{0, 1, 1, 1}));
}

TEST(Elementwise, EqualComparesStringsWithBroadcast) {
  StringTensor a{{2, 2}, {"a", "b", "c", "a"}};
  StringTensor b{{2}, {"a", "b"}};
  auto out = run_op("Equal", 19, {a, b});
  EXPECT_EQ(out[0].tensor().dtype(), mx::bool_);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{1, 1, 0, 0}));
  std::string msg = error_of("Equal", 19, {a, mx::array({1.f})});
  EXPECT_NE(msg.find("cannot compare strings[2,2]"), std::string::npos) << msg;
}

TEST(Elementwise, LogicOps) {
  mx::array t = mx::array({true, true, false, false});
  mx::array f = mx::array({true, false, true, false});
  EXPECT_EQ(to_ints(run_op("And", 7, {t, f})[0].tensor()), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(to_ints(run_op("Or", 7, {t, f})[0].tensor()), (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(to_ints(run_op("Xor", 7, {t, f})[0].tensor()), (std::vector<int64_t>{0, 1, 1, 0}));
  EXPECT_EQ(to_ints(run_op("Not", 1, {t})[0].tensor()), (std::vector<int64_t>{0, 0, 1, 1}));
}

TEST(Elementwise, WhereBroadcastsAllThreeInputs) {
  auto out =
      run_op("Where", 16, {mx::array({true, false}, {2, 1}), mx::array({1.f, 2.f, 3.f}), mx::array(-1.f)});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 3}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{1, 2, 3, -1, -1, -1}));
}

TEST(Elementwise, VariadicOpsFoldAllInputs) {
  mx::array a = mx::array({1.f, 6.f});
  mx::array b = mx::array({4.f, 2.f});
  mx::array c = mx::array({3.f}, {1, 1});
  EXPECT_EQ(to_doubles(run_op("Sum", 13, {a, b, c})[0].tensor()), (std::vector<double>{8, 11}));
  EXPECT_EQ(to_doubles(run_op("Max", 13, {a, b, c})[0].tensor()), (std::vector<double>{4, 6}));
  EXPECT_EQ(to_doubles(run_op("Min", 13, {a, b, c})[0].tensor()), (std::vector<double>{1, 2}));
  EXPECT_EQ(to_doubles(run_op("Mean", 13, {a, b, c})[0].tensor()),
            (std::vector<double>{static_cast<float>(8.0 / 3), static_cast<float>(11.0 / 3)}));
  EXPECT_EQ(run_op("Max", 13, {a, b, c})[0].tensor().shape(), (mx::Shape{1, 2}));
  EXPECT_EQ(to_doubles(run_op("Sum", 8, {a})[0].tensor()), (std::vector<double>{1, 6}));
  auto ints_max = run_op("Max", 13, {ints({1, 9}, mx::uint8), ints({5, 2}, mx::uint8)});
  EXPECT_EQ(ints_max[0].tensor().dtype(), mx::uint8);
}

TEST(Elementwise, ClipBoundsFromAttributesBeforeOpset11) {
  auto both = run_op("Clip", 6, {mx::array({-2.f, 0.f, 2.f})},
                     {testing::float_attr("min", -1), testing::float_attr("max", 1)});
  EXPECT_EQ(to_doubles(both[0].tensor()), (std::vector<double>{-1, 0, 1}));
  auto none = run_op("Clip", 6, {mx::array({-2.f, 2.f})});
  EXPECT_EQ(to_doubles(none[0].tensor()), (std::vector<double>{-2, 2}));
}

TEST(Elementwise, ClipBoundsFromOptionalInputs) {
  mx::array x = mx::array({-2.f, 0.f, 2.f});
  EXPECT_EQ(to_doubles(run_op("Clip", 13, {x, mx::array(-1.f)})[0].tensor()),
            (std::vector<double>{-1, 0, 2}));
  EXPECT_EQ(to_doubles(run_op("Clip", 13, {x, Value(), mx::array(1.f)})[0].tensor()),
            (std::vector<double>{-2, 0, 1}));
  // min > max: every element becomes max, as numpy.clip does.
  EXPECT_EQ(to_doubles(run_op("Clip", 13, {x, mx::array(2.f), mx::array(1.f)})[0].tensor()),
            (std::vector<double>{1, 1, 1}));
  auto i8 = run_op("Clip", 13, {ints({-100, 5, 100}, mx::int8), ints({0}, mx::int8)});
  EXPECT_EQ(i8[0].tensor().dtype(), mx::int8);
  EXPECT_EQ(to_ints(i8[0].tensor()), (std::vector<int64_t>{0, 5, 100}));
}

TEST(Elementwise, UnaryMath) {
  mx::array x = mx::array({-1.5f, 0.5f, 2.5f});
  EXPECT_EQ(to_doubles(run_op("Abs", 13, {x})[0].tensor()), (std::vector<double>{1.5, 0.5, 2.5}));
  EXPECT_EQ(to_doubles(run_op("Neg", 13, {x})[0].tensor()), (std::vector<double>{1.5, -0.5, -2.5}));
  EXPECT_EQ(to_doubles(run_op("Floor", 13, {x})[0].tensor()), (std::vector<double>{-2, 0, 2}));
  EXPECT_EQ(to_doubles(run_op("Ceil", 13, {x})[0].tensor()), (std::vector<double>{-1, 1, 3}));
  // Round halves to even.
  EXPECT_EQ(to_doubles(run_op("Round", 11, {x})[0].tensor()), (std::vector<double>{-2, 0, 2}));
  EXPECT_EQ(to_doubles(run_op("Sign", 13, {x})[0].tensor()), (std::vector<double>{-1, 1, 1}));
  EXPECT_EQ(to_doubles(run_op("Reciprocal", 13, {x})[0].tensor()),
            (std::vector<double>{static_cast<float>(-1 / 1.5), 2, 0.4f}));
  auto neg_int = run_op("Neg", 13, {ints({3}, mx::int8)});
  EXPECT_EQ(neg_int[0].tensor().dtype(), mx::int8);
}

TEST(Elementwise, IsInfHonoursItsDetectAttributes) {
  float inf = std::numeric_limits<float>::infinity();
  mx::array x = mx::array({-inf, inf, 1.f, NAN});
  EXPECT_EQ(to_ints(run_op("IsInf", 10, {x})[0].tensor()), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(to_ints(run_op("IsInf", 10, {x}, {int_attr("detect_negative", 0)})[0].tensor()),
            (std::vector<int64_t>{0, 1, 0, 0}));
  EXPECT_EQ(to_ints(run_op("IsInf", 10, {x}, {int_attr("detect_positive", 0)})[0].tensor()),
            (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(to_ints(run_op("IsNaN", 9, {x})[0].tensor()), (std::vector<int64_t>{0, 0, 0, 1}));
}

TEST(Elementwise, IdentityPassesAnyValueThrough) {
  auto seq = run_op("Identity", 14, {Value::sequence({mx::array(1.f), mx::array(2.f)})});
  ASSERT_TRUE(seq[0].is_sequence());
  EXPECT_EQ(seq[0].sequence_items().size(), 2u);
  auto t = run_op("Identity", 1, {ints({4, 5})});
  EXPECT_EQ(to_ints(t[0].tensor()), (std::vector<int64_t>{4, 5}));
}

/** Runs `op` eagerly and inside mx::compile with every input traced, and
 * expects the same dtype and values. */
void expect_compiled_matches_eager(const std::string& op, int opset, const std::vector<Value>& inputs,
                                   const std::vector<Attribute>& attributes = {}) {
  mx::array eager = run_op(op, opset, inputs, attributes)[0].tensor();
  std::vector<size_t> traced;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].is_none()) traced.push_back(i);
  }
  mx::array compiled = run_compiled(op, opset, inputs, traced, attributes)[0];
  EXPECT_EQ(compiled.dtype(), eager.dtype()) << op;
  EXPECT_EQ(to_doubles(compiled), to_doubles(eager)) << op;
}

TEST(Elementwise, CompiledMatchesEager) {
  mx::array a = ints({-7, 7, -7, 7}, mx::int32);
  mx::array b = ints({2, 2, -2, -3}, mx::int32);
  expect_compiled_matches_eager("Div", 14, {a, b});
  expect_compiled_matches_eager("Mod", 13, {a, b});
  expect_compiled_matches_eager("Mod", 13, {a, b}, {int_attr("fmod", 1)});
  expect_compiled_matches_eager("Mod", 28, {mx::array({4.f, -3.f}), mx::array({-2.f, 2.5f})});
  expect_compiled_matches_eager("BitShift", 28, {ints({-8, 16}, mx::int8), ints({9, 2}, mx::int8)},
                                {testing::string_attr("direction", "RIGHT")});
  expect_compiled_matches_eager("Pow", 15, {ints({2, 3}), mx::array({0.5f, 2.f})});
  expect_compiled_matches_eager("Clip", 13, {mx::array({-2.f, 0.f, 2.f}), mx::array(-1.f), mx::array(1.f)});
  expect_compiled_matches_eager("Where", 16,
                                {mx::array({true, false}), mx::array({1.f, 2.f}), mx::array(0.f)});
  expect_compiled_matches_eager("Mean", 13, {mx::array({1.f, 2.f}), mx::array({3.f}), mx::array({5.f, 7.f})});
  expect_compiled_matches_eager("Less", 6, {mx::zeros({2, 2}), mx::array({1.f, -1.f})},
                                {int_attr("broadcast", 1), int_attr("axis", 0)});
}

TEST(Elementwise, TrigAndHyperbolicMatchTheCLibrary) {
  struct Case {
    const char* op;
    int opset;
    double (*reference)(double);
  };
  const Case cases[] = {{"Tan", 7, std::tan},     {"Asin", 7, std::asin},   {"Acos", 7, std::acos},
                        {"Atan", 22, std::atan},  {"Sinh", 9, std::sinh},   {"Cosh", 9, std::cosh},
                        {"Asinh", 9, std::asinh}, {"Atanh", 22, std::atanh}};
  const std::vector<float> xs = {-0.9f, -0.3f, 0.0f, 0.4f, 0.8f};
  for (const Case& c : cases) {
    std::vector<double> got = to_doubles(run_op(c.op, c.opset, {mx::array(xs.data(), {5})})[0].tensor());
    for (size_t i = 0; i < xs.size(); ++i) {
      // float32 results: a few ulps of values below 2 in magnitude.
      EXPECT_NEAR(got[i], c.reference(xs[i]), 1e-6) << c.op << "(" << xs[i] << ")";
    }
  }
  std::vector<double> acosh = to_doubles(run_op("Acosh", 9, {mx::array({1.0f, 2.0f, 10.0f})})[0].tensor());
  EXPECT_NEAR(acosh[1], std::acosh(2.0), 1e-6);
  EXPECT_NEAR(acosh[2], std::acosh(10.0), 1e-5);
}

TEST(Elementwise, BitwiseOpsOnIntegers) {
  mx::array a = mx::array({0b1100, -1, 7}, {3}, mx::int32);
  mx::array b = mx::array({0b1010, 5, 0}, {3}, mx::int32);
  EXPECT_EQ(to_ints(run_op("BitwiseAnd", 18, {a, b})[0].tensor()), (std::vector<int64_t>{0b1000, 5, 0}));
  EXPECT_EQ(to_ints(run_op("BitwiseOr", 18, {a, b})[0].tensor()), (std::vector<int64_t>{0b1110, -1, 7}));
  EXPECT_EQ(to_ints(run_op("BitwiseXor", 18, {a, b})[0].tensor()), (std::vector<int64_t>{0b0110, -6, 7}));
  EXPECT_EQ(to_ints(run_op("BitwiseNot", 18, {a})[0].tensor()), (std::vector<int64_t>{~0b1100, 0, ~7}));
  mx::array u = mx::array({0xF0}, {1}, mx::uint8);
  EXPECT_EQ(to_ints(run_op("BitwiseNot", 18, {u})[0].tensor()), (std::vector<int64_t>{0x0F}));
}

}  // namespace
}  // namespace transmuter
