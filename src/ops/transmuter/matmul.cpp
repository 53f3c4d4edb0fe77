// PackedMatMul (ai.transmuter, since 1), made by src/passes/pack_matmul_weights.cpp:
//
//   Y = activation(A @ B + bias)
//
//   A [..., K] float32; packed: B [K, n] in the CPU GEMM's panel layout
//   (src/kernels/cpu/gemm.h: float32 [ceil(n / P), K, P]); bias (optional)
//   float32 [n]; residual (optional, no activation only) float32, added last
//   (in the epilogue when it has Y's shape); attributes n (int, required) and
//   activation ("" none, "gelu" erf form, "gelu_tanh"). Y [..., n].
//
// IntegerMatMul (ai.transmuter, since 1), made by src/passes/pack_integer_matmul_weights.cpp:
//
//   Y = (A - a_zero_point) @ (B - b_zero_point)   (int32, exact: ONNX MatMulInteger)
//
//   A [..., k] uint8 or int8; packed, column_sums, column_zeros: B [k, n] (int8 or uint8, a constant)
//   and its zero point as kernels::pack_integer_gemm_rhs prepared them (int8 [panels, k / 4, 128],
//   int32 [panels * 32] twice); a_zero_point (optional): A's type, one element; attributes k, n
//   (int, required). Y [..., n] int32.
//
//   Inputs 5 and 6 (optional; the pass's fusion of quantize_dynamic's Cast -> Mul -> Add after the
//   product): scale (float32, one element or [n]) and bias (float32 [n], only with scale):
//   Y = float(Y) * scale + bias, float32. Input 7 (optional, with scale): a second factor of the scale
//   (float32, one element or [n]; the pass takes quantize_dynamic's Mul of A's scale by B's constant
//   one): the scale is scale * input 7.
#include <optional>
#include <string>

#include <mlx/mlx.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/integer_gemm.h"
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

OpOutputs integer_matmul(NodeContext& ctx) {
  const mx::array& a = ctx.input(0);
  const int64_t k = ctx.attr_int("k", 0), n = ctx.attr_int("n", 0);
  kernels::PackedIntegerRhs b{ctx.input(1), ctx.input(2), ctx.input(3)};
  const int64_t panels = (n + 31) / 32, quads = (k + 3) / 4;
  if (k <= 0 || n <= 0 || b.packed.dtype() != mx::int8 || b.packed.shape() != mx::Shape{static_cast<int>(panels),
                                                                                         static_cast<int>(quads), 128}) {
    throw ctx.error("packed weight must be int8 [", panels, ", ", quads, ", 128] for k = ", k, ", n = ", n,
                    ", got ", b.packed.dtype(), " ", b.packed.shape());
  }
  for (const mx::array* column : {&b.column_sums, &b.column_zeros}) {
    if (column->dtype() != mx::int32 || column->shape() != mx::Shape{static_cast<int>(panels * 32)})
      throw ctx.error("column sums and zeros must be int32 [", panels * 32, "], got ", column->dtype(), " ",
                      column->shape());
  }
  if ((a.dtype() != mx::uint8 && a.dtype() != mx::int8) || a.ndim() < 1 || a.shape(-1) != k)
    throw ctx.error("A must be uint8 or int8 [..., ", k, "], got ", a.dtype(), " ", a.shape());
  std::optional<mx::array> a_zero = ctx.optional_input(4);
  if (a_zero && (a_zero->dtype() != a.dtype() || a_zero->size() != 1))
    throw ctx.error("a_zero_point must be one element of A's type ", a.dtype(), ", got ", a_zero->dtype(), " ",
                    a_zero->shape());
  std::optional<kernels::IntegerEpilogue> epilogue;
  if (std::optional<mx::array> scale = ctx.optional_input(5)) {
    if (scale->dtype() != mx::float32) throw ctx.error("scale must be float32, got ", scale->dtype());
    epilogue = kernels::IntegerEpilogue{*scale, ctx.optional_input(6), ctx.optional_input(7)};
    if (epilogue->scale_factor && epilogue->scale_factor->dtype() != mx::float32)
      throw ctx.error("the scale's factor must be float32, got ", epilogue->scale_factor->dtype());
    if (epilogue->bias && (epilogue->bias->dtype() != mx::float32 || epilogue->bias->shape() != mx::Shape{static_cast<int>(n)}))
      throw ctx.error("bias must be float32 [", n, "], got ", epilogue->bias->dtype(), " ", epilogue->bias->shape());
  } else if (ctx.has_input(6) || ctx.has_input(7)) {
    throw ctx.error("a bias or a scale factor needs the scale (input 5)");
  }
  return {kernels::integer_matmul(a, b, k, n, a_zero, ctx.stream(), epilogue)};
}

}  // namespace

void register_transmuter_matmul(OpRegistry& r) {
  r.add({
      {"PackedMatMul", kTransmuter, 1, kOpen, packed_matmul},
      {.op_type = "IntegerMatMul",
       .domain = kTransmuter,
       .since = 1,
       .until = kOpen,
       .fn = integer_matmul,
       .not_differentiable = "integer inputs and output"},
  });
}

}  // namespace transmuter
