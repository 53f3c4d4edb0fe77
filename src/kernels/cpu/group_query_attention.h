// One step of ONNX Runtime's GroupQueryAttention (com.microsoft) over a KV cache, as one CPU kernel.
//
// Per batch row b with T_b = seqlens_k[b] + 1 valid keys, the S new tokens sit at positions
// P_b + i (P_b = 0 on a first prompt, else T_b - S). The kernel
//   1. rotates the new queries and keys at those positions (rotary: cos/sin cache rows, halves or
//      interleaved pairs of the first R features),
//   2. writes the presents: past rows [0, P_b), the new keys and values at [P_b, P_b + S), zeros
//      after, in buffers of `capacity` rows,
//   3. attends: query i of head h (kv head h / (N / Kv)) over the keys j < T_b, j <= P_b + i when
//      causal, j > P_b + i - window with a local window; scores scaled, soft-capped
//      (cap * tanh(s / cap)), and softmaxed with an optional per-head sink logit that takes
//      weight but adds no value.
// The composition does this in ~40 MLX ops per layer (slices, rotary halves, masks, selects); a
// decode step of a 30-layer model replays all of them on the calling thread, which measured as the
// step's bottleneck (docs/llm_performance.md). Work items are (batch, head, query) rows; each row
// reads its keys where they are in the present buffer (ScoreRowInPlace), so the kernel suits the
// few queries of a decode step; long prompts go through the composition and the tiled attention
// kernel instead (the caller chooses).
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
  bool sink = false;  // inputs[8] holds one logit per query head
};

/** The step above. inputs, in this order:
 *   0-2  Q, K, V sources [B, S, *] float32 (the same array for packed QKV)
 *   3-4  past_key, past_value [B, Kv, P, H] float32 (P may be 0)
 *   5    seqlens_k [B] int32
 *   6-7  cos_cache, sin_cache [M, R/2] float32, 2 * R/2 <= H (any shape without rotary)
 *   8    sink [N] float32 (any shape without a sink)
 * Returns the attention [B, S, N * H] and the presents [B, Kv, capacity, H], float32. Positions
 * outside the cos/sin caches are clamped into them and present rows outside the buffers are not
 * written (the caller checks known lengths). reference(inputs) computes the same with MLX ops:
 * it runs on non-CPU streams and gives the gradients. */
std::vector<mx::array> group_query_attention(std::vector<mx::array> inputs,
                                             const GroupQueryAttentionSpec& spec, const Reference& reference,
                                             mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
