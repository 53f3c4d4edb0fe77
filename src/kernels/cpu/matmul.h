// Matrix products the CPU kernels route differently from mx::matmul.
//
// MLX sends every float32 product to cblas_sgemm. For one row (batch 1,
// sequence 1: a decoder step, a pooled embedding) OpenBLAS's sgemm still packs
// both operands, several times slower than its sgemv on the same bytes.
#pragma once

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

/** a [..., K] (one row in total: every leading axis is 1) times a weight
 * matrix: w [K, N], or w [N, K] when `transposed_w` (the product uses w^T, the
 * layout of Gemm's transB and of nn.Linear). Returns a's leading axes + [N].
 * float32 on a CPU stream through cblas_sgemv; otherwise mx::matmul. */
mx::array matvec(const mx::array& a, const mx::array& w, bool transposed_w, mx::StreamOrDevice s = {});

/** True when matvec() would take a and w through the GEMV kernel. */
bool matvec_applies(const mx::array& a, const mx::array& w, mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
