#include <cmath>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::i64;
using testing::int_attr;
using testing::run_compiled;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;

// float32 sums of a few values of order 1.
constexpr double kTol = 1e-6;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = kTol) {
  testing::expect_all_near(actual, expected, tol);
}

// [N=3, C=2]: row n holds (n, 10 + n).
mx::array three_by_two() { return mx::array({0.f, 10.f, 1.f, 11.f, 2.f, 12.f}, {3, 2}); }

TEST(NegativeLogLikelihoodLoss, PicksTheTargetClassPerRow) {
  auto none = run_op("NegativeLogLikelihoodLoss", 13, {three_by_two(), i64({1, 0, 1})},
                     {string_attr("reduction", "none")});
  expect_near(to_doubles(none[0].tensor()), {-10, -1, -12});
  auto sum = run_op("NegativeLogLikelihoodLoss", 13, {three_by_two(), i64({1, 0, 1})},
                    {string_attr("reduction", "sum")});
  expect_near(to_doubles(sum[0].tensor()), {-23});
  auto mean = run_op("NegativeLogLikelihoodLoss", 22, {three_by_two(), i64({1, 0, 1})});  // mean by default
  expect_near(to_doubles(mean[0].tensor()), {-23.0 / 3});
}

TEST(NegativeLogLikelihoodLoss, WeightedMeanDividesBySummedWeights) {
  mx::array weight = mx::array({2.f, 0.5f});
  auto out = run_op("NegativeLogLikelihoodLoss", 12, {three_by_two(), i64({1, 0, 1}), weight});
  // (-10 * 0.5 - 1 * 2 - 12 * 0.5) / (0.5 + 2 + 0.5)
  expect_near(to_doubles(out[0].tensor()), {-13.0 / 3});
}

TEST(NegativeLogLikelihoodLoss, IgnoredTargetsOutsideTheClassesCountNothing) {
  // ignore_index -1 is no class; the ignored row neither adds loss nor counts in the mean.
  auto out = run_op("NegativeLogLikelihoodLoss", 13, {three_by_two(), i64({1, -1, 0})},
                    {int_attr("ignore_index", -1)});
  expect_near(to_doubles(out[0].tensor()), {-(10.0 + 2.0) / 2});
  auto none = run_op("NegativeLogLikelihoodLoss", 13, {three_by_two(), i64({1, 7, 0})},
                     {int_attr("ignore_index", 7), string_attr("reduction", "none")});
  expect_near(to_doubles(none[0].tensor()), {-10, 0, -2});
}

TEST(NegativeLogLikelihoodLoss, SpatialDimensionsKeepTheirShape) {
  // [N=1, C=2, D=3]: class 0 holds 0, 1, 2 and class 1 holds 3, 4, 5.
  mx::array input = testing::iota({1, 2, 3});
  auto out = run_op("NegativeLogLikelihoodLoss", 13, {input, i64({0, 1, 0}, {1, 3})},
                    {string_attr("reduction", "none")});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 3}));
  expect_near(to_doubles(out[0].tensor()), {0, -4, -2});
}

TEST(NegativeLogLikelihoodLoss, CompiledWithTracedTargets) {
  auto out = run_compiled("NegativeLogLikelihoodLoss", 13, {three_by_two(), i64({1, 0, 1})}, {0, 1},
                          {string_attr("reduction", "sum")});
  expect_near(to_doubles(out[0]), {-23});
}

TEST(NegativeLogLikelihoodLoss, BadInputsNameTheNode) {
  std::string message =
      error_of<OpError>([] { run_op("NegativeLogLikelihoodLoss", 13, {three_by_two(), i64({1, 0})}); });
  EXPECT_NE(message.find("[NegativeLogLikelihoodLoss v"), std::string::npos) << message;
  EXPECT_NE(message.find("target shape"), std::string::npos) << message;
  EXPECT_THROW(run_op("NegativeLogLikelihoodLoss", 13, {mx::array({1.f, 2.f}), i64({0})}), OpError);
  EXPECT_THROW(run_op("NegativeLogLikelihoodLoss", 13, {three_by_two(), mx::array({1.f, 0.f, 1.f})}),
               OpError);
  EXPECT_THROW(run_op("NegativeLogLikelihoodLoss", 13, {three_by_two(), i64({1, 0, 1}), mx::ones({3})}),
               OpError);
  EXPECT_THROW(run_op("NegativeLogLikelihoodLoss", 13, {three_by_two(), i64({1, 0, 1})},
                      {string_attr("reduction", "max")}),
               OpError);
}

TEST(SoftmaxCrossEntropyLoss, LogSoftmaxThenNegativeLogLikelihood) {
  // Row (n, 10 + n): log p = (-log(1 + e^10), -log(1 + e^-10)).
  const double low = -std::log1p(std::exp(10.0)), high = -std::log1p(std::exp(-10.0));
  auto out = run_op("SoftmaxCrossEntropyLoss", 13, {three_by_two(), i64({1, 0, 1})},
                    {string_attr("reduction", "none")}, 2);
  expect_near(to_doubles(out[0].tensor()), {-high, -low, -high}, 1e-5);
  expect_near(to_doubles(out[1].tensor()), {low, high, low, high, low, high}, 1e-5);
}

TEST(SoftmaxCrossEntropyLoss, HalfPrecisionKeepsItsDtype) {
  mx::array scores = mx::astype(three_by_two(), mx::float16);
  auto out =
      run_op("SoftmaxCrossEntropyLoss", 13, {scores, i64({0, 0, 0})}, {string_attr("reduction", "sum")}, 2);
  EXPECT_EQ(out[0].tensor().dtype(), mx::float16);
  EXPECT_EQ(out[1].tensor().dtype(), mx::float16);
  expect_near(to_doubles(out[0].tensor()), {3 * std::log1p(std::exp(10.0))}, 0.02);  // f16 rounding of ~30
}

}  // namespace
}  // namespace transmuter
