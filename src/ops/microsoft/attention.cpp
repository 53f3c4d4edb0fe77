// ONNX Runtime's attention contrib operators (domain com.microsoft, version 1):
// Attention, MultiHeadAttention, GroupQueryAttention (RotaryEmbedding is in
// rotary_embedding.cpp). ONNX Runtime's transformer optimizer fuses BERT, GPT-2
// and Llama-style blocks into them.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//
// All three, per head (B batch, N heads, S queries, P past keys, T = P + L keys):
//   scores = scale * Q K^T + bias             scale default 1/sqrt(head_size)
//   output = softmax(scores) V                [B, S, N * H_v]
//
// Attention: Q|K|V = input W + b, split at qkv_hidden_sizes; past [2, B, N, P, H]
//   is prepended to K and V, present = [K; V]. MultiHeadAttention: Q, K, V given
//   ([B, S, D], packed [B, S, N, 3, H] / [B, L, N, 2, H], or K, V already
//   [B, N, L, H]), bias added, past_key/past_value prepended. Their bias is the
//   one of ONNX Runtime's CPU kernel: mask_filter_value (default -10000) where
//   the mask hides a key, the lowest float where unidirectional hides it (key
//   j > query i + P), plus attention_bias [B|1, N|1, S, T]. mask_index /
//   key_padding_mask: [B] key lengths, [2B] Attention's end then start positions,
//   [3B+2] (only its first B, key lengths, are read on CPU), [B, T] or
//   [B, S, T] 0/1, Attention's [B, 1, M, M] rows P..P+S and columns 0..T.
//
// GroupQueryAttention: Kv <= N key/value heads (query head h reads kv head
//   h / (N / Kv)); per batch b, T_b = seqlens_k[b] + 1 valid keys and the new
//   tokens sit at P_b = T_b - S (0 on the first prompt, S = total_sequence_length).
//   Optional rotary embedding of Q and K at positions P_b + i (position_ids when
//   given), present = past[.., :P_b] ++ K ++ zeros, of length
//   max(past length, total_sequence_length). Key j is seen by query i when
//   j < T_b and, causal, j <= P_b + i and, with local_window_size W,
//   j > P_b + i - W. scores are soft-capped (softcap * tanh(scores / softcap))
//   before attention_bias is added; head_sink adds exp(sink_h) to the softmax
//   denominator, smooth_softmax (when there is no head_sink) exp(0).
//
// float16/bfloat16 are computed in float32 and rounded once. The float32
// attention runs the fused CPU kernel (src/kernels/cpu/attention.h) unless
// softcap, a sink or the qk output needs the scores (then the composition).
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/attention.h"
#include "ops/node_context.h"
#include "ops/onnx/attention_common.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

constexpr float kLowest = std::numeric_limits<float>::lowest();

bool is_attention_float(mx::Dtype t) { return t == mx::float32 || t == mx::float16 || t == mx::bfloat16; }

void require_float(const NodeContext& ctx, const mx::array& x, std::string_view name, mx::Dtype like) {
  if (!is_attention_float(x.dtype())) {
    throw ctx.error(name, " must be float32, float16 or bfloat16, got ", x.dtype());
  }
  if (x.dtype() != like) throw ctx.error(name, " has dtype ", x.dtype(), " but the query has ", like);
}

// Input i, which the operator requires; named in the error when it is missing.
const mx::array& required_input(const NodeContext& ctx, size_t i, std::string_view name) {
  if (!ctx.has_input(i)) throw ctx.error(name, " (input ", i, ") is required");
  return ctx.input(i);
}

mx::array f32(const mx::array& x, mx::StreamOrDevice s) { return mx::astype(x, mx::float32, s); }

// [B, S, N * H] -> [B, N, S, H].
mx::array to_heads(const mx::array& x, int heads, mx::StreamOrDevice s) {
  mx::array split = mx::reshape(x, {x.shape(0), x.shape(1), heads, x.shape(2) / heads}, s);
  return mx::transpose(split, {0, 2, 1, 3}, s);
}

// [B, N, S, H] -> [B, S, N * H].
mx::array from_heads(const mx::array& x, mx::StreamOrDevice s) {
  return mx::reshape(mx::transpose(x, {0, 2, 1, 3}, s), {x.shape(0), x.shape(2), x.shape(1) * x.shape(3)}, s);
}

// --- The additive bias of Attention and MultiHeadAttention ---------------------

struct MaskSpec {
  std::string_view name;  // "mask_index" or "key_padding_mask"
  bool start_positions;   // [2B] means end then start positions (Attention)
  bool megatron;          // [B, 1, M, M] accepted (Attention)
};

// float32 [B, 1, S, T]: mask_filter_value where the mask hides key j from
// query i, the lowest float where causality hides it, else 0. nullopt when
// nothing masks.
std::optional<mx::array> padding_and_causal_bias(const NodeContext& ctx, const std::optional<mx::array>& mask,
                                                 const MaskSpec& spec, int batch, int sequence, int past,
                                                 int total, bool causal, float filter) {
  auto s = ctx.stream();
  std::optional<mx::array> hidden;  // bool, broadcastable to [B, S, T]
  if (mask) {
    if (!mx::issubdtype(mask->dtype(), mx::integer) && mask->dtype() != mx::bool_) {
      throw ctx.error(spec.name, " must be an int32 tensor, got ", mask->dtype());
    }
    const mx::array m = mx::astype(*mask, mx::int32, s);
    const mx::array key = mx::reshape(mx::arange(0, total, mx::int32, s), {1, 1, total}, s);
    const mx::Shape& shape = mask->shape();
    if (shape.size() == 1 &&
        (shape[0] == batch || shape[0] == 3 * batch + 2 || (spec.start_positions && shape[0] == 2 * batch))) {
      mx::array end = mx::reshape(mx::slice(m, {0}, {batch}, s), {batch, 1, 1}, s);
      hidden = mx::greater_equal(key, end, s);
      if (spec.start_positions && shape[0] == 2 * batch) {
        mx::array start = mx::reshape(mx::slice(m, {batch}, {2 * batch}, s), {batch, 1, 1}, s);
        hidden = mx::logical_or(*hidden, mx::less(key, start, s), s);
      }
    } else if (shape.size() == 2 && (shape[0] == batch || shape[0] == 1) && shape[1] == 1) {
      // [B, 1] or [1, 1]: the same value for every key, which masks nothing.
    } else if (shape.size() == 2 && shape[0] == batch && shape[1] == total) {
      hidden = mx::equal(mx::reshape(m, {batch, 1, total}, s), mx::array(0), s);
    } else if (shape.size() == 3 && shape == mx::Shape{batch, sequence, total}) {
      hidden = mx::equal(m, mx::array(0), s);
    } else if (spec.megatron && shape.size() == 4 && shape[0] == batch && shape[1] == 1 &&
               shape[2] == shape[3] && shape[2] >= past + sequence && shape[3] >= total) {
      if (causal) throw ctx.error("a 4-D mask_index cannot be combined with unidirectional");
      mx::array rows = mx::slice(m, {0, 0, past, 0}, {batch, 1, past + sequence, total}, s);
      hidden = mx::equal(mx::reshape(rows, {batch, sequence, total}, s), mx::array(0), s);
    } else {
      throw ctx.error(
          spec.name, " has shape ", shape, "; expected [", batch, "]",
          spec.start_positions ? " or [" + std::to_string(2 * batch) + "]" : std::string(), ", [",
          3 * batch + 2, "], [", batch, ", ", total, "], [", batch, ", ", sequence, ", ", total, "]",
          spec.megatron
              ? " or [" + std::to_string(batch) + ", 1, M, M] with M >= " + std::to_string(past + sequence)
              : std::string(),
          " (batch ", batch, ", sequence ", sequence, ", total sequence ", total, ")");
    }
  }
  causal = causal && sequence > 1;
  if (!hidden && !causal) return std::nullopt;
  mx::array bias = hidden ? mx::where(*hidden, mx::array(filter), mx::array(0.0f), s)
                          : mx::zeros({1, 1, total}, mx::float32, s);
  if (causal) {
    mx::array query = mx::reshape(mx::arange(0, sequence, mx::int32, s), {1, sequence, 1}, s);
    mx::array key = mx::reshape(mx::arange(0, total, mx::int32, s), {1, 1, total}, s);
    mx::array future = mx::greater(key, mx::add(query, mx::array(past), s), s);
    bias = mx::where(future, mx::array(kLowest), bias, s);
  }
  return mx::expand_dims(bias, 1, s);
}

// attention_bias [B|1, N|1, S, T] in float32, added to the mask bias.
std::optional<mx::array> with_attention_bias(const NodeContext& ctx, std::optional<mx::array> bias,
                                             size_t index, mx::Dtype dtype, int batch, int heads,
                                             int sequence, int total) {
  if (!ctx.has_input(index)) return bias;
  const mx::array& extra = ctx.input(index);
  require_float(ctx, extra, "attention_bias", dtype);
  if (extra.ndim() != 4 || (extra.shape(0) != batch && extra.shape(0) != 1) ||
      (extra.shape(1) != heads && extra.shape(1) != 1) || extra.shape(2) != sequence ||
      extra.shape(3) != total) {
    throw ctx.error("attention_bias must be [", batch, " or 1, ", heads, " or 1, ", sequence, ", ", total,
                    "], got ", extra.shape());
  }
  mx::array e = f32(extra, ctx.stream());
  return bias ? mx::add(*bias, e, ctx.stream()) : e;
}

// softmax(scale Q K^T + bias) V on float32 [B, N, S, H] heads; with `qk`, also
// the biased scores before the softmax (MultiHeadAttention's output 3).
mx::array biased_attention(const NodeContext& ctx, const mx::array& q, const mx::array& k, const mx::array& v,
                           const std::optional<mx::array>& bias, float scale, std::optional<mx::array>* qk) {
  auto s = ctx.stream();
  if (!qk) {
    return kernels::scaled_dot_product_attention(q, k, v, bias, {.scale = scale}, s);
  }
  mx::array scores = mx::multiply(mx::matmul(q, mx::swapaxes(k, -1, -2, s), s), mx::array(scale), s);
  if (bias) scores = mx::add(scores, *bias, s);
  *qk = scores;
  return mx::matmul(mx::softmax(scores, -1, /*precise=*/true, s), v, s);
}

float scale_attr(const NodeContext& ctx, int head_size) {
  const float scale = ctx.attr_float("scale", 0.0f);
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
}

int positive_heads(const NodeContext& ctx, std::string_view name) {
  const int64_t heads = ctx.required_int(name);
  if (heads <= 0 || heads > std::numeric_limits<int>::max()) {
    throw ctx.error(name, " must be positive, got ", heads);
  }
  return static_cast<int>(heads);
}

// --- Attention -------------------------------------------------------------------

OpOutputs attention(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& input = required_input(ctx, 0, "input");
  const mx::array& weights = required_input(ctx, 1, "weights");
  const mx::Dtype dtype = input.dtype();
  require_float(ctx, input, "input", dtype);
  require_float(ctx, weights, "weights", dtype);
  const int heads = positive_heads(ctx, "num_heads");
  if (ctx.attr_int("do_rotary", 0) != 0) {
    throw ctx.error(
        "do_rotary is not supported (nor by ONNX Runtime's CPU kernel): use MultiHeadAttention after "
        "RotaryEmbedding");
  }
  if (ctx.attr_int("past_present_share_buffer", 0) != 0 || ctx.has_input(6)) {
    throw ctx.error(
        "past_present_share_buffer and past_sequence_length are not supported (nor by ONNX Runtime's CPU "
        "kernel): pass past [2, B, N, P, H] holding only the past");
  }
  if (input.ndim() != 3)
    throw ctx.error("input must be 3-D [batch, sequence, input_hidden], got ", input.shape());
  if (weights.ndim() != 2 || weights.shape(0) != input.shape(2)) {
    throw ctx.error("weights must be 2-D [", input.shape(2), ", q + k + v hidden], got ", weights.shape());
  }
  const int batch = input.shape(0), sequence = input.shape(1), width = weights.shape(1);
  std::vector<int64_t> sizes = ctx.attr_ints("qkv_hidden_sizes");
  if (sizes.empty()) {
    if (width % 3 != 0) throw ctx.error("weights has ", width, " columns, not 3 equal hidden sizes");
    sizes = {width / 3, width / 3, width / 3};
  }
  if (sizes.size() != 3 || sizes[0] <= 0 || sizes[1] <= 0 || sizes[2] <= 0 ||
      sizes[0] + sizes[1] + sizes[2] != width) {
    throw ctx.error("qkv_hidden_sizes must be 3 positive sizes summing to the ", width, " weight columns");
  }
  if (sizes[0] != sizes[1])
    throw ctx.error("qkv_hidden_sizes: Q and K hidden sizes differ, ", sizes[0], " vs ", sizes[1]);
  for (int64_t size : sizes) {
    if (size % heads != 0) throw ctx.error("hidden size ", size, " is not divisible by ", heads, " heads");
  }
  const int qk_hidden = static_cast<int>(sizes[0]), v_hidden = static_cast<int>(sizes[2]);

  mx::array qkv = mx::matmul(f32(input, s), f32(weights, s), s);
  if (ctx.has_input(2)) {
    const mx::array& bias = ctx.input(2);
    require_float(ctx, bias, "bias", dtype);
    if (bias.shape() != mx::Shape{width}) throw ctx.error("bias must be [", width, "], got ", bias.shape());
    qkv = mx::add(qkv, f32(bias, s), s);
  }
  auto columns = [&](int from, int to) { return mx::slice(qkv, {0, 0, from}, {batch, sequence, to}, s); };
  mx::array q = to_heads(columns(0, qk_hidden), heads, s);
  mx::array k = to_heads(columns(qk_hidden, 2 * qk_hidden), heads, s);
  mx::array v = to_heads(columns(2 * qk_hidden, width), heads, s);

  int past = 0;
  if (ctx.has_input(4)) {
    const mx::array& state = ctx.input(4);
    require_float(ctx, state, "past", dtype);
    if (qk_hidden != v_hidden) throw ctx.error("past needs equal K and V hidden sizes");
    const int head_size = qk_hidden / heads;
    if (state.ndim() != 5 || state.shape(0) != 2 || state.shape(1) != batch || state.shape(2) != heads ||
        state.shape(4) != head_size) {
      throw ctx.error("past must be [2, ", batch, ", ", heads, ", past_sequence, ", head_size, "], got ",
                      state.shape());
    }
    past = state.shape(3);
    mx::array wide = f32(state, s);
    auto half = [&](int i) {
      return mx::squeeze(mx::slice(wide, {i, 0, 0, 0, 0}, {i + 1, batch, heads, past, head_size}, s), 0, s);
    };
    k = mx::concatenate({half(0), k}, 2, s);
    v = mx::concatenate({half(1), v}, 2, s);
  }
  const int total = past + sequence;
  const float filter = ctx.attr_float("mask_filter_value", -10000.0f);
  const bool causal = ctx.attr_int("unidirectional", 0) != 0;
  std::optional<mx::array> bias = padding_and_causal_bias(
      ctx, ctx.optional_input(3), {"mask_index", true, true}, batch, sequence, past, total, causal, filter);
  bias = with_attention_bias(ctx, bias, 5, dtype, batch, heads, sequence, total);
  mx::array y = biased_attention(ctx, q, k, v, bias, scale_attr(ctx, qk_hidden / heads), nullptr);
  OpOutputs out = {mx::astype(from_heads(y, s), dtype, s)};
  if (ctx.output_requested(1)) out.push_back(mx::astype(mx::stack({k, v}, 0, s), dtype, s));
  return out;
}

// --- MultiHeadAttention ------------------------------------------------------------

OpOutputs multi_head_attention(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& query = required_input(ctx, 0, "query");
  const mx::Dtype dtype = query.dtype();
  require_float(ctx, query, "query", dtype);
  const int heads = positive_heads(ctx, "num_heads");
  if (ctx.has_input(8) || ctx.has_input(9)) {
    throw ctx.error(
        "past_sequence_length and cache_indirection (the shared-buffer beam-search cache) are not "
        "supported: pass past_key/past_value holding only the past");
  }
  if (query.ndim() != 3 && query.ndim() != 5) {
    throw ctx.error(
        "query must be 3-D [batch, sequence, hidden] or 5-D packed QKV [batch, sequence, heads, 3, "
        "head], got ",
        query.shape());
  }
  const int batch = query.shape(0), sequence = query.shape(1);
  std::optional<mx::array> key = ctx.optional_input(1), value = ctx.optional_input(2);

  // Q, K, V as [B, S|L, N, H] (before the bias) or K, V already [B, N, L, H].
  mx::array q = f32(query, s);
  std::optional<mx::array> k, v;
  bool kv_in_heads = false;
  auto split_packed = [&](const mx::array& packed, int i) {
    mx::Shape start = {0, 0, 0, i, 0}, stop = packed.shape();
    stop[3] = i + 1;
    return mx::squeeze(mx::slice(packed, start, stop, s), 3, s);
  };
  if (query.ndim() == 5) {
    if (key || value)
      throw ctx.error("a packed QKV query [batch, sequence, heads, 3, head] takes no key or value");
    if (query.shape(2) != heads || query.shape(3) != 3) {
      throw ctx.error("packed QKV query must be [", batch, ", ", sequence, ", ", heads, ", 3, head], got ",
                      query.shape());
    }
    k = split_packed(q, 1);
    v = split_packed(q, 2);
    q = split_packed(q, 0);
  } else {
    if (query.shape(2) % heads != 0) {
      throw ctx.error("query hidden size ", query.shape(2), " is not divisible by ", heads, " heads");
    }
    q = mx::reshape(q, {batch, sequence, heads, query.shape(2) / heads}, s);
    if (!key) throw ctx.error("key is required unless the query is packed QKV");
    require_float(ctx, *key, "key", dtype);
    if (key->ndim() == 5) {
      if (value) throw ctx.error("a packed KV key [batch, kv_sequence, heads, 2, head] takes no value");
      if (key->shape(0) != batch || key->shape(2) != heads || key->shape(3) != 2 ||
          key->shape(4) != q.shape(3)) {
        throw ctx.error("packed KV key must be [", batch, ", kv_sequence, ", heads, ", 2, ", q.shape(3),
                        "], got ", key->shape());
      }
      mx::array kv = f32(*key, s);
      k = split_packed(kv, 0);
      v = split_packed(kv, 1);
    } else {
      if (!value) throw ctx.error("value is required with a ", key->ndim(), "-D key");
      require_float(ctx, *value, "value", dtype);
      if (key->ndim() == 3 && value->ndim() == 3) {
        if (key->shape(0) != batch || key->shape(2) != query.shape(2) || value->shape(0) != batch ||
            value->shape(1) != key->shape(1) || value->shape(2) % heads != 0) {
          throw ctx.error("key ", key->shape(), " and value ", value->shape(), " do not fit query ",
                          query.shape(), " with ", heads, " heads: expected [", batch, ", kv_sequence, ",
                          query.shape(2), "] and [", batch, ", kv_sequence, heads * v_head]");
        }
        k = mx::reshape(f32(*key, s), {batch, key->shape(1), heads, q.shape(3)}, s);
        v = mx::reshape(f32(*value, s), {batch, value->shape(1), heads, value->shape(2) / heads}, s);
      } else if (key->ndim() == 4 && value->ndim() == 4) {
        if (key->shape(0) != batch || key->shape(1) != heads || key->shape(3) != q.shape(3) ||
            value->shape(0) != batch || value->shape(1) != heads || value->shape(2) != key->shape(2)) {
          throw ctx.error("key ", key->shape(), " and value ", value->shape(), " must be [", batch, ", ",
                          heads, ", kv_sequence, head] with head ", q.shape(3), " for the key");
        }
        kv_in_heads = true;
        k = f32(*key, s);
        v = f32(*value, s);
      } else {
        throw ctx.error(
            "key ", key->shape(), " and value ", value->shape(),
            " must both be 3-D [batch, kv_sequence, hidden] or both 4-D [batch, heads, kv_sequence, head]");
      }
    }
  }
  const int head_size = q.shape(3), v_head = v->shape(3);
  const int qk_hidden = heads * head_size, v_hidden = heads * v_head;
  if (ctx.has_input(3)) {
    const mx::array& bias = ctx.input(3);
    require_float(ctx, bias, "bias", dtype);
    const int width = 2 * qk_hidden + v_hidden;
    if (bias.shape() != mx::Shape{width}) throw ctx.error("bias must be [", width, "], got ", bias.shape());
    mx::array b = f32(bias, s);
    auto part = [&](int from, int size, int head) {
      return mx::reshape(mx::slice(b, {from}, {from + size}, s), {1, 1, heads, head}, s);
    };
    q = mx::add(q, part(0, qk_hidden, head_size), s);
    // K and V given in heads are taken as projected already (ONNX Runtime adds
    // only the query's bias then).
    if (!kv_in_heads) {
      k = mx::add(*k, part(qk_hidden, qk_hidden, head_size), s);
      v = mx::add(*v, part(2 * qk_hidden, v_hidden, v_head), s);
    }
  }
  q = mx::transpose(q, {0, 2, 1, 3}, s);
  if (!kv_in_heads) {
    k = mx::transpose(*k, {0, 2, 1, 3}, s);
    v = mx::transpose(*v, {0, 2, 1, 3}, s);
  }

  int past = 0;
  if (ctx.has_input(6) != ctx.has_input(7)) throw ctx.error("past_key and past_value must be given together");
  if (ctx.has_input(6)) {
    if (kv_in_heads)
      throw ctx.error("past_key/past_value cannot be combined with a key and value in heads layout");
    const mx::array &past_key = ctx.input(6), &past_value = ctx.input(7);
    require_float(ctx, past_key, "past_key", dtype);
    require_float(ctx, past_value, "past_value", dtype);
    if (past_key.ndim() != 4 || past_key.shape(0) != batch || past_key.shape(1) != heads ||
        past_key.shape(3) != head_size || past_value.ndim() != 4 || past_value.shape(0) != batch ||
        past_value.shape(1) != heads || past_value.shape(2) != past_key.shape(2) ||
        past_value.shape(3) != v_head) {
      throw ctx.error("past_key ", past_key.shape(), " and past_value ", past_value.shape(), " must be [",
                      batch, ", ", heads, ", past_sequence, ", head_size, "] and [", batch, ", ", heads,
                      ", past_sequence, ", v_head, "]");
    }
    past = past_key.shape(2);
    k = mx::concatenate({f32(past_key, s), *k}, 2, s);
    v = mx::concatenate({f32(past_value, s), *v}, 2, s);
  }
  const int total = k->shape(2);
  const float filter = ctx.attr_float("mask_filter_value", -10000.0f);
  const bool causal = ctx.attr_int("unidirectional", 0) != 0;
  std::optional<mx::array> bias =
      padding_and_causal_bias(ctx, ctx.optional_input(4), {"key_padding_mask", false, false}, batch, sequence,
                              past, total, causal, filter);
  bias = with_attention_bias(ctx, bias, 5, dtype, batch, heads, sequence, total);
  std::optional<mx::array> qk;
  const bool want_qk = ctx.output_requested(3);
  mx::array y = biased_attention(ctx, q, *k, *v, bias, scale_attr(ctx, head_size), want_qk ? &qk : nullptr);
  OpOutputs out = {mx::astype(from_heads(y, s), dtype, s), mx::astype(*k, dtype, s),
                   mx::astype(*v, dtype, s)};
  if (want_qk) out.push_back(mx::astype(*qk, dtype, s));
  return out;
}

// --- GroupQueryAttention ---------------------------------------------------------------

/** The keys and values one GroupQueryAttention step attends over, which of them each query sees, and the
 * presents it writes. */
struct KeySlots {
  mx::array keys, values;                // [B, Kv, count, H]
  mx::array allowed;                     // [B, 1, S, count]
  mx::array present_key, present_value;  // [B, Kv, capacity, H]
  int count;
};

/** sliding_window_cache's resident row count L(T) for T tokens seen, in a buffer of C rows with window W:
 * T while it fits, then T less whole evictions of G = C - W + 1 rows (ONNX Runtime's contract, under
 * which the layout depends on T alone). */
mx::array resident_rows(const mx::array& tokens, int capacity, int64_t window, mx::StreamOrDevice s) {
  const int g = capacity - static_cast<int>(window) + 1;
  mx::array over = mx::maximum(mx::subtract(tokens, mx::array(capacity), s), mx::array(0), s);
  mx::array evictions = mx::floor_divide(mx::add(over, mx::array(g - 1), s), mx::array(g), s);
  return mx::subtract(tokens, mx::multiply(evictions, mx::array(g), s), s);
}

/** sliding_window_cache: the past holds, in rows [0, L(T - S)), the most recent positions before this step
 * in order. The step attends over those rows and its new ones side by side ([past; new], C + S slots,
 * each slot with its absolute position), within the window, and the present keeps the L(T) most recent
 * of them in rows [0, L(T)), zeros after. `before` [B] is T - S (0 on the first prompt), `valid` T. */
KeySlots windowed_slots(const mx::array& k, const mx::array& v, const mx::array& past_key,
                        const mx::array& past_value, const mx::array& before, const mx::array& valid,
                        int64_t window, mx::StreamOrDevice s) {
  const int batch = k.shape(0), sequence = k.shape(2);
  const int capacity = past_key.shape(2), count = capacity + sequence;
  auto per_batch = [&](const mx::array& x) { return mx::reshape(x, {batch, 1, 1, 1}, s); };
  const mx::array held = per_batch(resident_rows(before, capacity, window, s));  // past rows in use
  const mx::array fresh = per_batch(mx::subtract(valid, before, s));             // tokens this step
  const mx::array kept = per_batch(resident_rows(valid, capacity, window, s));   // rows after it
  const mx::array start = per_batch(before);

  // Slot j < C is past row j, at position T - S - held + j; slot C + i is new token i, at T - S + i.
  mx::array slot = mx::reshape(mx::arange(0, count, mx::int32, s), {1, 1, 1, count}, s);
  mx::array past_slot = mx::less(slot, mx::array(capacity), s);
  mx::array new_index = mx::subtract(slot, mx::array(capacity), s);
  mx::array position =
      mx::where(past_slot, mx::add(mx::subtract(start, held, s), slot, s), mx::add(start, new_index, s), s);
  mx::array there = mx::where(past_slot, mx::less(slot, held, s), mx::less(new_index, fresh, s), s);
  mx::array query =
      mx::add(start, mx::reshape(mx::arange(0, sequence, mx::int32, s), {1, 1, sequence, 1}, s), s);
  mx::array allowed = mx::logical_and(there, mx::less_equal(position, query, s), s);
  allowed = mx::logical_and(
      allowed, mx::greater(position, mx::subtract(query, mx::array(static_cast<int>(window)), s), s), s);

  mx::array keys = mx::concatenate({f32(past_key, s), k}, 2, s);
  mx::array values = mx::concatenate({f32(past_value, s), v}, 2, s);
  // Present row r < L(T) is entry held + fresh - kept + r of the past's rows followed by the new ones.
  mx::array row = mx::reshape(mx::arange(0, capacity, mx::int32, s), {1, 1, capacity, 1}, s);
  mx::array entry = mx::add(mx::subtract(mx::add(held, fresh, s), kept, s), row, s);
  mx::array source = mx::where(mx::less(entry, held, s), entry,
                               mx::add(mx::subtract(entry, held, s), mx::array(capacity), s), s);
  source = mx::broadcast_to(mx::clip(source, mx::array(0), mx::array(count - 1), s),
                            {batch, k.shape(1), capacity, k.shape(3)}, s);
  mx::array in_use = mx::less(row, kept, s);
  auto present = [&](const mx::array& slots) {
    return mx::where(in_use, mx::take_along_axis(slots, source, 2, s), mx::array(0.0f), s);
  };
  return {keys, values, allowed, present(keys), present(values), count};
}

OpOutputs group_query_attention(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& query = required_input(ctx, 0, "query");
  const mx::Dtype dtype = query.dtype();
  require_float(ctx, query, "query", dtype);
  const int heads = positive_heads(ctx, "num_heads"), kv_heads = positive_heads(ctx, "kv_num_heads");
  if (heads % kv_heads != 0)
    throw ctx.error("num_heads ", heads, " is not a multiple of kv_num_heads ", kv_heads);
  const int group = heads / kv_heads;
  for (const char* name : {"k_quant_type", "v_quant_type"}) {
    if (ctx.attr_string(name, "NONE") != "NONE")
      throw ctx.error(name, " other than NONE (a quantized KV cache) is not supported");
  }
  if (ctx.has_input(12) || ctx.has_input(13))
    throw ctx.error("k_scale/v_scale (a quantized KV cache) are not supported");
  if (ctx.has_input(14) || ctx.has_input(15)) {
    throw ctx.error(
        "q_norm_weight/k_norm_weight are not supported (ONNX Runtime's CPU kernel rejects them too)");
  }
  const bool causal = ctx.attr_int("causal", 1) != 0;
  const int64_t window = ctx.attr_int("local_window_size", -1);
  if (!causal && window != -1) throw ctx.error("local_window_size must be -1 when causal is 0, got ", window);
  const float softcap = ctx.attr_float("softcap", 0.0f);
  if (softcap < 0) throw ctx.error("softcap must be nonnegative, got ", softcap);
  const int64_t qk_output = ctx.attr_int("qk_output", 0);
  if (qk_output < 0 || qk_output > 2) throw ctx.error("qk_output must be 0, 1 or 2, got ", qk_output);
  const bool windowed = ctx.attr_int("sliding_window_cache", 0) != 0;
  if (windowed && window <= 0)
    throw ctx.error("sliding_window_cache needs local_window_size > 0, got ", window);
  if (windowed && (ctx.has_input(10) || (qk_output != 0 && ctx.output_requested(3)))) {
    throw ctx.error("sliding_window_cache with attention_bias or output_qk is not supported");
  }
  if (query.ndim() != 3) throw ctx.error("query must be 3-D [batch, sequence, hidden], got ", query.shape());
  const int batch = query.shape(0), sequence = query.shape(1);

  // Q [B, N, S, H], new K and V [B, Kv, S, H], in float32.
  mx::array q = f32(query, s), k = q, v = q;
  int head_size = 0;
  if (ctx.has_input(1) != ctx.has_input(2)) throw ctx.error("key and value must be given together");
  if (!ctx.has_input(1)) {
    const int packed = heads + 2 * kv_heads;
    if (query.shape(2) % packed != 0) {
      throw ctx.error("packed QKV query hidden size ", query.shape(2),
                      " is not divisible by num_heads + 2 * "
                      "kv_num_heads = ",
                      packed);
    }
    head_size = query.shape(2) / packed;
    auto part = [&](int from, int n) {
      return to_heads(mx::slice(q, {0, 0, from * head_size}, {batch, sequence, (from + n) * head_size}, s), n,
                      s);
    };
    k = part(heads, kv_heads);
    v = part(heads + kv_heads, kv_heads);
    q = part(0, heads);
  } else {
    if (query.shape(2) % heads != 0) {
      throw ctx.error("query hidden size ", query.shape(2), " is not divisible by ", heads, " heads");
    }
    head_size = query.shape(2) / heads;
    const mx::array &key = ctx.input(1), &value = ctx.input(2);
    require_float(ctx, key, "key", dtype);
    require_float(ctx, value, "value", dtype);
    const mx::Shape want = {batch, sequence, kv_heads * head_size};
    if (key.shape() != want || value.shape() != want) {
      throw ctx.error("key ", key.shape(), " and value ", value.shape(), " must be [", batch, ", ", sequence,
                      ", ", want[2], "]");
    }
    q = to_heads(q, heads, s);
    k = to_heads(f32(key, s), kv_heads, s);
    v = to_heads(f32(value, s), kv_heads, s);
  }

  const mx::array& seqlens = required_input(ctx, 5, "seqlens_k");
  const mx::array& total_input = required_input(ctx, 6, "total_sequence_length");
  if (total_input.size() != 1 || !mx::issubdtype(total_input.dtype(), mx::integer)) {
    throw ctx.error("total_sequence_length must be an int32 scalar, got ", total_input.dtype(), " ",
                    total_input.shape());
  }
  if (seqlens.ndim() != 1 || seqlens.shape(0) != batch || !mx::issubdtype(seqlens.dtype(), mx::integer)) {
    throw ctx.error("seqlens_k must be an int32 vector of the batch size ", batch, ", got ", seqlens.dtype(),
                    " ", seqlens.shape());
  }
  const int64_t total_length = ctx.host_int(6);
  int past_capacity = 0;
  std::optional<mx::array> past_key, past_value;
  if (ctx.has_input(3) != ctx.has_input(4)) throw ctx.error("past_key and past_value must be given together");
  if (ctx.has_input(3)) {
    past_key = ctx.input(3);
    past_value = ctx.input(4);
    require_float(ctx, *past_key, "past_key", dtype);
    require_float(ctx, *past_value, "past_value", dtype);
    if (past_key->ndim() != 4 || past_key->shape(0) != batch || past_key->shape(1) != kv_heads ||
        past_key->shape(3) != head_size || past_value->shape() != past_key->shape()) {
      throw ctx.error("past_key ", past_key->shape(), " and past_value ", past_value->shape(), " must be [",
                      batch, ", ", kv_heads, ", past_sequence, ", head_size, "]");
    }
    past_capacity = past_key->shape(2);
  }
  const bool first_prompt = sequence == total_length;
  if (total_length < sequence || total_length > std::numeric_limits<int>::max()) {
    throw ctx.error("total_sequence_length ", total_length, " is below the sequence length ", sequence);
  }
  if (!first_prompt && !past_key) {
    throw ctx.error("total_sequence_length ", total_length, " exceeds the sequence length ", sequence,
                    " but there is no past_key/past_value");
  }
  if (windowed && (!past_key || past_capacity < window)) {
    throw ctx.error("sliding_window_cache needs past_key/past_value buffers of at least local_window_size ",
                    window, " rows, got ", past_capacity);
  }
  const int capacity = windowed ? past_capacity : std::max(past_capacity, static_cast<int>(total_length));
  if (!seqlens.is_tracer()) {
    // Known lengths are checked; traced ones only select keys (a bad one
    // writes nothing outside the buffer).
    mx::array wide = mx::astype(seqlens, mx::int64, s);
    mx::array low = mx::min(wide, false, s), high = mx::max(wide, false, s);
    mx::eval({low, high});
    const int64_t lowest = low.item<int64_t>() + 1, highest = high.item<int64_t>() + 1;
    const int64_t least = first_prompt ? 1 : sequence;
    if (lowest < least || highest > total_length) {
      throw ctx.error("seqlens_k + 1 must lie in [", least, ", ", total_length,
                      "] (total_sequence_length), got ", lowest < least ? lowest : highest);
    }
  }

  // Per batch: valid keys T_b and the position P_b of the first new token.
  mx::array valid = mx::add(mx::astype(seqlens, mx::int32, s), mx::array(1), s);  // [B]
  mx::array start =
      first_prompt ? mx::zeros({batch}, mx::int32, s) : mx::subtract(valid, mx::array(sequence), s);
  mx::array start4 = mx::reshape(start, {batch, 1, 1, 1}, s);
  mx::array query_index = mx::reshape(mx::arange(0, sequence, mx::int32, s), {1, 1, sequence, 1}, s);

  if (ctx.attr_int("do_rotary", 0) != 0) {
    if (!ctx.has_input(7) || !ctx.has_input(8)) throw ctx.error("do_rotary needs cos_cache and sin_cache");
    const mx::array &cos_cache = ctx.input(7), &sin_cache = ctx.input(8);
    if (cos_cache.ndim() != 2 || sin_cache.shape() != cos_cache.shape() ||
        2 * cos_cache.shape(1) > head_size) {
      throw ctx.error("cos_cache ", cos_cache.shape(), " and sin_cache ", sin_cache.shape(),
                      " must be [max_sequence, rotary_dim / 2] with rotary_dim <= head size ", head_size);
    }
    // Positions [B, S]: P_b + i, or position_ids (on the first prompt only its
    // first element, as an offset, as ONNX Runtime reads it).
    mx::array offsets = mx::reshape(start, {batch, 1}, s);
    if (ctx.has_input(9)) {
      const mx::array& ids = ctx.input(9);
      if (!mx::issubdtype(ids.dtype(), mx::integer) || ids.shape() != mx::Shape{batch, sequence}) {
        throw ctx.error("position_ids must be int64 [", batch, ", ", sequence, "], got ", ids.dtype(), " ",
                        ids.shape());
      }
      offsets = first_prompt
                    ? mx::reshape(mx::slice(mx::astype(ids, mx::int32, s), {0, 0}, {1, 1}, s), {1, 1}, s)
                    : mx::astype(ids, mx::int32, s);
    }
    mx::array positions =
        first_prompt || !ctx.has_input(9)
            ? mx::add(offsets, mx::reshape(mx::arange(0, sequence, mx::int32, s), {1, sequence}, s), s)
            : offsets;
    positions = mx::broadcast_to(positions, {batch, sequence}, s);
    mx::array cos = mx::expand_dims(cache_rows(ctx, f32(cos_cache, s), positions, "cos_cache"), 1, s);
    mx::array sin = mx::expand_dims(cache_rows(ctx, f32(sin_cache, s), positions, "sin_cache"), 1, s);
    const bool interleaved = ctx.attr_int("rotary_interleaved", 0) != 0;
    q = rotate_pairs(q, cos, sin, interleaved, s);
    k = rotate_pairs(k, cos, sin, interleaved, s);
  }

  auto full_slots = [&]() -> KeySlots {
    // present[b, :, j] = past for j < P_b, new key j - P_b for j < P_b + S, else 0.
    mx::array slot = mx::reshape(mx::arange(0, capacity, mx::int32, s), {1, 1, capacity, 1}, s);
    mx::array from_new = mx::subtract(slot, start4, s);
    mx::array is_new = mx::logical_and(mx::greater_equal(from_new, mx::array(0), s),
                                       mx::less(from_new, mx::array(sequence), s), s);
    mx::array is_past = mx::less(slot, start4, s);
    mx::array gather = mx::clip(from_new, mx::array(0), mx::array(sequence - 1), s);
    auto widened = [&](const mx::array& old) {
      mx::array wide = f32(old, s);
      if (past_capacity < capacity) {
        wide = mx::pad(wide, {{0, 0}, {0, 0}, {0, capacity - past_capacity}, {0, 0}}, mx::array(0.0f),
                       "constant", s);
      }
      return wide;
    };
    auto present = [&](const mx::array& fresh, const std::optional<mx::array>& old) {
      if (old && batch == 1) {
        // One row (a decode step over a static cache): the past up to P_0 (zeros after, as ONNX Runtime
        // writes) with the new keys written at P_0, one select and one copy of the buffer instead of a
        // gather and two selects. P_0 is clipped so that a traced bad length writes nothing outside it.
        mx::array kept = mx::where(is_past, widened(*old), mx::array(0.0f), s);
        mx::array at = mx::clip(start, mx::array(0), mx::array(capacity - sequence), s);
        return mx::slice_update(kept, fresh, at, {2}, s);
      }
      mx::Shape shape = {batch, kv_heads, capacity, head_size};
      mx::array placed = mx::take_along_axis(fresh, mx::broadcast_to(gather, shape, s), 2, s);
      mx::array rest = mx::zeros(shape, mx::float32, s);
      if (old) rest = mx::where(is_past, widened(*old), rest, s);
      return mx::where(is_new, placed, rest, s);
    };
    mx::array present_key = present(k, past_key), present_value = present(v, past_value);

    // Which keys each query sees: [B, 1, S, capacity].
    mx::array key_index = mx::reshape(mx::arange(0, capacity, mx::int32, s), {1, 1, 1, capacity}, s);
    mx::array position = mx::add(query_index, start4, s);
    mx::array allowed = mx::less(key_index, mx::reshape(valid, {batch, 1, 1, 1}, s), s);
    if (causal) allowed = mx::logical_and(allowed, mx::less_equal(key_index, position, s), s);
    if (window > 0) {
      allowed = mx::logical_and(
          allowed, mx::greater(key_index, mx::subtract(position, mx::array(static_cast<int>(window)), s), s),
          s);
    }
    return {present_key, present_value, allowed, present_key, present_value, capacity};
  };
  const KeySlots slots =
      windowed ? windowed_slots(k, v, *past_key, *past_value, start, valid, window, s) : full_slots();
  const int key_count = slots.count;
  const mx::array& allowed = slots.allowed;

  std::optional<mx::array> extra;
  if (ctx.has_input(10)) {
    const mx::array& bias = ctx.input(10);
    require_float(ctx, bias, "attention_bias", dtype);
    if (bias.ndim() != 4 || (bias.shape(0) != batch && bias.shape(0) != 1) ||
        (bias.shape(1) != heads && bias.shape(1) != 1) || bias.shape(2) != sequence ||
        bias.shape(3) != total_length) {
      throw ctx.error("attention_bias must be [", batch, " or 1, ", heads, " or 1, ", sequence, ", ",
                      total_length, "], got ", bias.shape());
    }
    extra = f32(bias, s);
    if (capacity > total_length) {
      extra = mx::pad(*extra, {{0, 0}, {0, 0}, {0, 0}, {0, capacity - static_cast<int>(total_length)}},
                      mx::array(0.0f), "constant", s);
    }
  }
  std::optional<mx::array> sink;
  if (ctx.has_input(11)) {
    const mx::array& head_sink = ctx.input(11);
    require_float(ctx, head_sink, "head_sink", dtype);
    if (head_sink.shape() != mx::Shape{heads})
      throw ctx.error("head_sink must be [", heads, "], got ", head_sink.shape());
    sink = mx::reshape(f32(head_sink, s), {1, heads, 1, 1}, s);
  } else if (ctx.attr_int("smooth_softmax", 0) != 0) {
    sink = mx::zeros({1, 1, 1, 1}, mx::float32, s);
  }
  const float scale = scale_attr(ctx, head_size);
  const bool want_qk = qk_output != 0 && ctx.output_requested(3);
  const mx::array neg_inf(-std::numeric_limits<float>::infinity());

  mx::array y = q;
  std::optional<mx::array> qk;
  if (softcap == 0 && !sink && !want_qk) {
    mx::array mask = mx::where(allowed, extra ? *extra : mx::array(0.0f), neg_inf, s);
    y = kernels::scaled_dot_product_attention(q, slots.keys, slots.values, mask,
                                              {.scale = scale, .zero_fully_masked_rows = true}, s);
  } else {
    // Query heads grouped over their kv head: [B, Kv, G, S, H] against [B, Kv, 1, T, H].
    mx::array qg = mx::reshape(q, {batch, kv_heads, group, sequence, head_size}, s);
    mx::array kt = mx::expand_dims(mx::swapaxes(slots.keys, -1, -2, s), 2, s);
    mx::array scores = mx::reshape(mx::multiply(mx::matmul(qg, kt, s), mx::array(scale), s),
                                   {batch, heads, sequence, key_count}, s);
    if (softcap > 0) {
      scores = mx::multiply(mx::tanh(mx::divide(scores, mx::array(softcap), s), s), mx::array(softcap), s);
    }
    if (extra) scores = mx::add(scores, *extra, s);
    if (want_qk && qk_output == 1) qk = mx::where(allowed, scores, mx::array(0.0f), s);
    scores = mx::where(allowed, scores, neg_inf, s);
    mx::array probs = scores;
    if (sink) {
      mx::array column = mx::broadcast_to(*sink, {batch, heads, sequence, 1}, s);
      probs = mx::softmax(mx::concatenate({scores, column}, 3, s), -1, /*precise=*/true, s);
      probs = mx::slice(probs, {0, 0, 0, 0}, {batch, heads, sequence, key_count}, s);
    } else {
      probs = mx::softmax(scores, -1, /*precise=*/true, s);
    }
    if (want_qk && qk_output == 2) qk = probs;
    mx::array pg = mx::reshape(probs, {batch, kv_heads, group, sequence, key_count}, s);
    y = mx::reshape(mx::matmul(pg, mx::expand_dims(slots.values, 2, s), s),
                    {batch, heads, sequence, head_size}, s);
  }
  OpOutputs out = {mx::astype(from_heads(y, s), dtype, s), mx::astype(slots.present_key, dtype, s),
                   mx::astype(slots.present_value, dtype, s)};
  if (ctx.num_outputs() > 3) {
    if (ctx.output_requested(3) && qk_output == 0) throw ctx.error("output_qk needs qk_output 1 or 2");
    out.push_back(qk ? mx::astype(*qk, dtype, s) : mx::zeros({batch, heads, sequence, key_count}, dtype, s));
  }
  return out;
}

}  // namespace

void register_microsoft_attention(OpRegistry& r) {
  r.add({
      {.op_type = "Attention",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = attention,
       .restrictions =
           "no do_rotary, no past_present_share_buffer / past_sequence_length (as ONNX Runtime's CPU "
           "kernel)"},
      {.op_type = "MultiHeadAttention",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = multi_head_attention,
       .restrictions = "no past_sequence_length / cache_indirection (shared-buffer beam search)"},
      {.op_type = "GroupQueryAttention",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = group_query_attention,
       .host_inputs = {6},
       .restrictions =
           "no quantized KV cache (k_scale, v_scale, *_quant_type), no "
           "q_norm_weight / k_norm_weight, no attention_bias / output_qk with sliding_window_cache"},
  });
  register_microsoft_rotary_embedding(r);
}

}  // namespace transmuter
