// ONNX Concat as one CPU kernel: the inputs' bytes side by side along an axis.
//
//   parts [A..., n_i, B...] (one type, equal but for the axis):
//   out [A..., sum n_i, B...], each outer index's block the parts' blocks one after the other
//
// MLX's own concatenate is as fast; this one keeps a compiled segment eligible for direct runs
// (src/runtime/direct_run.h), where a ViT's class token and a decoder's cache met an MLX primitive.
#pragma once

#include <vector>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

/** True when `concatenate` runs the kernel on a CPU stream: two or more parts of one type and rank, equal
 * but for `axis` (normalized), with elements of 1, 2, 4 or 8 bytes. */
bool concatenate_fits(const std::vector<mx::array>& parts, int axis);

/** mx::concatenate(parts, axis): the kernel on CPU streams when concatenate_fits, else MLX's. */
mx::array concatenate(const std::vector<mx::array>& parts, int axis, mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
