// The geometry and pointers of one channels-last convolution call, shared by
// the convolution kernels (conv_nhwc.cpp, compiled once per SIMD target) and
// the fused depthwise blocks (depthwise_block.cpp) that reuse their rows.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/cpu/conv_nhwc.h"  // NhwcConvOptions

namespace transmuter::kernels {

// One call's pointers and geometry (outside the per-target namespaces: every
// target's code takes the same struct).
struct NhwcConvArgs {
  const float* x;         // [N, in_h, in_w, C], or [N, C, in_h, in_w] when channels_first
  const float* w;         // depthwise: [kernel_h, kernel_w, C]; group 1: packed panels
  const float* bias;      // [out_channels] or null
  const float* residual;  // y's shape, added before the activation (group 1), or null
  float* y;               // [N, out_h, out_w, out_channels]
  int64_t batch, channels, out_channels;
  int64_t in_h, in_w, out_h, out_w;
  int64_t kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left;
  int activation;  // a ConvActivation
  float clip_min, clip_max;
  bool channels_first;  // x is [N, C, H, W] (group 1 only: the direct kernel reads it in place)
  int64_t panel_width;  // group 1: columns per panel of the packed weight
  // x[n, iy, ix, c] lies at x + n * x_stride_n + iy * x_stride_h + ix * x_stride_w + c * x_stride_c.
  int64_t x_stride_n, x_stride_h, x_stride_w, x_stride_c;

  int64_t positions() const { return batch * out_h * out_w; }
  // A 1x1 convolution with stride 1 and no padding: the image's rows are the product's left-hand side.
  bool pointwise() const {
    return kernel_h == 1 && kernel_w == 1 && stride_h == 1 && stride_w == 1 && pad_top == 0 &&
           pad_left == 0 && out_h == in_h && out_w == in_w;
  }
  // fn(n, oy, ox, r) for the output positions [first, first + count) in order, r counting from 0 (an
  // odometer: no division per position).
  template <class Fn>
  void for_each_position(int64_t first, int64_t count, Fn&& fn) const {
    int64_t ox = first % out_w, oy = (first / out_w) % out_h, n = first / (out_w * out_h);
    for (int64_t r = 0; r < count; ++r) {
      fn(n, oy, ox, r);
      if (++ox == out_w) {
        ox = 0;
        if (++oy == out_h) oy = 0, ++n;
      }
    }
  }
  int64_t window() const { return kernel_h * kernel_w * channels; }  // the GEMM's K
  // First input row / column under kernel tap 0 of output row / column o.
  int64_t input_row(int64_t oy) const { return oy * stride_h - pad_top; }
  int64_t input_col(int64_t ox) const { return ox * stride_w - pad_left; }
};

/** The geometry of `o` over an input [batch, in_h, in_w, channels] and an output [batch, out_h, out_w,
 * out_channels] (channels-last strides; the pointers null). */
NhwcConvArgs nhwc_conv_geometry(const NhwcConvOptions& o, int64_t batch, int64_t in_h, int64_t in_w,
                                int64_t channels, int64_t out_h, int64_t out_w, int64_t out_channels);

/** The geometry of a call of `o` over x [N, H, W, C] (or [N, C, H, W] with o.channels_first_input, its
 * strides set for that layout) into y [N, oH, oW, M]; the pointers null. */
NhwcConvArgs nhwc_conv_args_of(const NhwcConvOptions& o, const mx::array& x, const mx::array& y);

/** One output row of the depthwise convolution `a` (a.w [kH, kW, C], a.bias,
 * a.activation; a.x and a.y unused): input_rows[ky] is the input row [in_w,
 * C] under kernel row ky, or null where that row lies in the padding; writes
 * the [out_w, C] row to out_row. Runs on the calling thread, on the CPU's best
 * SIMD target. */
void depthwise_row_from(const NhwcConvArgs& a, const float* const* input_rows, float* out_row);

// Shared by the convolution kernels' MLX-side code (conv_nhwc.cpp, winograd_conv.cpp).

/** The reference of a channels-last convolution: mx::conv_general of x = in[0] [N, H, W, C] with an
 * MLX-layout weight [M, kH, kW, C / groups], + the bias in[2] when has_bias, + the residual (the last
 * input) when has_residual, then o's activation. */
mx::array reference_conv_nhwc(const std::vector<mx::array>& in, const mx::array& weight, int groups,
                              bool has_bias, bool has_residual, const NhwcConvOptions& o, mx::Stream s);

/** [N, oH, oW, m] for input x under o. Throws std::invalid_argument when the window does not fit. */
mx::Shape nhwc_conv_output_shape(const mx::array& x, int64_t m, const NhwcConvOptions& o);

/** Throws std::invalid_argument unless o's kernel, strides and dilations are positive and its pads
 * non-negative. */
void check_conv_options(const NhwcConvOptions& o);

/** Throws std::invalid_argument unless bias is absent or float32 [m]. */
void check_conv_bias(const std::optional<mx::array>& bias, int64_t m);

}  // namespace transmuter::kernels
