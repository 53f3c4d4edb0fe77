// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); the kernel and the panel width come from the best target of the CPU,
// picked at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gemm.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/conv_activation-inl.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/partial_vectors-inl.h"

#ifndef TRANSMUTER_KERNELS_CPU_GEMM_ARGS
#define TRANSMUTER_KERNELS_CPU_GEMM_ARGS
namespace transmuter::kernels {
// Rows of one register tile: 6 rows x 2 vectors = 12 accumulators, leaving
// registers for the two panel vectors and the broadcast row value (16 on AVX2);
// AVX-512's 32 registers hold tiles of twice as many rows (TileRowsFor).
inline constexpr int64_t kTileRows = kGemmTileRows;
// Depth of one pass over K: a row tile's slice of A (6 x 256 floats, 6 KiB)
// stays in L1 while it passes over the block's panels (4 x 16 KiB with AVX2,
// 32 KiB with AVX-512, in L2). Blocks of many rows pass over twice the depth
// (DepthBlock).
inline constexpr int64_t kDepthBlock = 256;

// The panels a thread multiplies next: the next task's (run_gemm deals tasks to a thread in order, so
// the one after its current task is most likely its next), or none (count 0).
struct NextPanels {
  int64_t first = 0, count = 0;
};
}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

int64_t PanelWidth() { return 2 * static_cast<int64_t>(hn::Lanes(D())); }

// The `cols` (<= panel width) first columns of a row segment, as two vectors.
// Lanes past cols are neither read nor written (no fault past the row's end,
// no race with the neighbouring tile).
struct RowSegment {
  int64_t cols;
  bool full;
  size_t low, high;  // the lanes of each vector that hold columns

  explicit RowSegment(int64_t columns) : cols(columns) {
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(D()));
    full = cols == 2 * lanes;
    low = static_cast<size_t>(std::min(cols, lanes));
    high = static_cast<size_t>(cols > lanes ? cols - lanes : 0);
  }
  void load(const float* p, V& lo, V& hi) const {
    const D d;
    if (full) {
      lo = hn::LoadU(d, p);
      hi = hn::LoadU(d, p + hn::Lanes(d));
    } else {
      lo = LoadFirst(d, p, low);
      hi = high > 0 ? LoadFirst(d, p + hn::Lanes(d), high) : hn::Zero(d);
    }
  }
  void store(V lo, V hi, float* p) const {
    const D d;
    if (full) {
      hn::StoreU(lo, d, p);
      hn::StoreU(hi, d, p + hn::Lanes(d));
    } else {
      StoreFirst(lo, d, p, low);
      if (high > 0) StoreFirst(hi, d, p + hn::Lanes(d), high);
    }
  }
};

// Where a tile's accumulators start: y itself (a later K slice), else the
// column bias + the row bias + the residual (each zero when null; the
// residual has y's row stride and is y's shape).
struct TileStart {
  const float* col_bias;
  const float* row_bias;
  const float* residual;
  bool accumulate;
};

// max(v, 0), clip or HardSwish on the finished accumulators (GemmArgs::conv_activation).
struct Clamp {
  ConvActivation kind = ConvActivation::kNone;
  float lo = 0.0f, hi = 6.0f;

  V apply(V v) const { return ApplyConvActivation(D(), v, kind, lo, hi); }
};

// y[R rows, segment] = start + a[R rows, 0..depth) @ b[0..depth, segment),
// with b's rows `ldb` apart (TileStart). kMaskedB: b holds only the
// segment's columns (an unpacked matrix's last columns), read masked.
// kLowOnly: the segment's columns fit the first vector (a last panel of at
// most `lanes` columns; 16-column pointwise convs, N = 16, have nothing else),
// so the second vector's multiply-adds, all on zero padding, are skipped.
// kPrefetch: asks for the first `prefetch_rows` rows of the packed panel slice
// at `next_b` (same layout as b), one in step with each of b's rows, so that
// they are on their way into the caches while this slice is multiplied (see
// Block).
template <int R, bool kMaskedB, bool kLowOnly, bool kPrefetch>
HWY_INLINE void Tile(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t depth, float* y,
                     int64_t ldy, const RowSegment& segment, const TileStart& start, const Clamp* clamp,
                     const float* next_b, int64_t prefetch_rows) {
  const D d;
  const size_t lanes = hn::Lanes(d);
  V lo[R], hi[R];
  if constexpr (kLowOnly) {
    for (int r = 0; r < R; ++r) hi[r] = hn::Zero(d);  // stays zero: stored nowhere (segment.high == 0)
  }
  if (start.accumulate) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) segment.load(y + r * ldy, lo[r], hi[r]);
  } else {
    V start_lo = hn::Zero(d), start_hi = hn::Zero(d);
    if (start.col_bias != nullptr) segment.load(start.col_bias, start_lo, start_hi);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const V row = hn::Set(d, start.row_bias != nullptr ? start.row_bias[r] : 0.0f);
      lo[r] = hn::Add(start_lo, row);
      if constexpr (!kLowOnly) hi[r] = hn::Add(start_hi, row);
    }
    if (start.residual != nullptr) {
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        V res_lo, res_hi;
        segment.load(start.residual + r * ldy, res_lo, res_hi);
        lo[r] = hn::Add(lo[r], res_lo);
        if constexpr (!kLowOnly) hi[r] = hn::Add(hi[r], res_hi);
      }
    }
  }
  auto load_b = [&](int64_t k, V& b_lo, V& b_hi) {
    if constexpr (kPrefetch) {
      // Into L2 (locality 2): a whole panel slice ahead does not fit L1 beside this one.
      if (k < prefetch_rows) {
        __builtin_prefetch(next_b + k * ldb, 0, 2);
        __builtin_prefetch(next_b + k * ldb + lanes, 0, 2);
      }
    }
    if constexpr (kMaskedB) {
      segment.load(b + k * ldb, b_lo, b_hi);
    } else {
      b_lo = hn::LoadU(d, b + k * ldb);
      if constexpr (!kLowOnly) b_hi = hn::LoadU(d, b + k * ldb + lanes);
    }
  };
  int64_t k = 0;
  if constexpr (R == 1) {
    // One row (a decode step's matrix-vector product): a single accumulator pair waits out
    // each FMA's latency; three more pairs over interleaved k keep the FMA units busy.
    V lo_k[3] = {hn::Zero(d), hn::Zero(d), hn::Zero(d)}, hi_k[3] = {hn::Zero(d), hn::Zero(d), hn::Zero(d)};
    for (; k + 4 <= depth; k += 4) {
      V b_lo, b_hi;
      load_b(k, b_lo, b_hi);
      lo[0] = hn::MulAdd(hn::Set(d, a[k]), b_lo, lo[0]);
      if constexpr (!kLowOnly) hi[0] = hn::MulAdd(hn::Set(d, a[k]), b_hi, hi[0]);
#pragma GCC unroll 3
      for (int j = 0; j < 3; ++j) {
        load_b(k + 1 + j, b_lo, b_hi);
        lo_k[j] = hn::MulAdd(hn::Set(d, a[k + 1 + j]), b_lo, lo_k[j]);
        if constexpr (!kLowOnly) hi_k[j] = hn::MulAdd(hn::Set(d, a[k + 1 + j]), b_hi, hi_k[j]);
      }
    }
    lo[0] = hn::Add(hn::Add(lo[0], lo_k[0]), hn::Add(lo_k[1], lo_k[2]));
    hi[0] = hn::Add(hn::Add(hi[0], hi_k[0]), hn::Add(hi_k[1], hi_k[2]));
  }
#pragma GCC unroll 4
  for (; k < depth; ++k) {
    V b_lo, b_hi;
    load_b(k, b_lo, b_hi);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const V x = hn::Set(d, a[r * lda + k]);
      lo[r] = hn::MulAdd(x, b_lo, lo[r]);
      if constexpr (!kLowOnly) hi[r] = hn::MulAdd(x, b_hi, hi[r]);
    }
  }
  if (clamp != nullptr) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      lo[r] = clamp->apply(lo[r]);
      if constexpr (!kLowOnly) hi[r] = clamp->apply(hi[r]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) segment.store(lo[r], hi[r], y + r * ldy);
}

template <bool kMaskedB, bool kLowOnly = false, bool kPrefetch = false>
void TileRows(int64_t rows, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t depth, float* y,
              int64_t ldy, const RowSegment& segment, const TileStart& start, const Clamp* clamp,
              const float* next_b = nullptr, int64_t prefetch_rows = 0) {
  switch (rows) {
    case 12:
      return Tile<12, kMaskedB, kLowOnly, kPrefetch>(a, lda, b, ldb, depth, y, ldy, segment, start, clamp,
                                                     next_b, prefetch_rows);
    case 6:
      return Tile<6, kMaskedB, kLowOnly, kPrefetch>(a, lda, b, ldb, depth, y, ldy, segment, start, clamp,
                                                    next_b, prefetch_rows);
    case 5:
      return Tile<5, kMaskedB, kLowOnly, kPrefetch>(a, lda, b, ldb, depth, y, ldy, segment, start, clamp,
                                                    next_b, prefetch_rows);
    case 4:
      return Tile<4, kMaskedB, kLowOnly, kPrefetch>(a, lda, b, ldb, depth, y, ldy, segment, start, clamp,
                                                    next_b, prefetch_rows);
    case 3:
      return Tile<3, kMaskedB, kLowOnly, kPrefetch>(a, lda, b, ldb, depth, y, ldy, segment, start, clamp,
                                                    next_b, prefetch_rows);
    case 2:
      return Tile<2, kMaskedB, kLowOnly, kPrefetch>(a, lda, b, ldb, depth, y, ldy, segment, start, clamp,
                                                    next_b, prefetch_rows);
    default:
      return Tile<1, kMaskedB, kLowOnly, kPrefetch>(a, lda, b, ldb, depth, y, ldy, segment, start, clamp,
                                                    next_b, prefetch_rows);
  }
}

// The depth of a block's K slices: twice kDepthBlock for blocks of at least 8 row tiles, whose tiles
// each load and store their accumulators once per slice (the outputs' read-modify-write halves; A's
// 6 x 512 slice still fits L1) and which are compute-bound. 512 for every block measured ViT-base
// 0.974, BERT-base s128 0.986, MiniLM-L6 s128 0.985 but MiniLM-L6 s16 (one block of 16 rows reading
// its weights from memory) 1.031; this choice BERT 0.961 / 0.995, ViT 1.014 / 0.995, MiniLM-L6 s128
// 0.939, b32 0.979, s16 0.993 (alternating A/B, load 1.3-1.9).
int64_t DepthBlock(int64_t rows) { return rows >= 8 * kTileRows ? 2 * kDepthBlock : kDepthBlock; }

// The packed slice that the first row tile of a K slice multiplies after panel p's: the next panel's at
// this depth, else the block's first panel's at the next depth, else none.
const float* NextPackedSlice(const GemmArgs& g, int64_t p, int64_t k0, int64_t depth_block, int64_t panel0,
                             int64_t panels) {
  const int64_t width = PanelWidth();
  if (p + 1 < panel0 + panels) return g.packed + ((p + 1) * g.k + k0) * width;
  if (k0 + depth_block < g.k) return g.packed + (panel0 * g.k + k0 + depth_block) * width;
  return nullptr;
}

// Rows of a packed slice a Tile prefetches (none: next null or rows 0).
struct PrefetchShare {
  const float* next = nullptr;
  int64_t rows = 0;
};

// Row tile `tile`'s share (tiles 1 .. spread_tiles of a block, in equal parts) of the slice that the
// first row tile reads next in panel p's place: panel p's at the depth after k0, else, after the last
// depth, the next task's matching panel's first slice; none without one.
PrefetchShare ShareOfNextSlice(const GemmArgs& g, int64_t p, int64_t panel0, int64_t k0, int64_t depth_block,
                               int64_t tile, int64_t spread_tiles, const NextPanels& next) {
  if (spread_tiles <= 0) return {};
  int64_t panel = p, depth0 = k0 + depth_block;
  if (depth0 >= g.k) {
    if (p - panel0 >= next.count) return {};
    panel = next.first + (p - panel0);
    depth0 = 0;
  }
  const int64_t depth = std::min(depth_block, g.k - depth0);
  const int64_t share = (depth + spread_tiles - 1) / spread_tiles;
  const int64_t first_row = std::min((tile - 1) * share, depth);
  return {g.packed + (panel * g.k + depth0 + first_row) * PanelWidth(), std::min(share, depth - first_row)};
}

// Rows of the register tile for `remaining` rows: twice kTileRows where the target has 32 vector
// registers (AVX-512: 24 accumulators, half the panel loads per multiply-add), else kTileRows.
int64_t TileRowsFor(int64_t remaining) {
#if HWY_TARGET <= HWY_AVX3
  if (remaining >= 2 * kTileRows) return 2 * kTileRows;
#endif
  return std::min(kTileRows, remaining);
}

// Register tiles in a block of `rows` rows.
int64_t TilesIn(int64_t rows) {
  int64_t tiles = 0;
  for (int64_t r = 0; r < rows; r += TileRowsFor(rows - r)) ++tiles;
  return tiles;
}

// Asks for the residual rows a row tile at (r, col0) starts from (`rows` rows of one panel). Issued a
// tile ahead, they arrive while that tile multiplies instead of stalling its first multiply-adds: a
// ResNet block's 1x1 expansion over 64 channels, which reads its shortcut from memory, took 3.4 ms at
// batch 8 against 2.5 with them (kernel profile). Asking for a fresh output's lines the same way
// measured nothing.
void PrefetchResidualRows(const GemmArgs& g, int64_t r, int64_t rows, int64_t col0) {
  const size_t lanes = hn::Lanes(D());
  const float* residual = g.residual + r * g.ldy + col0;
  for (int64_t i = 0; i < rows; ++i) {
    __builtin_prefetch(residual + i * g.ldy, 0, 3);
    __builtin_prefetch(residual + i * g.ldy + lanes, 0, 3);
  }
}

// Output rows [row0, row0 + rows) x panels [panel0, panel0 + panels) (a
// panel: two vectors of columns): the work of one task. K in slices of
// DepthBlock(rows); each row tile's slice of A (6 or 12 x 256 or 512 floats) stays in L1 while
// it passes over the block's panels. The first row tile of a slice reads the
// packed weights from memory (a model's weights do not stay in the caches
// between its products): it prefetches the slice it will read next, which the
// hardware prefetcher, meeting a new 16-32 KiB run per panel, does not. The
// other row tiles share out each panel's slice at the next depth, a few rows
// each, so that the next depth's first row tile finds its weights in L2: one
// tile alone asks for a whole slice in the time of one tile, more than memory
// delivers (alternating A/B, whole models: BERT-base s128 0.957, MiniLM-L6 s16
// 0.917, ViT-base 0.970). After the last depth they share out the first slices
// of the `next` task's panels in the same way.
void Block(const GemmArgs& g, int64_t row0, int64_t rows, int64_t panel0, int64_t panels, NextPanels next) {
  const int64_t width = PanelWidth();
  const Clamp clamp{g.conv_activation, g.clip_min, g.clip_max};
  const int64_t spread_tiles = TilesIn(rows) - 1;  // row tiles after the first
  const int64_t depth_block = DepthBlock(rows);
  for (int64_t k0 = 0; k0 < g.k; k0 += depth_block) {
    const int64_t depth = std::min(depth_block, g.k - k0);
    const Clamp* last = k0 + depth == g.k && clamp.kind != ConvActivation::kNone ? &clamp : nullptr;
    int64_t tile = 0;
    for (int64_t r = row0, tile_rows = 0; r < row0 + rows; r += tile_rows, ++tile) {
      tile_rows = TileRowsFor(row0 + rows - r);
      const float* a = g.a + r * g.lda + k0;
      float* y = g.y + r * g.ldy;
      const float* row_bias = g.row_bias != nullptr ? g.row_bias + r : nullptr;
      for (int64_t p = panel0; p < panel0 + panels; ++p) {
        const int64_t col0 = p * width;
        const RowSegment segment(std::min(width, g.n - col0));
        const TileStart start{g.col_bias != nullptr ? g.col_bias + col0 : nullptr, row_bias,
                              g.residual != nullptr ? g.residual + r * g.ldy + col0 : nullptr, k0 > 0};
        PrefetchShare prefetch;
        if (g.packed != nullptr && r == row0) {
          prefetch = {NextPackedSlice(g, p, k0, depth_block, panel0, panels), depth};
        } else if (g.packed != nullptr) {
          prefetch = ShareOfNextSlice(g, p, panel0, k0, depth_block, tile, spread_tiles, next);
        }
        const float* next = prefetch.rows > 0 ? prefetch.next : nullptr;
        if (g.residual != nullptr && k0 == 0) {  // the next tile's
          if (p + 1 < panel0 + panels) {
            PrefetchResidualRows(g, r, tile_rows, col0 + width);
          } else if (r + tile_rows < row0 + rows) {
            PrefetchResidualRows(g, r + tile_rows, TileRowsFor(row0 + rows - r - tile_rows), panel0 * width);
          }
        }
        if (g.packed != nullptr && segment.high == 0) {  // zero-padded panels: full loads
          TileRows<false, true>(tile_rows, a, g.lda, g.packed + (p * g.k + k0) * width, width, depth,
                                y + col0, g.ldy, segment, start, last);
        } else if (next != nullptr) {
          TileRows<false, false, true>(tile_rows, a, g.lda, g.packed + (p * g.k + k0) * width, width, depth,
                                       y + col0, g.ldy, segment, start, last, next, prefetch.rows);
        } else if (g.packed != nullptr) {
          TileRows<false>(tile_rows, a, g.lda, g.packed + (p * g.k + k0) * width, width, depth, y + col0,
                          g.ldy, segment, start, last);
        } else if (segment.full) {
          TileRows<false>(tile_rows, a, g.lda, g.b + k0 * g.ldb + col0, g.ldb, depth, y + col0, g.ldy,
                          segment, start, last);
        } else {
          TileRows<true>(tile_rows, a, g.lda, g.b + k0 * g.ldb + col0, g.ldb, depth, y + col0, g.ldy, segment,
                         start, last);
        }
      }
    }
  }
  if (g.activation != Activation::kIdentity) {
    const int64_t col0 = panel0 * width;
    const int64_t cols = std::min(g.n, (panel0 + panels) * width) - col0;
    activate_block(g.y + row0 * g.ldy + col0, rows, cols, g.ldy, g.activation);
  }
}

// panel[kk * width + j] = rows[j][kk] for j < cols, kk < k, each row k floats
// at any byte alignment: 4 x 4 blocks transposed in registers, the edges
// element by element.
void TransposeRowsIntoPanel(const uint8_t* const* rows, int64_t cols, int64_t k, int64_t width,
                            float* panel) {
  constexpr int64_t kItem = sizeof(float);
#if HWY_TARGET == HWY_SCALAR
  const int64_t cols4 = 0, k4 = 0;  // no 4-lane vectors: all element by element
#else
  const hn::FixedTag<float, 4> d;
  const hn::Repartition<uint8_t, decltype(d)> bytes;
  const int64_t cols4 = cols / 4 * 4, k4 = k / 4 * 4;
  for (int64_t j = 0; j < cols4; j += 4) {
    for (int64_t kk = 0; kk < k4; kk += 4) {
      const auto r0 = hn::BitCast(d, hn::LoadU(bytes, rows[j] + kk * kItem));
      const auto r1 = hn::BitCast(d, hn::LoadU(bytes, rows[j + 1] + kk * kItem));
      const auto r2 = hn::BitCast(d, hn::LoadU(bytes, rows[j + 2] + kk * kItem));
      const auto r3 = hn::BitCast(d, hn::LoadU(bytes, rows[j + 3] + kk * kItem));
      const auto t0 = hn::InterleaveLower(d, r0, r1), t1 = hn::InterleaveLower(d, r2, r3);  // depths 0, 1
      const auto t2 = hn::InterleaveUpper(d, r0, r1), t3 = hn::InterleaveUpper(d, r2, r3);  // depths 2, 3
      float* out = panel + kk * width + j;
      hn::StoreU(hn::ConcatLowerLower(d, t1, t0), d, out);
      hn::StoreU(hn::ConcatUpperUpper(d, t1, t0), d, out + width);
      hn::StoreU(hn::ConcatLowerLower(d, t3, t2), d, out + 2 * width);
      hn::StoreU(hn::ConcatUpperUpper(d, t3, t2), d, out + 3 * width);
    }
    for (int64_t jj = j; jj < j + 4; ++jj) {
      for (int64_t kk = k4; kk < k; ++kk) std::memcpy(&panel[kk * width + jj], rows[jj] + kk * kItem, kItem);
    }
  }
#endif
  for (int64_t j = cols4; j < cols; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) std::memcpy(&panel[kk * width + j], rows[j] + kk * kItem, kItem);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/elementwise.h"

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"
#include "mlx_bridge/buffers.h"

namespace transmuter::kernels {

HWY_EXPORT(PanelWidth);
HWY_EXPORT(Block);
HWY_EXPORT(TransposeRowsIntoPanel);

namespace {

// Rows one task covers: 16 row tiles, each passing over the task's panels
// (4 x 256 x 16 floats = 64 KiB per K slice, in L2) with its slice of A in L1.
constexpr int64_t kBlockRows = 16 * kTileRows;
// Panels one task covers (64 columns with AVX2).
constexpr int64_t kBlockPanels = 4;
// Below this many multiply-adds a product runs on the calling thread: waking
// another thread costs more than it saves.
constexpr int64_t kParallelWork = 1 << 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

BlockSplit::BlockSplit(int64_t m_, int64_t panels_, int64_t max_rows, int64_t tile_rows, int64_t max_panels,
                       int64_t threads)
    : m(m_), panels(panels_) {
  if (threads <= 0) threads = kernel_threads();
  block_rows = ceil_div(ceil_div(m, ceil_div(m, max_rows)), tile_rows) * tile_rows;
  row_blocks = ceil_div(m, block_rows);
  block_panels = max_panels;
  while (block_panels > 1 && row_blocks * ceil_div(panels, block_panels) < 4 * threads) block_panels /= 2;
  panel_blocks = ceil_div(panels, block_panels);
  // Still too few tasks to share evenly (a 7x7 layer's 49 x 960 x 160: five one-panel tasks, three on one
  // of two threads): the rows split too, down to blocks of two tiles. `wanted` counts up on its own: a
  // rounded block size may leave the row blocks as they were (49 rows in 3 or 4 blocks: 18 each).
  for (int64_t wanted = row_blocks + 1;
       row_blocks * panel_blocks < 4 * threads && (row_blocks * panel_blocks) % threads != 0 &&
       block_rows > 2 * tile_rows;
       ++wanted) {
    block_rows = ceil_div(ceil_div(m, wanted), tile_rows) * tile_rows;
    row_blocks = ceil_div(m, block_rows);
  }
}

void BlockSplit::task(int64_t t, int64_t& row0, int64_t& rows, int64_t& panel0, int64_t& panel_count) const {
  row0 = (t / panel_blocks) * block_rows;
  panel0 = (t % panel_blocks) * block_panels;
  rows = std::min(block_rows, m - row0);
  panel_count = std::min(block_panels, panels - panel0);
}

// The panels of task t, if there is one.
NextPanels next_panels(const BlockSplit& split, int64_t t) {
  if (t >= split.tasks()) return {};
  int64_t row0, rows, panel0, panels;
  split.task(t, row0, rows, panel0, panels);
  return {panel0, panels};
}

// Splits g's output into blocks (BlockSplit: sized for balance as well as for the caches) and runs
// them across the kernel threads.
void run_gemm(const GemmArgs& g) {
  const BlockSplit split(g.m, ceil_div(g.n, gemm_panel_width()), kBlockRows, kTileRows, kBlockPanels);
  const int64_t grain = g.m * g.n * g.k < kParallelWork ? split.tasks() : 1;
  parallel_for(split.tasks(), grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t row0, rows, panel0, panels;
      split.task(t, row0, rows, panel0, panels);
      HWY_DYNAMIC_DISPATCH(Block)(g, row0, rows, panel0, panels, next_panels(split, t + 1));
    }
  });
}

void run_gemm_on_this_thread(const GemmArgs& g) {
  HWY_DYNAMIC_DISPATCH(Block)(g, 0, g.m, 0, ceil_div(g.n, gemm_panel_width()), NextPanels{});
}

namespace {

class PackedMatmulKernel : public CpuKernel {
 public:
  PackedMatmulKernel(mx::Stream stream, Reference reference, int64_t n, bool has_bias, bool has_residual,
                     Activation activation)
      : CpuKernel(stream, std::move(reference)),
        n_(n),
        has_bias_(has_bias),
        has_residual_(has_residual),
        activation_(activation) {}
  const char* name() const override { return "transmuter::PackedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const PackedMatmulKernel*>(&other);
    return o != nullptr && o->n_ == n_ && o->has_bias_ == has_bias_ && o->has_residual_ == has_residual_ &&
           o->activation_ == activation_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    GemmArgs g;
    g.a = in[0].data<float>();
    g.packed = in[1].data<float>();
    g.col_bias = has_bias_ ? in[2].data<float>() : nullptr;
    g.residual = has_residual_ ? in.back().data<float>() : nullptr;
    g.y = out[0].data<float>();
    g.k = g.lda = in[1].shape(1);
    g.n = g.ldy = n_;
    g.m = static_cast<int64_t>(in[0].size()) / g.k;
    g.activation = activation_;
    return [g] { run_gemm(g); };
  }

 private:
  int64_t n_;
  bool has_bias_, has_residual_;
  Activation activation_;
};

// Fills packed [panels, k, width] from b ([k, n] row-major, or [n, k] when
// transposed), zero past column n. Each loop reads b along its rows.
// B is read as bytes at any alignment (a weight may be read where it lies in
// its model file): elements move by memcpy, which costs nothing when aligned.
void pack_panels(const void* b, bool transposed, int64_t k, int64_t n, int64_t width, float* packed) {
  const auto* bytes = static_cast<const uint8_t*>(b);
  constexpr int64_t kItem = sizeof(float);
  const int64_t panels = ceil_div(n, width);
  parallel_for(panels, packing_grain(k * width * kItem), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t cols = std::min(width, n - p * width);
      float* panel = packed + p * k * width;
      if (transposed) {
        if (cols < width) std::memset(panel, 0, static_cast<size_t>(k * width) * sizeof(float));
        std::vector<const uint8_t*> rows(static_cast<size_t>(cols));
        for (int64_t j = 0; j < cols; ++j) rows[j] = bytes + (p * width + j) * k * kItem;
        transpose_rows_into_panel(rows.data(), cols, k, width, panel);
      } else {
        for (int64_t kk = 0; kk < k; ++kk)
          copy_panel_row(panel + kk * width, bytes + (kk * n + p * width) * kItem, cols, width);
      }
    }
  });
}

// Below this many rows per product the right-hand side is read in place:
// packing it costs a pass over K x N, which only pays when enough rows reuse it.
constexpr int64_t kPackRows = 8;
// Products of fewer multiply-adds than this are batched across the threads
// rather than split: splitting one costs a wake-up per product.
constexpr int64_t kSmallProduct = int64_t{1} << 22;

// Offsets of each output batch into a's and b's batches, numpy broadcasting
// their leading axes (both already padded to the output's batch rank).
struct BatchWalk {
  std::vector<int64_t> a_offsets, b_offsets;  // in matrices

  BatchWalk(const mx::Shape& a_batch, const mx::Shape& b_batch, const mx::Shape& out_batch) {
    int64_t count = 1;
    for (int d : out_batch) count *= d;
    for (int64_t index = 0; index < count; ++index) {
      int64_t rest = index, a_off = 0, b_off = 0, a_stride = 1, b_stride = 1;
      for (int d = static_cast<int>(out_batch.size()) - 1; d >= 0; --d) {
        const int64_t i = rest % out_batch[d];
        rest /= out_batch[d];
        if (a_batch[d] != 1) a_off += i * a_stride;
        if (b_batch[d] != 1) b_off += i * b_stride;
        a_stride *= a_batch[d];
        b_stride *= b_batch[d];
      }
      a_offsets.push_back(a_off);
      b_offsets.push_back(b_off);
    }
  }
};

class BatchedMatmulKernel : public CpuKernel {
 public:
  BatchedMatmulKernel(mx::Stream stream, Reference reference, mx::Shape a_batch, mx::Shape b_batch,
                      mx::Shape out_batch)
      : CpuKernel(stream, std::move(reference)),
        a_batch_(std::move(a_batch)),
        b_batch_(std::move(b_batch)),
        out_batch_(std::move(out_batch)) {}
  const char* name() const override { return "transmuter::Matmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const BatchedMatmulKernel*>(&other);
    return o != nullptr && o->a_batch_ == a_batch_ && o->b_batch_ == b_batch_ && o->out_batch_ == out_batch_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* a = in[0].data<float>();
    const float* b = in[1].data<float>();
    float* y = out[0].data<float>();
    const int64_t m = in[0].shape(-2), k = in[0].shape(-1), n = in[1].shape(-1);
    auto walk = std::make_shared<BatchWalk>(a_batch_, b_batch_, out_batch_);
    return [=] {
      const int64_t batches = static_cast<int64_t>(walk->a_offsets.size());
      // Products [begin, end) of the batch on this thread. A b broadcast over
      // the batch is packed once per run of products that share it.
      auto products = [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> panels;
        const int64_t width = gemm_panel_width();
        const bool pack = m >= kPackRows;
        if (pack) panels.resize(static_cast<size_t>(ceil_div(n, width) * k * width));
        const float* last_packed = nullptr;
        for (int64_t i = begin; i < end; ++i) {
          const float* b_matrix = b + walk->b_offsets[i] * k * n;
          GemmArgs g;
          g.a = a + walk->a_offsets[i] * m * k;
          g.lda = g.k = k;
          g.y = y + i * m * n;
          g.ldy = g.n = n;
          g.m = m;
          if (pack) {
            if (b_matrix != last_packed) pack_panels(b_matrix, false, k, n, width, panels.data());
            last_packed = b_matrix;
            g.packed = panels.data();
          } else {
            g.b = b_matrix;
            g.ldb = n;
          }
          run_gemm(g);  // inline when called inside the split below
        }
      };
      // Many small products (attention heads): one thread per run of
      // products; few large ones: each product split across the threads.
      if (batches >= 2 && m * n * k < kSmallProduct) {
        parallel_for(batches, 1, products);
      } else {
        products(0, batches);
      }
    };
  }

 private:
  mx::Shape a_batch_, b_batch_, out_batch_;
};

}  // namespace

// Not cached: the tests switch the SIMD target (support/simd_targets.h), and a dispatch is one indirect call.
int64_t gemm_panel_width() { return HWY_DYNAMIC_DISPATCH(PanelWidth)(); }

void transpose_rows_into_panel(const uint8_t* const* rows, int64_t cols, int64_t k, int64_t width,
                               float* panel) {
  HWY_DYNAMIC_DISPATCH(TransposeRowsIntoPanel)(rows, cols, k, width, panel);
}

mx::array pack_gemm_rhs(const mx::array& b, bool transposed) {
  if (b.ndim() != 2 || b.size() == 0 || !mx::issubdtype(b.dtype(), mx::floating)) {
    throw std::invalid_argument("pack_gemm_rhs: B must be a non-empty 2-D float array");
  }
  mx::array source = b;
  const std::span<const uint8_t> bytes = host_bytes(b, /*as_float32=*/true, source);
  const int64_t k = transposed ? b.shape(1) : b.shape(0);
  const int64_t n = transposed ? b.shape(0) : b.shape(1);
  const int64_t width = gemm_panel_width();
  const int64_t panels = ceil_div(n, width);
  // MLX's own buffer: an array built over foreign memory would be copied.
  MlxBuffer buffer(static_cast<size_t>(panels * k * width) * sizeof(float), BufferLifetime::kPacked);
  pack_panels(bytes.data(), transposed, k, n, width, buffer.as<float>());
  return buffer.into_array({static_cast<int>(panels), static_cast<int>(k), static_cast<int>(width)},
                           mx::float32);
}

mx::array unpack_gemm_rhs(const mx::array& packed, int64_t n, mx::StreamOrDevice s) {
  const int panels = packed.shape(0), k = packed.shape(1), width = packed.shape(2);
  mx::array rows = mx::reshape(mx::transpose(packed, {1, 0, 2}, s), {k, panels * width}, s);
  return mx::slice(rows, {0, 0}, {k, static_cast<int>(n)}, s);
}

bool packed_rhs_fits(const mx::array& packed, int64_t n) {
  return packed.dtype() == mx::float32 && packed.ndim() == 3 && packed.shape(2) == gemm_panel_width() &&
         n > 0 && packed.shape(1) > 0 && packed.shape(0) == ceil_div(n, gemm_panel_width());
}

mx::array packed_matmul(const mx::array& a, const mx::array& packed, const std::optional<mx::array>& bias,
                        int64_t n, Activation activation, mx::StreamOrDevice s,
                        const std::optional<mx::array>& residual) {
  const mx::Stream stream = mx::to_stream(s);
  const bool has_bias = bias.has_value();
  if (residual) {
    mx::Shape out_shape = a.shape();
    if (!out_shape.empty()) out_shape.back() = static_cast<int>(n);
    // A residual of another shape (broadcast) or dtype is an MLX add.
    if (residual->shape() != out_shape || residual->dtype() != mx::float32 ||
        activation != Activation::kIdentity) {
      if (activation != Activation::kIdentity) {
        throw std::invalid_argument("packed_matmul: a residual goes with no activation only");
      }
      return binary(BinaryOp::kAdd, packed_matmul(a, packed, bias, n, activation, s), *residual, stream);
    }
  }
  const bool has_residual = residual.has_value();
  Reference reference = [n, has_bias, has_residual, activation, stream](const std::vector<mx::array>& in) {
    mx::array product = mx::matmul(in[0], unpack_gemm_rhs(in[1], n, stream), stream);
    std::optional<mx::array> b;
    if (has_bias) b = in[2];
    if (b || activation != Activation::kIdentity) product = bias_activation(product, b, activation, stream);
    if (has_residual) product = mx::add(product, in.back(), stream);
    return std::vector<mx::array>{product};
  };
  std::vector<mx::array> inputs = {a, packed};
  if (bias) inputs.push_back(*bias);
  if (residual) inputs.push_back(*residual);
  const bool fits = is_cpu_stream(stream) && a.dtype() == mx::float32 && a.ndim() >= 1 && a.size() > 0 &&
                    packed_rhs_fits(packed, n) && a.shape(-1) == packed.shape(1) &&
                    (!bias || (bias->dtype() == mx::float32 && bias->ndim() == 1 && bias->shape(0) == n));
  if (!fits) return reference(inputs)[0];
  mx::Shape shape = a.shape();
  shape.back() = static_cast<int>(n);
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<PackedMatmulKernel>(kernel_stream, reference, n, has_bias, has_residual,
                                                    activation);
      },
      reference, inputs, {shape}, {mx::float32}, stream)[0];
}

bool batched_matmul_fits(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  if (!is_cpu_stream(s) || a.dtype() != mx::float32 || b.dtype() != mx::float32) return false;
  if (a.ndim() < 2 || b.ndim() < 2 || a.size() == 0 || b.size() == 0) return false;
  if (a.shape(-1) != b.shape(-2) || a.shape(-2) < 2) return false;
  const int rank = static_cast<int>(std::max(a.ndim(), b.ndim()));
  for (int d = 3; d <= rank; ++d) {  // leading axes, numpy broadcasting
    const int da = d <= static_cast<int>(a.ndim()) ? a.shape(-d) : 1;
    const int db = d <= static_cast<int>(b.ndim()) ? b.shape(-d) : 1;
    if (da != db && da != 1 && db != 1) return false;
  }
  return true;
}

mx::array batched_matmul(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::matmul(in[0], in[1], stream)};
  };
  if (!batched_matmul_fits(a, b, s)) return reference({a, b})[0];
  const int rank = static_cast<int>(std::max(a.ndim(), b.ndim()));
  mx::Shape a_batch, b_batch, out_batch;
  for (int d = rank; d >= 3; --d) {
    const int da = d <= static_cast<int>(a.ndim()) ? a.shape(-d) : 1;
    const int db = d <= static_cast<int>(b.ndim()) ? b.shape(-d) : 1;
    a_batch.push_back(da);
    b_batch.push_back(db);
    out_batch.push_back(std::max(da, db));
  }
  mx::Shape shape = out_batch;
  shape.push_back(a.shape(-2));
  shape.push_back(b.shape(-1));
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<BatchedMatmulKernel>(kernel_stream, reference, a_batch, b_batch, out_batch);
      },
      reference, {a, b}, {shape}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
