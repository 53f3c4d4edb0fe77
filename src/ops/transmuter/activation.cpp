// SwiGlu (ai.transmuter, since 1), made by src/passes/fuse_gated_mlp.cpp:
//
//   Y = silu(X[..., :n]) * X[..., n:]      X [..., 2n] float32 (the gate and up projections side by
//                                          side, one product's output), Y [..., n]
//
// Llama-style MLPs compute Mul(Mul(gate, Sigmoid(gate)), up): three MLX ops and two passes over
// memory a layer, one kernel here (src/kernels/cpu/activation.h).
#include <mlx/mlx.h>

#include "kernels/cpu/activation.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

OpOutputs swiglu(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.dtype() != mx::float32 || x.ndim() < 1 || x.shape(-1) % 2 != 0) {
    throw ctx.error("X must be float32 with an even last axis [..., 2n], got ", x.dtype(), " ", x.shape());
  }
  return {kernels::swiglu(x, ctx.stream())};
}

}  // namespace

void register_transmuter_activation(OpRegistry& r) {
  r.add({
      {"SwiGlu", kTransmuter, 1, kOpen, swiglu},
  });
}

}  // namespace transmuter
