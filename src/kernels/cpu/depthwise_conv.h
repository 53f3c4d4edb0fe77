// Depthwise 2-D convolution in ONNX's channels-first layout, as one CPU kernel.
//
//   x: [N, C, H, W], w: [M, 1, kH, kW] with M = C * multiplier, bias: [M]
//   y[n, m, oy, ox] = act(bias[m] + sum_{ky, kx} w[m, 0, ky, kx] *
//                         x[n, m / multiplier, oy * sH - padTop + ky * dH, ox * sW - padLeft + kx * dW])
//   y: [N, M, oH, oW], outside the input counts as zero.
//
// MLX's CPU backend runs grouped convolutions through slow_conv_2D, a scalar
// loop over every output element and kernel tap, and wants channels-last
// input, so ONNX's layout costs a transpose each way on top. The kernel works
// on each [H, W] plane where it lies: it copies the plane once into a
// zero-padded scratch split by the horizontal stride's phase (so that stride
// 2 reads contiguous vectors too), then accumulates kH * kW broadcast-weight
// FMAs into vectors along the output row. Planes go to the thread pool.
#pragma once

#include <optional>
#include <vector>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

/** What follows the convolution in the same kernel (applied to conv + bias). */
enum class ConvActivation {
  kNone,
  kRelu,       // max(v, 0)
  kClip,       // min(max(v, clip_min), clip_max); Relu6 is clip [0, 6]
  kHardSwish,  // v * min(max(v / 6 + 1/2, 0), 1), ONNX HardSwish
};

/** The MLX composition of `activation` on `v` (in v's dtype): the conv kernels'
 * references, and so their gradients. */
mx::array apply_conv_activation(const mx::array& v, ConvActivation activation, float clip_min, float clip_max,
                                mx::Stream s);

struct DepthwiseConvOptions {
  std::vector<int> strides = {1, 1};     // [sH, sW]
  std::vector<int> pads_begin = {0, 0};  // [padTop, padLeft]
  std::vector<int> pads_end = {0, 0};    // [padBottom, padRight]
  std::vector<int> dilations = {1, 1};   // [dH, dW]
  int groups = 1;
  ConvActivation activation = ConvActivation::kNone;
  float clip_min = 0.0f, clip_max = 6.0f;  // kClip only
};

/** A grouped convolution in ONNX layout: x [N, C, D...], w [M, C / groups,
 * k...], bias [M]; strides, pads and dilations per spatial axis. The kernel
 * takes the depthwise float32 case with one or two spatial axes (groups == C,
 * w's second dimension 1); everything else, and non-CPU streams, runs the
 * reference: mx::conv_general on channels-last transposes, + bias, then the
 * activation. Gradients are the reference's. Throws std::invalid_argument
 * (from MLX) on inconsistent shapes. */
mx::array depthwise_conv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                         const DepthwiseConvOptions& options, mx::StreamOrDevice s = {});

/** The MLX composition the conv kernels replace and differentiate (their
 * reference): mx::conv_general on channels-last transposes of x [N, C, D...]
 * and w [M, C / groups, k...], + bias [M] when in[2] is given, then the
 * activation. Runs on `s`. */
mx::array grouped_conv_reference(const std::vector<mx::array>& in, const DepthwiseConvOptions& options, mx::Stream s);

}  // namespace transmuter::kernels
