// Layer and RMS normalization over the last axis, with the residual and bias
// additions that precede them in transformer blocks, as one CPU kernel.
//
//   sum = x [+ skip] [+ bias]
//   y   = (sum - mean(sum)) / sqrt(var(sum) + epsilon) * gamma [+ beta]   (layer)
//   y   = sum / sqrt(mean(sum^2) + epsilon) * gamma [+ beta]             (rms)
//
// One pass over each row in cache instead of MLX's five elementwise and two
// reduction ops (which on CPU fall back to that composition: mx::fast's
// layer_norm has no CPU kernel). Statistics are float32, two-pass (mean first,
// then squared deviations), so they match the composition to float rounding.
#pragma once

#include <optional>
#include <vector>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

struct NormalizeOptions {
  float epsilon = 1e-5f;
  bool rms = false;          // RMS normalization: no mean is subtracted
  bool return_sum = false;   // also return x + skip + bias (SkipLayerNormalization's output 3)
};

/** The normalization above. x: float32 [..., D]; skip: x's shape; bias, gamma,
 * beta: [D]. Returns {y} or {y, sum}. Other dtypes or shapes run the MLX
 * composition (the kernel's reference), as do non-CPU streams. */
std::vector<mx::array> normalize_last_axis(const mx::array& x, const std::optional<mx::array>& skip,
                                           const std::optional<mx::array>& bias, const mx::array& gamma,
                                           const std::optional<mx::array>& beta, const NormalizeOptions& options,
                                           mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
