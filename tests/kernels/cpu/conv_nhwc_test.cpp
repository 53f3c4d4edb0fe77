// The channels-last convolution kernels (group 1 on the packed GEMM, depthwise
// vectorized across channels) against mx::conv_general written out here:
// kernel sizes, strides, dilations, asymmetric pads, channel counts that are
// no multiple of the SIMD width, batches, bias and activations; gradients;
// mx::compile; argument checks.
#include "kernels/cpu/conv_nhwc.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include <stdexcept>
#include <string>

#include "support/conv_reference.h"
#include "support/random_arrays.h"
#include "support/simd_targets.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// The kernels sum each output's taps in another order than MLX's convolution
// (bias first, K in slices, fused multiply-adds). With unit-scale inputs and
// at most a few hundred taps the float32 rounding differences stay within a
// few 1e-6; a wrong tap or channel moves the result by ~0.1 or more.
constexpr float kTolerance = 2e-5f;

// y (not yet evaluated) is one of the NHWC kernels' outputs.
bool from_kernel(const mx::array& y) {
  if (!y.has_primitive()) return false;
  const std::string name = y.primitive().name();
  return name == "transmuter::ConvNhwc" || name == "transmuter::DepthwiseConvNhwc";
}

mx::array activate(const mx::array& y, const NhwcConvOptions& o) {
  return testing::apply_activation(y, o.activation, o.clip_min, o.clip_max);
}

// x [N, H, W, C], w in ONNX's layout [M, C / groups, kH, kW].
mx::array expected(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                   const NhwcConvOptions& o, int groups) {
  mx::array y = mx::conv_general(x, mx::transpose(w, {0, 2, 3, 1}), {o.strides[0], o.strides[1]},
                                 {o.pads_begin[0], o.pads_begin[1]}, {o.pads_end[0], o.pads_end[1]},
                                 {o.dilations[0], o.dilations[1]}, {}, groups, false);
  if (bias) y = y + *bias;
  return activate(y, o);
}

struct Case {
  int batch, channels, out_channels, height, width, kernel_h, kernel_w;
  std::array<int, 2> strides, dilations, pads_begin, pads_end;
  bool bias;
  ConvActivation activation = ConvActivation::kNone;

  NhwcConvOptions options() const {
    return {.kernel = {kernel_h, kernel_w},
            .strides = strides,
            .pads_begin = pads_begin,
            .pads_end = pads_end,
            .dilations = dilations,
            .activation = activation,
            .clip_min = -0.25f,
            .clip_max = 0.75f};
  }
};

std::string describe(const Case& c) {
  return "x [" + std::to_string(c.batch) + "," + std::to_string(c.height) + "," + std::to_string(c.width) +
         "," + std::to_string(c.channels) + "] kernel " + std::to_string(c.kernel_h) + "x" +
         std::to_string(c.kernel_w) + " -> " + std::to_string(c.out_channels) + " channels, activation " +
         std::to_string(static_cast<int>(c.activation));
}

TEST(ConvNhwcKernel, Group1MatchesTheConvolution) {
  const std::vector<Case> cases = {
      // pointwise: the image is the product's left-hand side in place
      {2, 16, 24, 7, 9, 1, 1, {1, 1}, {1, 1}, {0, 0}, {0, 0}, true, ConvActivation::kRelu},
      {1, 3, 40, 5, 5, 1, 1, {1, 1}, {1, 1}, {0, 0}, {0, 0}, false},
      // pointwise with stride 2 (unfolded)
      {1, 8, 17, 9, 10, 1, 1, {2, 2}, {1, 1}, {0, 0}, {0, 0}, true, ConvActivation::kHardSwish},
      // 3x3 same padding, channel counts off the SIMD width
      {2, 5, 13, 8, 11, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true, ConvActivation::kClip},
      // ResNet's stem: 7x7 stride 2 over 3 channels
      {1, 3, 8, 23, 19, 7, 7, {2, 2}, {1, 1}, {3, 3}, {3, 3}, true, ConvActivation::kRelu},
      // asymmetric pads, dilation, rectangular kernel, more than 256 taps deep
      {1, 40, 33, 9, 12, 3, 4, {1, 2}, {2, 1}, {2, 0}, {1, 3}, false},
      // a kernel wider than the image (every column a border column)
      {1, 2, 4, 3, 4, 5, 5, {1, 1}, {1, 1}, {2, 2}, {2, 2}, true},
  };
  for (const Case& c : cases) {
    mx::array x = random_array({c.batch, c.height, c.width, c.channels}, 11);
    mx::array w = random_array({c.out_channels, c.channels, c.kernel_h, c.kernel_w}, 12);
    std::optional<mx::array> bias;
    if (c.bias) bias = random_array({c.out_channels}, 13);
    const NhwcConvOptions o = c.options();
    mx::array y = conv2d_nhwc(x, pack_conv_weight_nhwc(w), bias, c.out_channels, o, mx::Device::cpu);
    EXPECT_TRUE(from_kernel(y)) << describe(c);
    mx::array want = expected(x, w, bias, o, 1);
    ASSERT_EQ(y.shape(), want.shape()) << describe(c);
    EXPECT_LT(max_abs_diff(y, want), kTolerance) << describe(c);
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f) << describe(c);  // not vacuous
  }
}

TEST(ConvNhwcKernel, DepthwiseMatchesTheConvolution) {
  const std::vector<Case> cases = {
      {2, 16, 16, 9, 13, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true, ConvActivation::kHardSwish},
      {1, 13, 13, 10, 11, 3, 3, {2, 2}, {1, 1}, {1, 1}, {1, 1}, false, ConvActivation::kRelu},
      {1, 20, 20, 7, 17, 5, 5, {1, 1}, {1, 1}, {2, 2}, {2, 2}, true, ConvActivation::kClip},
      {2, 3, 3, 8, 9, 3, 2, {1, 2}, {2, 1}, {2, 0}, {1, 1}, true},
      {1, 9, 9, 4, 3, 7, 7, {1, 1}, {1, 1}, {3, 3}, {3, 3}, false},  // wider than the image
      // rows with 8- and 4-column interior blocks: 7 wide, 5 wide stride 2, 3 wide stride 2
      {1, 24, 24, 9, 21, 7, 7, {1, 1}, {1, 1}, {3, 3}, {3, 3}, true, ConvActivation::kRelu},
      {2, 16, 16, 11, 23, 5, 5, {2, 2}, {1, 1}, {2, 2}, {2, 2}, true},
      {1, 12, 12, 8, 30, 3, 3, {2, 2}, {1, 1}, {0, 0}, {1, 1}, false, ConvActivation::kHardSwish},
      {1, 16, 16, 6, 20, 3, 3, {1, 1}, {1, 2}, {1, 2}, {1, 2}, true},  // dilated
  };
  // On every SIMD target of the CPU: channel counts end inside a vector of each width.
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    for (const Case& c : cases) {
      mx::array x = random_array({c.batch, c.height, c.width, c.channels}, 21);
      mx::array w = random_array({c.channels, 1, c.kernel_h, c.kernel_w}, 22);
      std::optional<mx::array> bias;
      if (c.bias) bias = random_array({c.channels}, 23);
      const NhwcConvOptions o = c.options();
      mx::array y = depthwise_conv_nhwc(x, depthwise_weight_nhwc(w), bias, o, mx::Device::cpu);
      EXPECT_TRUE(from_kernel(y)) << target << " " << describe(c);
      mx::array want = expected(x, w, bias, o, c.channels);
      ASSERT_EQ(y.shape(), want.shape()) << describe(c);
      EXPECT_LT(max_abs_diff(y, want), kTolerance) << target << " " << describe(c);
      EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f) << describe(c);
    }
  });
  EXPECT_GE(targets, 1);
}

// The direct kernel (at most kConvDirectMaxChannels input channels, or NCHW
// input), on every SIMD target: output channel counts that fill 1-4 vectors
// of a register group, cross panels or end inside a vector (8-lane and, on
// AVX-512, 16-lane vectors from 32 channels), border and interior columns,
// strides, dilation, the residual, NHWC and NCHW input. NCHW input over 6
// channels takes the direct kernel too (the pass only makes it for stems).
TEST(ConvNhwcKernel, DirectKernelMatchesTheConvolution) {
  const std::vector<Case> cases = {
      {8, 3, 8, 12, 40, 3, 3, {2, 2}, {1, 1}, {1, 1}, {1, 1}, true, ConvActivation::kHardSwish},  // PP-LCNet's
                                                                                                  // stem
      {1, 3, 13, 9, 15, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, false, ConvActivation::kRelu},
      {1, 1, 24, 7, 19, 5, 3, {1, 2}, {1, 1}, {2, 0}, {1, 2}, true, ConvActivation::kClip},
      {2, 4, 40, 10, 21, 3, 3, {2, 2}, {2, 1}, {2, 1}, {2, 1}, true},
      {1, 3, 64, 17, 23, 7, 7, {2, 2}, {1, 1}, {3, 3}, {3, 3}, true, ConvActivation::kRelu},  // ResNet's stem
      {1, 3, 70, 8, 16, 4, 4, {4, 4}, {1, 1}, {0, 0}, {0, 0}, true},  // ConvNeXt's patchify
      {1, 2, 33, 5, 6, 1, 1, {2, 2}, {1, 1}, {0, 0}, {0, 0}, false},  // strided 1x1
      {1, 6, 20, 6, 9, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},   // NCHW only: 6 channels
  };
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    for (const Case& c : cases) {
      for (bool nchw : {false, true}) {
        if (!nchw && c.channels > kConvDirectMaxChannels) continue;
        mx::array x = random_array({c.batch, c.height, c.width, c.channels}, 81);
        mx::array w = random_array({c.out_channels, c.channels, c.kernel_h, c.kernel_w}, 82);
        std::optional<mx::array> bias;
        if (c.bias) bias = random_array({c.out_channels}, 83);
        NhwcConvOptions o = c.options();
        mx::array want = expected(x, w, bias, o, 1);
        o.channels_first_input = nchw;
        const mx::array input = nchw ? mx::contiguous(mx::transpose(x, {0, 3, 1, 2})) : x;
        mx::array y = conv2d_nhwc(input, pack_conv_weight_nhwc(w), bias, c.out_channels, o, mx::Device::cpu);
        EXPECT_TRUE(from_kernel(y)) << target << " " << describe(c);
        ASSERT_EQ(y.shape(), want.shape()) << describe(c);
        EXPECT_LT(max_abs_diff(y, want), kTolerance) << target << " nchw " << nchw << " " << describe(c);
        EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f) << describe(c);
      }
    }
    // The residual, in the direct kernel's epilogue: NCHW input, 40 channels (a 3-vector group).
    mx::array x = random_array({2, 3, 9, 10}, 84);
    mx::array w = random_array({40, 3, 3, 3}, 85);
    mx::array z = random_array({2, 9, 10, 40}, 86);
    NhwcConvOptions o{
        .kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}, .activation = ConvActivation::kRelu};
    NhwcConvOptions linear = o;
    linear.activation = ConvActivation::kNone;
    mx::array want =
        mx::maximum(expected(mx::transpose(x, {0, 2, 3, 1}), w, {}, linear, 1) + z, mx::array(0.0f));
    o.channels_first_input = true;
    mx::array y = conv2d_nhwc(x, pack_conv_weight_nhwc(w), {}, 40, o, mx::Device::cpu, z);
    EXPECT_TRUE(from_kernel(y)) << target;
    EXPECT_LT(max_abs_diff(y, want), kTolerance) << target;
  });
  EXPECT_GE(targets, 1);
}

// NCHW input: gradients (from the reference, which transposes it) equal the
// NHWC convolution's; a depthwise convolution refuses it.
TEST(ConvNhwcKernel, ChannelsFirstInputGradientsAndRefusals) {
  mx::array x = random_array({2, 3, 6, 7}, 91);  // NCHW
  mx::array w = random_array({5, 3, 3, 3}, 92);
  const mx::array packed = pack_conv_weight_nhwc(w);
  NhwcConvOptions o{.kernel = {3, 3}, .strides = {2, 1}, .pads_begin = {1, 1}, .pads_end = {0, 1}};
  o.channels_first_input = true;
  mx::array weights = random_array({2, 3, 7, 5}, 93);
  mx::array got = mx::vjp(
                      [&](const mx::array& v) {
                        return mx::sum(conv2d_nhwc(v, packed, {}, 5, o, mx::Device::cpu) * weights);
                      },
                      x, mx::array(1.0f))
                      .second;
  NhwcConvOptions nhwc = o;
  nhwc.channels_first_input = false;
  mx::array want = mx::vjp(
                       [&](const mx::array& v) {
                         return mx::sum(expected(mx::transpose(v, {0, 2, 3, 1}), w, {}, nhwc, 1) * weights);
                       },
                       x, mx::array(1.0f))
                       .second;
  ASSERT_EQ(got.shape(), x.shape());
  EXPECT_LT(max_abs_diff(got, want), 1e-5f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.1f);
  EXPECT_THROW(
      depthwise_conv_nhwc(mx::transpose(x, {0, 2, 3, 1}),
                          depthwise_weight_nhwc(random_array({3, 1, 3, 3}, 94)), {}, o, mx::Device::cpu),
      std::invalid_argument);
}

// A residual added before the activation: in the GEMM's epilogue when it has
// the output's shape, broadcast by MLX otherwise; gradients reach it.
TEST(ConvNhwcKernel, ResidualIsAddedBeforeTheActivation) {
  mx::array x = random_array({2, 6, 7, 12}, 71);
  mx::array w = random_array({20, 12, 3, 3}, 72);
  mx::array bias = random_array({20}, 73);
  const NhwcConvOptions o{
      .kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}, .activation = ConvActivation::kRelu};
  NhwcConvOptions linear = o;
  linear.activation = ConvActivation::kNone;
  const mx::array packed = pack_conv_weight_nhwc(w);
  for (const mx::Shape& shape : {mx::Shape{2, 6, 7, 20}, mx::Shape{1, 1, 7, 20}}) {
    mx::array z = random_array(shape, 74);
    mx::array y = conv2d_nhwc(x, packed, bias, 20, o, mx::Device::cpu, z);
    EXPECT_EQ(from_kernel(y), shape == mx::Shape({2, 6, 7, 20}));
    mx::array want = mx::maximum(expected(x, w, bias, linear, 1) + z, mx::array(0.0f));
    ASSERT_EQ(y.shape(), want.shape());
    EXPECT_LT(max_abs_diff(y, want), kTolerance);
    EXPECT_GT(mx::sum(mx::abs(want)).item<float>(), 1.0f);
  }
  // A residual nothing else holds gives the output its buffer (in place, the same values), on both
  // GEMM paths of a pointwise conv (K in one slice and in two).
  const NhwcConvOptions pointwise{.activation = ConvActivation::kRelu};
  for (const int channels : {12, 300}) {
    mx::array xp = random_array({2, 6, 7, channels}, 77);
    mx::array wp = random_array({20, channels, 1, 1}, 78);
    mx::array z0 = random_array({2, 6, 7, 20}, 79);
    mx::array residual = z0 * 2.0f;
    mx::eval(residual);
    const float* residual_data = residual.data<float>();
    mx::array y = conv2d_nhwc(xp, pack_conv_weight_nhwc(wp), bias, 20, pointwise, mx::Device::cpu, residual);
    residual = mx::array(0.0f);  // the conv's input is now its only holder
    mx::eval(y);
    EXPECT_EQ(y.data<float>(), residual_data) << channels;
    mx::array want = mx::maximum(expected(xp, wp, bias, NhwcConvOptions{}, 1) + z0 * 2.0f, mx::array(0.0f));
    // 300 taps deep: outputs up to ~50, rounding differences a few float32 epsilons of that.
    EXPECT_LT(max_abs_diff(y, want), kTolerance + 4e-6f * mx::max(mx::abs(want)).item<float>()) << channels;
  }
  mx::array z = random_array({2, 6, 7, 20}, 75);
  mx::array weights = random_array({2, 6, 7, 20}, 76);
  auto [_, grads] = mx::vjp(
      [&](const std::vector<mx::array>& p) {
        return std::vector<mx::array>{
            mx::sum(conv2d_nhwc(p[0], packed, bias, 20, o, mx::Device::cpu, p[1]) * weights)};
      },
      {x, z}, {mx::array(1.0f)});
  // d/dZ is the weights where the pre-activation is positive.
  mx::array positive = mx::greater(expected(x, w, bias, linear, 1) + z, mx::array(0.0f));
  EXPECT_LT(max_abs_diff(grads[1], mx::where(positive, weights, mx::array(0.0f))), 1e-6f);
}

// Large enough to split across the kernel threads and to unfold in several
// passes of rows: the same values.
TEST(ConvNhwcKernel, ThreadedAndMultiPassMatch) {
  mx::array x = random_array({2, 40, 44, 48}, 31);
  mx::array w = random_array({64, 48, 3, 3}, 32);
  mx::array bias = random_array({64}, 33);
  const NhwcConvOptions o{.kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  // 432 taps deep: outputs up to ~70, rounding differences up to ~1e-4
  // (float32's epsilon times the magnitude of the partial sums).
  mx::array want = expected(x, w, bias, o, 1);
  const float scale = mx::max(mx::abs(want)).item<float>();
  EXPECT_LT(max_abs_diff(conv2d_nhwc(x, pack_conv_weight_nhwc(w), bias, 64, o, mx::Device::cpu), want),
            4e-6f * scale);
  // Unfolded per task (2.4 MB of unfolded rows, 27 KB of weights): stride 2, a residual, a last task
  // of fewer rows.
  mx::array x2 = random_array({3, 61, 59, 24}, 35);
  mx::array w2 = random_array({20, 24, 3, 3}, 36);
  const NhwcConvOptions o2{.kernel = {3, 3},
                           .strides = {2, 2},
                           .pads_begin = {1, 1},
                           .pads_end = {1, 1},
                           .activation = ConvActivation::kRelu};
  NhwcConvOptions linear = o2;
  linear.activation = ConvActivation::kNone;
  mx::array residual = random_array(expected(x2, w2, std::nullopt, linear, 1).shape(), 37);
  mx::array want2 = mx::maximum(expected(x2, w2, std::nullopt, linear, 1) + residual, mx::array(0.0f));
  EXPECT_LT(
      max_abs_diff(
          conv2d_nhwc(x2, pack_conv_weight_nhwc(w2), std::nullopt, 20, o2, mx::Device::cpu, residual), want2),
      4e-6f * mx::max(mx::abs(want2)).item<float>());
  mx::array wd = random_array({48, 1, 3, 3}, 34);
  EXPECT_LT(max_abs_diff(depthwise_conv_nhwc(x, depthwise_weight_nhwc(wd), {}, o, mx::Device::cpu),
                         expected(x, wd, {}, o, 48)),
            kTolerance);
}

// Gradients come from the reference composition (conv_general over the
// unpacked weight): equal to the independent composition's, for x, the
// prepared weight and the bias.
TEST(ConvNhwcKernel, GradientsEqualThoseOfTheComposition) {
  mx::array x = random_array({2, 6, 7, 5}, 41);
  mx::array w = random_array({4, 5, 3, 3}, 42);
  mx::array bias = random_array({4}, 43);
  const NhwcConvOptions o{.kernel = {3, 3},
                          .strides = {2, 1},
                          .pads_begin = {1, 0},
                          .pads_end = {0, 1},
                          .activation = ConvActivation::kHardSwish};
  mx::array weights = random_array(expected(x, w, bias, o, 1).shape(), 44);
  // The packed weight is a function of w; differentiate through the packing
  // of the reference (unpack_gemm_rhs is differentiable) by comparing with
  // the gradient of w itself mapped the same way.
  mx::array packed = pack_conv_weight_nhwc(w);
  auto kernel_loss = [&](const std::vector<mx::array>& p) {
    return std::vector<mx::array>{mx::sum(conv2d_nhwc(p[0], p[1], p[2], 4, o, mx::Device::cpu) * weights)};
  };
  auto reference_loss = [&](const std::vector<mx::array>& p) {
    return std::vector<mx::array>{mx::sum(expected(p[0], p[1], p[2], o, 1) * weights)};
  };
  auto [_, got] = mx::vjp(kernel_loss, {x, packed, bias}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(reference_loss, {x, w, bias}, {mx::array(1.0f)});
  EXPECT_LT(max_abs_diff(got[0], want[0]), 1e-4f);
  EXPECT_LT(max_abs_diff(got[2], want[2]), 1e-4f);
  // d/d(packed) is d/dw in the packed layout.
  EXPECT_LT(max_abs_diff(got[1], pack_conv_weight_nhwc(want[1])), 1e-4f);

  mx::array wd = random_array({5, 1, 3, 3}, 45);
  mx::array bd = random_array({5}, 46);
  mx::array weights_d = random_array(expected(x, wd, bd, o, 5).shape(), 47);
  auto [___, got_d] = mx::vjp(
      [&](const std::vector<mx::array>& p) {
        return std::vector<mx::array>{
            mx::sum(depthwise_conv_nhwc(p[0], p[1], p[2], o, mx::Device::cpu) * weights_d)};
      },
      {x, depthwise_weight_nhwc(wd), bd}, {mx::array(1.0f)});
  auto [____, want_d] = mx::vjp(
      [&](const std::vector<mx::array>& p) {
        return std::vector<mx::array>{mx::sum(expected(p[0], p[1], p[2], o, 5) * weights_d)};
      },
      {x, wd, bd}, {mx::array(1.0f)});
  EXPECT_LT(max_abs_diff(got_d[0], want_d[0]), 1e-4f);
  EXPECT_LT(max_abs_diff(got_d[1], depthwise_weight_nhwc(want_d[1])), 1e-4f);
  EXPECT_LT(max_abs_diff(got_d[2], want_d[2]), 1e-4f);
}

TEST(ConvNhwcKernel, SpatialMeanMatchesMlxMean) {
  for (const mx::Shape& shape : {mx::Shape{3, 5, 7, 13}, mx::Shape{1, 1, 1, 40}, mx::Shape{2, 14, 14, 96}}) {
    mx::array x = random_array(shape, 81);
    mx::array y = spatial_mean_nhwc(x, mx::Device::cpu);
    EXPECT_TRUE(y.has_primitive() && std::string(y.primitive().name()) == "transmuter::SpatialMeanNhwc");
    mx::array want = mx::mean(x, {1, 2}, true);
    ASSERT_EQ(y.shape(), want.shape());
    EXPECT_LT(max_abs_diff(y, want), 1e-6f);
  }
  mx::array x = random_array({2, 3, 4, 5}, 82);
  mx::array weights = random_array({2, 1, 1, 5}, 83);
  auto [_, grads] = mx::vjp(
      [&](const std::vector<mx::array>& p) {
        return std::vector<mx::array>{mx::sum(spatial_mean_nhwc(p[0], mx::Device::cpu) * weights)};
      },
      {x}, {mx::array(1.0f)});
  EXPECT_LT(max_abs_diff(grads[0], mx::broadcast_to(weights / 12.0f, {2, 3, 4, 5})), 1e-6f);
}

TEST(ConvNhwcKernel, RunsInsideCompile) {
  mx::array x = random_array({1, 10, 12, 8}, 51);
  mx::array w = random_array({12, 8, 3, 3}, 52);
  const NhwcConvOptions o{.kernel = {3, 3}, .strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  mx::array packed = pack_conv_weight_nhwc(w);
  auto f = mx::compile([o](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        conv2d_nhwc(mx::multiply(in[0], mx::array(2.0f)), in[1], {}, 12, o, mx::Device::cpu)};
  });
  EXPECT_LT(max_abs_diff(f({x, packed})[0], expected(x * 2.0f, w, {}, o, 1)), kTolerance);
}

TEST(ConvNhwcKernel, MismatchedArgumentsAreRefused) {
  mx::array x = random_array({1, 5, 5, 4}, 61);
  mx::array packed = pack_conv_weight_nhwc(random_array({6, 4, 3, 3}, 62));
  const NhwcConvOptions o{.kernel = {3, 3}};
  auto message = [](auto f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // A window of another depth than the packed weight's.
  EXPECT_NE(message([&] {
              conv2d_nhwc(random_array({1, 5, 5, 3}, 63), packed, {}, 6, o);
            }).find("does not match 6 output channels over a window of 27 values"),
            std::string::npos);
  EXPECT_NE(
      message([&] { conv2d_nhwc(x, packed, random_array({5}, 64), 6, o); }).find("bias must be float32 [6]"),
      std::string::npos);
  const NhwcConvOptions too_big{.kernel = {7, 7}};
  EXPECT_NE(message([&] {
              depthwise_conv_nhwc(x, random_array({7, 7, 4}, 65), {}, too_big);
            }).find("window does not fit the input"),
            std::string::npos);
  EXPECT_NE(message([&] {
              depthwise_conv_nhwc(x, random_array({3, 3, 5}, 66), {}, o);
            }).find("depthwise weight must be float32 [3, 3, 4]"),
            std::string::npos);
  const NhwcConvOptions zero_stride{.kernel = {3, 3}, .strides = {0, 1}};
  EXPECT_NE(message([&] { conv2d_nhwc(x, packed, {}, 6, zero_stride); }).find("positive kernel, strides"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter::kernels
