// Operators of transformer-era models: Attention, RMSNormalization,
// RotaryEmbedding, TensorScatter, SwiGLU, LinearAttention,
// CausalConvWithState and FlexAttention (ai.onnx.preview).
// https://onnx.ai/onnx/operators/onnx__Attention.html (and the others)
//
// Everything here composes MLX ops and reads no tensor data on the host, so
// these ops compile whole: KV-cache lengths (nonpad_kv_seqlen), write indices
// and position ids may be traced.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <mlx/fast.h>
#include <mlx/mlx.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_kernel.h"
#include "ops/node_context.h"
#include "ops/onnx/attention_common.h"
#include "ops/registry.h"
#include "ops/vectorized_exp.h"

namespace transmuter {
namespace {

int rank_of(const mx::array& x) { return static_cast<int>(x.ndim()); }

bool is_half(mx::Dtype t) { return t == mx::float16 || t == mx::bfloat16; }

bool is_float(mx::Dtype t) { return is_half(t) || t == mx::float32 || t == mx::float64; }

void require_float(const NodeContext& ctx, const mx::array& x, std::string_view name) {
  if (!is_float(x.dtype())) throw ctx.error(name, " must be a floating-point tensor, got ", x.dtype());
}

mx::array neg_inf(mx::Dtype t) { return mx::array(-std::numeric_limits<float>::infinity(), t); }

// exp(x) for x <= 0 (or -inf), rounded to x's dtype once, as NumPy computes
// a half-precision exp: float32 inputs use the vectorized exp on CPU streams.
mx::array exp_nonpositive(const mx::array& x, mx::StreamOrDevice s) {
  if (x.dtype() == mx::float64) return mx::exp(x, s);
  if (x.dtype() == mx::float32) return exp_upto_88(x, s);
  return mx::astype(exp_upto_88(mx::astype(x, mx::float32, s), s), x.dtype(), s);
}

// Softmax over the last axis in x's dtype, step by step as the ONNX reference
// computes it (exp, sum and divide each rounded to x's dtype: a float32
// accumulation rounded once differs by an ulp in float16). A row that is all
// -inf (fully masked) gives zeros instead of NaN, and its gradient is zero.
mx::array masked_softmax(const mx::array& x, mx::StreamOrDevice s) {
  const mx::Dtype t = x.dtype();
  const mx::array zero = mx::array(0.0f, t), one = mx::array(1.0f, t);
  mx::array row_max = mx::max(x, -1, /*keepdims=*/true, s);
  mx::array safe_max = mx::where(mx::isneginf(row_max, s), zero, mx::stop_gradient(row_max, s), s);
  mx::array e = exp_nonpositive(mx::subtract(x, safe_max, s), s);
  mx::array sum = is_half(t) ? mx::astype(mx::sum(mx::astype(e, mx::float32, s), -1, true, s), t, s)
                             : mx::sum(e, -1, true, s);
  sum = mx::where(mx::equal(sum, zero, s), one, sum, s);
  return mx::divide(e, sum, s);
}

// [B, S, H * D] -> [B, H, S, D].
mx::array split_heads(const NodeContext& ctx, const mx::array& x, int64_t heads, std::string_view name) {
  if (heads <= 0) throw ctx.error(name, ": the number of heads must be positive, got ", heads);
  if (x.shape(2) % heads != 0) {
    throw ctx.error(name, ": hidden size ", x.shape(2), " is not divisible by ", heads, " heads");
  }
  const int h = static_cast<int>(heads);
  mx::array split = mx::reshape(x, {x.shape(0), x.shape(1), h, x.shape(2) / h}, ctx.stream());
  return mx::transpose(split, {0, 2, 1, 3}, ctx.stream());
}

// [B, H, S, D] -> [B, S, H * D].
mx::array merge_heads(const mx::array& x, mx::StreamOrDevice s) {
  mx::array t = mx::transpose(x, {0, 2, 1, 3}, s);
  return mx::reshape(t, {x.shape(0), x.shape(2), x.shape(1) * x.shape(3)}, s);
}

// The dtype a softmax_precision attribute names (TensorProto.DataType).
mx::Dtype precision_dtype(const NodeContext& ctx, int64_t code) {
  switch (code) {
    case 1:
      return mx::float32;
    case 10:
      return mx::float16;
    case 11:
      return mx::float64;
    case 16:
      return mx::bfloat16;
    default:
      throw ctx.error("softmax_precision ", code,
                      " is not one of 1 (float), 10 (float16), 11 (double), 16 (bfloat16)");
  }
}

// --- Attention (v23, v24, v25) ---------------------------------------------------

struct AttentionAttributes {
  std::optional<float> scale;
  bool is_causal;
  int64_t q_num_heads, kv_num_heads;  // 0: not given
  float softcap;
  std::optional<mx::Dtype> softmax_precision;
  int64_t qk_matmul_output_mode;
  int64_t left_window, right_window;  // -1: unbounded (v25)
};

AttentionAttributes attention_attributes(const NodeContext& ctx) {
  AttentionAttributes a;
  if (ctx.has_attr("scale")) a.scale = ctx.attr_float("scale", 0.0f);
  a.is_causal = ctx.attr_int("is_causal", 0) != 0;
  a.q_num_heads = ctx.attr_int("q_num_heads", 0);
  a.kv_num_heads = ctx.attr_int("kv_num_heads", 0);
  a.softcap = ctx.attr_float("softcap", 0.0f);
  if (ctx.has_attr("softmax_precision")) {
    a.softmax_precision = precision_dtype(ctx, ctx.attr_int("softmax_precision", 1));
  }
  a.qk_matmul_output_mode = ctx.attr_int("qk_matmul_output_mode", 0);
  if (a.qk_matmul_output_mode < 0 || a.qk_matmul_output_mode > 3) {
    throw ctx.error("qk_matmul_output_mode must be 0, 1, 2 or 3, got ", a.qk_matmul_output_mode);
  }
  a.left_window = ctx.attr_int("left_window_size", -1);
  a.right_window = ctx.attr_int("right_window_size", -1);
  if (a.left_window < -1 || a.right_window < -1) {
    throw ctx.error("left_window_size and right_window_size must be -1 or nonnegative, got ", a.left_window,
                    " and ", a.right_window);
  }
  if (a.softcap < 0) throw ctx.error("softcap must be nonnegative, got ", a.softcap);
  return a;
}

// Q, K, V as [B, H, S, D], and the cache the op returns.
struct AttentionInputs {
  mx::array q, k, v;  // k and v include the past (they are present_key/value)
  bool three_d;
  int past_length;
};

AttentionInputs attention_inputs(const NodeContext& ctx, const AttentionAttributes& a) {
  auto s = ctx.stream();
  mx::array q = ctx.input(0), k = ctx.input(1), v = ctx.input(2);
  require_float(ctx, q, "Q");
  require_float(ctx, k, "K");
  require_float(ctx, v, "V");
  if (k.dtype() != q.dtype()) throw ctx.error("K has dtype ", k.dtype(), " but Q has ", q.dtype());
  const int rank = rank_of(q);
  if ((rank != 3 && rank != 4) || rank_of(k) != rank || rank_of(v) != rank) {
    throw ctx.error("Q, K and V must all be 3-D or all 4-D, got ranks ", rank, ", ", rank_of(k), ", ",
                    rank_of(v));
  }
  if (rank == 3) {
    if (a.q_num_heads == 0 || a.kv_num_heads == 0) {
      throw ctx.error("3-D Q, K and V need the q_num_heads and kv_num_heads attributes");
    }
    q = split_heads(ctx, q, a.q_num_heads, "Q");
    k = split_heads(ctx, k, a.kv_num_heads, "K");
    v = split_heads(ctx, v, a.kv_num_heads, "V");
  } else if (ctx.node().opset >= 25 && (ctx.has_attr("q_num_heads") || ctx.has_attr("kv_num_heads"))) {
    throw ctx.error("q_num_heads and kv_num_heads must not be given for 4-D inputs");
  }
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0)) {
    throw ctx.error("Q, K and V must have the same batch size, got ", q.shape(0), ", ", k.shape(0), ", ",
                    v.shape(0));
  }
  if (k.shape(1) != v.shape(1) || k.shape(2) != v.shape(2)) {
    throw ctx.error("K ", k.shape(), " and V ", v.shape(), " must have the same heads and sequence length");
  }
  if (k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0) {
    throw ctx.error(q.shape(1), " query heads are not a multiple of ", k.shape(1), " key/value heads");
  }
  if (k.shape(3) != q.shape(3)) {
    throw ctx.error("Q head size ", q.shape(3), " differs from K head size ", k.shape(3));
  }

  const bool has_past_key = ctx.has_input(4), has_past_value = ctx.has_input(5);
  if (has_past_key != has_past_value) throw ctx.error("past_key and past_value must be given together");
  int past_length = 0;
  if (has_past_key) {
    if (ctx.has_input(6)) throw ctx.error("nonpad_kv_seqlen cannot be combined with past_key and past_value");
    const mx::array& past_key = ctx.input(4);
    const mx::array& past_value = ctx.input(5);
    auto check_past = [&](const mx::array& past, const mx::array& now, std::string_view name) {
      if (rank_of(past) != 4 || past.shape(0) != now.shape(0) || past.shape(1) != now.shape(1) ||
          past.shape(3) != now.shape(3)) {
        throw ctx.error(name, " ", past.shape(), " does not fit the new keys/values ", now.shape());
      }
    };
    check_past(past_key, k, "past_key");
    check_past(past_value, v, "past_value");
    past_length = past_key.shape(2);
    k = mx::concatenate({mx::astype(past_key, k.dtype(), s), k}, 2, s);
    v = mx::concatenate({mx::astype(past_value, v.dtype(), s), v}, 2, s);
  }
  return {q, k, v, rank == 3, past_length};
}

// attn_mask with its last axis padded to the total length (the spec allows a
// shorter mask when an external cache is longer): padded keys are masked.
mx::array padded_mask(const NodeContext& ctx, const mx::array& mask, int total) {
  auto s = ctx.stream();
  if (rank_of(mask) < 1 || rank_of(mask) > 4) {
    throw ctx.error("attn_mask must have rank 1 to 4, got ", mask.shape());
  }
  const int have = mask.shape(-1);
  if (have > total) throw ctx.error("attn_mask has ", have, " keys but there are only ", total);
  if (have == total) return mask;
  mx::Shape pad_shape = mask.shape();
  pad_shape.back() = total - have;
  mx::array fill = mask.dtype() == mx::bool_ ? mx::zeros(pad_shape, mx::bool_, s)
                                             : mx::full(pad_shape, neg_inf(mask.dtype()), s);
  return mx::concatenate({mask, fill}, -1, s);
}

// Which keys each query may attend, from is_causal, the v25 window and
// nonpad_kv_seqlen, or nullopt when all. Query i sits at absolute position
// i + offset, offset being the past length, or per batch nonpad_kv_seqlen - L
// for an external cache ([B, 1, L, 1] then).
std::optional<mx::array> structural_allowed(const NodeContext& ctx, const AttentionAttributes& a, int batch,
                                            int query_length, int total, int past_length) {
  auto s = ctx.stream();
  std::optional<mx::array> nonpad;
  if (ctx.has_input(6)) {
    nonpad = ctx.input(6);
    if (rank_of(*nonpad) != 1 || nonpad->shape(0) != batch || !mx::issubdtype(nonpad->dtype(), mx::integer)) {
      throw ctx.error("nonpad_kv_seqlen must be an integer vector of the batch size ", batch, ", got ",
                      nonpad->dtype(), " ", nonpad->shape());
    }
    nonpad = mx::reshape(mx::astype(*nonpad, mx::int64, s), {batch, 1, 1, 1}, s);
  }
  const bool windowed = a.left_window >= 0 || a.right_window >= 0;
  if (!a.is_causal && !windowed && !nonpad) return std::nullopt;

  mx::array key_position = mx::reshape(mx::arange(0, total, mx::int64, s), {1, total}, s);
  mx::array query_position = mx::reshape(mx::arange(0, query_length, mx::int64, s), {query_length, 1}, s);
  if (nonpad) {
    query_position = mx::add(query_position, mx::subtract(*nonpad, mx::array(int64_t{query_length}), s), s);
  } else {
    query_position = mx::add(query_position, mx::array(int64_t{past_length}), s);
  }
  // distance > 0: the key lies before the query.
  mx::array distance = mx::subtract(query_position, key_position, s);
  std::optional<mx::array> allowed;
  auto require = [&](const mx::array& condition) {
    allowed = allowed ? mx::logical_and(*allowed, condition, s) : condition;
  };
  const mx::array zero(int64_t{0});
  if (a.is_causal) require(mx::greater_equal(distance, zero, s));
  if (a.left_window >= 0) require(mx::less_equal(distance, mx::array(a.left_window), s));
  if (a.right_window >= 0) require(mx::less_equal(mx::negative(distance, s), mx::array(a.right_window), s));
  if (nonpad) require(mx::less(key_position, *nonpad, s));
  return allowed;
}

// The additive bias of the scores, [.., L, S] broadcastable to [B, Hq, L, S]:
// 0 where query i may attend key j, -inf where it may not, plus a float
// attn_mask. Absent when nothing masks.
std::optional<mx::array> attention_bias(const NodeContext& ctx, const AttentionAttributes& a,
                                        const AttentionInputs& in) {
  auto s = ctx.stream();
  const mx::Dtype t = in.q.dtype();
  const int total = in.k.shape(2);
  std::optional<mx::array> allowed =
      structural_allowed(ctx, a, in.q.shape(0), in.q.shape(2), total, in.past_length);
  std::optional<mx::array> float_mask;
  if (ctx.has_input(3)) {
    mx::array mask = padded_mask(ctx, ctx.input(3), total);
    if (mask.dtype() == mx::bool_) {
      allowed = allowed ? mx::logical_and(*allowed, mask, s) : mask;
    } else {
      float_mask = mx::astype(mask, t, s);
    }
  }
  if (!allowed) return float_mask;
  return mx::where(*allowed, float_mask ? *float_mask : mx::array(0.0f, t), neg_inf(t), s);
}

// softcap * tanh(x / softcap), in x's dtype.
mx::array soft_capped(const mx::array& x, float softcap, mx::StreamOrDevice s) {
  mx::array cap(softcap, x.dtype());
  return mx::multiply(mx::tanh(mx::divide(x, cap, s), s), cap, s);
}

// The attention kernel (src/kernels/cpu/attention.h) covers float32 on a CPU
// stream with a float or boolean mask and is_causal; softcap, sliding windows,
// nonpad_kv_seqlen, another softmax precision and the qk_matmul_output output
// keep the composition below.
bool attention_kernel_fits(const NodeContext& ctx, const AttentionAttributes& a, const AttentionInputs& in) {
  const bool wants_qk_output = ctx.num_outputs() > 3 && !ctx.node().outputs[3].empty();
  return kernels::is_cpu_stream(ctx.stream()) && in.q.dtype() == mx::float32 && in.v.dtype() == mx::float32 &&
         a.softcap == 0 && a.left_window < 0 && a.right_window < 0 && !ctx.has_input(6) && !wants_qk_output &&
         a.softmax_precision.value_or(mx::float32) == mx::float32;
}

// softmax(Q K^T * scale + mask [causal]) V in one kernel; the mask as an
// additive float32 bias (a boolean mask: 0 where true, -inf where false).
mx::array kernel_attention(const NodeContext& ctx, const AttentionAttributes& a, const AttentionInputs& in) {
  auto s = ctx.stream();
  std::optional<mx::array> bias;
  if (ctx.has_input(3)) {
    mx::array mask = padded_mask(ctx, ctx.input(3), in.k.shape(2));
    bias = mask.dtype() == mx::bool_ ? mx::where(mask, mx::array(0.0f), neg_inf(mx::float32), s)
                                     : mx::astype(mask, mx::float32, s);
  }
  const double scale = a.scale ? double{*a.scale} : 1.0 / std::sqrt(static_cast<double>(in.q.shape(3)));
  const kernels::SoftmaxOptions options{.scale = static_cast<float>(scale),
                                        .causal = a.is_causal,
                                        .causal_offset = in.past_length,
                                        .zero_fully_masked_rows = true};
  return kernels::scaled_dot_product_attention(in.q, in.k, in.v, bias, options, s);
}

// The composed attention, with GQA by grouping query heads instead of copying
// K and V: Q [B, Hkv, G, L, D] against K [B, Hkv, 1, S, D].
OpOutputs attention(NodeContext& ctx) {
  auto s = ctx.stream();
  const AttentionAttributes a = attention_attributes(ctx);
  const AttentionInputs in = attention_inputs(ctx, a);
  if (attention_kernel_fits(ctx, a, in)) {
    mx::array y = kernel_attention(ctx, a, in);
    if (in.three_d) y = merge_heads(y, s);
    return {y, in.k, in.v};
  }
  const mx::Dtype t = in.q.dtype();
  const int batch = in.q.shape(0), q_heads = in.q.shape(1), length = in.q.shape(2);
  const int kv_heads = in.k.shape(1), total = in.k.shape(2);
  const int group = q_heads / kv_heads;

  // The spec scales Q and K by sqrt(scale) each (against overflow), in Q's dtype.
  const double scale = a.scale ? double{*a.scale} : 1.0 / std::sqrt(static_cast<double>(in.q.shape(3)));
  const mx::array root_scale(static_cast<float>(std::sqrt(scale)), t);
  mx::array q =
      mx::reshape(mx::multiply(in.q, root_scale, s), {batch, kv_heads, group, length, in.q.shape(3)}, s);
  mx::array k = mx::expand_dims(mx::multiply(in.k, root_scale, s), 2, s);
  mx::array v = mx::expand_dims(in.v, 2, s);
  mx::array scores =
      mx::reshape(mx::matmul(q, mx::swapaxes(k, -1, -2, s), s), {batch, q_heads, length, total}, s);
  // qk_matmul_output: mode 0 the raw product (as the spec says; the reference
  // implementation returns it soft-capped when softcap is set), 1 after the
  // softcap, 2 with the bias added, 3 the probabilities.
  mx::array qk_output = scores;
  if (a.softcap > 0) {
    scores = soft_capped(scores, a.softcap, s);
    if (a.qk_matmul_output_mode == 1) qk_output = scores;
  }

  std::optional<mx::array> bias = attention_bias(ctx, a, in);
  if (bias) scores = mx::add(scores, *bias, s);
  if (a.qk_matmul_output_mode == 2) qk_output = scores;

  const mx::Dtype softmax_dtype = a.softmax_precision.value_or(t);
  mx::array probs = masked_softmax(mx::astype(scores, softmax_dtype, s), s);
  if (bias) {
    // A row whose bias is all -inf attends nothing: zeros (the spec), decided on
    // the bias so that a +inf score cannot turn the row into NaN.
    mx::array fully_masked = mx::isneginf(mx::max(*bias, -1, /*keepdims=*/true, s), s);
    probs = mx::where(fully_masked, mx::array(0.0f, softmax_dtype), probs, s);
  }
  probs = mx::astype(probs, t, s);
  if (a.qk_matmul_output_mode == 3) qk_output = probs;

  mx::array grouped = mx::reshape(probs, {batch, kv_heads, group, length, total}, s);
  mx::array y =
      mx::reshape(mx::matmul(grouped, mx::astype(v, t, s), s), {batch, q_heads, length, in.v.shape(3)}, s);
  if (in.three_d) y = merge_heads(y, s);
  return {y, in.k, in.v, mx::astype(qk_output, t, s)};
}

// --- RMSNormalization (v23) ---------------------------------------------------------

// Y = X / sqrt(mean(X^2 over axes [axis, rank)) + epsilon) * scale, the
// statistics in float32 for half inputs when stash_type is 1 (the default).
OpOutputs rms_normalization(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& scale = ctx.input(1);
  require_float(ctx, x, "X");
  require_float(ctx, scale, "scale");
  const int rank = rank_of(x);
  if (rank == 0) throw ctx.error("X must have rank >= 1");
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", -1), rank);
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);
  const int64_t stash_type = ctx.attr_int("stash_type", 1);
  if (stash_type != 0 && stash_type != 1) throw ctx.error("stash_type must be 0 or 1, got ", stash_type);
  const mx::Dtype compute = stash_type == 1 && is_half(x.dtype()) ? mx::float32 : x.dtype();

  // fast::rms_norm: last axis, a 1-D weight, float32 accumulation.
  const bool float32_stats = x.dtype() == mx::float32 || compute == mx::float32;
  if (axis == rank - 1 && float32_stats && scale.ndim() == 1 && scale.shape(0) == x.shape(-1) &&
      scale.dtype() == x.dtype()) {
    return {mx::fast::rms_norm(x, scale, epsilon, s)};
  }
  std::vector<int> axes;
  for (int i = axis; i < rank; ++i) axes.push_back(i);
  mx::array xc = mx::astype(x, compute, s);
  mx::array mean_square = mx::mean(mx::square(xc, s), axes, /*keepdims=*/true, s);
  mx::array inv_rms = mx::rsqrt(mx::add(mean_square, mx::array(epsilon, compute), s), s);
  mx::array normalized = mx::astype(mx::multiply(xc, inv_rms, s), x.dtype(), s);
  return {mx::astype(mx::multiply(normalized, scale, s), scale.dtype(), s)};
}

// --- RotaryEmbedding (v23) ----------------------------------------------------------

// cos/sin rows for each token, [B, S, R/2]: gathered by position_ids
// (cache_rows checks or clamps them), or the caches themselves when they are
// already per token.
mx::array rotation_table(const NodeContext& ctx, const mx::array& cache, const std::optional<mx::array>& ids,
                         std::string_view name) {
  if (!ids) {
    if (rank_of(cache) != 3) {
      throw ctx.error(name, " must be 3-D [batch, sequence, dim/2] without position_ids, got ",
                      cache.shape());
    }
    return cache;
  }
  if (rank_of(cache) != 2) {
    throw ctx.error(name, " must be 2-D [positions, dim/2] with position_ids, got ", cache.shape());
  }
  return cache_rows(ctx, cache, *ids, name);
}

// Rotates pairs (x1, x2) of the first rotary_embedding_dim features of each
// head by the token's angle: halves [x1 | x2], or interleaved (x1, x2, x1, ...).
OpOutputs rotary_embedding(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& input = ctx.input(0);
  require_float(ctx, input, "X");
  std::optional<mx::array> ids = ctx.optional_input(3);
  if (ids && (rank_of(*ids) != 2 || !mx::issubdtype(ids->dtype(), mx::integer))) {
    throw ctx.error("position_ids must be a 2-D integer tensor [batch, sequence], got ", ids->dtype(), " ",
                    ids->shape());
  }
  // Work on [B, H, S, D] (4-D input) or [B, S, H, D] (3-D input split into
  // heads); cos/sin [B, S, R/2] get a size-1 axis at head_axis to match.
  const int rank = rank_of(input);
  mx::array x = input;
  int head_axis = 1;
  if (rank == 3) {
    const int64_t heads = ctx.attr_int("num_heads", 0);
    if (heads <= 0) throw ctx.error("a 3-D input needs a positive num_heads attribute, got ", heads);
    if (input.shape(2) % heads != 0) {
      throw ctx.error("hidden size ", input.shape(2), " is not divisible by ", heads, " heads");
    }
    const int h = static_cast<int>(heads);
    x = mx::reshape(input, {input.shape(0), input.shape(1), h, input.shape(2) / h}, s);
    head_axis = 2;
  } else if (rank != 4) {
    throw ctx.error("X must be 3-D or 4-D, got ", input.shape());
  }
  const int batch = x.shape(0), sequence = x.shape(head_axis == 1 ? 2 : 1), head_size = x.shape(3);
  const int64_t dim_attr = ctx.attr_int("rotary_embedding_dim", 0);
  const int64_t dim = dim_attr == 0 ? head_size : dim_attr;
  if (dim < 0 || dim > head_size || dim % 2 != 0) {
    throw ctx.error("rotary_embedding_dim ", dim, " must be even and within the head size ", head_size);
  }
  const int half = static_cast<int>(dim / 2);

  mx::array cos = rotation_table(ctx, ctx.input(1), ids, "cos_cache");
  mx::array sin = rotation_table(ctx, ctx.input(2), ids, "sin_cache");
  for (const mx::array* table : {&cos, &sin}) {
    if (table->shape() != mx::Shape{batch, sequence, half}) {
      throw ctx.error("cos/sin rows have shape ", table->shape(), ", expected [", batch, ", ", sequence, ", ",
                      half, "]");
    }
  }
  cos = mx::astype(mx::expand_dims(cos, head_axis, s), x.dtype(), s);
  sin = mx::astype(mx::expand_dims(sin, head_axis, s), x.dtype(), s);

  const bool interleaved = ctx.attr_int("interleaved", 0) != 0;
  mx::array out = rotate_pairs(x, cos, sin, interleaved, s);
  return {mx::reshape(out, input.shape(), s)};
}

// --- TensorScatter (v24) ------------------------------------------------------------

// Writes update[b, .., k, ..] to cache position write_indices[b] + k along
// `axis` (mod the cache length in circular mode). Composed as a select over
// the cache: position p takes update index p - write_indices[b] when that lies
// in [0, sequence_length); writes past the end in linear mode are dropped.
OpOutputs tensor_scatter(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& cache = ctx.input(0);
  const mx::array& update = ctx.input(1);
  const int rank = rank_of(cache);
  if (rank < 2) throw ctx.error("past_cache must have rank >= 2, got ", cache.shape());
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", -2), rank);
  if (axis == 0) throw ctx.error("axis must not be 0 (the batch axis)");
  const std::string mode = ctx.attr_string("mode", "linear");
  if (mode != "linear" && mode != "circular") {
    throw ctx.error("mode must be 'linear' or 'circular', got '", mode, "'");
  }
  if (rank_of(update) != rank || update.dtype() != cache.dtype()) {
    throw ctx.error("update ", update.dtype(), " ", update.shape(), " does not match past_cache ",
                    cache.dtype(), " ", cache.shape());
  }
  for (int i = 0; i < rank; ++i) {
    if (i == axis ? update.shape(i) > cache.shape(i) : update.shape(i) != cache.shape(i)) {
      throw ctx.error("update ", update.shape(), " does not fit past_cache ", cache.shape(), " along axis ",
                      i);
    }
  }
  const int capacity = cache.shape(axis), length = update.shape(axis), batch = cache.shape(0);
  if (length == 0) return {cache};

  mx::Shape batch_shape(rank, 1), axis_shape(rank, 1);
  batch_shape[0] = batch;
  axis_shape[axis] = capacity;
  mx::array start = mx::zeros(batch_shape, mx::int64, s);
  if (ctx.has_input(2)) {
    const mx::array& indices = ctx.input(2);
    if (rank_of(indices) != 1 || indices.shape(0) != batch || !mx::issubdtype(indices.dtype(), mx::integer)) {
      throw ctx.error("write_indices must be an integer vector of the batch size ", batch, ", got ",
                      indices.dtype(), " ", indices.shape());
    }
    start = mx::reshape(mx::astype(indices, mx::int64, s), batch_shape, s);
  }
  mx::array position = mx::reshape(mx::arange(0, capacity, mx::int64, s), axis_shape, s);
  mx::array source = mx::subtract(position, start, s);  // [B, 1.., capacity, 1..]
  if (mode == "circular") source = mx::remainder(source, mx::array(int64_t{capacity}), s);
  mx::array written = mx::logical_and(mx::greater_equal(source, mx::array(int64_t{0}), s),
                                      mx::less(source, mx::array(int64_t{length}), s), s);
  mx::array clamped = mx::clip(source, mx::array(int64_t{0}), mx::array(int64_t{length} - 1), s);
  mx::Shape index_shape = update.shape();
  index_shape[axis] = capacity;
  mx::array gathered = mx::take_along_axis(update, mx::broadcast_to(clamped, index_shape, s), axis, s);
  return {mx::where(written, gathered, cache, s)};
}

// --- SwiGLU (v28) -------------------------------------------------------------------

// Y = A * sigmoid(alpha * A) * B, elementwise on equal shapes.
OpOutputs swiglu(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& gate = ctx.input(0);
  const mx::array& value = ctx.input(1);
  require_float(ctx, gate, "A");
  if (gate.shape() != value.shape() || gate.dtype() != value.dtype()) {
    throw ctx.error("A ", gate.dtype(), " ", gate.shape(), " and B ", value.dtype(), " ", value.shape(),
                    " must have the same shape and dtype");
  }
  const mx::array alpha(ctx.attr_float("alpha", 1.0f), gate.dtype());
  mx::array swish = mx::multiply(gate, mx::sigmoid(mx::multiply(alpha, gate, s), s), s);
  return {mx::multiply(swish, value, s)};
}

// --- LinearAttention (v27) ----------------------------------------------------------

// [B, T, H * D] -> [B, H, T, D] in float32.
mx::array heads_float32(const NodeContext& ctx, const mx::array& x, int64_t heads, std::string_view name) {
  if (rank_of(x) != 3) throw ctx.error(name, " must be 3-D [batch, time, heads * dim], got ", x.shape());
  return mx::astype(split_heads(ctx, x, heads, name), mx::float32, ctx.stream());
}

// Time step t of [B, H, T, D]: [B, H, D].
mx::array step(const mx::array& x, int t, mx::StreamOrDevice s) {
  mx::Shape start = {0, 0, t, 0}, stop = x.shape();
  stop[2] = t + 1;
  return mx::squeeze(mx::slice(x, start, stop, s), 2, s);
}

// The recurrence of the spec, one time step after another in float32:
//   S *= exp(g_t)                          (gated rules)
//   v_t = beta_t * (v_t - S^T k_t)         (delta rules)
//   S += k_t v_t^T;  o_t = scale * S^T q_t (query heads grouped over kv heads)
// A prefill of T tokens unrolls T steps into the graph; the chunk-parallel
// form that the chunk_size hint names is not implemented (same results).
OpOutputs linear_attention(NodeContext& ctx) {
  auto s = ctx.stream();
  const std::string rule = ctx.attr_string("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta") {
    throw ctx.error("update_rule must be linear, gated, delta or gated_delta, got '", rule, "'");
  }
  const bool gated = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  const int64_t q_heads = ctx.required_int("q_num_heads"), kv_heads = ctx.required_int("kv_num_heads");
  if (q_heads <= 0 || kv_heads <= 0 || q_heads % kv_heads != 0) {
    throw ctx.error("q_num_heads ", q_heads, " must be a positive multiple of kv_num_heads ", kv_heads);
  }
  if (gated != ctx.has_input(4)) {
    throw ctx.error("update_rule '", rule, "' ", gated ? "needs" : "forbids", " the decay input");
  }
  if (delta != ctx.has_input(5)) {
    throw ctx.error("update_rule '", rule, "' ", delta ? "needs" : "forbids", " the beta input");
  }

  const mx::array& query = ctx.input(0);
  require_float(ctx, query, "query");
  mx::array q = heads_float32(ctx, query, q_heads, "query");
  mx::array k = heads_float32(ctx, ctx.input(1), kv_heads, "key");
  mx::array v = heads_float32(ctx, ctx.input(2), kv_heads, "value");
  const int batch = q.shape(0), time = q.shape(2), d_k = q.shape(3), d_v = v.shape(3);
  const int kvh = static_cast<int>(kv_heads), group = static_cast<int>(q_heads / kv_heads);
  if (k.shape(0) != batch || v.shape(0) != batch || k.shape(2) != time || v.shape(2) != time ||
      k.shape(3) != d_k) {
    throw ctx.error("query ", query.shape(), ", key ", ctx.input(1).shape(), " and value ",
                    ctx.input(2).shape(), " do not agree on batch, time and key dim");
  }

  // Per-step gates as [B, Hkv, T, 1] or [B, Hkv, T, d_k] (decay) and
  // [B, Hkv or 1, T, 1] (beta).
  auto per_head = [&](size_t i, std::string_view name, std::vector<int> widths) {
    const mx::array& g = ctx.input(i);
    if (rank_of(g) != 3 || g.shape(0) != batch || g.shape(1) != time) {
      throw ctx.error(name, " must be [batch, time, ..], got ", g.shape());
    }
    const int last = g.shape(2);
    const int heads = last == 1 ? 1 : kvh;
    const int width = last / heads;
    if (std::find(widths.begin(), widths.end(), last) == widths.end()) {
      throw ctx.error(name, " has last dim ", last, ", not one of the allowed sizes for ", kvh, " heads");
    }
    mx::array split = mx::reshape(mx::astype(g, mx::float32, s), {batch, time, heads, width}, s);
    return mx::transpose(split, {0, 2, 1, 3}, s);
  };
  std::optional<mx::array> decay, beta;
  if (gated) decay = mx::exp(per_head(4, "decay", {kvh, kvh * d_k}), s);  // log-space gate -> factor
  if (delta) beta = per_head(5, "beta", {kvh, 1});

  mx::Dtype state_dtype = query.dtype();
  mx::array state = mx::zeros({batch, kvh, d_k, d_v}, mx::float32, s);
  if (ctx.has_input(3)) {
    const mx::array& past = ctx.input(3);
    require_float(ctx, past, "past_state");
    if (past.shape() != state.shape()) {
      throw ctx.error("past_state ", past.shape(), " must be ", state.shape());
    }
    state_dtype = past.dtype();
    state = mx::astype(past, mx::float32, s);
  }
  const float scale_attr = ctx.attr_float("scale", 0.0f);
  const mx::array scale(scale_attr != 0.0f ? scale_attr : 1.0f / std::sqrt(static_cast<float>(d_k)));

  std::vector<mx::array> outputs;
  for (int t = 0; t < time; ++t) {
    mx::array k_t = step(k, t, s), v_t = step(v, t, s);  // [B, Hkv, d]
    if (decay) state = mx::multiply(state, mx::expand_dims(step(*decay, t, s), -1, s), s);
    if (beta) {
      mx::array retrieved = mx::squeeze(mx::matmul(mx::expand_dims(k_t, 2, s), state, s), 2, s);
      v_t = mx::multiply(step(*beta, t, s), mx::subtract(v_t, retrieved, s), s);
    }
    state = mx::add(state, mx::multiply(mx::expand_dims(k_t, -1, s), mx::expand_dims(v_t, 2, s), s), s);
    mx::array q_t = mx::reshape(step(q, t, s), {batch, kvh, group, d_k}, s);
    mx::array o_t = mx::multiply(scale, mx::matmul(q_t, state, s), s);  // [B, Hkv, G, d_v]
    outputs.push_back(mx::reshape(o_t, {batch, 1, kvh * group * d_v}, s));
  }
  mx::array output =
      time == 0 ? mx::zeros({batch, 0, kvh * group * d_v}, mx::float32, s) : mx::concatenate(outputs, 1, s);
  return {mx::astype(output, query.dtype(), s), mx::astype(state, state_dtype, s)};
}

// --- CausalConvWithState (v27; com.microsoft v1) ---------------------------------------

// Depthwise causal conv1d over [B, C, L] with kernel [C, 1, k] and tap spacing `dilation`: the input is
// preceded by past_state (or (k - 1) * dilation zeros); the last (k - 1) * dilation columns of that
// padded sequence are the new state. Accumulates in float32. com.microsoft's version adds `dilation`,
// `channels_last` (input [B, L, d1..dn] and state [B, pad, d1..dn], channels = d1 * ... * dn, weight and
// bias channels-first), `ndim` and `state_window`; like ORT's CPU kernel this takes ndim 1 and
// state_window 0 (the window is for CUDA's speculative decoding).
OpOutputs causal_conv_with_state(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& given = ctx.input(0);
  const mx::array& weight = ctx.input(1);
  require_float(ctx, given, "input");
  const std::string activation = ctx.attr_string("activation", "none");
  if (activation != "none" && activation != "silu" && activation != "swish") {
    throw ctx.error("activation must be none, silu or swish, got '", activation, "'");
  }
  if (const int64_t ndim = ctx.attr_int("ndim", 1); ndim != 1) {
    throw ctx.error("ndim ", ndim, " is not supported (1 is; ONNX Runtime's CPU kernel takes 1 alone)");
  }
  if (const int64_t window = ctx.attr_int("state_window", 0); window != 0) {
    throw ctx.error("state_window ", window, " is not supported (0 is; ONNX Runtime runs it on CUDA only)");
  }
  const int64_t dilation_attr = ctx.attr_int("dilation", 1);
  if (dilation_attr < 1 || dilation_attr > (1 << 20))
    throw ctx.error("dilation must be >= 1, got ", dilation_attr);
  const int dilation = static_cast<int>(dilation_attr);
  const bool channels_last = ctx.attr_int("channels_last", 0) != 0;

  // The channels-first [B, C, L] view of the input.
  mx::array input = given;
  if (channels_last) {
    if (rank_of(given) < 3)
      throw ctx.error("channels_last input must be [batch, length, d1, ...], got ", given.shape());
    const mx::Shape& shape = given.shape();
    const int flat =
        static_cast<int>(std::accumulate(shape.begin() + 2, shape.end(), int64_t{1}, std::multiplies<>()));
    input = mx::transpose(mx::reshape(given, {shape[0], shape[1], flat}, s), {0, 2, 1}, s);
  } else if (rank_of(given) != 3) {
    throw ctx.error("input must be [batch, channels, length], got ", given.shape());
  }
  const int batch = input.shape(0), channels = input.shape(1), length = input.shape(2);
  if (rank_of(weight) != 3 || weight.shape(0) != channels || weight.shape(1) != 1 || weight.shape(2) < 1) {
    throw ctx.error("weight must be [", channels, ", 1, k] with k >= 1, got ", weight.shape());
  }
  const int kernel = weight.shape(2);
  const int64_t pad64 = int64_t{kernel - 1} * dilation;
  if (pad64 > (1 << 24)) throw ctx.error("(k - 1) * dilation = ", pad64, " is too large");
  const int pad = static_cast<int>(pad64);
  // The state's shape as the caller sees it, and its channels-first view.
  mx::Shape state_shape = {batch, channels, pad};
  if (channels_last) {
    state_shape = given.shape();
    state_shape[1] = pad;
  }
  mx::array past = mx::zeros({batch, channels, pad}, input.dtype(), s);
  if (ctx.has_input(3)) {
    const mx::array& given_past = ctx.input(3);
    if (given_past.shape() != state_shape) {
      throw ctx.error("past_state must be ", state_shape, ", got ", given_past.shape());
    }
    past = mx::astype(given_past, input.dtype(), s);
    if (channels_last) past = mx::transpose(mx::reshape(past, {batch, pad, channels}, s), {0, 2, 1}, s);
  }
  mx::array padded = mx::concatenate({past, input}, 2, s);
  mx::array wide = mx::astype(padded, mx::float32, s);
  mx::array w = mx::astype(weight, mx::float32, s);
  mx::array out = mx::zeros({batch, channels, length}, mx::float32, s);
  for (int j = 0; j < kernel; ++j) {
    mx::array tap = mx::reshape(mx::slice(w, {0, 0, j}, {channels, 1, j + 1}, s), {1, channels, 1}, s);
    mx::array window = mx::slice(wide, {0, 0, j * dilation}, {batch, channels, j * dilation + length}, s);
    out = mx::add(out, mx::multiply(window, tap, s), s);
  }
  if (ctx.has_input(2)) {
    const mx::array& bias = ctx.input(2);
    if (bias.shape() != mx::Shape{channels}) {
      throw ctx.error("bias must be [", channels, "], got ", bias.shape());
    }
    out = mx::add(out, mx::reshape(mx::astype(bias, mx::float32, s), {1, channels, 1}, s), s);
  }
  if (activation != "none") out = mx::multiply(out, mx::sigmoid(out, s), s);
  out = mx::astype(out, input.dtype(), s);
  const int padded_length = padded.shape(2);
  mx::array state = mx::slice(padded, {0, 0, padded_length - pad}, {batch, channels, padded_length}, s);
  if (channels_last) {
    out = mx::reshape(mx::transpose(out, {0, 2, 1}, s), given.shape(), s);
    state = mx::reshape(mx::transpose(state, {0, 2, 1}, s), state_shape, s);
  }
  return {out, state};
}

// --- FlexAttention (ai.onnx.preview v1) ---------------------------------------------

// Runs a score_mod / prob_mod body: one [B, Hq, L, S] tensor in, one of the
// same shape out, cast back to the softmax dtype.
mx::array modified(NodeContext& ctx, std::string_view name, const mx::array& x) {
  std::vector<Value> outputs = ctx.run_subgraph(ctx.attr_graph(name), {Value(x)});
  if (outputs.size() != 1 || !outputs[0].is_tensor() || outputs[0].tensor().shape() != x.shape()) {
    throw ctx.error(name, " must return one tensor of shape ", x.shape());
  }
  return mx::astype(outputs[0].tensor(), x.dtype(), ctx.stream());
}

// Attention whose scores and probabilities pass through optional subgraphs:
// softmax(score_mod(Q K^T * scale)) then prob_mod, times V. The softmax and
// the last matmul run in softmax_precision (default float32, float64 for
// double inputs).
OpOutputs flex_attention(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array &q = ctx.input(0), &k = ctx.input(1), &v = ctx.input(2);
  require_float(ctx, q, "Q");
  if (rank_of(q) != 4 || rank_of(k) != 4 || rank_of(v) != 4) {
    throw ctx.error("Q, K and V must be 4-D, got ", q.shape(), ", ", k.shape(), ", ", v.shape());
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    throw ctx.error("Q, K and V must have the same dtype");
  }
  const int batch = q.shape(0), q_heads = q.shape(1), length = q.shape(2), head_size = q.shape(3);
  const int kv_heads = k.shape(1), total = k.shape(2);
  if (k.shape(0) != batch || v.shape(0) != batch || v.shape(1) != kv_heads || v.shape(2) != total ||
      k.shape(3) != head_size || kv_heads == 0 || q_heads % kv_heads != 0) {
    throw ctx.error("K ", k.shape(), " and V ", v.shape(), " do not fit Q ", q.shape());
  }
  const int group = q_heads / kv_heads;
  const mx::Dtype compute = ctx.has_attr("softmax_precision")
                                ? precision_dtype(ctx, ctx.attr_int("softmax_precision", 1))
                                : (q.dtype() == mx::float64 ? mx::float64 : mx::float32);
  const float scale = ctx.attr_float("scale", 1.0f / std::sqrt(static_cast<float>(head_size)));
  const mx::array root_scale(std::sqrt(scale), q.dtype());

  mx::array qg = mx::reshape(mx::multiply(q, root_scale, s), {batch, kv_heads, group, length, head_size}, s);
  mx::array kg = mx::expand_dims(mx::multiply(k, root_scale, s), 2, s);
  mx::array scores =
      mx::reshape(mx::matmul(qg, mx::swapaxes(kg, -1, -2, s), s), {batch, q_heads, length, total}, s);
  scores = mx::astype(scores, compute, s);
  if (ctx.has_attr("score_mod")) scores = modified(ctx, "score_mod", scores);
  mx::array probs = masked_softmax(scores, s);
  if (ctx.has_attr("prob_mod")) probs = modified(ctx, "prob_mod", probs);
  mx::array grouped = mx::reshape(probs, {batch, kv_heads, group, length, total}, s);
  mx::array vg = mx::expand_dims(mx::astype(v, compute, s), 2, s);
  mx::array y = mx::reshape(mx::matmul(grouped, vg, s), {batch, q_heads, length, v.shape(3)}, s);
  return {mx::astype(y, v.dtype(), s)};
}

}  // namespace

void register_attention(OpRegistry& registry) {
  registry.add({
      {.op_type = "Attention", .domain = kOnnx, .since = 23, .until = 23, .fn = attention},
      // v24: nonpad_kv_seqlen (external KV cache).
      {.op_type = "Attention", .domain = kOnnx, .since = 24, .until = 24, .fn = attention},
      // v25: left_window_size / right_window_size.
      {.op_type = "Attention", .domain = kOnnx, .since = 25, .until = kOpen, .fn = attention},
      {.op_type = "RMSNormalization", .domain = kOnnx, .since = 23, .until = kOpen, .fn = rms_normalization},
      {.op_type = "RotaryEmbedding", .domain = kOnnx, .since = 23, .until = kOpen, .fn = rotary_embedding},
      {.op_type = "TensorScatter",
       .domain = kOnnx,
       .since = 24,
       .until = kOpen,
       .fn = tensor_scatter,
       .restrictions = "no string tensors"},
      {.op_type = "SwiGLU", .domain = kOnnx, .since = 28, .until = kOpen, .fn = swiglu},
      {.op_type = "LinearAttention", .domain = kOnnx, .since = 27, .until = kOpen, .fn = linear_attention},
      {.op_type = "CausalConvWithState",
       .domain = kOnnx,
       .since = 27,
       .until = kOpen,
       .fn = causal_conv_with_state},
      // onnxruntime-genai's LFM2, Qwen3.5 and Mamba builds; adds dilation, channels_last, ndim, state_window.
      {.op_type = "CausalConvWithState",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = causal_conv_with_state,
       .restrictions = "ndim 1, state_window 0 (as ONNX Runtime's CPU kernel)"},
      {.op_type = "FlexAttention",
       .domain = "ai.onnx.preview",
       .since = 1,
       .until = kOpen,
       .fn = flex_attention},
  });
}

}  // namespace transmuter
