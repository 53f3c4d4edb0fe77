// ONNX Gather -- an embedding lookup on axis 0, a pooler's first token on axis 1 -- as one CPU kernel.
//
//   data [A..., V, B...] (any type, V on `axis`), indices int32 or int64 [I...]:
//   out[a..., i..., b...] = data[a..., w(clamp(indices[i...], -V, V - 1)), b...],  w(j) = j < 0 ? j + V : j
//   out: A + I + B, data's type.
//
// The clamp and wrap are those of Gather's traced path (ops/onnx/indexing.cpp: an index out of range is an
// error where its value is known, checked before, and clamped while tracing); there they are six MLX
// primitives around mx::take (widen, clip's two bounds, a comparison, an add, a select), per lookup: a
// MiniLM's three embedding lookups were 17 of its first primitives, each a hand-off to the stream's
// thread before its first kernel could start. Here each row is one copy.
#pragma once

#include <mlx/mlx.h>

#include "kernels/cpu/cpu_kernel.h"

namespace transmuter::kernels {

namespace mx = mlx::core;

/** The gather above on a CPU stream, for non-empty data, an axis in [0, rank) and non-empty int32 or int64
 * indices; anything else (other streams, types; gradients with respect to data) is reference({data,
 * indices}), which must compute the same: mx::take of the clamped, wrapped indices along `axis`. */
mx::array take_rows(const mx::array& data, const mx::array& indices, const Reference& reference,
                    mx::StreamOrDevice s = {}, int axis = 0);

}  // namespace transmuter::kernels
