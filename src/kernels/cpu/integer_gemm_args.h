// The arguments of one 8-bit integer product (integer_gemm.cpp, compiled once per SIMD target), shared
// with the kernels that run it on rows of their own: the channels-last QLinearConv (qlinear_conv.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace transmuter::kernels {

// Columns of one packed panel (two vectors of 16 int32 lanes) and bytes of one of its depth quads.
inline constexpr int64_t kIntPanelColumns = 32;
inline constexpr int64_t kIntQuadBytes = 4 * kIntPanelColumns;
// Rows of one register tile: 6 rows x 2 vectors = 12 accumulators.
inline constexpr int64_t kIntTileRows = 6;

// One call's pointers and sizes (outside the per-target namespaces). Exactly one of y, y_float and
// y_quant is non-null: the int32 products, the float epilogue's or the requantizing one's results.
struct IntegerGemmArgs {
  const uint8_t* a;             // [m, lda]: row i's k values, then zeros up to the next multiple of 4
  int64_t lda;                  // bytes between rows of a, >= k rounded up to a multiple of 4
  const int32_t* row_sums;      // [m]: sum_k of each row of a
  const int8_t* packed;         // [panels, ceil(k / 4), kIntQuadBytes]
  const int32_t* column_sums;   // [panels * kIntPanelColumns]
  const int32_t* column_zeros;  // [panels * kIntPanelColumns]
  int32_t a_zero;
  bool b_zero_free;  // every column_zeros value is 0 (set by the runners): row_sums is then not read
  int64_t m, k, n;
  int32_t* y;  // [m, n]
  // The float epilogue: y_float = float(acc) * scale[j or 0] [+ bias[j]].
  float* y_float;
  const float* scale;
  bool scale_per_column;
  const float* factor;  // null: none; else scale is scale * factor
  bool factor_per_column;
  const float* bias;  // null: none
  // The requantizing epilogue (QLinearConv's): y_quant = clamp(round_half_even(float(acc + bias_int[j]) *
  // scale[j or 0]) + y_zero, y_min, y_max) as bytes (int8 when y_signed, else uint8).
  uint8_t* y_quant;
  const int32_t* bias_int;  // [n], or null
  int32_t y_zero, y_min, y_max;
  bool y_signed;
  // Its per-column constants, padded with zeros to whole panels (set_requantize_columns, once a call): the
  // zero points' column terms plus bias_int (K za zb' - za sum_k b' + bias), and the scales (the one scale
  // repeated when per tensor).
  const int32_t* column_offsets;
  const float* column_scales;
  // Then, when add_other is set, com.microsoft QLinearAdd of the requantized bytes and add_other's (the
  // output's type and [m, n] layout) over y_quant, as kernels::qlinear_add computes it:
  // saturate(round(fma(A, add_a, fma(B, add_b, add_fixed)))), A the product's bytes when add_product_first,
  // else add_other's. Each task adds over its own block once its products are stored (still in cache): a
  // residual's add without a kernel and a pass over memory of its own.
  const uint8_t* add_other;
  float add_a, add_b, add_fixed;
  bool add_product_first;
};

/** The storage behind IntegerGemmArgs::column_offsets and column_scales, owned by the caller of a call. */
struct RequantizeColumns {
  std::vector<int32_t> offsets;
  std::vector<float> scales;
};

/** Fills `storage` from g (its a_zero, column sums and zeros, bias_int, scale) and points g at it. Once per
 * call of a requantizing product, after g.a_zero is set. */
void set_requantize_columns(IntegerGemmArgs& g, RequantizeColumns& storage);

/** Sets g.b_zero_free from g's column zeros (whether B has no zero points: then A's row sums are neither
 * computed nor read). Once per call, before integer_gemm_rows_on_this_thread. */
void set_zero_free_columns(IntegerGemmArgs& g);

/** The product of rows [row0, row0 + rows) of g.a (all columns) on the calling thread, their row sums
 * computed here when B has zero points (g.row_sums is not read); g.b_zero_free set by set_zero_free_columns.
 * On the CPU's best SIMD target; requires integer_gemm_available(). */
void integer_gemm_rows_on_this_thread(const IntegerGemmArgs& g, int64_t row0, int64_t rows);

/** The whole product g (all g.m rows), its row sums computed here, split between the kernel threads. */
void run_integer_gemm(IntegerGemmArgs g);

}  // namespace transmuter::kernels
