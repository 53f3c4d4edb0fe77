// ONNX Runtime's FusedMatMul contrib operator (domain com.microsoft, version 1):
// a MatMul with its operands' transposes and a scale folded in, what ONNX
// Runtime's optimizer fuses Transpose -> MatMul -> Mul into.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//   FusedMatMul(A, B) = alpha * matmul(A', B')   (numpy matmul semantics)
// A' of A with rank r >= 2:
//   transBatchA  moves A's first axis behind its batch axes:
//                [d0, d1, ..., d(r-2), d(r-1)] -> [d1, ..., d(r-2), d0, d(r-1)]
//   transA       then swaps the last two axes
// and the same for B with transBatchB, transB. A 1-D operand is never
// transposed (numpy promotes it to a matrix).
#include <algorithm>
#include <numeric>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/onnx/matmul.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

mx::array transposed_operand(const mx::array& x, bool trans_batch, bool trans, mx::StreamOrDevice s) {
  const int rank = static_cast<int>(x.ndim());
  if (rank < 2 || (!trans_batch && !trans)) return x;
  std::vector<int> axes(rank);
  std::iota(axes.begin(), axes.end(), 0);
  if (trans_batch) {
    // [0, 1, ..., r-2, r-1] -> [1, ..., r-2, 0, r-1]
    std::rotate(axes.begin(), axes.begin() + 1, axes.end() - 1);
  }
  if (trans) std::swap(axes[rank - 2], axes[rank - 1]);
  return mx::transpose(x, axes, s);
}

OpOutputs fused_matmul(NodeContext& ctx) {
  const auto s = ctx.stream();
  const mx::array& a = ctx.input(0);
  const mx::array& b = ctx.input(1);
  if (!mx::issubdtype(a.dtype(), mx::floating)) throw ctx.error("A must be a float tensor, got ", a.dtype());
  mx::array y = numpy_matmul(
      ctx, transposed_operand(a, ctx.attr_int("transBatchA", 0) != 0, ctx.attr_int("transA", 0) != 0, s),
      transposed_operand(b, ctx.attr_int("transBatchB", 0) != 0, ctx.attr_int("transB", 0) != 0, s));
  const float alpha = ctx.attr_float("alpha", 1.0f);
  if (alpha != 1.0f) y = mx::multiply(y, mx::array(alpha, y.dtype()), s);
  return {y};
}

}  // namespace

void register_microsoft_matmul(OpRegistry& r) {
  r.add({
      {"FusedMatMul", kMicrosoft, 1, kOpen, fused_matmul},
  });
}

}  // namespace transmuter
