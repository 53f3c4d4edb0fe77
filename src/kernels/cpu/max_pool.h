// 2-D max pooling over channels-last input, as one CPU kernel.
//
//   x: [N, H, W, C]
//   y[n, oy, ox, c] = max over ky < kH, kx < kW of
//                     x[n, oy * sH - padTop + ky * dH, ox * sW - padLeft + kx * dW, c]
//   y: [N, oH, oW, C]; window positions outside x are left out (as -inf
//   padding: a window with none gives -inf). NaN propagates, as in mx::maximum.
//
// The MLX composition (pad with -inf, one strided slice per window offset,
// mx::maximum) writes the padded input and an intermediate per offset: at a
// ResNet stem (b8: [8, 112, 112, 64]) 37 MiB of buffers beside the input and
// output, and a single-threaded pass each. The kernel reads each window's
// rows where they lie, C channels as vectors, rows of the output across the
// thread pool.
#pragma once

#include <array>
#include <cstdint>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

struct MaxPoolOptions {
  std::array<int, 2> kernel = {1, 1};      // [kH, kW]
  std::array<int, 2> strides = {1, 1};     // [sH, sW]
  std::array<int, 2> dilations = {1, 1};   // [dH, dW]
  std::array<int, 2> pads_begin = {0, 0};  // [padTop, padLeft]
  std::array<int, 2> output = {1, 1};      // [oH, oW] (from the caller's rules: ceil_mode, auto_pad)
};

/** The max pool above. The kernel takes float32 x on a CPU stream with
 * positive kernel, strides and dilations, non-negative pads and a positive
 * output; everything else runs the reference (max_pool_nhwc_reference), whose
 * gradient is the kernel's too. */
mx::array max_pool_nhwc(const mx::array& x, const MaxPoolOptions& options, mx::StreamOrDevice s = {});

/** The smallest value of `dtype` (-inf for floats): padding that never wins a max. */
mx::array lowest_value(mx::Dtype dtype);

/** The MLX composition: x padded with lowest_value of its dtype, one
 * strided slice per window offset, folded with mx::maximum. */
mx::array max_pool_nhwc_reference(const mx::array& x, const MaxPoolOptions& options, mx::Stream s);

}  // namespace transmuter::kernels
