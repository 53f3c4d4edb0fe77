// Elementwise arithmetic, comparison and logic operators.
// https://onnx.ai/onnx/operators/ (Add, Sub, Mul, Div, ...)
#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// Before opset 7, binary ops broadcast only when `broadcast=1`, aligning B to
// A starting at `axis` (default: trailing alignment, like numpy).
mx::array legacy_broadcast(const NodeContext& ctx, const mx::array& a, mx::array b) {
  if (ctx.attr_int("broadcast", 0) == 0 || !ctx.has_attr("axis")) return b;
  int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), a.ndim());
  mx::Shape shape = b.shape();
  for (int i = axis + static_cast<int>(b.ndim()); i < static_cast<int>(a.ndim()); ++i) shape.push_back(1);
  return mx::reshape(b, shape, ctx.stream());
}

template <mx::array (*Fn)(const mx::array&, const mx::array&, mx::StreamOrDevice)>
OpOutputs binary(NodeContext& ctx) {
  const mx::array& a = ctx.input(0);
  mx::array b = ctx.opset() < 7 ? legacy_broadcast(ctx, a, ctx.input(1)) : ctx.input(1);
  return {Fn(a, b, ctx.stream())};
}

}  // namespace

void register_elementwise(OpRegistry& r) {
  r.add({
      {"Add", kOnnx, 1, 6, binary<mx::add>},
      {"Add", kOnnx, 7, kOpen, binary<mx::add>},
  });
}

}  // namespace transmuter
