// The rotary position embedding of Llama-style exports (transformers' apply_rotary_pos_emb with
// rotate_half) as one CPU kernel:
//
//   y = x * cos + rotate_half(x) * sin,   rotate_half(x) = concat(-x[..., h:], x[..., :h]),  h = D / 2
//
//   x: float32 [B, H, S, D] (D even); cos, sin: float32 [Bc, Hc, S, D], Bc in {1, B}, Hc in {1, H}
//   (the per-position tables, broadcast over the batch and the heads as the export unsqueezes them).
//
// The export computes it as seven MLX ops per tensor (two Slices, Neg, Concat, two Muls, Add), q and
// k of every layer each decode step; here one primitive. The products and the sum round as the
// composition's do (x * c + (-x') * s, no fused multiply-add), so the result is the composition's.
#pragma once

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

/** True when rotate_half_rotary runs the kernel for these arguments on a CPU stream (the shapes
 * above, float32); otherwise it runs the reference. */
bool rotate_half_rotary_fits(const mx::array& x, const mx::array& cos, const mx::array& sin);

/** y above; arguments that do not fit, and non-CPU streams, run the reference (which broadcasts as
 * MLX's ops do). Gradients are the reference's. */
mx::array rotate_half_rotary(const mx::array& x, const mx::array& cos, const mx::array& sin,
                             mx::StreamOrDevice s = {});

/** The same composed of MLX ops (last axis split in halves). */
mx::array rotate_half_rotary_reference(const mx::array& x, const mx::array& cos, const mx::array& sin,
                                       mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
