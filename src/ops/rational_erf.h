// erf as a rational function built from MLX's vectorized elementwise ops.
//
// MLX's CPU erf evaluates one element at a time (about 25 ns per element on
// x86, bench/results/mlx_transcendentals.txt), which made exact GELU the
// largest cost of a BERT forward pass. Multiply, add and divide are
// vectorized and fuse under mx::compile, so a rational approximation is about
// 20x faster at float32 accuracy.
//
// Its vjp and jvp are the analytic 2/sqrt(pi) exp(-x^2) (with the vectorized
// exp), not the derivative of the rational function. GPU backends evaluate
// erf natively: on a GPU stream rational_erf is mx::erf.
#pragma once

#include <mlx/mlx.h>

namespace transmuter {

namespace mx = mlx::core;

/** erf(x). On a CPU stream, float32 uses erf(x) ~= x * P(x^2) / Q(x^2) on x
 * clamped to [-4, 4] (max abs error 3.8e-7 over the reals, result clipped to
 * [-1, 1], checked in tests/ops/rational_erf_test.cpp), differentiated as
 * 2/sqrt(pi) exp(-x^2); float16/bfloat16 are computed in float32 and rounded
 * once; other dtypes, and every dtype on a GPU stream, use mx::erf. */
mx::array rational_erf(const mx::array& x, mx::StreamOrDevice s = {});

}  // namespace transmuter
