// exp and softmax built from MLX's vectorized elementwise ops.
//
// MLX's CPU exp evaluates one element at a time (about 12 ns per element on
// x86, bench/results/mlx_transcendentals.txt), so softmax over attention
// scores cost more than the matmuls around it. Range reduction plus a
// polynomial uses only multiply, add, round and a bit shift, which are
// vectorized and fuse under mx::compile.
//
// The composition builds 2^k by reinterpreting integer bits (mx::view), which
// MLX cannot differentiate, so it is wrapped in mx::custom_vjp with the
// analytic derivative (d exp(x) = exp(x) dx). GPU backends evaluate exp
// natively and fast: on a GPU stream these functions are MLX's own.
#pragma once

#include <vector>

#include <mlx/mlx.h>

namespace transmuter {

namespace mx = mlx::core;

/** True when `s` (default: the default device) is a CPU stream: the
 * vectorized compositions here and in rational_erf.h are used only there. */
bool on_cpu_stream(mx::StreamOrDevice s);

/** exp(x) for float32 x <= 88 (larger x: use mx::exp). On a CPU stream:
 * relative error below 2e-7; results under 2^-126 (x < -87.33) flush to 0;
 * NaN stays NaN; the vjp is y * cotangent (no jvp: see the .cpp). On a GPU
 * stream: mx::exp.
 * x: float32, any shape. */
mx::array exp_upto_88(const mx::array& x, mx::StreamOrDevice s = {});

/** softmax over `axes` with exp_upto_88 (the exponent x - max(x) is <= 0) on
 * a CPU stream, mx::softmax (precise) on a GPU stream. float32 only; callers
 * widen half precision first. */
mx::array softmax_float32(const mx::array& x, const std::vector<int>& axes, mx::StreamOrDevice s = {});

}  // namespace transmuter
