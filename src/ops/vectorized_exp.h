// exp and softmax built from MLX's vectorized elementwise ops.
//
// MLX's CPU exp evaluates one element at a time (about 12 ns per element on
// x86, bench/results/mlx_transcendentals.txt), so softmax over attention
// scores cost more than the matmuls around it. Range reduction plus a
// polynomial uses only multiply, add, round and a bit shift, which are
// vectorized and fuse under mx::compile.
#pragma once

#include <vector>

#include <mlx/mlx.h>

namespace transmuter {

namespace mx = mlx::core;

/** exp(x) for float32 x <= 88 (larger x: use mx::exp). Relative error below
 * 2e-7; results under 2^-126 (x < -87.33) flush to 0; NaN stays NaN.
 * x: float32, any shape. */
mx::array exp_upto_88(const mx::array& x, mx::StreamOrDevice s = {});

/** softmax over `axes` with exp_upto_88 (the exponent x - max(x) is <= 0).
 * float32 only; callers widen half precision first. */
mx::array softmax_float32(const mx::array& x, const std::vector<int>& axes, mx::StreamOrDevice s = {});

}  // namespace transmuter
