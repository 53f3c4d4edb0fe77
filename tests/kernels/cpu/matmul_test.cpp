// The GEMV route against mx::matmul (the reference it replaces).
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>
#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// Both sum K products in float32 in different orders: with K <= 1000 and unit
// normal values the sums stay below ~100, so 1e-4 absolute is a few ulps.
constexpr float kTolerance = 1e-4f;

TEST(MatvecKernel, MatchesMatmulForStoredAndTransposedWeights) {
  for (auto [k, n] : {std::pair{1, 1}, {7, 3}, {384, 1536}, {1000, 17}}) {
    mx::array a = random_array({1, 1, k}, static_cast<uint64_t>(k));
    mx::array w = random_array({k, n}, static_cast<uint64_t>(n) + 100);
    ASSERT_TRUE(matvec_applies(a, w, mx::Device::cpu));
    mx::array got = matvec(a, w, false, mx::Device::cpu);
    EXPECT_EQ(got.shape(), (mx::Shape{1, 1, n}));
    EXPECT_LT(max_abs_diff(got, mx::matmul(a, w)), kTolerance) << k << "x" << n;
    mx::array wt = mx::contiguous(mx::transpose(w));  // stored [N, K]
    mx::array got_t = matvec(a, wt, true, mx::Device::cpu);
    EXPECT_LT(max_abs_diff(got_t, mx::matmul(a, w)), kTolerance) << k << "x" << n << " transposed";
  }
}

TEST(MatvecKernel, MoreThanOneRowIsNotAMatvec) {
  EXPECT_FALSE(matvec_applies(random_array({2, 8}, 1), random_array({8, 4}, 2), mx::Device::cpu));
  EXPECT_FALSE(matvec_applies(mx::ones({1, 8}, mx::float16), mx::ones({8, 4}, mx::float16), mx::Device::cpu));
  EXPECT_FALSE(matvec_applies(random_array({1, 8}, 1), random_array({2, 8, 4}, 2), mx::Device::cpu));
  // Called anyway, it computes the product with mx::matmul.
  mx::array a = random_array({3, 8}, 3);
  mx::array w = random_array({8, 4}, 4);
  EXPECT_LT(max_abs_diff(matvec(a, w, false, mx::Device::cpu), mx::matmul(a, w)), kTolerance);
}

TEST(MatvecKernel, GradientsAndCompileFollowTheReference) {
  mx::array a = random_array({1, 16}, 5);
  mx::array w = random_array({16, 9}, 6);
  auto loss = [](bool kernel) {
    return [kernel](const std::vector<mx::array>& p) {
      mx::array y = kernel ? matvec(p[0], p[1], false, mx::Device::cpu) : mx::matmul(p[0], p[1]);
      return std::vector<mx::array>{mx::sum(mx::square(y))};
    };
  };
  auto [_, got] = mx::vjp(loss(true), {a, w}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss(false), {a, w}, {mx::array(1.0f)});
  EXPECT_LT(max_abs_diff(got[0], want[0]), 1e-3f);
  EXPECT_LT(max_abs_diff(got[1], want[1]), 1e-3f);
  auto compiled = mx::compile([](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{matvec(mx::add(in[0], mx::array(1.0f)), in[1], false, mx::Device::cpu)};
  });
  EXPECT_LT(max_abs_diff(compiled({a, w})[0], mx::matmul(a + 1.0f, w)), kTolerance);
}

}  // namespace
}  // namespace transmuter::kernels
