// Matrix products with a constant right-hand side packed once, at load.
//
//   y[..., N] = act(a[..., K] @ B[K, N] + bias[N])
//
// MLX sends every float32 product to OpenBLAS's sgemm, which copies ("packs")
// both operands into its blocked layout on every call, zeroes or scales the
// output first, and keeps a second thread spinning between calls. For a
// model's weights the packing of B can be done once: pack_gemm_rhs() stores B
// as column panels, each panel `panel_width` columns wide and K rows deep,
// contiguous, so the kernel streams through it without strides:
//
//   packed[p, k, j] = B[k, p * panel_width + j]     (0 past column N)
//
// The kernel computes register tiles of 6 rows x one panel (two SIMD vectors
// per row) with Highway, blocks K so that a panel's slice stays in L1, starts
// the accumulators at the bias, applies the activation to each finished block
// while it is still in cache, and splits the output blocks across the kernel
// threads (parallel_for). One row (a decoder step) is the same loop with a
// one-row tile: a streaming GEMV over the packed panels.
//
// The packed layout depends on the CPU's SIMD width (gemm_panel_width()), so it
// is made at load on the machine that runs it and never stored in a file.
// Gradients and non-CPU streams use the reference composition:
// act(a @ unpack_gemm_rhs(packed) + bias).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/depthwise_conv.h"  // ConvActivation

namespace transmuter::kernels {

namespace mx = mlx::core;

/** Rows of the GEMM's register tile: a product's rows are best split in multiples of it. */
inline constexpr int64_t kGemmTileRows = 6;

/** Columns per packed panel on this CPU: two vectors of the SIMD target
 * Highway picks at run time (16 with AVX2). */
int64_t gemm_panel_width();

/** panel[kk * width + j] = rows[j][kk] for j < cols and kk < k, each of the cols
 * rows k float32 values at any byte alignment (a weight where it lies in its
 * file); the panel's other columns are left as they are. */
void transpose_rows_into_panel(const uint8_t* const* rows, int64_t cols, int64_t k, int64_t width,
                               float* panel);

/** B packed as above: float32 [ceil(N / P), K, P] with P = gemm_panel_width().
 * `b` is float (any float dtype, converted to float32) [K, N], or [N, K] when
 * `transposed` (Gemm's transB, nn.Linear's layout). Evaluates `b`. Throws
 * std::invalid_argument when b is not a non-empty 2-D float array. */
mx::array pack_gemm_rhs(const mx::array& b, bool transposed);

/** The inverse of pack_gemm_rhs as an MLX composition (differentiable):
 * packed [panels, K, P] -> B [K, n]. */
mx::array unpack_gemm_rhs(const mx::array& packed, int64_t n, mx::StreamOrDevice s = {});

/** True when `packed` is a packed right-hand side this CPU's kernel reads
 * (float32, 3-D, panel width gemm_panel_width(), enough panels for n). */
bool packed_rhs_fits(const mx::array& packed, int64_t n);

/** act(a @ B + bias) [+ residual] with B given packed. a: float32 [..., K]
 * (rank >= 1); bias: float32 [n] or none; residual (with no activation only):
 * added in the epilogue when it has the output's shape (a layer-scale block's
 * shortcut), else by MLX with broadcasting. Returns a's leading axes + [n]. On
 * a CPU stream with arguments that fit, the kernel above; otherwise (and for
 * gradients) the reference composition. Throws std::invalid_argument (from
 * MLX) when K does not match. */
mx::array packed_matmul(const mx::array& a, const mx::array& packed, const std::optional<mx::array>& bias,
                        int64_t n, Activation activation = Activation::kIdentity, mx::StreamOrDevice s = {},
                        const std::optional<mx::array>& residual = std::nullopt);

/** True when batched_matmul() runs the kernel: a CPU stream, float32 a [..., M, K]
 * and b [..., K, N] (rank >= 2, leading axes broadcastable, non-empty) with
 * M >= 2 (one row is kernels::matvec's). */
bool batched_matmul_fits(const mx::array& a, const mx::array& b, mx::StreamOrDevice s = {});

/** a @ b with numpy broadcasting of the leading axes, for operands that are
 * not constant (attention scores outside the fused kernel, a weight fed as an
 * input): b is packed per call when a has 8 rows or more (once when it is
 * broadcast over the batch), read in place otherwise; one run_gemm per batch.
 * Outside batched_matmul_fits, and for gradients, mx::matmul. */
mx::array batched_matmul(const mx::array& a, const mx::array& b, mx::StreamOrDevice s = {});

/** The kernel underneath, for other kernels (conv2d): y = act(a @ B +
 * col_bias + row_bias + residual), float32, B packed (pack_gemm_rhs's layout) or a
 * strided row-major matrix. Runs on the calling thread and the kernel pool. */
struct GemmArgs {
  const float* a = nullptr;  // [m, k], row stride lda
  int64_t lda = 0;
  const float* packed = nullptr;  // [ceil(n / panel width), k, panel width], or null:
  const float* b = nullptr;       // [k, n], row stride ldb
  int64_t ldb = 0;
  const float* col_bias = nullptr;  // [n] or null
  const float* row_bias = nullptr;  // [m] or null
  const float* residual = nullptr;  // [m, n] added before the activation (row stride ldy), or null
  float* y = nullptr;               // [m, n], row stride ldy
  int64_t ldy = 0;
  int64_t m = 0, k = 0, n = 0;
  Activation activation = Activation::kIdentity;
  // A convolution's activation, applied in registers before the last store
  // (instead of `activation`; clip bounds for kClip only).
  ConvActivation conv_activation = ConvActivation::kNone;
  float clip_min = 0.0f, clip_max = 6.0f;
};

void run_gemm(const GemmArgs& args);

/** How a product's output [m rows x `panels` column panels] splits into the tasks of one
 * parallel_for: rows evenly into blocks of at most `max_rows` (whole tiles of `tile_rows`; 128 rows:
 * 66 + 62, not 96 + 32), panels into blocks of `max_panels`, halved down to one panel until each
 * thread has about four tasks (a short sequence's 16 x 384 x 384: 12 panels, 3 blocks of 4 for 2
 * threads, get narrower ones); then, while fewer tasks than that do not divide among the threads,
 * rows into more blocks, down to two tiles (a 7x7 layer's 49 rows x 5 panels: 10 tasks, not 5).
 * Shared by the float GEMM, the int8 one (integer_gemm.h) and the Winograd convolution. */
struct BlockSplit {
  int64_t m, panels, block_rows, row_blocks, block_panels, panel_blocks;

  /** `threads`: the threads the tasks share (0: kernel_threads()). */
  BlockSplit(int64_t m, int64_t panels, int64_t max_rows, int64_t tile_rows, int64_t max_panels,
             int64_t threads = 0);
  int64_t tasks() const { return row_blocks * panel_blocks; }
  /** Task t's first row, rows, first panel and panels. */
  void task(int64_t t, int64_t& row0, int64_t& rows, int64_t& panel0, int64_t& panel_count) const;
};

/** run_gemm on the calling thread alone: for a kernel that already runs its
 * own parallel tasks (a fused block's row strips). */
void run_gemm_on_this_thread(const GemmArgs& args);

/** Copies one row of a panel: `cols` floats of src (at any alignment), then zeros up to
 * `width` (the panel width). The common widths are constant-size copies the
 * compiler inlines (a libc call per 64 bytes dominated packing). */
inline void copy_panel_row(float* dst, const void* src, int64_t cols, int64_t width) {
  if (cols == 16 && width == 16) {
    std::memcpy(dst, src, 16 * sizeof(float));
  } else if (cols == 32 && width == 32) {
    std::memcpy(dst, src, 32 * sizeof(float));
  } else {
    std::memcpy(dst, src, static_cast<size_t>(cols) * sizeof(float));
    std::fill(dst + cols, dst + width, 0.0f);
  }
}

}  // namespace transmuter::kernels
