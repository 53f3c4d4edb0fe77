// The group-1 2-D convolution kernel against the MLX composition it replaces:
// outputs over kernel sizes 1/3/5/7, strides, dilations, asymmetric pads,
// batches, bias and activations; gradients; mx::compile; the cases it hands
// back to the composition; the unfold size it reports.
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include <string>

#include "support/conv_reference.h"

namespace transmuter::kernels {
namespace {

// The kernel's GEMM (OpenBLAS) sums the C * kH * kW products of each output
// in another order than MLX's convolution, and starts from the bias. With
// unit-scale inputs and at most ~200 products (|sum| ~ 15) the float32
// rounding differences stay below ~1e-5; 1e-4 leaves room without hiding a
// wrong tap (which moves a result by ~1).
constexpr float kTolerance = 1e-4f;

mx::array random_array(const mx::Shape& shape, uint64_t seed) {
  return mx::random::normal(shape, mx::float32, 0, 1, mx::random::key(seed));
}

bool from_kernel(const mx::array& y) {
  return y.has_primitive() && std::string(y.primitive().name()) == "transmuter::Conv2d";
}

float max_abs_diff(const mx::array& a, const mx::array& b) {
  return mx::max(mx::abs(mx::subtract(a, b))).item<float>();
}

// The expected result written out independently of the kernel's reference.
mx::array expected(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                   const Conv2dOptions& o) {
  mx::array y = mx::conv_general(mx::transpose(x, {0, 2, 3, 1}), mx::transpose(w, {0, 2, 3, 1}), o.strides,
                                 o.pads_begin, o.pads_end, o.dilations, {}, 1, false);
  y = mx::transpose(y, {0, 3, 1, 2});
  if (bias) y = y + mx::reshape(*bias, {-1, 1, 1});
  return testing::apply_activation(y, o.activation, o.clip_min, o.clip_max);
}

struct Case {
  int batch, channels, out_channels, height, width, kernel_h, kernel_w;
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
  return "x [" + list({c.batch, c.channels, c.height, c.width}) + "] M " + std::to_string(c.out_channels) +
         " kernel " + list({c.kernel_h, c.kernel_w}) + " strides " + list(c.strides) + " dilations " +
         list(c.dilations) + " pads " + list(c.pads_begin) + list(c.pads_end) + " bias " +
         std::to_string(c.bias) + " activation " + std::to_string(static_cast<int>(c.activation));
}

TEST(Conv2dKernel, MatchesTheComposition) {
  using A = ConvActivation;
  const std::vector<Case> cases = {
      {1, 3, 5, 5, 7, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},
      {2, 4, 6, 9, 33, 3, 3, {2, 2}, {1, 1}, {1, 1}, {1, 1}, false, A::kRelu},
      {1, 3, 8, 12, 17, 5, 5, {1, 1}, {1, 1}, {2, 2}, {2, 2}, true, A::kHardSwish},
      {3, 2, 4, 11, 40, 5, 5, {2, 2}, {1, 1}, {2, 2}, {2, 2}, true, A::kRelu},
      {1, 3, 7, 30, 29, 7, 7, {2, 2}, {1, 1}, {3, 3}, {3, 3}, true},  // ResNet's stem, small
      {2, 6, 9, 6, 10, 1, 1, {1, 1}, {1, 1}, {0, 0}, {0, 0}, true, A::kClip},  // pointwise: no unfold
      {2, 6, 9, 6, 10, 1, 1, {1, 1}, {1, 1}, {0, 0}, {0, 0}, false},
      {1, 8, 4, 14, 14, 1, 1, {2, 2}, {1, 1}, {0, 0}, {0, 0}, true},  // ResNet's strided shortcut
      {1, 4, 3, 6, 6, 1, 1, {1, 1}, {1, 1}, {0, 1}, {2, 0}, true},    // padded 1x1
      {2, 3, 5, 10, 23, 3, 3, {1, 2}, {2, 3}, {0, 1}, {2, 0}, true},  // asymmetric everything
      {1, 4, 2, 8, 1, 3, 3, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},
      {1, 2, 3, 1, 100, 1, 5, {1, 3}, {1, 2}, {0, 4}, {0, 1}, false},
      {1, 2, 3, 5, 5, 3, 3, {2, 2}, {3, 3}, {4, 5}, {6, 7}, true},  // pads past the input
      {1, 2, 2, 9, 9, 3, 3, {3, 3}, {1, 1}, {0, 0}, {0, 0}, true, A::kClip},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    mx::array x = random_array({c.batch, c.channels, c.height, c.width}, seed++);
    mx::array w = random_array({c.out_channels, c.channels, c.kernel_h, c.kernel_w}, seed++);
    std::optional<mx::array> bias;
    if (c.bias) bias = random_array({c.out_channels}, seed++);
    Conv2dOptions o{.strides = c.strides,
                    .pads_begin = c.pads_begin,
                    .pads_end = c.pads_end,
                    .dilations = c.dilations,
                    .activation = c.activation};
    if (c.activation == ConvActivation::kClip) o.clip_min = -0.5f, o.clip_max = 0.75f;
    mx::array got = conv2d(x, w, bias, o, mx::Device::cpu);
    mx::array want = expected(x, w, bias, o);
    EXPECT_TRUE(from_kernel(got)) << describe(c);
    ASSERT_EQ(got.shape(), want.shape()) << describe(c);
    EXPECT_LT(max_abs_diff(got, want), kTolerance) << describe(c);
  }
}

TEST(Conv2dKernel, TakesTransposedInput) {
  mx::array x = mx::transpose(random_array({2, 10, 12, 8}, 61), {0, 3, 1, 2});  // [2, 8, 10, 12]
  mx::array w = random_array({5, 8, 3, 3}, 62);
  Conv2dOptions o{.pads_begin = {1, 1}, .pads_end = {1, 1}};
  EXPECT_LT(max_abs_diff(conv2d(x, w, {}, o, mx::Device::cpu), expected(x, w, {}, o)), kTolerance);
}

TEST(Conv2dKernel, GradientsEqualThoseOfTheComposition) {
  mx::array x = random_array({2, 3, 9, 11}, 71);
  mx::array w = random_array({4, 3, 3, 3}, 72);
  mx::array bias = random_array({4}, 73);
  Conv2dOptions o{.strides = {2, 1},
                  .pads_begin = {1, 0},
                  .pads_end = {0, 2},
                  .dilations = {1, 2},
                  .activation = ConvActivation::kHardSwish};
  mx::array weights = random_array(expected(x, w, bias, o).shape(), 74);
  auto loss_of = [&](bool kernel) {
    return [&, kernel](const std::vector<mx::array>& p) {
      mx::array y = kernel ? conv2d(p[0], p[1], p[2], o, mx::Device::cpu) : expected(p[0], p[1], p[2], o);
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

TEST(Conv2dKernel, RunsInsideCompile) {
  mx::array x = random_array({2, 5, 14, 21}, 81);
  mx::array w = random_array({6, 5, 5, 5}, 82);
  mx::array bias = random_array({6}, 83);
  Conv2dOptions o{.strides = {2, 2}, .pads_begin = {2, 2}, .pads_end = {2, 2}, .activation = ConvActivation::kRelu};
  auto f = mx::compile([o](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{conv2d(mx::multiply(in[0], mx::array(2.0f)), in[1], in[2], o, mx::Device::cpu)};
  });
  for (int call = 0; call < 2; ++call) {  // the second call replays the compiled graph
    mx::array got = f({x, w, bias})[0];
    EXPECT_LT(max_abs_diff(got, expected(x * 2.0f, w, bias, o)), 2 * kTolerance);
  }
}

TEST(Conv2dKernel, OtherDtypesGroupingsAndWindowsUseTheComposition) {
  mx::array x = random_array({1, 4, 7, 9}, 91);
  mx::array w = random_array({3, 4, 3, 3}, 92);
  Conv2dOptions o{.pads_begin = {1, 1}, .pads_end = {1, 1}};
  mx::array half = conv2d(mx::astype(x, mx::float16), mx::astype(w, mx::float16), {}, o, mx::Device::cpu);
  EXPECT_FALSE(from_kernel(half));
  EXPECT_EQ(half.dtype(), mx::float16);
  // float16 keeps ~3 significant digits; sums of 36 unit-scale products stay within 5e-2.
  EXPECT_LT(max_abs_diff(mx::astype(half, mx::float32), expected(x, w, {}, o)), 5e-2f);

  // Weight channels != input channels (a grouped weight): the composition's error.
  mx::array w2 = random_array({6, 2, 3, 3}, 93);
  EXPECT_THROW(conv2d(x, w2, {}, o, mx::Device::cpu), std::invalid_argument);

  // A window larger than the padded input: the composition's error.
  mx::array w7 = random_array({2, 4, 9, 9}, 94);
  EXPECT_THROW(conv2d(x, w7, {}, {}, mx::Device::cpu), std::invalid_argument);

  // A float16 bias with float32 operands: the composition (type promotion).
  mx::array b16 = mx::astype(random_array({3}, 95), mx::float16);
  mx::array mixed = conv2d(x, w, b16, o, mx::Device::cpu);
  EXPECT_FALSE(from_kernel(mixed));
  EXPECT_LT(max_abs_diff(mixed, expected(x, w, b16, o)), kTolerance);
}

TEST(Conv2dKernel, ReportsThePanelBufferOfOneImage) {
  // C * kH * kW rows of the output positions rounded up to the panel width.
  const size_t width = static_cast<size_t>(gemm_panel_width());
  auto padded = [&](size_t positions) { return (positions + width - 1) / width * width; };
  mx::array x = random_array({4, 8, 10, 12}, 101);
  mx::array w = random_array({5, 8, 3, 3}, 102);
  Conv2dOptions o{.pads_begin = {1, 1}, .pads_end = {1, 1}};
  EXPECT_EQ(conv2d_unfold_bytes(x, w, o), 8 * 9 * padded(10 * 12) * 4);
  mx::array w1 = random_array({5, 8, 1, 1}, 103);
  EXPECT_EQ(conv2d_unfold_bytes(x, w1, {}), 8 * padded(10 * 12) * 4);
  EXPECT_EQ(conv2d_unfold_bytes(x, w1, {.strides = {2, 2}}), 8 * padded(5 * 6) * 4);
}

}  // namespace
}  // namespace transmuter::kernels
