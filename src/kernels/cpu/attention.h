// Scaled dot-product attention, heads batched, as one CPU kernel.
//
//   q: [B, Hq, Sq, D]   k: [B, Hkv, Sk, D]   v: [B, Hkv, Sk, Dv]   (Hq % Hkv == 0:
//   query head h reads key/value head h / (Hq / Hkv), grouped-query attention)
//   scores = q . k^T                               [B, Hq, Sq, Sk]
//   probs  = softmax(scores * scale [+ mask] [causal])   (softmax.h's options)
//   out    = probs . v                             [B, Hq, Sq, Dv]
//
// Work items are (batch, head, block of queries), split across the kernel
// thread pool; the scores of one item live in a per-thread buffer that stays
// in cache, so the [B, Hq, Sq, Sk] tensor is never written to memory. The two
// products are Highway register-blocked loops (D and Sk of encoder heads are
// small, where a BLAS call per head costs more in packing than it computes).
#pragma once

#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/softmax.h"

namespace transmuter::kernels {

namespace mx = mlx::core;

/** The attention above. mask: float32, broadcastable to [B, Hq, Sq, Sk] with
 * its last axis Sk (e.g. [B, 1, 1, Sk], [B, 1, Sq, Sk], [Sq, Sk]). float32 q,
 * k, v; other dtypes or shapes run the MLX composition (the kernel's
 * reference), as do non-CPU streams. */
mx::array scaled_dot_product_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                                       const std::optional<mx::array>& mask, const SoftmaxOptions& options,
                                       mx::StreamOrDevice s = {});

/** Keys [B, Hkv, S, D] and their values [B, Hkv, S, Dv]. */
struct KeyValueRows {
  mx::array keys;
  mx::array values;
};

/** The attention above over keys and values that come in two runs along the
 * sequence axis, `first` then `appended` (a decode step's new rows after the
 * cache): the same as over their concatenation, which is never made. The mask's
 * last axis spans both runs. */
mx::array scaled_dot_product_attention(const mx::array& q, const KeyValueRows& first, const KeyValueRows& appended,
                                       const std::optional<mx::array>& mask, const SoftmaxOptions& options,
                                       mx::StreamOrDevice s = {});

/** The kernel's reference: the same attention composed of MLX ops. */
mx::array scaled_dot_product_attention_reference(const mx::array& q, const mx::array& k, const mx::array& v,
                                                 const std::optional<mx::array>& mask, const SoftmaxOptions& options,
                                                 mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
