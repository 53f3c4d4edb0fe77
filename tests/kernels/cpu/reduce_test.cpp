// The sum / mean kernel against float64 sums, within the bound of sequential float32 summation
// (n * 2^-24 * sum |x|, n the values summed, + the mean's one rounding): the reduced axes last (rows), first,
// in the middle, several adjacent ones, ones separated only by extents of 1, keepdims on and off, sizes that
// span many tasks and more columns than a task; a transposed view; gradients (mx::sum's / mx::mean's);
// the cases handed to MLX (axes not adjacent, other types). Under each SIMD target the CPU has.
#include "kernels/cpu/reduce.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include "support/simd_targets.h"

#include <cmath>
#include <string>
#include <vector>

namespace transmuter::kernels {
namespace {

struct Case {
  mx::Shape shape;
  std::vector<int> axes;
};

void expect_within_summation_bound(const mx::array& x, const std::vector<int>& axes, bool keepdims,
                                   bool mean) {
  const mx::array got = sum_over_axes(x, axes, keepdims, mean, mx::Device::cpu);
  ASSERT_TRUE(got.has_primitive());
  EXPECT_EQ(std::string(got.primitive().name()), mean ? "transmuter::Mean" : "transmuter::Sum");
  const mx::array x64 = mx::astype(x, mx::float64, mx::Device::cpu);
  mx::array want = mx::sum(x64, axes, keepdims, mx::Device::cpu);
  mx::array magnitude = mx::sum(mx::abs(x64, mx::Device::cpu), axes, keepdims, mx::Device::cpu);
  double n = 1;
  for (int a : axes) n *= x.shape(a);
  if (mean) {
    want = mx::divide(want, mx::array(n, mx::float64), mx::Device::cpu);
    magnitude = mx::divide(magnitude, mx::array(n, mx::float64), mx::Device::cpu);
  }
  ASSERT_EQ(got.shape(), want.shape());
  const double eps = std::ldexp(1.0, -24);
  const mx::array bound =
      mx::add(mx::multiply(magnitude, mx::array((n + 1) * eps, mx::float64)), mx::array(1e-30, mx::float64));
  const mx::array error = mx::abs(mx::subtract(mx::astype(got, mx::float64, mx::Device::cpu), want));
  EXPECT_TRUE(mx::all(mx::less_equal(error, bound), mx::Device::cpu).item<bool>())
      << ::testing::PrintToString(x.shape()) << " over " << ::testing::PrintToString(axes) << " mean "
      << mean;
}

TEST(SumOverAxesKernel, WithinTheSummationBoundOfFloat64Sums) {
  const std::vector<Case> cases = {
      {{5, 300}, {1}},            // rows
      {{37, 1001}, {1}},          // rows with tails, several tasks
      {{2, 49, 320}, {1}},        // columns: a global average pool over NHWC
      {{1, 2, 80, 256}, {1}},     // a text recognizer's height pooling
      {{64, 300, 8}, {1}},        // many tasks of columns
      {{3, 2000}, {0}},           // the first axis
      {{2, 3, 4, 5}, {1, 2}},     // two adjacent axes
      {{4, 1, 6}, {0, 2}},        // adjacent once the 1 is set aside
      {{2, 7, 7, 1000}, {1, 2}},  // more columns than a task
      {{6}, {0}},                 // everything
      {{16, 384}, {0, 1}},
  };
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    SCOPED_TRACE(target);
    uint64_t seed = 1;
    for (const Case& c : cases) {
      const mx::array x = mx::random::normal(c.shape, mx::float32, 1.0f, 3.0f, mx::random::key(seed++));
      for (bool keepdims : {true, false}) {
        for (bool mean : {false, true}) expect_within_summation_bound(x, c.axes, keepdims, mean);
      }
    }
  });
  EXPECT_GE(targets, 1);
  const mx::array t = mx::transpose(mx::random::normal({40, 30}, mx::float32, mx::random::key(9)));
  expect_within_summation_bound(t, {1}, false, true);
}

TEST(SumOverAxesKernel, GradientsAreMlxs) {
  const mx::array x = mx::random::normal({3, 4, 5}, mx::float32, mx::random::key(20));
  for (bool mean : {false, true}) {
    auto loss = [mean](bool kernel) {
      return [mean, kernel](const mx::array& in) {
        const std::vector<int> axes = {1};
        const mx::array y = kernel ? sum_over_axes(in, axes, false, mean, mx::Device::cpu)
                                   : (mean ? mx::mean(in, axes) : mx::sum(in, axes));
        return mx::sum(mx::multiply(y, y));
      };
    };
    const mx::array got = mx::grad(loss(true))(x), want = mx::grad(loss(false))(x);
    EXPECT_TRUE(mx::allclose(got, want, 1e-5, 1e-6).item<bool>()) << mean;
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.0f);
  }
}

TEST(SumOverAxesKernel, OtherAxesAndTypesAreMlxs) {
  const mx::array x = mx::random::normal({3, 4, 5}, mx::float32, mx::random::key(30));
  EXPECT_FALSE(sum_over_axes_fits(x, {0, 2}));
  const mx::array apart = sum_over_axes(x, {0, 2}, false, true, mx::Device::cpu);
  EXPECT_EQ(std::string(apart.primitive().name()).rfind("transmuter::", 0),
            std::string::npos);  // before eval
  EXPECT_TRUE(mx::allclose(apart, mx::mean(x, std::vector<int>{0, 2})).item<bool>());
  const mx::array half = sum_over_axes(mx::astype(x, mx::float16), {1}, true, false, mx::Device::cpu);
  EXPECT_EQ(half.dtype(), mx::float16);
  EXPECT_EQ(std::string(half.primitive().name()), "Sum");
}

}  // namespace
}  // namespace transmuter::kernels
