// The fused depthwise block (1x1 expand -> depthwise -> 1x1 project + residual)
// against the three convolutions written out with mx::conv_general: with and
// without each 1x1 stage, strides, dilations, asymmetric pads, channel counts
// that are no multiple of the SIMD width, batches, images that stream through
// the fused kernel (strips, the expanded-row window), batches of small ones,
// and a single small image that runs as separate kernels; gradients;
// mx::compile; argument checks.
#include "kernels/cpu/depthwise_block.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include <stdexcept>
#include <string>

#include "kernels/cpu/thread_pool.h"
#include "support/conv_reference.h"
#include "support/expect_error.h"
#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// Three convolutions in another summation order than MLX's (bias first, K in
// slices): a few float32 ulps per output over at most a few hundred taps per
// stage; a wrong row, tap or channel moves outputs by ~0.1.
constexpr float kTolerance = 5e-5f;

// x [N, H, W, C], w in ONNX's layout [M, C / groups, kH, kW].
mx::array conv(const mx::array& x, const mx::array& w, const mx::array& bias, const NhwcConvOptions& o,
               int groups) {
  mx::array y = mx::conv_general(x, mx::transpose(w, {0, 2, 3, 1}), {o.strides[0], o.strides[1]},
                                 {o.pads_begin[0], o.pads_begin[1]}, {o.pads_end[0], o.pads_end[1]},
                                 {o.dilations[0], o.dilations[1]}, {}, groups, false);
  return y + bias;
}

NhwcConvOptions pointwise(ConvActivation activation) {
  NhwcConvOptions o;
  o.activation = activation;
  o.clip_min = 0.0f;
  o.clip_max = 6.0f;
  return o;
}

struct Case {
  int batch, in_channels, channels, out_channels, height, width, kernel;
  std::array<int, 2> strides, dilations, pads_begin, pads_end;
  bool expand, project, residual;

  std::string describe() const {
    return "x [" + std::to_string(batch) + "," + std::to_string(height) + "," + std::to_string(width) + "," +
           std::to_string(in_channels) + "] -> " + std::to_string(channels) + " -> " +
           std::to_string(out_channels) + ", kernel " + std::to_string(kernel) + ", stride " +
           std::to_string(strides[0]) + ", expand " + std::to_string(expand) + ", project " +
           std::to_string(project) + ", residual " + std::to_string(residual);
  }
};

// Runs one case through depthwise_block_nhwc and through conv_general; returns the
// kernel primitive's name (or "" when the block ran as separate kernels).
std::string check_case(const Case& c, int seed) {
  SCOPED_TRACE(c.describe());
  const int channels = c.expand ? c.channels : c.in_channels;
  mx::array x = random_array({c.batch, c.height, c.width, c.in_channels}, seed);
  mx::array we = random_array({channels, c.in_channels, 1, 1}, seed + 1) * 0.5f;
  mx::array be = random_array({channels}, seed + 2);
  mx::array wd = random_array({channels, 1, c.kernel, c.kernel}, seed + 3) * 0.5f;
  mx::array bd = random_array({channels}, seed + 4);
  mx::array wp = random_array({c.out_channels, channels, 1, 1}, seed + 5) * 0.3f;
  mx::array bp = random_array({c.out_channels}, seed + 6);
  const NhwcConvOptions dw{.kernel = {c.kernel, c.kernel},
                           .strides = c.strides,
                           .pads_begin = c.pads_begin,
                           .pads_end = c.pads_end,
                           .dilations = c.dilations,
                           .activation = ConvActivation::kHardSwish};
  const NhwcConvOptions e = pointwise(ConvActivation::kClip), p = pointwise(ConvActivation::kNone);

  mx::array want = x;
  if (c.expand) want = testing::apply_activation(conv(want, we, be, e, 1), e.activation, 0.0f, 6.0f);
  want = testing::apply_activation(conv(want, wd, bd, dw, channels), dw.activation, 0.0f, 6.0f);
  std::optional<mx::array> residual;
  if (c.project) {
    want = conv(want, wp, bp, p, 1);
    if (c.residual) {
      residual = random_array(want.shape(), seed + 7);
      want = want + *residual;
    }
  }
  std::optional<PointwiseStage> expand, project;
  if (c.expand) expand = PointwiseStage{pack_conv_weight_nhwc(we), be, channels, e};
  if (c.project) project = PointwiseStage{pack_conv_weight_nhwc(wp), bp, c.out_channels, p};
  mx::array got =
      depthwise_block_nhwc(x, expand, depthwise_weight_nhwc(wd), bd, dw, project, residual, mx::Device::cpu);
  const std::string name = got.has_primitive() ? got.primitive().name() : "";
  EXPECT_EQ(got.shape(), want.shape());
  EXPECT_LT(max_abs_diff(got, want), kTolerance);
  return name == "transmuter::DepthwiseBlockNhwc" ? name : "";
}

TEST(DepthwiseBlockKernel, MatchesTheThreeConvolutions) {
  // Images of 48 x 48 x 64 channels (576 KiB) stream through the fused kernel.
  const std::vector<Case> streamed = {
      // MobileNetV2's inverted residual: expand, 3x3, project + shortcut.
      {1, 24, 64, 24, 48, 48, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true, true, true},
      // Its stride-2 block, odd sizes, channels past the last full vector.
      {2, 13, 72, 19, 49, 47, 3, {2, 2}, {1, 1}, {1, 1}, {1, 1}, true, true, false},
      // 5x5, dilation 2, asymmetric pads, no project (the depthwise output is the block's).
      {2, 16, 68, 0, 50, 45, 5, {1, 2}, {2, 1}, {3, 2}, {1, 4}, true, false, false},
      // Depthwise + pointwise (PP-LCNet): no expand.
      {3, 64, 64, 40, 48, 48, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, false, true, false},
      {1, 72, 72, 8, 50, 50, 3, {2, 2}, {1, 1}, {0, 0}, {1, 1}, false, true, false},
  };
  int seed = 100;
  for (const Case& c : streamed)
    EXPECT_EQ(check_case(c, seed += 10), "transmuter::DepthwiseBlockNhwc") << c.describe();
  // Small images in a batch stream too (one strip per image), down to images the kernel covers at once;
  // a single 14x14 image in strips two halos tall (the expanded rows they share are computed twice).
  const std::vector<Case> batched = {
      {1, 8, 24, 8, 14, 14, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true, true, true},
      {2, 8, 24, 8, 9, 11, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true, true, true},
      {4, 5, 20, 6, 3, 4, 3, {2, 1}, {1, 1}, {1, 1}, {1, 1}, true, true, false},
      {3, 16, 16, 12, 2, 2, 5, {1, 1}, {1, 1}, {2, 2}, {2, 2}, false, true, false},
  };
  for (const Case& c : batched)
    EXPECT_EQ(check_case(c, seed += 10), "transmuter::DepthwiseBlockNhwc") << c.describe();
  // A single small image is one strip: with more threads than that it runs as the separate kernels,
  // which split each product across them. The same results either way.
  const Case single = {1, 16, 16, 12, 7, 7, 3, {2, 2}, {1, 1}, {1, 1}, {1, 1}, false, true, false};
  EXPECT_EQ(check_case(single, seed += 10), kernel_threads() > 1 ? "" : "transmuter::DepthwiseBlockNhwc");
}

TEST(DepthwiseBlockKernel, GradientsEqualThoseOfTheComposition) {
  mx::array x = random_array({1, 48, 48, 8}, 201);
  mx::array we = random_array({64, 8, 1, 1}, 202);
  mx::array wd = random_array({64, 1, 3, 3}, 203);
  mx::array bd = random_array({64}, 204);
  mx::array wp = random_array({8, 64, 1, 1}, 205);
  const NhwcConvOptions dw{.kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  const NhwcConvOptions relu = pointwise(ConvActivation::kRelu), none = pointwise(ConvActivation::kNone);
  mx::array weights = random_array({1, 48, 48, 8}, 206);
  auto fused_loss = [&](const std::vector<mx::array>& p) {
    mx::array y =
        depthwise_block_nhwc(p[0], PointwiseStage{p[1], std::nullopt, 64, relu}, p[2], p[3], dw,
                             PointwiseStage{p[4], std::nullopt, 8, none}, std::nullopt, mx::Device::cpu);
    EXPECT_EQ(y.primitive().name(), std::string("transmuter::DepthwiseBlockNhwc"));
    return std::vector<mx::array>{mx::sum(y * weights)};
  };
  auto separate_loss = [&](const std::vector<mx::array>& p) {
    mx::array e = conv2d_nhwc(p[0], p[1], std::nullopt, 64, relu, mx::Device::cpu);
    mx::array d = depthwise_conv_nhwc(e, p[2], p[3], dw, mx::Device::cpu);
    return std::vector<mx::array>{
        mx::sum(conv2d_nhwc(d, p[4], std::nullopt, 8, none, mx::Device::cpu) * weights)};
  };
  const std::vector<mx::array> primals = {x, pack_conv_weight_nhwc(we), depthwise_weight_nhwc(wd), bd,
                                          pack_conv_weight_nhwc(wp)};
  auto [_, got] = mx::vjp(fused_loss, primals, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(separate_loss, primals, {mx::array(1.0f)});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_GT(mx::max(mx::abs(want[i])).item<float>(), 0.0f) << "input " << i;
    EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-3f) << "input " << i;
  }
}

TEST(DepthwiseBlockKernel, RunsInsideCompile) {
  mx::array x = random_array({1, 48, 48, 64}, 301);
  mx::array wd = depthwise_weight_nhwc(random_array({64, 1, 3, 3}, 302));
  const PointwiseStage project{pack_conv_weight_nhwc(random_array({16, 64, 1, 1}, 303)), std::nullopt, 16,
                               pointwise(ConvActivation::kNone)};
  const NhwcConvOptions dw{.kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  auto f = [&](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{depthwise_block_nhwc(in[0], std::nullopt, wd, std::nullopt, dw, project,
                                                       std::nullopt, mx::Device::cpu)};
  };
  mx::array eager = f({x})[0];
  mx::array compiled = mx::compile(f)({x})[0];
  EXPECT_LT(max_abs_diff(eager, compiled), 1e-6f);
}

TEST(DepthwiseBlockKernel, MismatchedArgumentsAreRefused) {
  mx::array x = random_array({1, 8, 8, 4}, 401);
  mx::array wd = depthwise_weight_nhwc(random_array({4, 1, 3, 3}, 402));
  const NhwcConvOptions dw{.kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  const PointwiseStage project{pack_conv_weight_nhwc(random_array({6, 4, 1, 1}, 403)), std::nullopt, 6,
                               pointwise(ConvActivation::kNone)};
  auto message = [](auto f) { return testing::error_of<std::invalid_argument>(f); };
  EXPECT_NE(message([&] {
              depthwise_block_nhwc(x, std::nullopt, wd, std::nullopt, dw, std::nullopt,
                                   random_array({1, 8, 8, 4}, 404));
            }).find("a residual needs the project stage"),
            std::string::npos);
  PointwiseStage wide = project;
  wide.options.kernel = {3, 3};
  EXPECT_NE(message([&] {
              depthwise_block_nhwc(x, std::nullopt, wd, std::nullopt, dw, wide, std::nullopt);
            }).find("the project stage must be a 1x1 convolution"),
            std::string::npos);
  // An expand weight for 5 input channels on a 4-channel x.
  const PointwiseStage expand{pack_conv_weight_nhwc(random_array({4, 5, 1, 1}, 405)), std::nullopt, 4,
                              pointwise(ConvActivation::kNone)};
  EXPECT_NE(message([&] {
              depthwise_block_nhwc(x, expand, wd, std::nullopt, dw, project, std::nullopt);
            }).find("does not match 4 output channels over a window of 4 values"),
            std::string::npos);
  // A depthwise weight for 5 channels after a 4-channel stage.
  EXPECT_NE(message([&] {
              depthwise_block_nhwc(x, std::nullopt, depthwise_weight_nhwc(random_array({5, 1, 3, 3}, 406)),
                                   std::nullopt, dw, project, std::nullopt);
            }).find("depthwise weight must be float32 [3, 3, 4]"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter::kernels
