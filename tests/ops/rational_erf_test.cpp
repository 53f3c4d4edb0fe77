#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <mlx/primitives.h>

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

TEST(RationalErf, GradientIsTheAnalyticDerivative) {
  mx::array x = mx::linspace(-6.0, 6.0, 1201, mx::float32);
  auto erf = [](const mx::array& v) { return rational_erf(v, mx::Device::cpu); };
  std::vector<double> xs = testing::to_doubles(x);
  std::vector<double> g = testing::to_doubles(mx::vjp(erf, x, mx::full({1201}, 0.5f)).second);
  std::vector<double> t = testing::to_doubles(mx::jvp(erf, x, mx::full({1201}, 2.0f)).second);
  for (size_t i = 0; i < xs.size(); ++i) {
    double d = M_2_SQRTPI * std::exp(-xs[i] * xs[i]);
    EXPECT_NEAR(g[i], 0.5 * d, 1e-7 + 1e-6 * d) << xs[i];
    EXPECT_NEAR(t[i], 2 * d, 1e-7 + 1e-6 * d) << xs[i];
  }
}

TEST(RationalErf, HalfPrecisionAndCompiledGradients) {
  mx::array x = mx::array({-1.5f, 0.25f, 2.f});
  auto erf = [](const std::vector<mx::array>& v) { return std::vector<mx::array>{rational_erf(v[0], mx::Device::cpu)}; };
  std::vector<double> g = testing::to_doubles(mx::vjp(mx::compile(erf), {x}, {mx::ones({3})}).second[0]);
  std::vector<double> h =
      testing::to_doubles(mx::vjp(erf, {mx::astype(x, mx::bfloat16)}, {mx::ones({3}, mx::bfloat16)}).second[0]);
  for (size_t i = 0; i < 3; ++i) {
    double xi = testing::to_doubles(x)[i];
    double d = M_2_SQRTPI * std::exp(-xi * xi);
    EXPECT_NEAR(g[i], d, 1e-6 * d);
    EXPECT_NEAR(h[i], d, 1e-2);  // bfloat16 cotangent and result
  }
}

TEST(RationalErf, GpuStreamsUseStockErf) {
  // Built on a GPU stream and never evaluated, so it runs without a GPU.
  const mx::Stream gpu(0, mx::Device::gpu);
  EXPECT_EQ(std::string(rational_erf(mx::zeros({3}), gpu).primitive().name()), "Erf");
  EXPECT_NE(std::string(rational_erf(mx::zeros({3}), mx::Device::cpu).primitive().name()), "Erf");
}

}  // namespace
}  // namespace transmuter
