// Softmax over the last axis with the scale, additive mask and causal limit
// of attention scores, as one CPU kernel.
//
//   v = x * scale [+ mask]                    (mask broadcast against x)
//   v[..., i, j] = -inf for j > i + causal_offset   (causal)
//   y = exp(v - max(v)) / sum(exp(v - max(v)))      (over the last axis)
//
// One kernel instead of MLX's chain (multiply, add, max, subtract, exp, sum,
// divide: seven passes over the scores, exp evaluated one element at a time on
// x86). Rows are split across the kernel thread pool; each row takes three
// passes in L1 with an exp for non-positive arguments (softmax_row-inl.h).
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

struct SoftmaxOptions {
  float scale = 1.0f;
  bool causal = false;
  int64_t causal_offset = 0;  // causal: query row i attends keys j <= i + causal_offset
  // A row with nothing to attend (all -inf) gives zeros (ONNX Attention), not
  // NaN (ONNX Softmax, mx::softmax).
  bool zero_fully_masked_rows = false;
};

/** The softmax above. x: float32 [..., n] (rank >= 2 when causal, the query
 * axis being -2); mask: float32, broadcastable to x with its last axis equal
 * to n. Other dtypes or mask shapes run the MLX composition (the kernel's
 * reference), as do non-CPU streams. */
mx::array softmax_last_axis(const mx::array& x, const std::optional<mx::array>& mask, const SoftmaxOptions& options,
                            mx::StreamOrDevice s = {});

/** The kernel's reference: the same softmax composed of MLX ops, in x's dtype
 * (gradients and non-CPU streams use it). */
mx::array softmax_last_axis_reference(const mx::array& x, const std::optional<mx::array>& mask,
                                      const SoftmaxOptions& options, mx::StreamOrDevice s = {});

/** y[i] = exp(x[i]) by the softmax's exponential, which takes x <= 0 (or NaN) only: at most 1.02 ulp
 * from exp there, 0 below ln(FLT_MIN) (softmax_row-inl.h). On the CPU's best SIMD target; for its
 * accuracy test. */
void exp_non_positive(const float* x, int64_t n, float* y);

}  // namespace transmuter::kernels
