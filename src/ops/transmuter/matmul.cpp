// PackedMatMul (ai.transmuter, since 1), made by src/passes/pack_matmul_weights.cpp:
//
//   Y = activation(A @ B + bias)
//
//   A [..., K] float32; packed: B [K, n] in the CPU GEMM's panel layout
//   (src/kernels/cpu/gemm.h: float32 [ceil(n / P), K, P]); bias (optional)
//   float32 [n]; residual (optional, no activation only) float32, added last
//   (in the epilogue when it has Y's shape); attributes n (int, required) and
//   activation ("" none, "gelu" erf form, "gelu_tanh"). Y [..., n].
#include <optional>
#include <string>

#include <mlx/mlx.h>

#include "kernels/cpu/gemm.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

kernels::Activation parse_activation(const NodeContext& ctx) {
  const std::string name = ctx.attr_string("activation", "");
  if (name.empty()) return kernels::Activation::kIdentity;
  if (name == "gelu") return kernels::Activation::kGeluErf;
  if (name == "gelu_tanh") return kernels::Activation::kGeluTanh;
  throw ctx.error("unknown activation '", name, "' (expected \"\", \"gelu\" or \"gelu_tanh\")");
}

OpOutputs packed_matmul(NodeContext& ctx) {
  const mx::array& a = ctx.input(0);
  const mx::array& packed = ctx.input(1);
  const int64_t n = ctx.attr_int("n", 0);
  if (packed.dtype() != mx::float32 || packed.ndim() != 3 || n <= 0 ||
      n > static_cast<int64_t>(packed.shape(0)) * packed.shape(2)) {
    throw ctx.error("packed weight must be float32 [panels, K, width] holding n = ", n, " columns, got ",
                    packed.dtype(), " ", packed.shape());
  }
  if (a.dtype() != mx::float32 || a.ndim() < 1 || a.shape(-1) != packed.shape(1)) {
    throw ctx.error("A must be float32 [..., ", packed.shape(1), "], got ", a.dtype(), " ", a.shape());
  }
  std::optional<mx::array> bias = ctx.optional_input(2);
  if (bias && (bias->dtype() != mx::float32 || bias->ndim() != 1 || bias->shape(0) != n)) {
    throw ctx.error("bias must be float32 [", n, "], got ", bias->dtype(), " ", bias->shape());
  }
  std::optional<mx::array> residual = ctx.optional_input(3);
  const kernels::Activation activation = parse_activation(ctx);
  if (residual && (residual->dtype() != mx::float32 || activation != kernels::Activation::kIdentity)) {
    throw ctx.error("residual must be float32 and goes with no activation, got ", residual->dtype());
  }
  return {kernels::packed_matmul(a, packed, bias, n, activation, ctx.stream(), residual)};
}

}  // namespace

void register_transmuter_matmul(OpRegistry& r) {
  r.add({
      {"PackedMatMul", kTransmuter, 1, kOpen, packed_matmul},
  });
}

}  // namespace transmuter
