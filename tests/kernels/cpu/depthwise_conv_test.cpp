// The depthwise convolution kernel against the MLX composition it replaces:
// outputs over kernel sizes, strides, dilations, asymmetric pads, SIMD tails,
// batches, bias and activations; gradients; mx::compile; the cases it hands
// back to the composition.
#include "kernels/cpu/depthwise_conv.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include <string>
#include "support/conv_reference.h"
#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// The kernel sums the kH * kW taps of each output in another order than MLX's
// convolution (bias first, rows then columns, fused multiply-adds). With unit
// scale inputs and at most 49 taps the float32 rounding differences stay
// around 1e-6; 1e-5 leaves room without hiding a wrong tap (which moves the
// result by ~0.1).
constexpr float kTolerance = 1e-5f;

// Whether y (not yet evaluated: evaluation detaches the graph) is the
// kernel's output, directly or through the reshape of a 1-D problem.
bool from_kernel(const mx::array& y) {
  if (!y.has_primitive()) return false;
  if (std::string(y.primitive().name()) == "transmuter::DepthwiseConv") return true;
  return y.inputs().size() == 1 && from_kernel(y.inputs()[0]);
}

// The expected result written out independently of the kernel's reference:
// mx::conv_general on channels-last copies, + bias, activation.
mx::array expected(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                   const DepthwiseConvOptions& o) {
  mx::array y = mx::conv_general(mx::transpose(x, {0, 2, 3, 1}), mx::transpose(w, {0, 2, 3, 1}), o.strides,
                                 o.pads_begin, o.pads_end, o.dilations, {}, o.groups, false);
  y = mx::transpose(y, {0, 3, 1, 2});
  if (bias) y = y + mx::reshape(*bias, {-1, 1, 1});
  return testing::apply_activation(y, o.activation, o.clip_min, o.clip_max);
}

struct Case {
  int batch, channels, multiplier, height, width, kernel_h, kernel_w;
  std::vector<int> strides, dilations, pads_begin, pads_end;
  bool bias;
  ConvActivation activation = ConvActivation::kNone;
};

std::string list(const std::vector<int>& v) {
  std::string text;
  for (int x : v) text += std::to_string(x) + ",";
  return text;
}

std::string describe(const Case& c) {
  return "x [" + list({c.batch, c.channels, c.height, c.width}) + "] multiplier " +
         std::to_string(c.multiplier) + " kernel " + list({c.kernel_h, c.kernel_w}) + " strides " +
         list(c.strides) + " dilations " + list(c.dilations) + " pads " + list(c.pads_begin) +
         list(c.pads_end) + " bias " + std::to_string(c.bias) + " activation " +
         std::to_string(static_cast<int>(c.activation));
}

DepthwiseConvOptions options_of(const Case& c) {
  return {.strides = c.strides,
          .pads_begin = c.pads_begin,
          .pads_end = c.pads_end,
          .dilations = c.dilations,
          .groups = c.channels,
          .activation = c.activation};
}

TEST(DepthwiseConvKernel, MatchesTheComposition) {
  using A = ConvActivation;
  // Widths below, at and between SIMD widths (4, 8, 16 lanes) and past the
  // 4-vector block; kernel sizes 1 to 7; strides 1 to 3 per axis; dilations;
  // asymmetric and kernel-sized pads; batches; channel multipliers.
  const std::vector<Case> cases = {
      {1, 3, 1, 5, 7, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},
      {2, 4, 1, 9, 33, 3, 3, {2, 2}, {1, 1}, {1, 1}, {1, 1}, false},
      {1, 8, 1, 12, 17, 5, 5, {1, 1}, {1, 1}, {2, 2}, {2, 2}, true, A::kHardSwish},
      {3, 2, 1, 11, 40, 5, 5, {2, 2}, {1, 1}, {2, 2}, {2, 2}, true, A::kRelu},
      {1, 5, 1, 13, 29, 7, 7, {3, 3}, {1, 1}, {3, 3}, {3, 3}, false},
      {1, 6, 1, 6, 70, 1, 1, {1, 1}, {1, 1}, {0, 0}, {0, 0}, true, A::kClip},
      {2, 3, 1, 10, 23, 3, 3, {1, 2}, {2, 3}, {0, 1}, {2, 0}, true},
      {1, 4, 1, 8, 1, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},
      {1, 4, 1, 1, 100, 1, 5, {1, 3}, {1, 2}, {0, 4}, {0, 1}, false},
      {2, 3, 2, 7, 19, 3, 5, {2, 1}, {1, 1}, {1, 0}, {0, 3}, true},
      {1, 16, 1, 24, 96, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true, A::kHardSwish},
      {1, 2, 1, 4, 9, 3, 3, {1, 1}, {1, 1}, {0, 0}, {0, 0}, false},
      {1, 2, 1, 5, 5, 3, 3, {2, 2}, {3, 3}, {4, 5}, {6, 7}, true},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    mx::array x = random_array({c.batch, c.channels, c.height, c.width}, seed++);
    mx::array w = random_array({c.channels * c.multiplier, 1, c.kernel_h, c.kernel_w}, seed++);
    std::optional<mx::array> bias;
    if (c.bias) bias = random_array({c.channels * c.multiplier}, seed++);
    DepthwiseConvOptions options = options_of(c);
    if (c.activation == ConvActivation::kClip) options.clip_min = -0.5f, options.clip_max = 0.75f;
    mx::array got = depthwise_conv(x, w, bias, options, mx::Device::cpu);
    mx::array want = expected(x, w, bias, options);
    EXPECT_TRUE(from_kernel(got)) << describe(c);
    ASSERT_EQ(got.shape(), want.shape()) << describe(c);
    EXPECT_LT(max_abs_diff(got, want), kTolerance) << describe(c);
  }
}

TEST(DepthwiseConvKernel, OneSpatialAxis) {
  mx::array x = random_array({2, 6, 37}, 51);
  mx::array w = random_array({6, 1, 5}, 52);
  mx::array bias = random_array({6}, 53);
  DepthwiseConvOptions o{.strides = {2}, .pads_begin = {3}, .pads_end = {1}, .dilations = {2}, .groups = 6};
  mx::array got = depthwise_conv(x, w, bias, o, mx::Device::cpu);
  EXPECT_TRUE(from_kernel(got));
  using Ints = std::vector<int>;
  mx::array want = mx::conv_general(mx::transpose(x, {0, 2, 1}), mx::transpose(w, {0, 2, 1}), Ints{2},
                                    Ints{3}, Ints{1}, Ints{2}, {}, 6, false);
  want = mx::transpose(want, {0, 2, 1}) + mx::reshape(bias, {-1, 1});
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_LT(max_abs_diff(got, want), kTolerance);
}

// Non-contiguous input (a transpose from a channels-last producer) is made contiguous first.
TEST(DepthwiseConvKernel, TakesTransposedInput) {
  mx::array x = mx::transpose(random_array({2, 10, 12, 8}, 61), {0, 3, 1, 2});  // [2, 8, 10, 12]
  mx::array w = random_array({8, 1, 3, 3}, 62);
  DepthwiseConvOptions o{.pads_begin = {1, 1}, .pads_end = {1, 1}, .groups = 8};
  EXPECT_LT(max_abs_diff(depthwise_conv(x, w, {}, o, mx::Device::cpu), expected(x, w, {}, o)), kTolerance);
}

// Gradients come from the reference composition: equal to the independent
// composition's for every input.
TEST(DepthwiseConvKernel, GradientsEqualThoseOfTheComposition) {
  mx::array x = random_array({2, 4, 9, 11}, 71);
  mx::array w = random_array({4, 1, 3, 3}, 72);
  mx::array bias = random_array({4}, 73);
  DepthwiseConvOptions o{.strides = {2, 1},
                         .pads_begin = {1, 0},
                         .pads_end = {0, 2},
                         .dilations = {1, 2},
                         .groups = 4,
                         .activation = ConvActivation::kHardSwish};
  mx::array weights = random_array(expected(x, w, bias, o).shape(), 74);
  auto loss_of = [&](bool kernel) {
    return [&, kernel](const std::vector<mx::array>& p) {
      mx::array y =
          kernel ? depthwise_conv(p[0], p[1], p[2], o, mx::Device::cpu) : expected(p[0], p[1], p[2], o);
      return std::vector<mx::array>{mx::sum(y * weights)};
    };
  };
  std::vector<mx::array> primals = {x, w, bias};
  auto [_, got] = mx::vjp(loss_of(true), primals, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss_of(false), primals, {mx::array(1.0f)});
  for (size_t i = 0; i < primals.size(); ++i) {
    ASSERT_EQ(got[i].shape(), primals[i].shape()) << "input " << i;
    EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-4f) << "input " << i;
  }
}

TEST(DepthwiseConvKernel, RunsInsideCompile) {
  mx::array x = random_array({1, 6, 14, 21}, 81);
  mx::array w = random_array({6, 1, 5, 5}, 82);
  mx::array bias = random_array({6}, 83);
  DepthwiseConvOptions o{.strides = {2, 2}, .pads_begin = {2, 2}, .pads_end = {2, 2}, .groups = 6};
  auto f = mx::compile([o](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        depthwise_conv(mx::multiply(in[0], mx::array(2.0f)), in[1], in[2], o, mx::Device::cpu)};
  });
  mx::array got = f({x, w, bias})[0];
  EXPECT_LT(max_abs_diff(got, expected(x * 2.0f, w, bias, o)), kTolerance);
}

// Cases the kernel does not take run the composition: same values.
TEST(DepthwiseConvKernel, OtherDtypesAndGroupingsUseTheComposition) {
  // float16
  mx::array x = random_array({1, 4, 7, 9}, 91);
  mx::array w = random_array({4, 1, 3, 3}, 92);
  DepthwiseConvOptions o{.pads_begin = {1, 1}, .pads_end = {1, 1}, .groups = 4};
  mx::array half =
      depthwise_conv(mx::astype(x, mx::float16), mx::astype(w, mx::float16), {}, o, mx::Device::cpu);
  EXPECT_FALSE(from_kernel(half));
  EXPECT_EQ(half.dtype(), mx::float16);
  // float16 keeps ~3 significant digits; sums of 9 unit-scale products stay within 1e-2.
  EXPECT_LT(max_abs_diff(mx::astype(half, mx::float32), expected(x, w, {}, o)), 1e-2f);

  // Two input channels per group.
  mx::array w2 = random_array({6, 2, 3, 3}, 93);
  DepthwiseConvOptions grouped{.groups = 2};
  mx::array got = depthwise_conv(x, w2, {}, grouped, mx::Device::cpu);
  EXPECT_FALSE(from_kernel(got));
  EXPECT_LT(max_abs_diff(got, expected(x, w2, {}, grouped)), kTolerance);

  // Three spatial axes: the composition, which MLX's grouped convolution
  // refuses (so does the Conv op today).
  mx::array x3 = random_array({1, 3, 4, 5, 6}, 94);
  mx::array w3 = random_array({3, 1, 2, 2, 2}, 95);
  DepthwiseConvOptions o3{.strides = {1, 1, 1},
                          .pads_begin = {0, 0, 0},
                          .pads_end = {0, 0, 0},
                          .dilations = {1, 1, 1},
                          .groups = 3};
  EXPECT_THROW(depthwise_conv(x3, w3, {}, o3, mx::Device::cpu), std::invalid_argument);
}

TEST(DepthwiseConvKernel, WindowsBeyondTheInputGoToTheComposition) {
  mx::array x = random_array({1, 4, 5, 5}, 101);
  mx::array w = random_array({4, 1, 7, 7}, 102);  // window larger than the unpadded input
  EXPECT_THROW(depthwise_conv(x, w, {}, {.groups = 4}, mx::Device::cpu), std::invalid_argument);
  // One short of the window with stride 2: MLX's convolution still gives one
  // output (its length formula truncates toward zero); the kernel leaves such
  // windows to it, so the result is the composition's.
  mx::array w6 = random_array({4, 1, 6, 6}, 103);
  DepthwiseConvOptions strided{.strides = {2, 2}, .groups = 4};
  mx::array got = depthwise_conv(x, w6, {}, strided, mx::Device::cpu);
  EXPECT_FALSE(from_kernel(got));
  mx::array want = expected(x, w6, {}, strided);
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_LT(max_abs_diff(got, want), kTolerance);
}

}  // namespace
}  // namespace transmuter::kernels
