// Group-1 2-D convolution in ONNX's channels-first layout, as one CPU kernel.
//
//   x: [N, C, H, W], w: [M, C, kH, kW], bias: [M]
//   per image n:  cols[C * kH * kW, oH * oW] = im2col(x[n])     (skipped for 1x1, stride 1, no pads)
//                 y[n][M, oH * oW] = act(W[M, C * kH * kW] @ cols + bias)
//
// MLX's CPU convolution wants channels-last, so ONNX's layout costs a
// transpose of the input, of the weight and of the output around MLX's own
// unfold + GEMM, and the bias and the activation are further passes over the
// output. This kernel unfolds in place of the transposes (one buffer of one
// image, reused by the stream thread), runs the GEMM of src/kernels/cpu/gemm.h
// per image reading the weight and the unfolded rows where they are (no
// packing copy, unlike OpenBLAS's sgemm) with the bias as the accumulators'
// start and the activation applied in registers before the store.
#pragma once

#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/depthwise_conv.h"  // ConvActivation

namespace transmuter::kernels {

namespace mx = mlx::core;

struct Conv2dOptions {
  std::vector<int> strides = {1, 1};     // [sH, sW]
  std::vector<int> pads_begin = {0, 0};  // [padTop, padLeft]
  std::vector<int> pads_end = {0, 0};    // [padBottom, padRight]
  std::vector<int> dilations = {1, 1};   // [dH, dW]
  ConvActivation activation = ConvActivation::kNone;
  float clip_min = 0.0f, clip_max = 6.0f;  // kClip only
};

/** True when conv2d runs the kernel for these arguments on a CPU stream:
 * float32 x [N, C, H, W] and w [M, C, kH, kW] (group 1), bias absent or
 * float32 [M], non-empty, sane window attributes and a positive output. */
bool conv2d_fits(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                 const Conv2dOptions& options);

/** Bytes of the buffer the kernel allocates for one image: its unfolded input
 * (the input itself for a 1x1 conv) in the GEMM's panels, positions rounded
 * up to the panel width. Callers hold it to their memory limit. Requires
 * conv2d_fits. */
size_t conv2d_unfold_bytes(const mx::array& x, const mx::array& w, const Conv2dOptions& options);

/** The convolution as above. Arguments that do not fit (conv2d_fits), and
 * non-CPU streams, run the reference: mx::conv_general on channels-last
 * transposes, + bias, then the activation, which also gives the gradients.
 * Throws std::invalid_argument (from MLX) on inconsistent shapes. */
mx::array conv2d(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                 const Conv2dOptions& options, mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
