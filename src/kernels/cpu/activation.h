// Elementwise activations with the bias addition that precedes them (the
// epilogue of a MatMul in transformer feed-forward blocks), as one CPU kernel.
//
//   y = f(x [+ bias])     bias broadcast along the last axis
//
// MLX's CPU backend evaluates erf, tanh and exp one element at a time, on one
// thread (compiled or not); this kernel is Highway SIMD across the kernel
// threads. Accuracy, float32 (checked in tests/kernels/cpu/activation_test.cpp):
//   kGeluErf   0.5 z (1 + erf(z / sqrt 2)); erf as a rational function on
//              [-4, 4] (the coefficients of src/ops/rational_erf.cpp), max abs
//              error of erf 3.8e-7, so |error| <= 2e-7 |z| + rounding
//   kGeluTanh  0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))); Highway's Tanh,
//              4 ulp
//   kSigmoid   1 / (1 + exp(-z)); Highway's Exp (1 ulp) on -z clamped to 88
//   kSilu      z * sigmoid(z)
//   kErf       erf(z), as in kGeluErf
//   kTanh      tanh(z): Highway's Tanh, 4 ulp (a BERT pooler's activation)
//   kIdentity  z (a plain bias add)
// NaN stays NaN. Gradients are those of the MLX composition (mx::erf, mx::tanh,
// mx::sigmoid), which is also what runs off CPU streams.
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

enum class Activation { kIdentity, kGeluErf, kGeluTanh, kSigmoid, kSilu, kErf, kTanh };

/** True when bias_activation runs the kernel for these arguments on a CPU
 * stream: x float32 with at least one dimension; bias absent or float32 [D],
 * D = x's last dimension. Callers keep their own (faster or differently
 * rounded) composition for the other cases. */
bool bias_activation_fits(const mx::array& x, const std::optional<mx::array>& bias);

/** f(x + bias) as above. x: float32 [..., D]; bias: float32 [D] or none.
 * Arguments that do not fit (bias_activation_fits), and non-CPU streams, run
 * the MLX composition. */
mx::array bias_activation(const mx::array& x, const std::optional<mx::array>& bias, Activation activation,
                          mx::StreamOrDevice s = {});

/** The gated feed-forward activation of Llama-style MLPs: x [..., 2n] holds the gate then the up
 * projection, y [..., n] = silu(gate) * up (silu as kSilu above). float32 on CPU streams runs the
 * kernel; the rest (odd widths, other dtypes, other streams) and gradients the MLX composition. */
mx::array swiglu(const mx::array& x, mx::StreamOrDevice s = {});

/** For kernels with an activation epilogue (gemm.cpp): y[r * ld + c] =
 * f(y[r * ld + c]) for r < rows, c < cols, in place, on the calling thread,
 * with the math above. */
void activate_block(float* y, int64_t rows, int64_t cols, int64_t ld, Activation activation);

}  // namespace transmuter::kernels
