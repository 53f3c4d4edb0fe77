// The numpy-semantics matrix product that MatMul runs, shared with
// com.microsoft FusedMatMul (src/ops/microsoft/matmul.cpp).
#pragma once

#include <mlx/mlx.h>

#include "ops/node_context.h"

namespace transmuter {

// numpy matmul: 1-D operands promoted to a matrix and the added axis removed
// again, broadcast batch axes; integers exact, floats on the CPU kernels where
// they apply.
mx::array numpy_matmul(const NodeContext& ctx, mx::array a, mx::array b);

}  // namespace transmuter
