#include <cmath>

#include <gtest/gtest.h>

#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::float_attr;
using testing::int_attr;
using testing::run_op;
using testing::to_doubles;

// Tolerance for float32 results of a few operations on values of order 1.
constexpr double kTol = 1e-5;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = kTol) {
  testing::expect_all_near(actual, expected, tol);
}

TEST(LayerNormalization, LastAxisMatchesHandComputed) {
  // Row [1, 3]: mean 2, variance 1 -> [-1, 1] / sqrt(1 + eps).
  mx::array x = mx::array({1.f, 3.f, 0.f, 4.f}, {2, 2});
  auto out = run_op("LayerNormalization", 17, {x, mx::array({1.f, 2.f}), mx::array({0.f, 10.f})},
                    {float_attr("epsilon", 0.f)});
  expect_near(to_doubles(out[0].tensor()), {-1, 12, -1, 12});
}

TEST(LayerNormalization, InnerAxisWithStatistics) {
  // axis 1 of [1, 2, 2]: one group of four values {0, 2, 4, 6}, mean 3, variance 5.
  mx::array x = mx::array({0.f, 2.f, 4.f, 6.f}, {1, 2, 2});
  auto out = run_op("LayerNormalization", 17, {x, mx::ones({2, 2})},
                    {int_attr("axis", 1), float_attr("epsilon", 0.f)}, 3);
  const double inv = 1 / std::sqrt(5.0);
  expect_near(to_doubles(out[0].tensor()), {-3 * inv, -inv, inv, 3 * inv});
  EXPECT_EQ(out[1].tensor().shape(), (mx::Shape{1, 1, 1}));
  expect_near(to_doubles(out[1].tensor()), {3});
  expect_near(to_doubles(out[2].tensor()), {inv});
}

TEST(LayerNormalization, HalfInputComputesStatisticsInFloat32) {
  mx::array x = mx::astype(mx::array({1000.f, 1001.f, 1002.f, 1003.f}, {1, 4}), mx::float16);
  auto out = run_op("LayerNormalization", 17, {x, mx::ones({4}, mx::float16)}, {int_attr("axis", 0)}, 3);
  EXPECT_EQ(out[0].tensor().dtype(), mx::float16);
  EXPECT_EQ(out[1].tensor().dtype(), mx::float32);
  expect_near(to_doubles(out[1].tensor()), {1001.5});
  const double inv = 1 / std::sqrt(1.25 + 1e-5);
  expect_near(to_doubles(out[0].tensor()), {-1.5 * inv, -0.5 * inv, 0.5 * inv, 1.5 * inv},
              2e-3);  // f16 rounding
}

TEST(BatchNormalization, InferencePerChannel) {
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f}, {1, 2, 2, 1});
  auto out =
      run_op("BatchNormalization", 15,
             {x, mx::array({1.f, 2.f}), mx::array({0.f, 1.f}), mx::array({1.f, 3.f}), mx::array({4.f, 1.f})},
             {float_attr("epsilon", 0.f)});
  // Channel 0: (x - 1) / 2; channel 1: 2 * (x - 3) + 1.
  expect_near(to_doubles(out[0].tensor()), {0, 0.5, 1, 3});
}

TEST(BatchNormalization, LegacyPerActivationParameters) {
  // v6 with spatial=0: parameters of shape [C, H] apply per activation.
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f}, {1, 2, 2});
  mx::array mean = mx::array({1.f, 2.f, 3.f, 4.f}, {2, 2});
  auto out = run_op("BatchNormalization", 6, {x, mx::ones({2, 2}), mx::ones({2, 2}), mean, mx::ones({2, 2})},
                    {int_attr("spatial", 0), int_attr("is_test", 1), float_attr("epsilon", 0.f)});
  expect_near(to_doubles(out[0].tensor()), {1, 1, 1, 1});
}

TEST(BatchNormalization, TrainingModeUpdatesRunningStatistics) {
  // One channel holding {0, 2}: batch mean 1, population variance 1.
  mx::array x = mx::array({0.f, 2.f}, {2, 1});
  auto out = run_op(
      "BatchNormalization", 15, {x, mx::array({1.f}), mx::array({0.f}), mx::array({5.f}), mx::array({3.f})},
      {int_attr("training_mode", 1), float_attr("momentum", 0.5f), float_attr("epsilon", 0.f)}, 3);
  expect_near(to_doubles(out[0].tensor()), {-1, 1});
  expect_near(to_doubles(out[1].tensor()), {3});  // 0.5 * 5 + 0.5 * 1
  expect_near(to_doubles(out[2].tensor()), {2});  // 0.5 * 3 + 0.5 * 1
}

TEST(InstanceNormalization, NormalizesEachChannelOverSpace) {
  mx::array x = mx::array({1.f, 3.f, 10.f, 30.f}, {1, 2, 2});
  auto out = run_op("InstanceNormalization", 6, {x, mx::array({1.f, 2.f}), mx::array({0.f, 5.f})},
                    {float_attr("epsilon", 0.f)});
  expect_near(to_doubles(out[0].tensor()), {-1, 1, 3, 7});
}

TEST(GroupNormalization, V18ScalesPerGroupAndV21PerChannel) {
  // Two groups of two channels, one value each: group {1, 3} -> [-1, 1].
  mx::array x = mx::array({1.f, 3.f, 5.f, 9.f}, {1, 4, 1});
  auto v18 = run_op("GroupNormalization", 18, {x, mx::array({1.f, 2.f}), mx::array({0.f, 1.f})},
                    {int_attr("num_groups", 2), float_attr("epsilon", 0.f)});
  expect_near(to_doubles(v18[0].tensor()), {-1, 1, -1, 3});
  auto v21 = run_op("GroupNormalization", 21, {x, mx::array({1.f, 2.f, 3.f, 4.f}), mx::zeros({4})},
                    {int_attr("num_groups", 2), float_attr("epsilon", 0.f)});
  expect_near(to_doubles(v21[0].tensor()), {-1, 2, -3, 4});
}

TEST(GroupNormalization, GroupsMustDivideChannels) {
  EXPECT_THROW(run_op("GroupNormalization", 21, {mx::ones({1, 3, 2}), mx::ones({3}), mx::ones({3})},
                      {int_attr("num_groups", 2)}),
               OpError);
}

TEST(LpNormalization, ZeroNormGivesZero) {
  mx::array x = mx::array({3.f, 0.f, -4.f, 0.f}, {2, 2});
  auto l2 = run_op("LpNormalization", 22, {x}, {int_attr("axis", 0)});
  expect_near(to_doubles(l2[0].tensor()), {0.6, 0, -0.8, 0});
  auto l1 = run_op("LpNormalization", 1, {x}, {int_attr("axis", 0), int_attr("p", 1)});
  expect_near(to_doubles(l1[0].tensor()), {3.0 / 7, 0, -4.0 / 7, 0});
}

}  // namespace
}  // namespace transmuter
