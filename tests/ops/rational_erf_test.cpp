#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/rational_erf.h"
#include "support/op_test_support.h"

namespace transmuter {
namespace {

TEST(RationalErf, Float32WithinFourTenthsOfAMillionth) {
  // 1.2M points over [-6, 6], against double-precision std::erf.
  const int n = 1200001;
  mx::array x = mx::linspace(-6.0, 6.0, n, mx::float32);
  std::vector<double> xs = testing::to_doubles(x);
  std::vector<double> ys = testing::to_doubles(rational_erf(x, mx::Device::cpu));
  double worst = 0;
  for (int i = 0; i < n; ++i) worst = std::max(worst, std::abs(ys[i] - std::erf(xs[i])));
  EXPECT_LT(worst, 4e-7);
}

TEST(RationalErf, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  mx::array x = mx::array({0.f, -0.f, inf, -inf, std::nanf("")});
  std::vector<double> y = testing::to_doubles(rational_erf(x, mx::Device::cpu));
  EXPECT_EQ(y[0], 0.0);
  EXPECT_EQ(y[1], 0.0);
  EXPECT_EQ(y[2], 1.0);
  EXPECT_EQ(y[3], -1.0);
  EXPECT_TRUE(std::isnan(y[4]));
}

TEST(RationalErf, HalfPrecisionKeepsItsDtype) {
  mx::array x = mx::array({-1.5f, 0.25f, 2.f});
  for (mx::Dtype dtype : {mx::float16, mx::bfloat16}) {
    mx::array y = rational_erf(mx::astype(x, dtype), mx::Device::cpu);
    EXPECT_EQ(y.dtype(), dtype);
    std::vector<double> v = testing::to_doubles(y);
    EXPECT_NEAR(v[0], std::erf(-1.5), 1e-2);
    EXPECT_NEAR(v[2], std::erf(2.0), 1e-2);
  }
}

TEST(RationalErf, Float64GoesToMlxErf) {
  // mx::erf keeps float64 but is only float32-accurate (2.5e-7 off at 0.5).
  mx::array y = rational_erf(mx::array({0.5}, mx::float64), mx::Device::cpu);
  EXPECT_EQ(y.dtype(), mx::float64);
  EXPECT_NEAR(testing::to_doubles(y)[0], std::erf(0.5), 1e-6);
}

}  // namespace
}  // namespace transmuter
