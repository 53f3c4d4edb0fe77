// ONNX Runtime's GroupQueryAttention (domain com.microsoft, version 1), the attention of
// onnxruntime-genai's decoders.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//
// Kv <= N key/value heads (query head h reads kv head h / (N / Kv)); per batch b,
// T_b = seqlens_k[b] + 1 valid keys and the new tokens sit at P_b = T_b - S (0 on the
// first prompt, S = total_sequence_length). Optional rotary embedding of Q and K at
// positions P_b + i (position_ids when given), present = past[.., :P_b] ++ K ++ zeros,
// of length max(past length, total_sequence_length). Key j is seen by query i when
// j < T_b and, causal, j <= P_b + i and, with local_window_size W, j > P_b + i - W.
// scores are soft-capped (softcap * tanh(scores / softcap)) before attention_bias is
// added; head_sink adds exp(sink_h) to the softmax denominator, smooth_softmax (when
// there is no head_sink) exp(0). sliding_window_cache: window-sized buffers (below).
//
// float16/bfloat16 are computed in float32 and rounded once. A step of at most
// kFusedMaxQueries tokens without position_ids, attention_bias, output_qk or
// sliding_window_cache (every decode step of a genai decoder) runs as CPU kernels
// (src/kernels/cpu/group_query_attention.h: the two cache writes, which take over a static cache's
// buffer when the graph holds its last reference, and the attention) whose references are
// composed_present and composed_attention below;
// the rest is composed of MLX ops, its attention the fused attention kernel
// (src/kernels/cpu/attention.h) unless softcap, a sink or the qk output needs the scores.
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/group_query_attention.h"
#include "ops/microsoft/attention_helpers.h"
#include "ops/node_context.h"
#include "ops/onnx/attention_common.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

using namespace microsoft_attention;
using Spec = kernels::GroupQueryAttentionSpec;

// Steps of up to this many new tokens run as the fused kernel, which reads each query's keys in
// place; longer prompts take the composition, whose attention kernel tiles many queries at once.
constexpr int kFusedMaxQueries = 16;

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

/** Per batch row: the valid keys T_b and the position P_b of the first new token, int32 [B]. */
struct StepPositions {
  mx::array valid, start;
};

StepPositions step_positions(const mx::array& seqlens, int sequence, bool first_prompt,
                             mx::StreamOrDevice s) {
  mx::array valid = mx::add(mx::astype(seqlens, mx::int32, s), mx::array(1), s);
  mx::array start = first_prompt ? mx::zeros({seqlens.shape(0)}, mx::int32, s)
                                 : mx::subtract(valid, mx::array(sequence), s);
  return {valid, start};
}

// Heads [B, n, S, H] from the features [column, column + n * H) of a source's rows [B, S, *].
mx::array source_heads(const mx::array& source, int64_t column, int n, int head_size, mx::StreamOrDevice s) {
  const int batch = source.shape(0), sequence = source.shape(1);
  const int from = static_cast<int>(column), to = static_cast<int>(column + int64_t{n} * head_size);
  return to_heads(mx::slice(source, {0, 0, from}, {batch, sequence, to}, s), n, s);
}

// Q and K rotated by the cos/sin rows of their positions [B, S].
void rotate_step(mx::array& q, mx::array& k, const mx::array& cos_rows, const mx::array& sin_rows,
                 bool interleaved, mx::StreamOrDevice s) {
  mx::array cos = mx::expand_dims(cos_rows, 1, s), sin = mx::expand_dims(sin_rows, 1, s);
  q = rotate_pairs(q, cos, sin, interleaved, s);
  k = rotate_pairs(k, cos, sin, interleaved, s);
}

/** A buffer of `capacity` rows (not sliding_window_cache): present[b, :, j] = old for j < P_b, the new
 * row j - P_b for j < P_b + S, else 0. */
mx::array present_buffer(const mx::array& fresh, const std::optional<mx::array>& old, const StepPositions& at,
                         int capacity, mx::StreamOrDevice s) {
  const int batch = fresh.shape(0), kv_heads = fresh.shape(1), sequence = fresh.shape(2),
            head_size = fresh.shape(3);
  mx::array start4 = mx::reshape(at.start, {batch, 1, 1, 1}, s);
  mx::array slot = mx::reshape(mx::arange(0, capacity, mx::int32, s), {1, 1, capacity, 1}, s);
  mx::array is_past = mx::less(slot, start4, s);
  auto widened = [&](const mx::array& past) {
    mx::array wide = f32(past, s);
    if (past.shape(2) < capacity) {
      wide = mx::pad(wide, {{0, 0}, {0, 0}, {0, capacity - past.shape(2)}, {0, 0}}, mx::array(0.0f),
                     "constant", s);
    }
    return wide;
  };
  if (old && batch == 1) {
    // One row (a decode step over a static cache): the past up to P_0 (zeros after, as ONNX Runtime
    // writes) with the new keys written at P_0, one select and one copy of the buffer instead of a
    // gather and two selects. P_0 is clipped so that a traced bad length writes nothing outside it.
    mx::array kept = mx::where(is_past, widened(*old), mx::array(0.0f), s);
    mx::array where_new = mx::clip(at.start, mx::array(0), mx::array(capacity - sequence), s);
    return mx::slice_update(kept, fresh, where_new, {2}, s);
  }
  mx::array from_new = mx::subtract(slot, start4, s);
  mx::array is_new = mx::logical_and(mx::greater_equal(from_new, mx::array(0), s),
                                     mx::less(from_new, mx::array(sequence), s), s);
  mx::array gather = mx::clip(from_new, mx::array(0), mx::array(sequence - 1), s);
  mx::Shape shape = {batch, kv_heads, capacity, head_size};
  mx::array placed = mx::take_along_axis(fresh, mx::broadcast_to(gather, shape, s), 2, s);
  mx::array rest = mx::zeros(shape, mx::float32, s);
  if (old) rest = mx::where(is_past, widened(*old), rest, s);
  return mx::where(is_new, placed, rest, s);
}

/** Which of `capacity` key slots each of the S queries sees: [B, 1, S, capacity]. */
mx::array allowed_keys(const StepPositions& at, int sequence, int capacity, bool causal, int64_t window,
                       mx::StreamOrDevice s) {
  const int batch = at.start.shape(0);
  mx::array key_index = mx::reshape(mx::arange(0, capacity, mx::int32, s), {1, 1, 1, capacity}, s);
  mx::array query_index = mx::reshape(mx::arange(0, sequence, mx::int32, s), {1, 1, sequence, 1}, s);
  mx::array position = mx::add(query_index, mx::reshape(at.start, {batch, 1, 1, 1}, s), s);
  mx::array allowed = mx::less(key_index, mx::reshape(at.valid, {batch, 1, 1, 1}, s), s);
  if (causal) allowed = mx::logical_and(allowed, mx::less_equal(key_index, position, s), s);
  if (window > 0) {
    allowed = mx::logical_and(
        allowed, mx::greater(key_index, mx::subtract(position, mx::array(static_cast<int>(window)), s), s),
        s);
  }
  return allowed;
}

/** Buffers of `capacity` rows (not sliding_window_cache): the presents as present_buffer writes them;
 * the step attends over them. */
KeySlots full_slots(const mx::array& k, const mx::array& v, const std::optional<mx::array>& past_key,
                    const std::optional<mx::array>& past_value, const StepPositions& at, int capacity,
                    bool causal, int64_t window, mx::StreamOrDevice s) {
  mx::array present_key = present_buffer(k, past_key, at, capacity, s);
  mx::array present_value = present_buffer(v, past_value, at, capacity, s);
  mx::array allowed = allowed_keys(at, k.shape(2), capacity, causal, window, s);
  return {present_key, present_value, allowed, present_key, present_value, capacity};
}

/** How the scores become the attention: scale, softcap (0: none), an additive bias [B|1, N|1, S, T], a
 * per-head sink logit [1, N|1, 1, 1], and output_qk (1: the capped, biased scores; 2: the softmax). */
struct ScoreRule {
  float scale = 1.0f, softcap = 0.0f;
  std::optional<mx::array> bias{}, sink{};
  int64_t qk_output = 0;
};

// softmax over the allowed slots of Q K^T under `rule`, times V: [B, N, S, H]; *qk gets output_qk.
mx::array attend(const mx::array& q, const KeySlots& slots, const ScoreRule& rule,
                 std::optional<mx::array>* qk, mx::StreamOrDevice s) {
  const int batch = q.shape(0), heads = q.shape(1), sequence = q.shape(2), head_size = q.shape(3);
  const int kv_heads = slots.keys.shape(1), group = heads / kv_heads, key_count = slots.count;
  const mx::array neg_inf(-std::numeric_limits<float>::infinity());
  if (rule.softcap == 0 && !rule.sink && rule.qk_output == 0) {
    mx::array mask = mx::where(slots.allowed, rule.bias ? *rule.bias : mx::array(0.0f), neg_inf, s);
    return kernels::scaled_dot_product_attention(q, slots.keys, slots.values, mask,
                                                 {.scale = rule.scale, .zero_fully_masked_rows = true}, s);
  }
  // Query heads grouped over their kv head: [B, Kv, G, S, H] against [B, Kv, 1, T, H].
  mx::array qg = mx::reshape(q, {batch, kv_heads, group, sequence, head_size}, s);
  mx::array kt = mx::expand_dims(mx::swapaxes(slots.keys, -1, -2, s), 2, s);
  mx::array scores = mx::reshape(mx::multiply(mx::matmul(qg, kt, s), mx::array(rule.scale), s),
                                 {batch, heads, sequence, key_count}, s);
  if (rule.softcap > 0) {
    scores =
        mx::multiply(mx::tanh(mx::divide(scores, mx::array(rule.softcap), s), s), mx::array(rule.softcap), s);
  }
  if (rule.bias) scores = mx::add(scores, *rule.bias, s);
  if (rule.qk_output == 1) *qk = mx::where(slots.allowed, scores, mx::array(0.0f), s);
  scores = mx::where(slots.allowed, scores, neg_inf, s);
  mx::array probs = scores;
  if (rule.sink) {
    mx::array column = mx::broadcast_to(*rule.sink, {batch, heads, sequence, 1}, s);
    probs = mx::softmax(mx::concatenate({scores, column}, 3, s), -1, /*precise=*/true, s);
    probs = mx::slice(probs, {0, 0, 0, 0}, {batch, heads, sequence, key_count}, s);
  } else {
    probs = mx::softmax(scores, -1, /*precise=*/true, s);
  }
  if (rule.qk_output == 2) *qk = probs;
  mx::array pg = mx::reshape(probs, {batch, kv_heads, group, sequence, key_count}, s);
  return mx::reshape(mx::matmul(pg, mx::expand_dims(slots.values, 2, s), s),
                     {batch, heads, sequence, head_size}, s);
}

/** x [B, n, S, H] rotated at the step's positions P_b + i, clamped into the cos/sin caches [M, R/2]. */
mx::array rotated_at_positions(const mx::array& x, const StepPositions& at, const mx::array& cos,
                               const mx::array& sin, bool interleaved, mx::StreamOrDevice s) {
  const int batch = x.shape(0), sequence = x.shape(2);
  mx::array positions = mx::add(mx::reshape(at.start, {batch, 1}, s),
                                mx::reshape(mx::arange(0, sequence, mx::int32, s), {1, sequence}, s), s);
  positions = mx::clip(positions, mx::array(0), mx::array(cos.shape(0) - 1), s);
  return rotate_pairs(x, mx::expand_dims(mx::take(cos, positions, 0, s), 1, s),
                      mx::expand_dims(mx::take(sin, positions, 0, s), 1, s), interleaved, s);
}

/** kv_cache_write's reference: the present composed of MLX ops, from the kernel's inputs
 * (kernels/cpu/group_query_attention.h). */
std::vector<mx::array> composed_present(const kernels::KvCacheWriteSpec& spec,
                                        const std::vector<mx::array>& in, mx::StreamOrDevice s) {
  const int sequence = in[1].shape(1);
  mx::array fresh = source_heads(in[1], spec.column, spec.kv_heads, spec.head_size, s);
  const StepPositions at = step_positions(in[2], sequence, spec.first_prompt, s);
  if (spec.rotate) fresh = rotated_at_positions(fresh, at, in[3], in[4], spec.interleaved, s);
  std::optional<mx::array> past;
  if (in[0].shape(2) > 0) past = in[0];
  return {present_buffer(fresh, past, at, spec.capacity, s)};
}

/** The attention kernel's reference, from its inputs (the presents written). */
std::vector<mx::array> composed_attention(const Spec& spec, const std::vector<mx::array>& in,
                                          mx::StreamOrDevice s) {
  const int sequence = in[0].shape(1);
  mx::array q = source_heads(in[0], spec.q_column, spec.heads, spec.head_size, s);
  const StepPositions at = step_positions(in[3], sequence, spec.first_prompt, s);
  if (spec.rotary) q = rotated_at_positions(q, at, in[4], in[5], spec.interleaved, s);
  mx::array allowed = allowed_keys(at, sequence, spec.capacity, spec.causal, spec.window, s);
  const KeySlots slots{in[1], in[2], allowed, in[1], in[2], spec.capacity};
  ScoreRule rule{.scale = spec.scale, .softcap = spec.softcap};
  if (spec.sink) rule.sink = mx::reshape(in[6], {1, spec.heads, 1, 1}, s);
  return {from_heads(attend(q, slots, rule, nullptr, s), s)};
}

/** The attributes and inputs of one GroupQueryAttention node that shape its step. */
struct StepInputs {
  Spec spec;
  mx::array q_source, k_source, v_source;  // float32 [B, S, *]
  std::optional<mx::array> past_key{}, past_value{};
  bool windowed = false;
  int64_t qk_output = 0;
  bool want_qk = false;
  int past_capacity = 0;
  std::optional<int64_t> highest_position{};  // the last new token's position, when seqlens_k is known
};

// Q, K and V: a packed [B, S, (N + 2 Kv) H] query, or query, key and value apart; sets the head
// size and the columns.
void read_sources(const NodeContext& ctx, const mx::array& query, StepInputs& step) {
  auto s = ctx.stream();
  Spec& spec = step.spec;
  const int batch = query.shape(0), sequence = query.shape(1);
  if (ctx.has_input(1) != ctx.has_input(2)) throw ctx.error("key and value must be given together");
  if (!ctx.has_input(1)) {
    const int packed = spec.heads + 2 * spec.kv_heads;
    if (query.shape(2) % packed != 0) {
      throw ctx.error("packed QKV query hidden size ", query.shape(2),
                      " is not divisible by num_heads + 2 * kv_num_heads = ", packed);
    }
    spec.head_size = query.shape(2) / packed;
    spec.k_column = int64_t{spec.heads} * spec.head_size;
    spec.v_column = int64_t{spec.heads + spec.kv_heads} * spec.head_size;
    return;
  }
  if (query.shape(2) % spec.heads != 0) {
    throw ctx.error("query hidden size ", query.shape(2), " is not divisible by ", spec.heads, " heads");
  }
  spec.head_size = query.shape(2) / spec.heads;
  const mx::array &key = ctx.input(1), &value = ctx.input(2);
  require_float(ctx, key, "key", query.dtype());
  require_float(ctx, value, "value", query.dtype());
  const mx::Shape want = {batch, sequence, spec.kv_heads * spec.head_size};
  if (key.shape() != want || value.shape() != want) {
    throw ctx.error("key ", key.shape(), " and value ", value.shape(), " must be [", batch, ", ", sequence,
                    ", ", want[2], "]");
  }
  step.k_source = f32(key, s);
  step.v_source = f32(value, s);
}

// The attributes, sources, past and lengths of the node, checked.
StepInputs read_step(const NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& query = required_input(ctx, 0, "query");
  const mx::Dtype dtype = query.dtype();
  require_float(ctx, query, "query", dtype);
  Spec spec;
  spec.heads = positive_heads(ctx, "num_heads");
  spec.kv_heads = positive_heads(ctx, "kv_num_heads");
  if (spec.heads % spec.kv_heads != 0)
    throw ctx.error("num_heads ", spec.heads, " is not a multiple of kv_num_heads ", spec.kv_heads);
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
  spec.causal = ctx.attr_int("causal", 1) != 0;
  spec.window = ctx.attr_int("local_window_size", -1);
  if (!spec.causal && spec.window != -1)
    throw ctx.error("local_window_size must be -1 when causal is 0, got ", spec.window);
  spec.softcap = ctx.attr_float("softcap", 0.0f);
  if (spec.softcap < 0) throw ctx.error("softcap must be nonnegative, got ", spec.softcap);
  const int64_t qk_output = ctx.attr_int("qk_output", 0);
  if (qk_output < 0 || qk_output > 2) throw ctx.error("qk_output must be 0, 1 or 2, got ", qk_output);
  const bool windowed = ctx.attr_int("sliding_window_cache", 0) != 0;
  if (windowed && spec.window <= 0)
    throw ctx.error("sliding_window_cache needs local_window_size > 0, got ", spec.window);
  if (windowed && (ctx.has_input(10) || (qk_output != 0 && ctx.output_requested(3)))) {
    throw ctx.error("sliding_window_cache with attention_bias or output_qk is not supported");
  }
  if (query.ndim() != 3) throw ctx.error("query must be 3-D [batch, sequence, hidden], got ", query.shape());
  const int batch = query.shape(0), sequence = query.shape(1);

  mx::array source = f32(query, s);
  StepInputs step{.spec = spec, .q_source = source, .k_source = source, .v_source = source};
  step.windowed = windowed;
  step.qk_output = qk_output;
  step.want_qk = qk_output != 0 && ctx.output_requested(3);
  read_sources(ctx, query, step);
  Spec& out = step.spec;

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
  if (ctx.has_input(3) != ctx.has_input(4)) throw ctx.error("past_key and past_value must be given together");
  if (ctx.has_input(3)) {
    step.past_key = ctx.input(3);
    step.past_value = ctx.input(4);
    require_float(ctx, *step.past_key, "past_key", dtype);
    require_float(ctx, *step.past_value, "past_value", dtype);
    const mx::array &pk = *step.past_key, &pv = *step.past_value;
    if (pk.ndim() != 4 || pk.shape(0) != batch || pk.shape(1) != out.kv_heads ||
        pk.shape(3) != out.head_size || pv.shape() != pk.shape()) {
      throw ctx.error("past_key ", pk.shape(), " and past_value ", pv.shape(), " must be [", batch, ", ",
                      out.kv_heads, ", past_sequence, ", out.head_size, "]");
    }
    step.past_capacity = pk.shape(2);
  }
  out.first_prompt = sequence == total_length;
  if (total_length < sequence || total_length > std::numeric_limits<int>::max()) {
    throw ctx.error("total_sequence_length ", total_length, " is below the sequence length ", sequence);
  }
  if (!out.first_prompt && !step.past_key) {
    throw ctx.error("total_sequence_length ", total_length, " exceeds the sequence length ", sequence,
                    " but there is no past_key/past_value");
  }
  if (windowed && (!step.past_key || step.past_capacity < out.window)) {
    throw ctx.error("sliding_window_cache needs past_key/past_value buffers of at least local_window_size ",
                    out.window, " rows, got ", step.past_capacity);
  }
  out.capacity = windowed ? step.past_capacity : std::max(step.past_capacity, static_cast<int>(total_length));
  if (!seqlens.is_tracer()) {
    // Known lengths are checked; traced ones only select keys (a bad one
    // writes nothing outside the buffer).
    mx::array wide = mx::astype(seqlens, mx::int64, s);
    mx::array low = mx::min(wide, false, s), high = mx::max(wide, false, s);
    mx::eval({low, high});
    const int64_t lowest = low.item<int64_t>() + 1, highest = high.item<int64_t>() + 1;
    const int64_t least = out.first_prompt ? 1 : sequence;
    if (lowest < least || highest > total_length) {
      throw ctx.error("seqlens_k + 1 must lie in [", least, ", ", total_length,
                      "] (total_sequence_length), got ", lowest < least ? lowest : highest);
    }
    step.highest_position = out.first_prompt ? sequence - 1 : highest - 1;
  }
  out.scale = scale_attr(ctx, out.head_size);
  out.interleaved = ctx.attr_int("rotary_interleaved", 0) != 0;
  out.rotary = ctx.attr_int("do_rotary", 0) != 0;
  if (out.rotary) {
    if (!ctx.has_input(7) || !ctx.has_input(8)) throw ctx.error("do_rotary needs cos_cache and sin_cache");
    const mx::array &cos_cache = ctx.input(7), &sin_cache = ctx.input(8);
    if (cos_cache.ndim() != 2 || sin_cache.shape() != cos_cache.shape() ||
        2 * cos_cache.shape(1) > out.head_size) {
      throw ctx.error("cos_cache ", cos_cache.shape(), " and sin_cache ", sin_cache.shape(),
                      " must be [max_sequence, rotary_dim / 2] with rotary_dim <= head size ", out.head_size);
    }
  }
  return step;
}

// The per-head sink logits [N] (head_sink, or zeros for smooth_softmax), or nullopt.
std::optional<mx::array> sink_logits(const NodeContext& ctx, int heads, mx::Dtype dtype) {
  if (ctx.has_input(11)) {
    const mx::array& head_sink = ctx.input(11);
    require_float(ctx, head_sink, "head_sink", dtype);
    if (head_sink.shape() != mx::Shape{heads})
      throw ctx.error("head_sink must be [", heads, "], got ", head_sink.shape());
    return f32(head_sink, ctx.stream());
  }
  if (ctx.attr_int("smooth_softmax", 0) != 0) {
    const std::vector<float> zeros(static_cast<size_t>(heads), 0.0f);
    return mx::array(zeros.begin(), {heads}, mx::float32);
  }
  return std::nullopt;
}

// The step as the fused kernels: both cache writes, then the attention over them (their references,
// composed_present and composed_attention, run on other streams and for gradients).
std::vector<mx::array> fused_step(const NodeContext& ctx, const StepInputs& step,
                                  const std::optional<mx::array>& sink) {
  auto s = ctx.stream();
  const mx::Stream stream = mx::to_stream(s);
  const Spec& spec = step.spec;
  const int batch = step.q_source.shape(0);
  const mx::array none(0.0f);  // an unused input slot
  mx::array cos = none, sin = none;
  if (spec.rotary) {
    cos = f32(ctx.input(7), s);
    sin = f32(ctx.input(8), s);
    if (cos.shape(0) == 0) throw ctx.error("cos_cache has no positions to index");
    if (step.highest_position && *step.highest_position >= cos.shape(0)) {
      throw ctx.error("position id ", *step.highest_position, " out of range for cos_cache with ",
                      cos.shape(0), " positions");
    }
  }
  const mx::array seqlens = mx::astype(ctx.input(5), mx::int32, s);
  auto write = [&](const std::optional<mx::array>& past, const mx::array& source, int64_t column,
                   bool rotate) {
    const kernels::KvCacheWriteSpec write_spec = kernels::kv_write_spec(spec, column, rotate);
    mx::array old =
        past ? f32(*past, s) : mx::zeros({batch, spec.kv_heads, 0, spec.head_size}, mx::float32, s);
    kernels::Reference reference = [write_spec, stream](const std::vector<mx::array>& in) {
      return composed_present(write_spec, in, stream);
    };
    return kernels::kv_cache_write({std::move(old), source, seqlens, cos, sin}, write_spec, reference, s);
  };
  mx::array present_key = write(step.past_key, step.k_source, spec.k_column, spec.rotary);
  mx::array present_value = write(step.past_value, step.v_source, spec.v_column, false);
  Spec kernel_spec = spec;
  kernel_spec.sink = sink.has_value();
  kernels::Reference reference = [kernel_spec, stream](const std::vector<mx::array>& in) {
    return composed_attention(kernel_spec, in, stream);
  };
  mx::array y = kernels::group_query_attention(
      {step.q_source, present_key, present_value, seqlens, cos, sin, sink ? *sink : none}, kernel_spec,
      reference, s);
  return {y, present_key, present_value};
}

OpOutputs group_query_attention(NodeContext& ctx) {
  auto s = ctx.stream();
  const StepInputs step = read_step(ctx);
  const Spec& spec = step.spec;
  const mx::Dtype dtype = ctx.input(0).dtype();
  const int batch = step.q_source.shape(0), sequence = step.q_source.shape(1);
  std::optional<mx::array> sink = sink_logits(ctx, spec.heads, dtype);
  std::optional<mx::array> extra;
  if (ctx.has_input(10)) {
    const mx::array& bias = ctx.input(10);
    require_float(ctx, bias, "attention_bias", dtype);
    const int64_t total_length = ctx.host_int(6);
    if (bias.ndim() != 4 || (bias.shape(0) != batch && bias.shape(0) != 1) ||
        (bias.shape(1) != spec.heads && bias.shape(1) != 1) || bias.shape(2) != sequence ||
        bias.shape(3) != total_length) {
      throw ctx.error("attention_bias must be [", batch, " or 1, ", spec.heads, " or 1, ", sequence, ", ",
                      total_length, "], got ", bias.shape());
    }
    extra = f32(bias, s);
    if (spec.capacity > total_length) {
      extra = mx::pad(*extra, {{0, 0}, {0, 0}, {0, 0}, {0, spec.capacity - static_cast<int>(total_length)}},
                      mx::array(0.0f), "constant", s);
    }
  }
  if (ctx.num_outputs() > 3 && ctx.output_requested(3) && step.qk_output == 0)
    throw ctx.error("output_qk needs qk_output 1 or 2");

  const bool fused =
      !step.windowed && !ctx.has_input(9) && !extra && !step.want_qk && sequence <= kFusedMaxQueries;
  mx::array y = step.q_source, present_key = y, present_value = y;
  std::optional<mx::array> qk;
  if (fused) {
    std::vector<mx::array> out = fused_step(ctx, step, sink);
    y = out[0];
    present_key = out[1];
    present_value = out[2];
  } else {
    mx::array q = source_heads(step.q_source, spec.q_column, spec.heads, spec.head_size, s);
    mx::array k = source_heads(step.k_source, spec.k_column, spec.kv_heads, spec.head_size, s);
    mx::array v = source_heads(step.v_source, spec.v_column, spec.kv_heads, spec.head_size, s);
    const StepPositions at = step_positions(ctx.input(5), sequence, spec.first_prompt, s);
    if (spec.rotary) {
      // Positions [B, S]: P_b + i, or position_ids (on the first prompt only its
      // first element, as an offset, as ONNX Runtime reads it).
      mx::array offsets = mx::reshape(at.start, {batch, 1}, s);
      if (ctx.has_input(9)) {
        const mx::array& ids = ctx.input(9);
        if (!mx::issubdtype(ids.dtype(), mx::integer) || ids.shape() != mx::Shape{batch, sequence}) {
          throw ctx.error("position_ids must be int64 [", batch, ", ", sequence, "], got ", ids.dtype(), " ",
                          ids.shape());
        }
        offsets = spec.first_prompt
                      ? mx::reshape(mx::slice(mx::astype(ids, mx::int32, s), {0, 0}, {1, 1}, s), {1, 1}, s)
                      : mx::astype(ids, mx::int32, s);
      }
      mx::array positions =
          spec.first_prompt || !ctx.has_input(9)
              ? mx::add(offsets, mx::reshape(mx::arange(0, sequence, mx::int32, s), {1, sequence}, s), s)
              : offsets;
      positions = mx::broadcast_to(positions, {batch, sequence}, s);
      rotate_step(q, k, cache_rows(ctx, f32(ctx.input(7), s), positions, "cos_cache"),
                  cache_rows(ctx, f32(ctx.input(8), s), positions, "sin_cache"), spec.interleaved, s);
    }
    const KeySlots slots = step.windowed ? windowed_slots(k, v, *step.past_key, *step.past_value, at.start,
                                                          at.valid, spec.window, s)
                                         : full_slots(k, v, step.past_key, step.past_value, at, spec.capacity,
                                                      spec.causal, spec.window, s);
    ScoreRule rule{.scale = spec.scale, .softcap = spec.softcap, .bias = extra};
    if (sink) rule.sink = mx::reshape(*sink, {1, spec.heads, 1, 1}, s);
    if (step.want_qk) rule.qk_output = step.qk_output;
    y = from_heads(attend(q, slots, rule, &qk, s), s);
    present_key = slots.present_key;
    present_value = slots.present_value;
  }
  OpOutputs out = {mx::astype(y, dtype, s), mx::astype(present_key, dtype, s),
                   mx::astype(present_value, dtype, s)};
  if (ctx.num_outputs() > 3) {
    const int key_count = step.windowed ? spec.capacity + sequence : spec.capacity;
    out.push_back(qk ? mx::astype(*qk, dtype, s)
                     : mx::zeros({batch, spec.heads, sequence, key_count}, dtype, s));
  }
  return out;
}

}  // namespace

void register_microsoft_group_query_attention(OpRegistry& r) {
  r.add({
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
}

}  // namespace transmuter
