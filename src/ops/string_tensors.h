// Helpers for ops on string tensors. ONNX string tensors live on the host as
// StringTensor (MLX has no string dtype), so the ops that take them loop there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "transmuter/value.h"

namespace transmuter {

/** NumPy-style broadcast of two shapes; throws an OpError via `ctx`. */
std::vector<int64_t> broadcast_shapes(const NodeContext& ctx, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b);

/** Flat index into a tensor of `shape` for the broadcast position `index`
 * (a multi-index over the output shape, of rank >= shape.size()). */
size_t broadcast_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& index);

/** Advances a row-major multi-index over `shape`; false after the last one. */
bool next_index(std::vector<int64_t>& index, const std::vector<int64_t>& shape);

/** A bool tensor of `shape` from host flags (checked shape). */
mx::array bool_tensor(const NodeContext& ctx, const std::vector<int64_t>& shape,
                      const std::vector<bool>& flags);

}  // namespace transmuter
