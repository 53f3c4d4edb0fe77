// 2-D convolutions in the channels-last layout (NHWC), the layout the
// channels_last_convs pass (src/passes/channels_last_convs.cpp) moves CNNs to.
//
//   x: [N, H, W, C]  ->  y: [N, oH, oW, M]
//   y[n, oy, ox, m] = act(bias[m] + sum_{ky, kx, c} w[ky, kx, c, m] *
//                         x[n, oy * sH - padTop + ky * dH, ox * sW - padLeft + kx * dW, c])
//
// Why channels-last: in ONNX's NCHW layout a convolution is a product whose
// right-hand side is the image, so the image must be copied into the GEMM's
// panels on every call and the weights are the (unpacked) left-hand side. In
// NHWC the image rows are the left-hand side, read in place, and the weights
// are the right-hand side, packed once at load: a pointwise conv is exactly a
// packed matrix product over all N * H * W positions, and a k x k conv copies
// each position's k x k x C window (contiguous runs of C, or of kW * C values)
// into one row of an unfolded matrix. A depthwise conv vectorizes across the
// channels, which lie next to each other. ONNX Runtime gets its CNN speed the
// same way (its NCHWc layout); with NCHW kernels only, Transmuter was 1.5-2.7x
// slower than ONNX Runtime on ResNet-50, MobileNetV2 and PP-LCNet.
//
// Group 1 takes the weights packed (pack_conv_weight_nhwc), depthwise
// (groups == C == M) takes them as [kH, kW, C]. Non-CPU streams and gradients
// use the reference: mx::conv_general (which is channels-last) + bias + the
// activation.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/depthwise_conv.h"  // ConvActivation

namespace transmuter::kernels {

namespace mx = mlx::core;

struct NhwcConvOptions {
  std::array<int, 2> kernel = {1, 1};      // [kH, kW]
  std::array<int, 2> strides = {1, 1};     // [sH, sW]
  std::array<int, 2> pads_begin = {0, 0};  // [padTop, padLeft]
  std::array<int, 2> pads_end = {0, 0};    // [padBottom, padRight]
  std::array<int, 2> dilations = {1, 1};   // [dH, dW]
  ConvActivation activation = ConvActivation::kNone;
  float clip_min = 0.0f, clip_max = 6.0f;  // kClip only
  // Group 1: x is [N, C, H, W] (ONNX's layout), read in place by the direct
  // kernel; the output is channels-last all the same. A CNN's stem reads the
  // graph's NCHW input this way, without a transpose into NHWC.
  bool channels_first_input = false;

  bool operator==(const NhwcConvOptions&) const = default;
};

/** Group-1 convolutions over at most this many input channels (a CNN's stem
 * over RGB) run on the direct kernel, which reads the input through strides:
 * NHWC, or NCHW with channels_first_input. Wider inputs are unfolded into the
 * GEMM (channels_first_input works there too, at the direct kernel's speed). */
constexpr int64_t kConvDirectMaxChannels = 4;

/** An ONNX conv weight [M, C, kH, kW] (float) packed for conv2d_nhwc: the
 * GEMM's right-hand side B[(ky * kW + kx) * C + c, m] in its panel layout
 * (gemm.h), float32 [ceil(M / P), kH * kW * C, P]. Evaluates `w`. */
mx::array pack_conv_weight_nhwc(const mx::array& w);

/** Panel `p` of the filters `weight` (float32 [m, k] row-major, k = C * taps, at any alignment)
 * transposed: by_channel[r, j] = weight[p * P + j, r] (0 past filter m), P = gemm_panel_width(), rows
 * r in the filters' own (c, tap) order. pack_conv_weight_nhwc's first step. */
void filter_panel_by_channel(const uint8_t* weight, int64_t m, int64_t k, int64_t p, float* by_channel);

/** The shape pack_conv_weight_nhwc gives a weight of shape `w` [M, C, kH, kW]. */
mx::Shape packed_conv_weight_shape(const mx::Shape& w);

/** An ONNX depthwise weight [C, 1, kH, kW] (float) as [kH, kW, C] (float32), made on the calling thread.
 * Evaluates `w`. */
mx::array depthwise_weight_nhwc(const mx::array& w);

/** Group-1 convolution: x float32 [N, H, W, C] ([N, C, H, W] with
 * options.channels_first_input), packed from
 * pack_conv_weight_nhwc of an [M, C, kH, kW] weight, bias [M] or none, and a
 * residual added before the activation (a ResNet block's shortcut: in the
 * GEMM's epilogue when it has the output's shape, else broadcast by MLX).
 * Returns [N, oH, oW, M]. Throws std::invalid_argument when the shapes do not
 * agree or the output would be empty. */
mx::array conv2d_nhwc(const mx::array& x, const mx::array& packed, const std::optional<mx::array>& bias, int64_t m,
                      const NhwcConvOptions& options, mx::StreamOrDevice s = {},
                      const std::optional<mx::array>& residual = std::nullopt);

/** Depthwise convolution: x float32 [N, H, W, C], w [kH, kW, C], bias [C] or
 * none. Returns [N, oH, oW, C]. Throws std::invalid_argument as above. */
mx::array depthwise_conv_nhwc(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                              const NhwcConvOptions& options, mx::StreamOrDevice s = {});

/** The mean over the spatial axes of x float32 [N, H, W, C], kept:
 * [N, 1, 1, C] (GlobalAveragePool in channels-last; MLX reduces these
 * non-adjacent-to-the-end axes through a generic strided loop, 8 % of
 * PP-LCNet rec). Gradients are mx::mean's. */
mx::array spatial_mean_nhwc(const mx::array& x, mx::StreamOrDevice s = {});

/** Output length of one spatial axis; <= 0 when the window does not fit. */
int64_t conv_output_length(int64_t in, int kernel, int stride, int pad_begin, int pad_end, int dilation);

}  // namespace transmuter::kernels
