// The softmax kernel against an independent composition: scale, broadcast
// masks, causal limits, fully masked rows, gradients, compile, fallbacks.
#include "kernels/cpu/softmax.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>
#include "support/random_arrays.h"
#include "support/simd_targets.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// The kernel's exponential is within ~1 ulp (ExponentialIsWithinOneUlp) and it
// multiplies by 1/sum where the composition divides: probabilities (<= 1) agree
// to a few float32 ulps.
constexpr float kTolerance = 1e-6f;
const float kInf = std::numeric_limits<float>::infinity();

// Written out independently of the kernel's reference: an explicit lower
// triangle for the causal limit, MLX's softmax.
mx::array expected(const mx::array& x, const std::optional<mx::array>& mask, const SoftmaxOptions& o) {
  mx::array v = x * o.scale;
  if (mask) v = v + *mask;
  if (o.causal) {
    const int q = x.shape(-2), n = x.shape(-1);
    mx::array allowed = mx::tri(q, n, static_cast<int>(o.causal_offset), mx::bool_);
    v = mx::where(allowed, v, mx::array(-kInf));
  }
  return mx::softmax(v, -1, /*precise=*/true);
}

struct Case {
  mx::Shape shape;
  std::optional<mx::Shape> mask;
  float scale;
  bool causal;
  int64_t offset;
};

std::string describe(const Case& c) {
  std::string text = "shape [";
  for (int d : c.shape) text += std::to_string(d) + ",";
  text += "] mask [";
  if (c.mask) {
    for (int d : *c.mask) text += std::to_string(d) + ",";
  }
  return text + "] scale " + std::to_string(c.scale) + " causal " + std::to_string(c.causal) + " offset " +
         std::to_string(c.offset);
}

// The softmax's exponential (arguments x - max <= 0) against exp in double over every 257th float32
// in [ln(FLT_MIN), 0] ($TRANSMUTER_EXP_STRIDE sets the stride: 1 checks all 1.1e9 of them), under each
// SIMD target: at most 1.05 ulp of the float32 result (all of them, stride 1, measured 1.019 at worst,
// x = -27.378, on AVX-512 and AVX2); 0 below ln(FLT_MIN) and at -inf; NaN stays NaN.
TEST(SoftmaxKernel, ExponentialIsWithinOneUlp) {
  const char* env = std::getenv("TRANSMUTER_EXP_STRIDE");
  const uint32_t stride = env != nullptr ? static_cast<uint32_t>(std::max(1, std::atoi(env))) : 257;
  const float lowest = -87.33654f;  // ln(FLT_MIN): exp is a normal float from here up
  uint32_t last_bits;
  std::memcpy(&last_bits, &lowest, sizeof(float));
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    double worst = 0.0;
    float worst_at = 0.0f;
    std::vector<float> x, y;
    for (uint64_t bits = 0x80000000u; bits <= last_bits;) {  // -0 down to `lowest`
      x.clear();
      for (; bits <= last_bits && x.size() < (1u << 20); bits += stride) {
        const uint32_t b = static_cast<uint32_t>(bits);
        float v;
        std::memcpy(&v, &b, sizeof(float));
        x.push_back(v);
      }
      y.resize(x.size());
      exp_non_positive(x.data(), static_cast<int64_t>(x.size()), y.data());
      for (size_t i = 0; i < x.size(); ++i) {
        const double exact = std::exp(static_cast<double>(x[i]));
        const float rounded = static_cast<float>(exact);
        const double ulp = std::nextafter(rounded, kInf) - rounded;
        const double error = std::abs(y[i] - exact) / ulp;
        if (error > worst) worst = error, worst_at = x[i];
      }
    }
    EXPECT_LE(worst, 1.05) << target << " at x = " << worst_at;
    if (env != nullptr) std::printf("%s: worst %.4f ulp at x = %.9g\n", target.c_str(), worst, worst_at);
    const float specials[] = {0.0f, -0.0f, -87.4f, -100.0f, -kInf, std::numeric_limits<float>::quiet_NaN()};
    float out[6];
    exp_non_positive(specials, 6, out);
    EXPECT_EQ(out[0], 1.0f) << target;
    EXPECT_EQ(out[1], 1.0f) << target;
    EXPECT_EQ(out[2], 0.0f) << target;
    EXPECT_EQ(out[3], 0.0f) << target;
    EXPECT_EQ(out[4], 0.0f) << target;
    EXPECT_TRUE(std::isnan(out[5])) << target;
  });
  EXPECT_GE(targets, 1);
}

TEST(SoftmaxKernel, MatchesTheCompositionWithScaleMasksAndCausal) {
  // Row lengths below, at and between SIMD widths; masks broadcast over
  // batch, head and query axes; enough rows to split across threads.
  const std::vector<Case> cases = {
      {{3, 5}, std::nullopt, 1.0f, false, 0},
      {{1, 17}, std::nullopt, 0.5f, false, 0},
      {{2, 4, 8, 128}, mx::Shape{2, 1, 1, 128}, 0.125f, false, 0},
      {{2, 4, 8, 33}, mx::Shape{2, 1, 8, 33}, 1.0f, false, 0},
      {{2, 3, 9, 9}, mx::Shape{9, 9}, 0.3f, true, 0},
      {{1, 2, 5, 12}, std::nullopt, 1.0f, true, 7},   // queries at the end of a longer key axis
      {{1, 2, 6, 4}, mx::Shape{1, 2, 1, 4}, 1.0f, true, -2},  // first rows fully masked: NaN both ways
      {{4096, 40}, mx::Shape{40}, 2.0f, false, 0},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    mx::array x = random_array(c.shape, seed++, 3.0f);
    std::optional<mx::array> mask;
    if (c.mask) mask = random_array(*c.mask, seed++, 2.0f);
    const SoftmaxOptions o{.scale = c.scale, .causal = c.causal, .causal_offset = c.offset};
    mx::array got = softmax_last_axis(x, mask, o, mx::Device::cpu);
    mx::array want = expected(x, mask, o);
    EXPECT_EQ(got.shape(), c.shape) << describe(c);
    // NaN rows (nothing to attend) must be NaN in both.
    EXPECT_TRUE(mx::array_equal(mx::isnan(got), mx::isnan(want)).item<bool>()) << describe(c);
    mx::array finite = mx::where(mx::isnan(want), mx::array(0.0f), want);
    EXPECT_LT(max_abs_diff(mx::where(mx::isnan(got), mx::array(0.0f), got), finite), kTolerance) << describe(c);
  }
}

TEST(SoftmaxKernel, FullyMaskedRowsGiveZerosWhenAsked) {
  mx::array x = random_array({2, 3, 8}, 5);
  mx::array mask = mx::where(mx::reshape(mx::array({true, false, true}), {1, 3, 1}), mx::array(0.0f),
                             mx::array(-kInf));
  mx::array mask3 = mx::broadcast_to(mask, {1, 3, 8});
  mx::array got = softmax_last_axis(x, mask3, {.zero_fully_masked_rows = true}, mx::Device::cpu);
  mx::array row1 = mx::slice(got, {0, 1, 0}, {2, 2, 8});
  EXPECT_EQ(mx::max(mx::abs(row1)).item<float>(), 0.0f);
  mx::array others = mx::sum(mx::slice(got, {0, 0, 0}, {2, 1, 8}), -1);
  EXPECT_LT(max_abs_diff(others, mx::ones({2, 1})), 1e-6f);
  // Without the option the row is NaN, as mx::softmax gives.
  mx::array nan = softmax_last_axis(x, mask3, {}, mx::Device::cpu);
  EXPECT_TRUE(mx::all(mx::isnan(mx::slice(nan, {0, 1, 0}, {2, 2, 8}))).item<bool>());
}

TEST(SoftmaxKernel, GradientsEqualThoseOfTheComposition) {
  mx::array x = random_array({2, 2, 6, 10}, 11);
  mx::array mask = random_array({2, 1, 1, 10}, 12);
  mx::array weights = random_array({2, 2, 6, 10}, 13);
  const SoftmaxOptions o{.scale = 0.7f, .causal = true, .causal_offset = 3};
  auto loss_of = [&](bool kernel) {
    return [&, kernel](const std::vector<mx::array>& p) {
      mx::array y = kernel ? softmax_last_axis(p[0], p[1], o, mx::Device::cpu) : expected(p[0], p[1], o);
      return std::vector<mx::array>{mx::sum(y * weights)};
    };
  };
  auto [_, got] = mx::vjp(loss_of(true), {x, mask}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss_of(false), {x, mask}, {mx::array(1.0f)});
  for (size_t i = 0; i < 2; ++i) EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-5f) << "input " << i;
}

TEST(SoftmaxKernel, RunsInsideCompile) {
  mx::array x = random_array({3, 4, 16}, 21);
  mx::array mask = random_array({3, 1, 16}, 22);
  auto f = mx::compile([](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        softmax_last_axis(mx::multiply(in[0], mx::array(2.0f)), in[1], {.scale = 0.5f}, mx::Device::cpu)};
  });
  mx::array got = f({x, mask})[0];
  EXPECT_LT(max_abs_diff(got, expected(x * 2.0f, mask, {.scale = 0.5f})), kTolerance);
}

// Inputs the kernel does not take run the composition: same values.
TEST(SoftmaxKernel, OtherDtypesAndMaskShapesUseTheComposition) {
  mx::array x = random_array({3, 16}, 31);
  mx::array column_mask = random_array({3, 1}, 32);  // last axis 1: not a row mask
  mx::array y = softmax_last_axis(x, column_mask, {}, mx::Device::cpu);
  EXPECT_LT(max_abs_diff(y, expected(x, column_mask, {})), kTolerance);

  mx::array half = mx::astype(x, mx::float16);
  mx::array yh = softmax_last_axis(half, std::nullopt, {}, mx::Device::cpu);
  EXPECT_EQ(yh.dtype(), mx::float16);
  EXPECT_LT(max_abs_diff(mx::astype(yh, mx::float32), expected(x, std::nullopt, {})), 2e-3f);
}

TEST(SoftmaxKernel, TakesTransposedInput) {
  mx::array x = mx::transpose(random_array({24, 10}, 41));
  mx::array y = softmax_last_axis(x, std::nullopt, {}, mx::Device::cpu);
  EXPECT_LT(max_abs_diff(y, expected(x, std::nullopt, {})), kTolerance);
}

}  // namespace
}  // namespace transmuter::kernels
