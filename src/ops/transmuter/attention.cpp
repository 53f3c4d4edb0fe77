// Transmuter's own operators (domain "ai.transmuter"): nodes that load-time
// passes put in place of a subgraph, never found in exported files.
//
// ScaledDotProductAttention (since 1), made by src/passes/fuse_attention.cpp:
//
//   Y = Softmax(MatMul(Q, K^T) * scale [+ mask], axis = -1) . V
//
//   Q [..., Sq, D], K [..., Sk, D], V [..., Sk, Dv] with MatMul's broadcasting
//   of the leading axes; mask (optional) broadcast against the scores
//   [..., Sq, Sk]; attribute scale (float, default 1). A row whose scores are
//   all -inf gives NaN, as Softmax does.
#include <optional>
#include <string_view>

#include <mlx/mlx.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_kernel.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

bool is_float(mx::Dtype t) { return t == mx::float16 || t == mx::bfloat16 || t == mx::float32 || t == mx::float64; }

// The 4-D, one-key-head-per-query-head float32 case the kernel takes on a CPU
// stream (the kernel itself checks the mask and falls back when it does not fit).
bool kernel_fits(const NodeContext& ctx, const mx::array& q, const mx::array& k, const mx::array& v) {
  if (!kernels::is_cpu_stream(ctx.stream())) return false;
  for (const mx::array* t : {&q, &k, &v}) {
    if (t->dtype() != mx::float32 || t->ndim() != 4) return false;
  }
  return k.shape(0) == q.shape(0) && k.shape(1) == q.shape(1) && v.shape(0) == q.shape(0) &&
         v.shape(1) == q.shape(1);
}

OpOutputs scaled_dot_product_attention(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array &q = ctx.input(0), &k = ctx.input(1), &v = ctx.input(2);
  for (const auto& [t, name] : {std::pair{&q, "Q"}, std::pair{&k, "K"}, std::pair{&v, "V"}}) {
    if (!is_float(t->dtype()) || t->ndim() < 2) {
      throw ctx.error(name, " must be a floating-point tensor of rank >= 2, got ", t->dtype(), " ", t->shape());
    }
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    throw ctx.error("Q, K and V must have one dtype, got ", q.dtype(), ", ", k.dtype(), ", ", v.dtype());
  }
  std::optional<mx::array> mask = ctx.optional_input(3);
  const float scale = ctx.attr_float("scale", 1.0f);
  if (kernel_fits(ctx, q, k, v)) {
    return {kernels::scaled_dot_product_attention(q, k, v, mask, {.scale = scale}, s)};
  }
  // The unfused ops' math for every other case (shapes are checked by matmul).
  mx::array scores = mx::matmul(q, mx::swapaxes(k, -1, -2, s), s);
  if (scale != 1.0f) scores = mx::multiply(scores, mx::array(scale, scores.dtype()), s);
  if (mask) scores = mx::add(scores, *mask, s);
  mx::array probs = mx::softmax(scores, -1, /*precise=*/true, s);
  return {mx::matmul(probs, v, s)};
}

}  // namespace

void register_transmuter_attention(OpRegistry& r) {
  r.add({
      {"ScaledDotProductAttention", kTransmuter, 1, kOpen, scaled_dot_product_attention},
  });
}

}  // namespace transmuter
