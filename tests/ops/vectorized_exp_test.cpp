#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/vectorized_exp.h"
#include "support/op_test_support.h"

namespace transmuter {
namespace {

TEST(VectorizedExp, RelativeErrorBelowTwoTenMillionths) {
  const int n = 1000001;
  mx::array x = mx::linspace(-87.0, 88.0, n, mx::float32);
  std::vector<double> xs = testing::to_doubles(x);
  std::vector<double> ys = testing::to_doubles(exp_upto_88(x, mx::Device::cpu));
  double worst = 0;
  for (int i = 0; i < n; ++i) worst = std::max(worst, std::abs(ys[i] / std::exp(xs[i]) - 1));
  EXPECT_LT(worst, 2e-7);
}

TEST(VectorizedExp, UnderflowInfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<double> y =
      testing::to_doubles(exp_upto_88(mx::array({0.f, -88.f, -1000.f, -inf, std::nanf("")}), mx::Device::cpu));
  EXPECT_EQ(y[0], 1.0);
  EXPECT_EQ(y[1], 0.0);  // below 2^-126: flushed
  EXPECT_EQ(y[2], 0.0);
  EXPECT_EQ(y[3], 0.0);
  EXPECT_TRUE(std::isnan(y[4]));
}

TEST(VectorizedExp, SoftmaxMatchesMlxIncludingMaskedEntries) {
  const float inf = std::numeric_limits<float>::infinity();
  mx::array scores = mx::random::normal({4, 8, 16}, mx::float32, 0, 5, mx::random::key(3));
  // Mask the upper triangle of the last two axes with -inf, as causal attention does.
  mx::array mask = mx::triu(mx::full({8, 16}, -inf), 1);
  mx::array x = mx::add(scores, mask);
  std::vector<double> ours = testing::to_doubles(softmax_float32(x, {2}, mx::Device::cpu));
  std::vector<double> ref = testing::to_doubles(mx::softmax(x, std::vector<int>{2}, true, mx::Device::cpu));
  ASSERT_EQ(ours.size(), ref.size());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_NEAR(ours[i], ref[i], 1e-6) << i;
}

}  // namespace
}  // namespace transmuter
