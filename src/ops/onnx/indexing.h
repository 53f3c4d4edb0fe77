// ONNX Gather's checked take, for the ops built on it (ai.transmuter GatherRows).
#pragma once

#include <cstdint>

#include <mlx/mlx.h>

#include "ops/node_context.h"

namespace transmuter {

namespace mx = mlx::core;

/** mx::take(data, indices, axis) under Gather's rules: integer indices, data of rank >= 1, a negative
 * axis or index counting from the end; an index out of range is an OpError where its value is known
 * (clamped while tracing, as indexing.cpp explains). */
mx::array checked_gather(const NodeContext& ctx, const mx::array& data, const mx::array& indices,
                         int64_t axis);

}  // namespace transmuter
