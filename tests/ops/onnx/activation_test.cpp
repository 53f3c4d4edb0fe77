#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::float_attr;
using testing::int_attr;
using testing::run_compiled;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;

// float32 results against double formulas: a few float32 ulps.
constexpr double kTol = 1e-6;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = kTol) {
  testing::expect_all_near(actual, expected, tol);
}

const std::vector<float> kInputs = {-3.f, -0.5f, 0.f, 0.5f, 3.f};

std::vector<double> apply(double (*f)(double)) {
  std::vector<double> out;
  for (float x : kInputs) out.push_back(f(x));
  return out;
}

std::vector<double> run_on_inputs(const std::string& op, int opset,
                                  const std::vector<Attribute>& attrs = {}) {
  return to_doubles(run_op(op, opset, {mx::array(kInputs.data(), {5})}, attrs)[0].tensor());
}

TEST(Activation, ReluKeepsIntegerTypes) {
  auto out = run_op("Relu", 14, {mx::astype(mx::array({-3, 4}), mx::int8)});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int8);
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{0, 4}));
}

TEST(Activation, LeakyReluDefaultsAndKeepsFloat16) {
  expect_near(run_on_inputs("LeakyRelu", 16), apply([](double x) { return x < 0 ? 0.01 * x : x; }));
  auto f16 =
      run_op("LeakyRelu", 16, {mx::astype(mx::array({-2.f}), mx::float16)}, {float_attr("alpha", 0.5f)});
  EXPECT_EQ(f16[0].tensor().dtype(), mx::float16);
  EXPECT_EQ(to_doubles(f16[0].tensor()), (std::vector<double>{-1}));
}

TEST(Activation, ExponentialLinearUnits) {
  expect_near(run_on_inputs("Elu", 6, {float_attr("alpha", 2.f)}),
              apply([](double x) { return x < 0 ? 2 * (std::exp(x) - 1) : x; }));
  expect_near(run_on_inputs("Selu", 6), apply([](double x) {
                return 1.05070102214813232421875 *
                       (x > 0 ? x : 1.67326319217681884765625 * (std::exp(x) - 1));
              }));
  expect_near(run_on_inputs("Celu", 12, {float_attr("alpha", 2.f)}),
              apply([](double x) { return std::max(0.0, x) + std::min(0.0, 2 * (std::exp(x / 2) - 1)); }));
}

TEST(Activation, HardSigmoidAndHardSwish) {
  expect_near(run_on_inputs("HardSigmoid", 6),
              apply([](double x) { return std::clamp(0.2 * x + 0.5, 0.0, 1.0); }));
  expect_near(run_on_inputs("HardSwish", 14),
              apply([](double x) { return x * std::clamp(x / 6 + 0.5, 0.0, 1.0); }));
}

TEST(Activation, SmoothActivations) {
  expect_near(run_on_inputs("Softplus", 1), apply([](double x) { return std::log1p(std::exp(x)); }));
  expect_near(run_on_inputs("Softsign", 1), apply([](double x) { return x / (1 + std::abs(x)); }));
  expect_near(run_on_inputs("Mish", 18),
              apply([](double x) { return x * std::tanh(std::log1p(std::exp(x))); }));
  expect_near(run_on_inputs("Sigmoid", 13), apply([](double x) { return 1 / (1 + std::exp(-x)); }));
  expect_near(run_on_inputs("ThresholdedRelu", 10, {float_attr("alpha", 0.4f)}),
              apply([](double x) { return x > 0.4 ? x : 0.0; }));
}

TEST(Activation, SoftplusDoesNotOverflowForLargeInputs) {
  auto out = run_op("Softplus", 22, {mx::array({100.f, -100.f})});
  std::vector<double> v = to_doubles(out[0].tensor());
  EXPECT_FLOAT_EQ(v[0], 100.f);
  EXPECT_NEAR(v[1], 0.0, 1e-40);
}

TEST(Activation, GeluExactAndTanhApproximation) {
  expect_near(run_on_inputs("Gelu", 20),
              apply([](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }));
  expect_near(run_on_inputs("Gelu", 20, {string_attr("approximate", "tanh")}), apply([](double x) {
                return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
              }));
  try {
    run_on_inputs("Gelu", 20, {string_attr("approximate", "fast")});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[Gelu v20] node 'test_Gelu': attribute 'approximate'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Activation, NarrowFloatsRoundOnlyTheResult) {
  // bfloat16 Gelu/Mish are computed in float32 and rounded once, so they equal
  // the float32 result converted to bfloat16.
  mx::array x = mx::astype(mx::array(kInputs.data(), {5}), mx::bfloat16);
  for (const char* op : {"Gelu", "Mish", "Celu", "Selu"}) {
    int opset = 22;
    mx::array narrow = run_op(op, opset, {x})[0].tensor();
    EXPECT_EQ(narrow.dtype(), mx::bfloat16) << op;
    mx::array wide = run_op(op, opset, {mx::astype(x, mx::float32)})[0].tensor();
    EXPECT_EQ(to_doubles(narrow), to_doubles(mx::astype(wide, mx::bfloat16))) << op;
  }
}

TEST(Activation, PReluLegacySlopeFollowsTheChannelAxis) {
  // X [1, 2, 2]: channel 0 = {-1, -1}, channel 1 = {-1, -1}; slope per channel.
  mx::array x = mx::full({1, 2, 2}, -1.f);
  mx::array slope = mx::array({0.1f, 0.2f});
  expect_near(to_doubles(run_op("PRelu", 6, {x, slope})[0].tensor()), {-0.1, -0.1, -0.2, -0.2});
  // From opset 7 the same slope broadcasts numpy-style, along the last axis.
  expect_near(to_doubles(run_op("PRelu", 16, {x, slope})[0].tensor()), {-0.1, -0.2, -0.1, -0.2});
}

TEST(Activation, SoftmaxBeforeOpset13NormalizesTheFlattenedTail) {
  mx::array x = mx::reshape(mx::arange(8.f), {2, 2, 2});
  // Opset 11, axis 1 (default): each batch row of 4 values sums to 1.
  mx::array old = run_op("Softmax", 11, {x})[0].tensor();
  expect_near(to_doubles(mx::sum(old, std::vector<int>{1, 2})), {1, 1});
  // Opset 13, axis -1 (default): each pair sums to 1.
  mx::array now = run_op("Softmax", 13, {x})[0].tensor();
  expect_near(to_doubles(mx::sum(now, -1)), {1, 1, 1, 1});
  EXPECT_GT(std::abs(to_doubles(old)[0] - to_doubles(now)[0]), 0.1);
}

TEST(Activation, LogSoftmaxMatchesLogOfSoftmax) {
  mx::array x = mx::array({1.f, 2.f, 3.f, 1000.f, 1001.f, 1002.f}, {2, 3});
  std::vector<double> log_soft = to_doubles(run_op("LogSoftmax", 13, {x})[0].tensor());
  double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  // Row 2 goes through values near 1000, where a float32 ulp is 6e-5.
  expect_near(log_soft, {1 - lse, 2 - lse, 3 - lse, 1 - lse, 2 - lse, 3 - lse}, 1e-4);
  // Opset 1-12 with axis 0 normalizes over everything.
  std::vector<double> all = to_doubles(
      run_op("LogSoftmax", 12, {mx::array({0.f, 0.f}, {1, 2})}, {int_attr("axis", 0)})[0].tensor());
  expect_near(all, {std::log(0.5), std::log(0.5)});
}

TEST(Activation, SoftmaxRejectsAnAxisOutOfRange) {
  try {
    run_op("Softmax", 13, {mx::zeros({2, 2})}, {int_attr("axis", 2)});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("axis 2 out of range for rank 2"), std::string::npos) << e.what();
  }
}

TEST(Activation, CompiledMatchesEager) {
  mx::array bf16 = mx::astype(mx::array(kInputs.data(), {5}), mx::bfloat16);
  mx::array x3 = mx::reshape(testing::iota({8}), {2, 2, 2});
  struct Case {
    const char* op;
    int opset;
    std::vector<Value> inputs;
  };
  for (const Case& c : {Case{"Gelu", 20, {bf16}}, Case{"Mish", 22, {bf16}}, Case{"Softmax", 11, {x3}},
                        Case{"LogSoftmax", 13, {x3}}, Case{"PRelu", 6, {x3, mx::array({0.1f, 0.2f})}},
                        Case{"HardSwish", 22, {bf16}}}) {
    mx::array eager = run_op(c.op, c.opset, c.inputs)[0].tensor();
    std::vector<size_t> traced(c.inputs.size());
    std::iota(traced.begin(), traced.end(), 0);
    mx::array compiled = run_compiled(c.op, c.opset, c.inputs, traced)[0];
    EXPECT_EQ(compiled.dtype(), eager.dtype()) << c.op;
    // Fusion may reorder float32 rounding: a few ulps.
    expect_near(to_doubles(compiled), to_doubles(eager), 1e-6);
  }
}

TEST(Activation, ShrinkShiftsOutsideLambdAndZeroesInside) {
  mx::array x = mx::array({-2.0f, -0.5f, 0.0f, 0.3f, 1.5f});
  auto out = testing::run_op("Shrink", 9, {x}, {testing::float_attr("lambd", 1.0f), testing::float_attr("bias", 0.5f)});
  EXPECT_EQ(testing::to_doubles(out[0].tensor()), (std::vector<double>{-1.5, 0, 0, 0, 1.0}));
}

TEST(Activation, HardmaxMarksTheFirstMaximum) {
  // Ties go to the first maximum; v13 works along one axis.
  mx::array x = mx::array({1.0f, 3.0f, 3.0f, 0.0f, 5.0f, 2.0f}, {2, 3});
  auto rows = testing::run_op("Hardmax", 13, {x});
  EXPECT_EQ(testing::to_doubles(rows[0].tensor()), (std::vector<double>{0, 1, 0, 0, 1, 0}));
  auto columns = testing::run_op("Hardmax", 13, {x}, {testing::int_attr("axis", 0)});
  EXPECT_EQ(testing::to_doubles(columns[0].tensor()), (std::vector<double>{1, 0, 1, 0, 1, 0}));
  // v11 with axis 0 coerces to one row: a single 1 over the whole tensor.
  auto whole = testing::run_op("Hardmax", 11, {x}, {testing::int_attr("axis", 0)});
  EXPECT_EQ(testing::to_doubles(whole[0].tensor()), (std::vector<double>{0, 0, 0, 0, 1, 0}));
}

TEST(Activation, SwishIsXTimesSigmoidOfAlphaX) {
  mx::array x = mx::array({-1.0f, 0.5f, 2.0f});
  auto out = testing::run_op("Swish", 24, {x}, {testing::float_attr("alpha", 2.0f)});
  std::vector<double> got = testing::to_doubles(out[0].tensor());
  const double xs[] = {-1.0, 0.5, 2.0};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], xs[i] / (1 + std::exp(-2 * xs[i])), 1e-6);
}

}  // namespace
}  // namespace transmuter
