// The Winograd F(2x2, 3x3) convolution kernel against mx::conv_general written
// out here: odd and even output sizes (tiles hanging over the last row and
// column), pads from 0 to 2 and asymmetric, channel counts that are no
// multiple of the SIMD width, batches, bias, residual and activations, enough
// tiles to split across threads and panels; the weight recovered exactly from
// its transform; gradients; mx::compile; argument checks.
#include "kernels/cpu/winograd_conv.h"
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cpu/conv_nhwc.h"
#include "support/conv_reference.h"
#include "support/expect_error.h"
#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

bool from_kernel(const mx::array& y) {
  return y.has_primitive() && std::string(y.primitive().name()) == "transmuter::WinogradConvNhwc";
}

// x [N, H, W, C], w in ONNX's layout [M, C, 3, 3].
mx::array expected(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                   const NhwcConvOptions& o, const std::optional<mx::array>& residual = std::nullopt) {
  mx::array y =
      mx::conv_general(x, mx::transpose(w, {0, 2, 3, 1}), {1, 1}, {o.pads_begin[0], o.pads_begin[1]},
                       {o.pads_end[0], o.pads_end[1]}, {1, 1}, {}, 1, false);
  if (bias) y = y + *bias;
  if (residual) y = y + *residual;
  return testing::apply_activation(y, o.activation, o.clip_min, o.clip_max);
}

mx::array transformed(const mx::array& w) {
  return winograd_weight_from_packed(pack_conv_weight_nhwc(w), w.shape(1));
}

struct Case {
  int batch, channels, out_channels, height, width;
  std::array<int, 2> pads_begin, pads_end;
  bool bias;
  ConvActivation activation = ConvActivation::kNone;

  NhwcConvOptions options() const {
    return {.kernel = {3, 3},
            .pads_begin = pads_begin,
            .pads_end = pads_end,
            .activation = activation,
            .clip_min = -0.25f,
            .clip_max = 0.75f};
  }
};

// The transforms add up to 16 transformed products per output where the direct sum has 9 * C: a
// few more float32 roundings (epsilon 6e-8) of values the size of the sums before the activation.
// With unit-scale inputs those reach ~sqrt(9 C); a misplaced tile, tap or channel moves an output by
// ~0.1 or more.
float tolerance(const mx::array& before_activation) {
  return 2e-6f * std::max(1.0f, mx::max(mx::abs(before_activation)).item<float>());
}

TEST(WinogradConvKernel, MatchesTheConvolution) {
  const std::vector<Case> cases = {
      {1, 8, 16, 6, 6, {1, 1}, {1, 1}, true, ConvActivation::kRelu},        // whole tiles
      {2, 5, 3, 7, 9, {1, 1}, {1, 1}, false},                               // odd sizes: tiles hang over
      {1, 19, 40, 5, 8, {0, 0}, {0, 0}, true, ConvActivation::kClip},       // no padding: 3x6 outputs
      {1, 16, 33, 9, 4, {2, 1}, {0, 2}, true, ConvActivation::kHardSwish},  // asymmetric pads
      {3, 64, 70, 14, 14, {1, 1}, {1, 1}, true},  // several tiles per task and panels
      {1, 6, 8, 1, 1, {1, 1}, {1, 1}, true},      // one output, mostly padding
  };
  for (const Case& c : cases) {
    mx::array x = random_array({c.batch, c.height, c.width, c.channels}, 11);
    mx::array w = random_array({c.out_channels, c.channels, 3, 3}, 12);
    std::optional<mx::array> bias;
    if (c.bias) bias = random_array({c.out_channels}, 13);
    const NhwcConvOptions o = c.options();
    mx::array y = winograd_conv_nhwc(x, transformed(w), bias, c.out_channels, o, mx::Device::cpu);
    EXPECT_TRUE(from_kernel(y));
    mx::array want = expected(x, w, bias, o);
    NhwcConvOptions linear = o;
    linear.activation = ConvActivation::kNone;
    ASSERT_EQ(y.shape(), want.shape()) << c.channels << " -> " << c.out_channels;
    EXPECT_LT(max_abs_diff(y, want), tolerance(expected(x, w, bias, linear)))
        << c.channels << " -> " << c.out_channels;
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);  // not vacuous
  }
}

// Large enough to split the tiles of one image across tasks (a ResNet stage's 56x56 x 64), and
// few tiles with wide weights (7x7 x 256: tasks split the output panels; at batch 1 its 16 tiles are one
// block, 12 + 4 rows).
TEST(WinogradConvKernel, ThreadedBlocksMatch) {
  struct Case {
    int batch, size, channels;
  };
  for (const auto& [batch, size, channels] : {Case{2, 56, 64}, Case{2, 7, 256}, Case{1, 7, 256}}) {
    mx::array x = random_array({batch, size, size, channels}, 21);
    mx::array w = random_array({channels, channels, 3, 3}, 22, 1.0f / 16.0f);
    mx::array bias = random_array({channels}, 23);
    const NhwcConvOptions o{.kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
    mx::array want = expected(x, w, bias, o);
    EXPECT_LT(max_abs_diff(winograd_conv_nhwc(x, transformed(w), bias, channels, o, mx::Device::cpu), want),
              tolerance(want))
        << batch << "x" << size;
  }
}

TEST(WinogradConvKernel, ResidualIsAddedBeforeTheActivation) {
  mx::array x = random_array({2, 6, 7, 12}, 71);
  mx::array w = random_array({20, 12, 3, 3}, 72);
  mx::array bias = random_array({20}, 73);
  const NhwcConvOptions o{
      .kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}, .activation = ConvActivation::kRelu};
  for (const mx::Shape& shape : {mx::Shape{2, 6, 7, 20}, mx::Shape{1, 1, 7, 20}}) {
    mx::array z = random_array(shape, 74);
    mx::array y = winograd_conv_nhwc(x, transformed(w), bias, 20, o, mx::Device::cpu, z);
    EXPECT_EQ(from_kernel(y), shape == mx::Shape({2, 6, 7, 20}));  // a broadcast residual is MLX's add
    mx::array want = expected(x, w, bias, o, z);
    ASSERT_EQ(y.shape(), want.shape());
    EXPECT_LT(max_abs_diff(y, want), tolerance(want));
  }
  // A residual nothing else holds gives the output its buffer: the same values, in place.
  mx::array z0 = random_array({2, 6, 7, 20}, 75);
  mx::array residual = z0 * 2.0f;
  mx::eval(residual);
  const float* residual_data = residual.data<float>();
  mx::array y = winograd_conv_nhwc(x, transformed(w), bias, 20, o, mx::Device::cpu, residual);
  residual = mx::array(0.0f);
  mx::eval(y);
  EXPECT_EQ(y.data<float>(), residual_data);
  mx::array want = expected(x, w, bias, o, z0 * 2.0f);
  EXPECT_LT(max_abs_diff(y, want), tolerance(want));
}

// g = L U L^T recovers the 3x3 weight from its transform: the reference (gradients, other devices)
// convolves with the weight the model had.
TEST(WinogradConvKernel, TheWeightIsRecoveredFromItsTransform) {
  for (const auto& [m, c] : {std::pair{5, 7}, std::pair{40, 64}}) {
    mx::array w = random_array({m, c, 3, 3}, 31);
    mx::array hwcm = winograd_weight_to_hwcm(transformed(w), m);  // [3, 3, C, M]
    EXPECT_LT(max_abs_diff(hwcm, mx::transpose(w, {2, 3, 1, 0})), 1e-6f) << m;
  }
}

TEST(WinogradConvKernel, TheTransformFromTheFiltersEqualsTheOneFromThePackedWeight) {
  // Output channels that fill no whole panel, one panel and a half, several panels.
  for (int64_t out_channels : {int64_t{5}, gemm_panel_width() * 3 / 2, 2 * gemm_panel_width() + 3}) {
    const mx::array w =
        random_array({static_cast<int>(out_channels), 7, 3, 3}, 70 + static_cast<int>(out_channels));
    const mx::array from_filters = winograd_weight_from_filters(w);
    const mx::array from_packed = transformed(w);
    ASSERT_EQ(from_filters.shape(), from_packed.shape()) << out_channels;
    EXPECT_TRUE(mx::array_equal(from_filters, from_packed).item<bool>())
        << out_channels << " output channels";
  }
  const std::string message = testing::error_of<std::invalid_argument>(
      [] { winograd_weight_from_filters(random_array({6, 4, 1, 1}, 71)); });
  EXPECT_NE(message.find("3x3 weight [M, C, 3, 3]"), std::string::npos) << message;
}

TEST(WinogradConvKernel, GradientsEqualThoseOfTheComposition) {
  mx::array x = random_array({2, 6, 7, 5}, 41);
  mx::array w = random_array({4, 5, 3, 3}, 42);
  mx::array bias = random_array({4}, 43);
  mx::array z = random_array({2, 6, 7, 4}, 44);
  const NhwcConvOptions o{
      .kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}, .activation = ConvActivation::kHardSwish};
  mx::array weights = random_array({2, 6, 7, 4}, 45);
  mx::array u = transformed(w);
  auto [_, got] = mx::vjp(
      [&](const std::vector<mx::array>& p) {
        return std::vector<mx::array>{
            mx::sum(winograd_conv_nhwc(p[0], u, p[1], 4, o, mx::Device::cpu, p[2]) * weights)};
      },
      {x, bias, z}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(
      [&](const std::vector<mx::array>& p) {
        return std::vector<mx::array>{mx::sum(expected(p[0], w, p[1], o, p[2]) * weights)};
      },
      {x, bias, z}, {mx::array(1.0f)});
  for (size_t i = 0; i < got.size(); ++i) EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-4f) << i;
  EXPECT_GT(mx::max(mx::abs(want[0])).item<float>(), 0.1f);
}

TEST(WinogradConvKernel, RunsInsideCompile) {
  mx::array x = random_array({1, 10, 12, 8}, 51);
  mx::array w = random_array({12, 8, 3, 3}, 52);
  const NhwcConvOptions o{.kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  auto f = mx::compile([o](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        winograd_conv_nhwc(mx::multiply(in[0], mx::array(2.0f)), in[1], {}, 12, o, mx::Device::cpu)};
  });
  mx::array want = expected(x * 2.0f, w, {}, o);
  EXPECT_LT(max_abs_diff(f({x, transformed(w)})[0], want), tolerance(want));
}

TEST(WinogradConvKernel, MismatchedArgumentsAreRefused) {
  mx::array x = random_array({1, 5, 5, 4}, 61);
  mx::array u = transformed(random_array({6, 4, 3, 3}, 62));
  const NhwcConvOptions o{.kernel = {3, 3}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  NhwcConvOptions strided = o;
  strided.strides = {2, 2};
  const std::pair<std::function<void()>, std::string> cases[] = {
      {[&] { winograd_conv_nhwc(random_array({1, 5, 5, 3}, 63), u, {}, 6, o); },
       "does not match 6 output channels over 3 input channels"},
      {[&] { winograd_conv_nhwc(x, u, random_array({5}, 64), 6, o); }, "bias must be float32 [6]"},
      {[&] { winograd_conv_nhwc(x, u, {}, 6, strided); }, "3x3 kernel, stride 1"},
      {[&] { winograd_conv_nhwc(random_array({1, 1, 1, 4}, 65), u, {}, 6, {.kernel = {3, 3}}); },
       "window does not fit the input"},
      {[&] { winograd_weight_from_packed(pack_conv_weight_nhwc(random_array({6, 4, 1, 1}, 66)), 4); },
       "expected a packed 3x3 weight"},
  };
  for (const auto& [call, expected_message] : cases) {
    const std::string message = testing::error_of<std::invalid_argument>(call);
    EXPECT_NE(message.find(expected_message), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace transmuter::kernels
