// The normalization kernel against its reference (the MLX composition it
// replaces): outputs, the optional sum output, gradients, and the inputs it
// hands back to the composition.
#include "kernels/cpu/layer_norm.h"

#include <gtest/gtest.h>

#include <string>
#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// The kernel sums in a different order (SIMD lanes, two passes) than MLX's
// reductions; for rows of up to ~1000 values near unit scale float32 rounding
// keeps results within a few ulps of 1, far inside 1e-5.
constexpr float kTolerance = 1e-5f;

struct Case {
  mx::Shape shape;
  bool skip, bias, beta, rms, return_sum;
};

std::string describe(const Case& c) {
  std::string text = "shape [";
  for (int d : c.shape) text += std::to_string(d) + ",";
  return text + "] skip=" + std::to_string(c.skip) + " bias=" + std::to_string(c.bias) + " beta=" +
         std::to_string(c.beta) + " rms=" + std::to_string(c.rms) + " sum=" + std::to_string(c.return_sum);
}

// The reference written out independently of the kernel's own reference.
std::vector<mx::array> expected(const mx::array& x, const std::optional<mx::array>& skip,
                                const std::optional<mx::array>& bias, const mx::array& gamma,
                                const std::optional<mx::array>& beta, const NormalizeOptions& o) {
  mx::array sum = x;
  if (skip) sum = sum + *skip;
  if (bias) sum = sum + *bias;
  mx::array mean = o.rms ? mx::zeros({1}) : mx::mean(sum, -1, true);
  mx::array var = mx::mean(mx::square(sum - mean), -1, true);
  mx::array y = (sum - mean) / mx::sqrt(var + o.epsilon) * gamma;
  if (beta) y = y + *beta;
  return {y, sum};
}

TEST(NormalizeKernel, MatchesTheCompositionForEveryInputCombination) {
  // Row lengths below, at and between SIMD widths; enough rows to split across threads.
  const std::vector<Case> cases = {
      {{3, 5}, false, false, true, false, false},   {{2, 4, 384}, true, true, true, false, true},
      {{1, 17}, true, false, false, false, false},  {{4096, 33}, false, true, true, false, false},
      {{7, 768}, true, true, false, true, true},    {{100, 3, 64}, false, false, false, true, false},
      {{1, 1}, false, false, true, false, false},   {{600, 1000}, true, false, true, false, true},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const int d = c.shape.back();
    mx::array x = random_array(c.shape, seed++, 3.0f);
    std::optional<mx::array> skip, bias, beta;
    if (c.skip) skip = random_array(c.shape, seed++);
    if (c.bias) bias = random_array({d}, seed++);
    if (c.beta) beta = random_array({d}, seed++);
    mx::array gamma = random_array({d}, seed++);
    NormalizeOptions options{.epsilon = 1e-5f, .rms = c.rms, .return_sum = c.return_sum};
    std::vector<mx::array> got = normalize_last_axis(x, skip, bias, gamma, beta, options, mx::Device::cpu);
    std::vector<mx::array> want = expected(x, skip, bias, gamma, beta, options);
    ASSERT_EQ(got.size(), c.return_sum ? 2u : 1u) << describe(c);
    EXPECT_EQ(got[0].shape(), c.shape) << describe(c);
    EXPECT_LT(max_abs_diff(got[0], want[0]), kTolerance) << describe(c);
    if (c.return_sum) EXPECT_LT(max_abs_diff(got[1], want[1]), kTolerance) << describe(c);
  }
}

TEST(NormalizeKernel, ConstantRowsNormalizeToBeta) {
  mx::array x = mx::full({4, 50}, 2.5f);
  mx::array gamma = mx::ones({50});
  mx::array beta = mx::full({50}, 0.25f);
  mx::array y = normalize_last_axis(x, {}, {}, gamma, beta, {}, mx::Device::cpu)[0];
  EXPECT_LT(max_abs_diff(y, mx::full({4, 50}, 0.25f)), 1e-6f);
}

// Gradients come from the reference composition: equal to those of the
// independent composition above.
TEST(NormalizeKernel, GradientsEqualThoseOfTheComposition) {
  mx::array x = random_array({6, 40}, 11);
  mx::array skip = random_array({6, 40}, 12);
  mx::array gamma = random_array({40}, 13);
  mx::array beta = random_array({40}, 14);
  mx::array weights = random_array({6, 40}, 15);
  NormalizeOptions options{};
  auto loss_of = [&](bool kernel) {
    return [&, kernel](const std::vector<mx::array>& p) {
      mx::array y = kernel ? normalize_last_axis(p[0], p[1], {}, p[2], p[3], options, mx::Device::cpu)[0]
                           : expected(p[0], p[1], {}, p[2], p[3], options)[0];
      return std::vector<mx::array>{mx::sum(y * weights)};
    };
  };
  std::vector<mx::array> primals = {x, skip, gamma, beta};
  auto [_, got] = mx::vjp(loss_of(true), primals, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss_of(false), primals, {mx::array(1.0f)});
  for (size_t i = 0; i < primals.size(); ++i) EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-4f) << "input " << i;
}

TEST(NormalizeKernel, RunsInsideCompile) {
  mx::array x = random_array({5, 64}, 21);
  mx::array gamma = random_array({64}, 22);
  auto f = mx::compile([](const std::vector<mx::array>& in) {
    return normalize_last_axis(mx::multiply(in[0], mx::array(2.0f)), {}, {}, in[1], {}, {}, mx::Device::cpu);
  });
  mx::array got = f({x, gamma})[0];
  mx::array want = expected(x * 2.0f, {}, {}, gamma, {}, {})[0];
  EXPECT_LT(max_abs_diff(got, want), kTolerance);
}

// Shapes or dtypes the kernel does not take run the composition: same values.
TEST(NormalizeKernel, OtherDtypesAndBroadcastParametersUseTheComposition) {
  mx::array x = random_array({3, 16}, 31);
  mx::array gamma2d = random_array({1, 16}, 32);
  mx::array y = normalize_last_axis(x, {}, {}, gamma2d, {}, {}, mx::Device::cpu)[0];
  EXPECT_LT(max_abs_diff(y, expected(x, {}, {}, gamma2d, {}, {})[0]), kTolerance);

  mx::array half = mx::astype(x, mx::float16);
  mx::array gamma = mx::ones({16}, mx::float16);
  mx::array yh = normalize_last_axis(half, {}, {}, gamma, {}, {}, mx::Device::cpu)[0];
  EXPECT_EQ(yh.dtype(), mx::float16);
  EXPECT_LT(max_abs_diff(mx::astype(yh, mx::float32), expected(x, {}, {}, mx::ones({16}), {}, {})[0]), 1e-2f);
}

// Non-contiguous input (a transpose) is made contiguous before the kernel.
TEST(NormalizeKernel, TakesTransposedInput) {
  mx::array x = mx::transpose(random_array({24, 10}, 41));
  mx::array gamma = random_array({24}, 42);
  mx::array y = normalize_last_axis(x, {}, {}, gamma, {}, {}, mx::Device::cpu)[0];
  EXPECT_LT(max_abs_diff(y, expected(x, {}, {}, gamma, {}, {})[0]), kTolerance);
}

}  // namespace
}  // namespace transmuter::kernels
