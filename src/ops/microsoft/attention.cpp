// ONNX Runtime's attention contrib operators (domain com.microsoft, version 1):
// Attention and MultiHeadAttention (GroupQueryAttention is in
// group_query_attention.cpp, RotaryEmbedding in rotary_embedding.cpp). ONNX
// Runtime's transformer optimizer fuses BERT, GPT-2 and Llama-style blocks into
// them.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//
// Both, per head (B batch, N heads, S queries, P past keys, T = P + L keys):
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
// float16/bfloat16 are computed in float32 and rounded once. The float32
// attention runs the fused CPU kernel (src/kernels/cpu/attention.h) unless the
// qk output needs the scores (then the composition).
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/attention.h"
#include "ops/microsoft/attention_helpers.h"
#include "ops/node_context.h"
#include "ops/onnx/attention_common.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

using namespace microsoft_attention;

constexpr float kLowest = std::numeric_limits<float>::lowest();

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
  });
  register_microsoft_group_query_attention(r);
  register_microsoft_rotary_embedding(r);
}

}  // namespace transmuter
