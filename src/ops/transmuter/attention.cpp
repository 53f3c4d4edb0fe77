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
//
//   Inputs 4 and 5 (optional, both or neither): Kkv [B, Hkv, Sk, D] and Vkv,
//   the key/value heads that K and V repeat (transformers' repeat_kv, matched
//   by fuse_attention). When K is [B, Hkv * r, Sk, D] and V likewise, the CPU
//   kernel reads Kkv and Vkv with query head h on key/value head h / r, and
//   K and V are never computed.
//
//   Inputs 6 and 7 (optional, both or neither, with 4 and 5): rows appended to
//   Kkv and Vkv along axis 2 (fuse_attention's match of a Concat(past, new)
//   feeding the repeat): the key/value heads are Concat(Kkv, input 6) and
//   Concat(Vkv, input 7), which the CPU kernel reads in place, so the
//   concatenation (a copy of the whole past in a decode step) is not made
//   either. Without a repeat (as many key/value heads as query heads), K and V
//   are those concatenations themselves.
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

// Kkv, Vkv (of shape `grouped`) hold the heads that K, V repeat: same batch and
// trailing axes, K's heads a multiple of theirs (the pass matched the repeat;
// the shapes confirm it).
bool repeats_heads_of(const mx::array& repeated, const mx::Shape& grouped, mx::Dtype grouped_dtype) {
  return repeated.ndim() == 4 && grouped.size() == 4 && repeated.shape(0) == grouped[0] &&
         repeated.shape(2) == grouped[2] && repeated.shape(3) == grouped[3] && grouped[1] > 0 &&
         repeated.shape(1) % grouped[1] == 0 && repeated.dtype() == grouped_dtype;
}

// `rows` appended to `grouped` along axis 2: the same batch, heads, trailing axis and dtype.
bool appends_to(const mx::array& grouped, const mx::array& rows) {
  return rows.ndim() == 4 && rows.shape(0) == grouped.shape(0) && rows.shape(1) == grouped.shape(1) &&
         rows.shape(3) == grouped.shape(3) && rows.dtype() == grouped.dtype();
}

// Kkv (and Vkv) with the rows appended to them, when given: the shape the repeat reads.
mx::Shape joined_shape(const mx::array& grouped, const std::optional<mx::array>& appended) {
  mx::Shape shape = grouped.shape();
  if (appended && shape.size() == 4 && appended->ndim() == 4) shape[2] += appended->shape(2);
  return shape;
}

// The kernel on Kkv and Vkv (and the rows appended to them): the query heads are K's, which are a
// multiple of Kkv's.
bool grouped_kernel_fits(const NodeContext& ctx, const mx::array& q, const mx::array& k, const mx::array& v,
                         const mx::array& k_kv, const mx::array& v_kv, const std::optional<mx::array>& k_more,
                         const std::optional<mx::array>& v_more) {
  if (!kernels::is_cpu_stream(ctx.stream()) || q.ndim() != 4 || q.dtype() != mx::float32) return false;
  if (k_more.has_value() != v_more.has_value()) return false;
  if (k_more && (!appends_to(k_kv, *k_more) || !appends_to(v_kv, *v_more) || k_more->shape(2) != v_more->shape(2)))
    return false;
  return k.ndim() == 4 && v.ndim() == 4 && k.shape(1) == q.shape(1) && v.shape(1) == q.shape(1) &&
         k.shape(0) == q.shape(0) && v.shape(0) == q.shape(0) &&
         repeats_heads_of(k, joined_shape(k_kv, k_more), k_kv.dtype()) &&
         repeats_heads_of(v, joined_shape(v_kv, v_more), v_kv.dtype()) && k_kv.shape(1) == v_kv.shape(1);
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
  std::optional<mx::array> k_kv = ctx.optional_input(4), v_kv = ctx.optional_input(5);
  std::optional<mx::array> k_more = ctx.optional_input(6), v_more = ctx.optional_input(7);
  if (k_kv && v_kv && grouped_kernel_fits(ctx, q, k, v, *k_kv, *v_kv, k_more, v_more)) {
    if (k_more)
      return {kernels::scaled_dot_product_attention(q, {*k_kv, *v_kv}, {*k_more, *v_more}, mask, {.scale = scale}, s)};
    return {kernels::scaled_dot_product_attention(q, *k_kv, *v_kv, mask, {.scale = scale}, s)};
  }
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
