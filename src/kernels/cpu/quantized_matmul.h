// Matrix products with a weight quantized in MLX's affine layout (what
// mx::quantize makes and src/passes/pack_matmul_nbits.cpp converts
// MatMulNBits weights into):
//
//   y[M, N] = x[M, K] @ W^T,   W[n, k] = scales[n, g] * q[n, k] + biases[n, g],  g = k / group_size
//
//   w: uint32 [N, K * bits / 32]; each word holds 32 / bits values q of one row
//      along K, low bits first (bits 4: q[n, 8i + j] = (w[n, i] >> 4j) & 15)
//   scales, biases: float32 [N, K / group_size]; without biases (a symmetric weight: MatMulNBits
//      without zero points) biases = -2^(bits - 1) * scales, computed in the kernel, so the stored
//      layout is the file's: bits / 8 bytes a weight and 4 bytes of scale a group
//
// MLX's CPU quantized matmul is scalar (4-bit 4096 x 4096, one row: ~11 ms,
// under 1 GB/s of weight). Two paths here, both vectorized with Highway and
// split over N across the kernel threads (parallel_for):
//
// - Few rows (a decoder step): a GEMV that streams the packed weight once.
//   A vector of words holds, in plane j = (word >> j * bits) & mask, the values
//   k = 8i + j of lane i (bits 4); x is permuted once per call into that plane
//   order, so each plane is one convert and one FMA per row against x, with no
//   shuffles. The dot product of a group is scaled once (its scale), and the
//   biases are applied once per group as biases[n, g] * sum(x in group g).
// - More rows (a prefill): blocks of 4 GEMM panels (64 columns with AVX2) x
//   256 of K are dequantized into the float GEMM's packed panels
//   (kernels/cpu/gemm.h) in a buffer that stays in L2, and the GEMM
//   accumulates the K slices into y.
// - Few rows with Activations::int8_per_group (MatMulNBits accuracy_level 4):
//   x is rounded to int8 per group once per call and the GEMV takes integer
//   dot products of the weight's bytes with x's (AVX512-VNNI vpdpbusd; the
//   AVX-512/AVX2 vpmaddubsw pair for 4 bits), one float scale per group:
//   exact, so equal to the float GEMV on the rounded x, which the other
//   targets (and $TRANSMUTER_INT8_GEMV=0) run.
//
// The stored weight is never expanded: the GEMV reads bits / 8 bytes per
// weight plus 8 bytes of scale and bias per group (4 without biases) (docs/quantized_performance.md:
// 4096 x 4096 at 4 bits, one row, ~70 % of the memory read bandwidth with the
// weights coming from memory). Gradients (with respect to x, scales, biases)
// and non-CPU streams use the reference, mx::quantized_matmul.
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

/** What the product does with x. */
enum class Activations {
  float32,         // x as given
  int8_per_group,  // ONNX Runtime's MatMulNBits accuracy_level 4: x rounded per group (int8_group_rounded)
};

/** x with each group of `group` values along its last axis rounded to int8 as ONNX Runtime's
 * MatMulNBits at accuracy_level 4 quantizes A (MLAS's QuantizeARow_CompInt8): scale = max|x| / 127,
 * value = nearbyint(x * (127 / max|x|)) * scale, zero in an all-zero group; a last partial group is
 * quantized over its own values. The gradient passes through unchanged (straight-through: rounding's
 * own derivative is zero almost everywhere). float32 in, float32 out. */
mx::array int8_group_rounded(const mx::array& x, int group, mx::StreamOrDevice s = {});

/** True when quantized_matmul() runs the kernel: a CPU stream, x float32
 * [..., K] non-empty, bits 4 or 8, group_size 32, 64 or 128 dividing K, w
 * uint32 [N, K * bits / 32], scales and biases (when given) float32 [N, K / group_size]. */
bool quantized_matmul_fits(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int group_size, int bits,
                           mx::StreamOrDevice s = {});

/** x [..., K] @ dequantize(w, scales, biases)^T -> [..., N], float32: the
 * kernel above where quantized_matmul_fits(), otherwise (and for gradients)
 * mx::quantized_matmul(x, w, scales, biases, true, group_size, bits, "affine").
 * No biases: those of the symmetric weight, -2^(bits - 1) * scales. With
 * Activations::int8_per_group, x is int8_group_rounded(x, group_size) first. */
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int group_size, int bits,
                           mx::StreamOrDevice s = {}, Activations activations = Activations::float32);

/** True when routed_quantized_matmul() runs the kernel: a CPU stream, bits 4 or 8, group_size 32, 64 or
 * 128 dividing K, x float32 [R, K] non-empty, experts uint32 [P] with P a multiple of R, w uint32
 * [E, N, K * bits / 32], scales and biases (when given) float32 [E, N, K / group_size]. */
bool routed_quantized_matmul_fits(const mx::array& x, const mx::array& experts, const mx::array& w,
                                  const mx::array& scales, const std::optional<mx::array>& biases,
                                  int group_size, int bits, mx::StreamOrDevice s = {});

/** A mixture of experts' routed products over experts' weights in the layout above, one weight per expert:
 *   y[p] = x[p / (P / R)] @ dequantize(w[e], scales[e], biases[e])^T,  e = experts[p],
 * x [R, K] (R = P: a row per pair; R < P: the P / R pairs of a token share its row), experts [P],
 * w [E, N, K * bits / 32], scales and biases [E, N, K / group_size] -> y [P, N], float32. The pairs of
 * one expert are one product over its packed weight, which stays packed: the GEMV for a few rows (a
 * decode step routes one row to each of its k experts), the dequantized GEMM for many (a prefill). No
 * biases: those of the symmetric weight. Elsewhere (and for gradients) mx::gather_qmm. An expert index
 * out of range gives a row of NaN. */
mx::array routed_quantized_matmul(const mx::array& x, const mx::array& experts, const mx::array& w,
                                  const mx::array& scales, const std::optional<mx::array>& biases,
                                  int group_size, int bits, mx::StreamOrDevice s = {});

/** The biases of a symmetric weight: -2^(bits - 1) * scales. */
mx::array symmetric_biases(const mx::array& scales, int bits, mx::StreamOrDevice s = {});

/** Rows of x from which the kernel dequantizes blocks for the float GEMM
 * instead of running the GEMV over row tiles (picked by bench/q4_bench.py). */
int64_t quantized_matmul_gemm_rows();

}  // namespace transmuter::kernels
