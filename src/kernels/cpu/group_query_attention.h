// One step of ONNX Runtime's GroupQueryAttention (com.microsoft) over a KV cache, as three CPU
// kernels: two cache writes (keys, values) and the attention over the written caches.
//
// Per batch row b with T_b = seqlens_k[b] + 1 valid keys, the S new tokens sit at positions
// P_b + i (P_b = 0 on a first prompt, else T_b - S).
//   kv_cache_write: the present buffer of `capacity` rows: past rows [0, P_b), the new keys (rotated
//     at their positions: cos/sin cache rows, halves or interleaved pairs of the first R features)
//     or values at [P_b, P_b + S), zeros after. When the past already has `capacity` rows and
//     nothing else holds it (MLX's donation rule: the graph's last reference), the present takes
//     the past's buffer and only the new rows are written; the rows after them keep the past's
//     values, as in ONNX Runtime's shared past/present buffer (no query reads them). A decode step
//     over a static cache then costs O(S) rows instead of a copy of the whole cache.
//   group_query_attention: query i of head h (kv head h / (N / Kv)), rotated, over the present keys
//     j < T_b, j <= P_b + i when causal, j > P_b + i - window with a local window; scores scaled,
//     soft-capped (cap * tanh(s / cap)), and softmaxed with an optional per-head sink logit that
//     takes weight but adds no value.
// The writes are kernels of one output each because MLX donates an input only to a primitive whose
// outputs are the input's sole holders (a primitive's sibling outputs each hold its inputs).
// The composition does this in ~40 MLX ops per layer (slices, rotary halves, masks, selects); a
// decode step of a 30-layer model replays all of them on the calling thread, which measured as the
// step's bottleneck (docs/llm_performance.md). The attention splits the keys into blocks (flash
// decoding): a work item is one block of one (batch row, kv head) for all the query rows that share the
// kv head, which read its keys and values once, where they are in the present buffer, and leave a
// partial softmax (max, sum, weighted values) that a second pass merges per row. So the threads share
// the cache's reads evenly however few kv heads there are; the kernel suits the few queries of a
// decode step, and long prompts go through the composition and the tiled attention kernel instead (the
// caller chooses). bench/gqa_bench times it by cache length.
#pragma once

#include <cstdint>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/cpu_kernel.h"

namespace transmuter::kernels {

namespace mx = mlx::core;

struct GroupQueryAttentionSpec {
  int heads = 0, kv_heads = 0, head_size = 0;
  // The first feature of Q, K and V within their source rows (packed QKV: 0, N*H, (N+Kv)*H).
  int64_t q_column = 0, k_column = 0, v_column = 0;
  int capacity = 0;           // rows of the present buffers (>= the past's rows and every T_b)
  bool first_prompt = false;  // sequence == total_sequence_length: the new tokens start at 0
  bool causal = true;
  int64_t window = -1;  // local_window_size; -1: none
  float scale = 1.0f;
  float softcap = 0.0f;  // 0: none
  bool rotary = false, interleaved = false;
  bool sink = false;  // inputs[6] holds one logit per query head
};

/** One cache's write (keys: rotate = the step's rotary; values: rotate = false). */
struct KvCacheWriteSpec {
  int kv_heads = 0, head_size = 0;
  int64_t column = 0;  // the first feature of the keys (values) within their source rows
  int capacity = 0;
  bool first_prompt = false;
  bool rotate = false, interleaved = false;
};

/** The write of one of a step's caches: keys at `column` rotated as the step says, or values at
 * theirs with rotate = false. */
inline KvCacheWriteSpec kv_write_spec(const GroupQueryAttentionSpec& spec, int64_t column, bool rotate) {
  return {.kv_heads = spec.kv_heads,
          .head_size = spec.head_size,
          .column = column,
          .capacity = spec.capacity,
          .first_prompt = spec.first_prompt,
          .rotate = rotate,
          .interleaved = spec.interleaved};
}

/** The present buffer above. inputs, in this order:
 *   0  past [B, Kv, P, H] float32 (P may be 0)
 *   1  the source [B, S, *] float32 of the new keys (values)
 *   2  seqlens_k [B] int32
 *   3-4  cos_cache, sin_cache [M, R/2] float32, 2 * R/2 <= H (any shape without rotation)
 * Returns the present [B, Kv, capacity, H] float32. Positions outside the cos/sin caches are
 * clamped into them and rows outside the buffer are not written (the caller checks known lengths).
 * reference(inputs) computes the same with MLX ops (non-CPU streams, gradients). */
mx::array kv_cache_write(std::vector<mx::array> inputs, const KvCacheWriteSpec& spec,
                         const Reference& reference, mx::StreamOrDevice s = {});

/** The attention above. inputs, in this order:
 *   0  the query source [B, S, *] float32
 *   1-2  present_key, present_value [B, Kv, capacity, H] float32 (kv_cache_write's)
 *   3  seqlens_k [B] int32
 *   4-5  cos_cache, sin_cache [M, R/2] float32, 2 * R/2 <= H (any shape without rotary)
 *   6  sink [N] float32 (any shape without a sink)
 * Returns the attention [B, S, N * H] float32; reference(inputs) as above. */
mx::array group_query_attention(std::vector<mx::array> inputs, const GroupQueryAttentionSpec& spec,
                                const Reference& reference, mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
