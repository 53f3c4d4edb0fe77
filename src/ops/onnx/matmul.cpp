// Matrix products: MatMul, Gemm, Einsum.
// https://onnx.ai/onnx/operators/onnx__MatMul.html
// https://onnx.ai/onnx/operators/onnx__Gemm.html
// https://onnx.ai/onnx/operators/onnx__Einsum.html
#include <string>

#include <mlx/mlx.h>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matmul.h"
#include "ops/node_context.h"
#include "ops/onnx/matmul.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

bool is_integral(mx::Dtype dtype) { return mx::issubdtype(dtype, mx::integer) || dtype == mx::bool_; }

// Batched matrix product of integer matrices, exact and on any device: MLX
// matmul takes floats only, and a float detour is inexact past 2^24 (or
// float64, which GPUs lack). a: [..., M, K], b: [..., K, N] -> [..., M, N],
// through a [..., M, K, N] intermediate; integer matmuls in real models are
// small (shape arithmetic, index math).
mx::array integer_matmul(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  mx::array products = mx::multiply(mx::expand_dims(a, -1, s), mx::expand_dims(b, -3, s), s);
  return mx::sum(products, -2, false, s);
}

}  // namespace

mx::array numpy_matmul(const NodeContext& ctx, mx::array a, mx::array b) {
  auto s = ctx.stream();
  if (a.ndim() == 0 || b.ndim() == 0) throw ctx.error("MatMul operands must have rank >= 1");
  if (a.dtype() != b.dtype()) throw ctx.error("operand dtypes differ: ", a.dtype(), " and ", b.dtype());
  const bool vector_a = a.ndim() == 1;
  const bool vector_b = b.ndim() == 1;
  if (vector_a) a = mx::expand_dims(a, 0, s);
  if (vector_b) b = mx::expand_dims(b, -1, s);
  if (a.shape(-1) != b.shape(-2)) {
    throw ctx.error("inner dimensions differ: ", a.shape(-1), " and ", b.shape(-2));
  }
  mx::array out = is_integral(a.dtype())                 ? integer_matmul(a, b, s)
                  : kernels::matvec_applies(a, b, s) ? kernels::matvec(a, b, /*transposed_w=*/false, s)
                  : kernels::batched_matmul_fits(a, b, s) ? kernels::batched_matmul(a, b, s)
                                                     : mx::matmul(a, b, s);
  if (vector_b) out = mx::squeeze(out, -1, s);
  if (vector_a) out = mx::squeeze(out, vector_b ? -1 : -2, s);
  return out;
}

namespace {

// MatMul: every version has numpy semantics; v9 and v13 only add dtypes.
OpOutputs matmul(NodeContext& ctx) { return {numpy_matmul(ctx, ctx.input(0), ctx.input(1))}; }

// Gemm: Y = alpha * A' * B' + beta * C with A' = transA ? A^T : A.
// Before v7, C is broadcast only with broadcast=1 (otherwise it must already
// have Y's shape), which numpy broadcasting covers; C is optional from v11.
OpOutputs gemm(NodeContext& ctx) {
  auto s = ctx.stream();
  mx::array a = ctx.input(0);
  mx::array b = ctx.input(1);
  if (a.ndim() != 2 || b.ndim() != 2)
    throw ctx.error("A and B must be matrices, got ranks ", a.ndim(), ", ", b.ndim());
  if (ctx.attr_int("transA", 0) != 0) a = mx::transpose(a, s);
  const bool trans_b = ctx.attr_int("transB", 0) != 0;
  const float alpha = ctx.attr_float("alpha", 1.0f);
  const float beta = ctx.attr_float("beta", 1.0f);
  const mx::Dtype dtype = a.dtype();

  // One row times a weight: GEMV reads B as stored, transposed or not.
  const bool one_row = a.shape(0) == 1 && kernels::matvec_applies(a, b, s);
  if (one_row && a.shape(1) != (trans_b ? b.shape(1) : b.shape(0))) {
    throw ctx.error("inner dimensions differ: ", a.shape(1), " and ", trans_b ? b.shape(1) : b.shape(0));
  }
  mx::array y = one_row ? kernels::matvec(a, b, trans_b, s) : numpy_matmul(ctx, a, trans_b ? mx::transpose(b, s) : b);
  // The scalings and C's addition through the float32 kernels where they fit (kernels/cpu/elementwise.h).
  using kernels::BinaryOp;
  if (alpha != 1.0f) y = kernels::binary(BinaryOp::kMultiply, y, mx::array(alpha, dtype), s);
  if (auto c = ctx.optional_input(2); c && beta != 0.0f) {
    mx::array scaled_c =
        beta == 1.0f ? *c : kernels::binary(BinaryOp::kMultiply, *c, mx::array(beta, dtype), s);
    y = kernels::binary(BinaryOp::kAdd, y, scaled_c, s);
  }
  return {mx::astype(y, dtype, s)};
}

// Einsum: mx::einsum understands the ONNX equation grammar (spaces, implicit
// output, ellipsis, repeated indices). Integer operands go through float64
// on the CPU (exact for |values| < 2^53) and float32 elsewhere, since the
// contraction may use matmul, which takes floats only.
OpOutputs einsum(NodeContext& ctx) {
  auto s = ctx.stream();
  const std::string equation = ctx.attr_string("equation", "");
  if (equation.empty()) throw ctx.error("required attribute 'equation' is missing");
  std::vector<mx::array> operands;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) operands.push_back(ctx.input(i));
  if (operands.empty()) throw ctx.error("Einsum needs at least one input");
  const mx::Dtype dtype = operands[0].dtype();
  if (is_integral(dtype)) {
    bool on_cpu = mx::to_stream(s).device == mx::Device::cpu;
    for (auto& op : operands) op = mx::astype(op, on_cpu ? mx::float64 : mx::float32, s);
  }
  try {
    return {mx::astype(mx::einsum(equation, operands, s), dtype, s)};
  } catch (const std::invalid_argument& e) {
    throw ctx.error("equation '", equation, "': ", e.what());
  }
}

}  // namespace

void register_matmul(OpRegistry& r) {
  r.add({
      {"MatMul", kOnnx, 1, kOpen, matmul},
      // Gemm: v6 drops legacy attrs, v7 numpy broadcast of C, v9/v13 dtypes.
      {"Gemm", kOnnx, 1, 10, gemm},
      {"Gemm", kOnnx, 11, kOpen, gemm},  // C optional
      {"Einsum",
       kOnnx,
       12,
       kOpen,
       einsum,
       {},
       false,  // v28: bfloat16
       "integer operands computed in float64 on CPU, float32 on GPU (exact below 2^53 / 2^24)"},
  });
}

}  // namespace transmuter
