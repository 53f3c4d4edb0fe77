// Exact 8-bit integer matrix products as one CPU kernel: ONNX MatMulInteger's
//
//   Y[i, j] = sum_k (A[i, k] - a_zero) (B[k, j] - b_zero[j])      (int32)
//
// for uint8 A [..., M, K] (a dynamically quantized activation) and a constant
// int8 or uint8 B [K, N] packed once at load. With AVX512-VNNI (vpdpbusd: four
// u8 x s8 products summed into each int32 lane) the raw sum_k A B' over the
// packed B' is exact in int32 and the zero points enter afterwards through the
// row sums of A and the column sums of B' (precomputed):
//
//   sum (a - za)(b' - zb') = sum a b' - zb' sum_k a - za sum_k b' + K za zb'
//
// where b' = B - 128 for uint8 B (int8 as it is) and zb' = b_zero - 128 likewise.
// Other CPUs, other streams, int8 A or K not a multiple of 4 run the kernel's
// reference: the same integers in float32 matmuls over chunks short enough
// that every partial sum is exact (below 2^24), summed in int32.
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

namespace transmuter::kernels {

/** A stored 8-bit weight or zero point's value: the byte as int8 when `is_signed`, else as uint8. */
inline int32_t byte_value(uint8_t byte, bool is_signed) {
  return is_signed ? int32_t{static_cast<int8_t>(byte)} : int32_t{byte};
}

namespace mx = mlx::core;

/** Float32 holds every integer below 2^24 exactly, so a sum of at most 2^24 / 65025 = 258 products
 * of integers in [-255, 255] is exact in float32 whatever the summation order (blocking, FMA, GPU
 * split-K). TF32 matmul on GPUs rounds operands to 11 significant bits, which still holds them. */
inline constexpr int kExactIntegerTerms = 258;

/** Exact a @ b for float32 a [..., M, K] and b [..., K, N] (batch axes broadcast) holding integers in
 * [-255, 255] (8-bit values minus 8-bit zero points); int32 result [..., M, N]. K is cut into chunks
 * of at most kExactIntegerTerms, each chunk's product is exact in float32 (Transmuter's GEMM on CPU
 * streams, MLX's matmul elsewhere), and the chunks are summed in int32 (wrapping like a 32-bit
 * accumulator, which ONNX allows). */
mx::array exact_integer_matmul(mx::array a, mx::array b, mx::StreamOrDevice s = {});

/** B prepared for integer_matmul. packed: int8 [panels, K / 4 (rounded up), 128]: panels of 32
 * columns, each quad of 4 depths holding column j's 4 values at bytes 4 j .. 4 j + 3 (zeros past K
 * and N). column_sums: int32 [N], sum_k of the shifted B'. column_zeros: int32 [N], b_zero - shift. */
struct PackedIntegerRhs {
  mx::array packed;
  mx::array column_sums;
  mx::array column_zeros;
};

/** Packs a constant B [K, N] (int8 or uint8) and its zero point (nullopt: 0; a scalar or [N], of B's
 * type), evaluated on the host. Throws std::invalid_argument for other dtypes or shapes. */
PackedIntegerRhs pack_integer_gemm_rhs(const mx::array& b, const std::optional<mx::array>& b_zero_point);

/** pack_integer_gemm_rhs of B from B^T [N, K] (each column's K values in a row, as a convolution's or
 * Gemm transB's weight holds them), without transposing it first. */
PackedIntegerRhs pack_integer_gemm_rhs_columns(const mx::array& bt,
                                               const std::optional<mx::array>& b_zero_point);

/** True when this CPU runs integer_matmul's kernel (AVX512-VNNI): otherwise the reference runs. */
bool integer_gemm_available();

/** A float epilogue of the integer product: Y = float(acc) * scale [+ bias], each rounded as the
 * separate Cast, Mul and Add of quantize_dynamic's exports round (no fused multiply-add). scale:
 * float32, one element or [n] (computed at run time: A's scale times B's); bias: float32 [n]. */
struct IntegerEpilogue {
  mx::array scale;
  std::optional<mx::array> bias = std::nullopt;
  /** A second factor of the scale (one element or [n]): scale is then scale * scale_factor, rounded
   * once as the graph's Mul of A's scale and B's computes it. */
  std::optional<mx::array> scale_factor = std::nullopt;
};

/** int32 (A - a_zero_point) @ (B - b_zero_point) [..., M, n] for A [..., M, k] uint8 or int8,
 * B packed by pack_integer_gemm_rhs (k its depth, n its columns), a_zero_point of A's type, scalar
 * (nullopt: 0); with an epilogue, the float32 result of it instead. */
mx::array integer_matmul(const mx::array& a, const PackedIntegerRhs& b, int64_t k, int64_t n,
                         const std::optional<mx::array>& a_zero_point, mx::StreamOrDevice s = {},
                         const std::optional<IntegerEpilogue>& epilogue = std::nullopt);

}  // namespace transmuter::kernels
