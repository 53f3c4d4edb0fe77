// ONNX DynamicQuantizeLinear as one CPU kernel: uint8 quantization of a float32
// tensor with one scale and zero point computed from its own range,
//
//   high = max(max(x), 0), low = min(min(x), 0), scale = (high - low) / 255
//   (1 / 255 when the range is 0), zero = round(clip(-low / scale, 0, 255)),
//   y = clip(round(x / scale) + zero, 0, 255)          (round: half to even)
//
// in two threaded SIMD passes over x (the range, then the quantization) instead
// of MLX's seven single-threaded ones. The division is x / scale, as the
// composition computes it, so y is the same bytes. Inputs with NaN: the range
// ignores them here (x86 min/max), where the composition's is NaN; either way
// the result means nothing.
#pragma once

#include <vector>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

/** {y (uint8, x's shape), scale (float32 scalar), zero point (uint8 scalar)} for non-empty float32 x;
 * on other streams, or for other inputs, the MLX composition (the kernel's reference). */
std::vector<mx::array> dynamic_quantize_linear(const mx::array& x, mx::StreamOrDevice s = {});

/** The kernel's reference: the same quantization composed of MLX ops. */
std::vector<mx::array> dynamic_quantize_linear_reference(const mx::array& x, mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
