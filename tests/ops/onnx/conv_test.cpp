#include <gtest/gtest.h>

#include <limits>
#include <string>

#include <mlx/primitives.h>

#include "kernels/cpu/gemm.h"
#include "support/expect_error.h"
#include "support/graph_builder.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::int_attr;
using testing::ints_attr;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;

// Float32 sums of a few dozen small integers are exact; allow for
// reassociation in the convolution kernels anyway.
constexpr double kTol = 1e-4;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected) {
  testing::expect_all_near(actual, expected, kTol);
}

// Deterministic small integers, so the naive reference below is exact.
mx::array ramp(mx::Shape shape, int modulus = 7) {
  int n = 1;
  for (int d : shape) n *= d;
  return mx::reshape(mx::astype(mx::remainder(mx::arange(n), mx::array(modulus)), mx::float32), shape);
}

struct Conv2dCase {
  int stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, pad_bottom, pad_right, group;
};

// Direct-loop 2-D convolution in ONNX layout, for comparison.
std::vector<double> naive_conv2d(const std::vector<double>& x, mx::Shape xs, const std::vector<double>& w,
                                 mx::Shape ws, const Conv2dCase& c, mx::Shape& out_shape) {
  const int n = xs[0], ci = xs[1], h = xs[2], wd = xs[3];
  const int m = ws[0], cg = ws[1], kh = ws[2], kw = ws[3];
  const int oh = (h + c.pad_top + c.pad_bottom - ((kh - 1) * c.dil_h + 1)) / c.stride_h + 1;
  const int ow = (wd + c.pad_left + c.pad_right - ((kw - 1) * c.dil_w + 1)) / c.stride_w + 1;
  out_shape = {n, m, oh, ow};
  std::vector<double> y(static_cast<size_t>(n) * m * oh * ow, 0.0);
  const int m_per_group = m / c.group;
  for (int b = 0; b < n; ++b)
    for (int o = 0; o < m; ++o)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j) {
          double acc = 0;
          const int g = o / m_per_group;
          for (int cc = 0; cc < cg; ++cc)
            for (int p = 0; p < kh; ++p)
              for (int q = 0; q < kw; ++q) {
                int yy = i * c.stride_h - c.pad_top + p * c.dil_h;
                int xx = j * c.stride_w - c.pad_left + q * c.dil_w;
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                int channel = g * cg + cc;
                acc += x[((b * ci + channel) * h + yy) * wd + xx] * w[((o * cg + cc) * kh + p) * kw + q];
              }
          y[((b * m + o) * oh + i) * ow + j] = acc;
        }
  (void)ci;
  return y;
}

TEST(Conv, MatchesDirectLoopsWithGroupsStridesDilationsAndAsymmetricPads) {
  const Conv2dCase c{2, 1, 1, 2, 1, 0, 2, 1, 2};
  mx::Shape xs{2, 4, 7, 6}, ws{6, 2, 3, 2};
  mx::array x = ramp(xs), w = mx::subtract(ramp(ws, 5), mx::array(2.f));
  auto out = run_op(
      "Conv", 11, {x, w},
      {ints_attr("strides", {c.stride_h, c.stride_w}), ints_attr("dilations", {c.dil_h, c.dil_w}),
       ints_attr("pads", {c.pad_top, c.pad_left, c.pad_bottom, c.pad_right}), int_attr("group", c.group)});
  mx::Shape expected_shape;
  auto expected = naive_conv2d(to_doubles(x), xs, to_doubles(w), ws, c, expected_shape);
  EXPECT_EQ(out[0].tensor().shape(), expected_shape);
  expect_near(to_doubles(out[0].tensor()), expected);
}

// A group-1 1-D convolution runs the 2-D kernel over a height of one (views on both sides): strides,
// dilations, asymmetric pads and the bias as the direct loops have them.
TEST(Conv, OneSpatialAxisRunsTheKernelAndMatchesDirectLoops) {
  const Conv2dCase c{1, 2, 1, 2, 0, 3, 0, 1, 1};  // along the one axis: stride 2, dilation 2, pads 3 and 1
  mx::Shape xs{2, 5, 1, 23}, ws{4, 5, 1, 3};
  mx::array x = ramp(xs), w = mx::subtract(ramp(ws, 5), mx::array(2.f));
  mx::array bias = mx::array({1.f, -2.f, 3.f, -4.f});
  auto out = run_op("Conv", 11, {mx::reshape(x, {2, 5, 23}), mx::reshape(w, {4, 5, 3}), bias},
                    {ints_attr("strides", {2}), ints_attr("dilations", {2}), ints_attr("pads", {3, 1})});
  const mx::array& y = out[0].tensor();
  ASSERT_TRUE(y.has_primitive());
  EXPECT_EQ(std::string(const_cast<mx::array&>(y).primitive().name()), "Reshape");
  EXPECT_EQ(std::string(const_cast<mx::array&>(y).inputs()[0].primitive().name()), "transmuter::Conv2d");
  mx::Shape expected_shape;
  auto expected = naive_conv2d(to_doubles(x), xs, to_doubles(w), ws, c, expected_shape);
  const int64_t per_channel = expected_shape[3];
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += to_doubles(bias)[(i / per_channel) % 4];
  EXPECT_EQ(y.shape(), (mx::Shape{expected_shape[0], expected_shape[1], expected_shape[3]}));
  expect_near(to_doubles(y), expected);
}

// group == channels runs the depthwise kernel on CPU; a channel multiplier of 2 here.
TEST(Conv, DepthwiseMatchesDirectLoops) {
  const Conv2dCase c{2, 1, 1, 2, 1, 0, 2, 1, 3};
  mx::Shape xs{2, 3, 9, 11}, ws{6, 1, 3, 3};
  mx::array x = ramp(xs), w = mx::subtract(ramp(ws, 5), mx::array(2.f));
  mx::array bias = mx::array({1.f, -2.f, 3.f, -4.f, 5.f, -6.f});
  auto out = run_op(
      "Conv", 11, {x, w, bias},
      {ints_attr("strides", {c.stride_h, c.stride_w}), ints_attr("dilations", {c.dil_h, c.dil_w}),
       ints_attr("pads", {c.pad_top, c.pad_left, c.pad_bottom, c.pad_right}), int_attr("group", c.group)});
  mx::Shape expected_shape;
  auto expected = naive_conv2d(to_doubles(x), xs, to_doubles(w), ws, c, expected_shape);
  const int64_t per_channel = static_cast<int64_t>(expected.size()) / (expected_shape[0] * expected_shape[1]);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += to_doubles(bias)[(i / per_channel) % 6];
  EXPECT_EQ(out[0].tensor().shape(), expected_shape);
  expect_near(to_doubles(out[0].tensor()), expected);
}

// 1x1 kernels with unit strides and no pads run as one matrix product per image.
TEST(Conv, PointwiseMatchesDirectLoops) {
  const Conv2dCase c{1, 1, 1, 1, 0, 0, 0, 0, 1};
  mx::Shape xs{2, 5, 3, 7}, ws{4, 5, 1, 1};
  mx::array x = ramp(xs), w = mx::subtract(ramp(ws, 5), mx::array(2.f));
  auto out = run_op("Conv", 11, {x, w});
  mx::Shape expected_shape;
  auto expected = naive_conv2d(to_doubles(x), xs, to_doubles(w), ws, c, expected_shape);
  EXPECT_EQ(out[0].tensor().shape(), expected_shape);
  expect_near(to_doubles(out[0].tensor()), expected);
  // One spatial axis, with a bias.
  auto one_d = run_op("Conv", 11, {mx::ones({1, 2, 3}), mx::ones({2, 2, 1}), mx::array({10.f, 20.f})});
  EXPECT_EQ(to_doubles(one_d[0].tensor()), (std::vector<double>{12, 12, 12, 22, 22, 22}));
}

TEST(Conv, AddsBiasPerOutputChannel) {
  auto out = run_op("Conv", 11, {mx::ones({1, 1, 2, 2}), mx::ones({2, 1, 1, 1}), mx::array({10.f, 20.f})});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{11, 11, 11, 11, 21, 21, 21, 21}));
}

TEST(Conv, SameUpperAndSameLowerPutTheOddPadOnDifferentSides) {
  // 1-D, kernel 2, stride 1: one pad element, at the end (UPPER) or start (LOWER).
  mx::array x = mx::array({1.f, 2.f, 3.f}, {1, 1, 3});
  mx::array w = mx::array({1.f, 10.f}, {1, 1, 2});
  auto upper = run_op("Conv", 11, {x, w}, {string_attr("auto_pad", "SAME_UPPER")});
  auto lower = run_op("Conv", 11, {x, w}, {string_attr("auto_pad", "SAME_LOWER")});
  EXPECT_EQ(to_doubles(upper[0].tensor()), (std::vector<double>{21, 32, 3}));
  EXPECT_EQ(to_doubles(lower[0].tensor()), (std::vector<double>{10, 21, 32}));
}

TEST(Conv, ValidAndThreeSpatialAxes) {
  auto out = run_op("Conv", 11, {mx::ones({1, 2, 4, 5, 6}), mx::ones({3, 2, 2, 3, 4})},
                    {string_attr("auto_pad", "VALID"), ints_attr("strides", {2, 2, 1})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 3, 2, 2, 3}));
  EXPECT_EQ(to_doubles(out[0].tensor())[0], 48);
}

TEST(Conv, ChannelMismatchIsAnError) {
  EXPECT_THROW(run_op("Conv", 11, {mx::ones({1, 3, 4, 4}), mx::ones({2, 2, 1, 1})}), OpError);
}

TEST(ConvTranspose, StridedOutputWithPadsCropped) {
  // 1-D, stride 2, kernel [1, 1, 1]: full output length 2 * (3 - 1) + 3 = 7.
  mx::array x = mx::array({1.f, 2.f, 3.f}, {1, 1, 3});
  mx::array w = mx::ones({1, 1, 3});
  auto full = run_op("ConvTranspose", 11, {x, w}, {ints_attr("strides", {2})});
  EXPECT_EQ(to_doubles(full[0].tensor()), (std::vector<double>{1, 1, 3, 2, 5, 3, 3}));
  auto cropped = run_op("ConvTranspose", 11, {x, w}, {ints_attr("strides", {2}), ints_attr("pads", {1, 2})});
  EXPECT_EQ(to_doubles(cropped[0].tensor()), (std::vector<double>{1, 3, 2, 5}));
}

TEST(ConvTranspose, OutputShapeExtendsWithZerosAndOutputPaddingAppends) {
  mx::array x = mx::array({1.f, 2.f}, {1, 1, 2});
  mx::array w = mx::ones({1, 1, 2});
  // Full output: [1, 3, 2]; output_shape 4 asks for one more element.
  auto shaped = run_op("ConvTranspose", 11, {x, w}, {ints_attr("output_shape", {4})});
  EXPECT_EQ(to_doubles(shaped[0].tensor()), (std::vector<double>{1, 3, 2, 0}));
  auto padded =
      run_op("ConvTranspose", 11, {x, w}, {ints_attr("output_padding", {1}), ints_attr("strides", {2})});
  EXPECT_EQ(to_doubles(padded[0].tensor()), (std::vector<double>{1, 1, 2, 2, 0}));
}

TEST(ConvTranspose, GroupsKeepChannelsApart) {
  // Two groups of one input channel, each producing one output channel.
  mx::array x = mx::array({1.f, 2.f}, {1, 2, 1});
  mx::array w = mx::array({10.f, 100.f}, {2, 1, 1});
  auto out = run_op("ConvTranspose", 11, {x, w, mx::array({1.f, 2.f})}, {int_attr("group", 2)});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 2, 1}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{11, 202}));
}

TEST(Conv, WindowAttributesBeyondInt32AreErrors) {
  // Used to be cut to int32 on the way to mx::conv_general (2^32 + 1 -> 1).
  const mx::array x = mx::zeros({1, 1, 4}), w = mx::zeros({1, 1, 1});
  EXPECT_EQ(testing::error_of<OpError>(
                [&] { run_op("Conv", 11, {x, w}, {ints_attr("strides", {(int64_t{1} << 32) + 1})}); }),
            "[Conv v1] node 'test_Conv': attribute 'strides' value 4294967297 does not fit in int32");
  EXPECT_NE(testing::error_of<OpError>([&] {
              run_op("Conv", 11, {x, w}, {ints_attr("pads", {int64_t{1} << 32, 0})});
            }).find("pad 4294967296 does not fit in int32"),
            std::string::npos);
  EXPECT_NE(testing::error_of<OpError>([&] {
              run_op("Conv", 11, {x, mx::zeros({1, 1, 1})}, {int_attr("group", int64_t{1} << 62)});
            }).find("channels do not match"),
            std::string::npos);
}

TEST(ConvTranspose, OutputShapeAndPaddingBeyondInt32AreErrors) {
  const mx::array x = mx::zeros({1, 1, 2}), w = mx::zeros({1, 1, 1});
  EXPECT_EQ(
      testing::error_of<OpError>(
          [&] { run_op("ConvTranspose", 11, {x, w}, {ints_attr("output_shape", {int64_t{1} << 62})}); }),
      "[ConvTranspose v1] node 'test_ConvTranspose': output_shape value 4611686018427387904 does not fit in "
      "int32");
  EXPECT_NE(testing::error_of<OpError>([&] {
              run_op("ConvTranspose", 11, {x, w},
                     {ints_attr("output_padding", {std::numeric_limits<int64_t>::min()})});
            }).find("output_padding value -9223372036854775808 does not fit in int32"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter

namespace transmuter {
namespace {

// A 32x32 kernel over a 64x64 image: the output is 33x33 floats (4 KiB), the
// im2col buffer MLX would allocate 33*33*1024 floats (4.4 MB).
Model big_kernel_conv() {
  return testing::GraphBuilder()
      .input("x", OnnxType::kFloat, {1, 1, 64, 64})
      .initializer("w", mx::ones({1, 1, 32, 32}))
      .node("Conv", {"x", "w"}, {"y"})
      .output("y")
      .build({.run_passes = false});  // ONNX's Conv itself, not channels_last_convs's ConvNhwc
}

TEST(Conv, UnfoldedInputOverTheMemoryLimitIsRefusedBeforeMlxAllocates) {
  Model model = big_kernel_conv();
  Inputs in = {{"x", mx::ones({1, 1, 64, 64})}};
  RunOptions small_limit{.device = mx::Device::cpu, .memory_limit = 1 << 20};
  std::string message = testing::error_of<OpError>([&] { run(model, model.params(), in, small_limit); });
  EXPECT_NE(message.find("[Conv v1] node"), std::string::npos) << message;
  // 1024 taps x 33 * 33 positions, rounded up to the GEMM's panel width.
  const int64_t width = kernels::gemm_panel_width();
  const int64_t bytes = 1024 * ((33 * 33 + width - 1) / width * width) * 4;
  EXPECT_NE(message.find("the unfolded input of this convolution would need " + std::to_string(bytes) +
                         " bytes, over the memory limit of 1048576 bytes"),
            std::string::npos)
      << message;
  // Within the default limit the same model runs: every output is a 32x32 window sum of ones.
  mx::array y = run(model, model.params(), in, {.device = mx::Device::cpu}).tensor("y");
  EXPECT_EQ(y.shape(), (mx::Shape{1, 1, 33, 33}));
  EXPECT_EQ(mx::min(y).item<float>(), 1024.f);
}

}  // namespace
}  // namespace transmuter
