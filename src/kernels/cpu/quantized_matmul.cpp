// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); the kernels come from the best target of the CPU, picked at run time.
// The plane order of x depends on the vector width, so x is permuted by the
// same target that runs the GEMV.
// AVX3_DL (Ice Lake, Zen 4: AVX512-VNNI) is compiled too (HWY_WANT_AVX3_DL, set for every kernel file
// in CMakeLists.txt): its vpdpbusd is the int8 GEMV's dot product.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/quantized_matmul.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/partial_vectors-inl.h"
#include "kernels/cpu/quantized_matmul.h"

#ifndef TRANSMUTER_KERNELS_CPU_QUANTIZED_MATMUL_ARGS
#define TRANSMUTER_KERNELS_CPU_QUANTIZED_MATMUL_ARGS
namespace transmuter::kernels {

// One product's operands (quantized_matmul.h has the layout).
struct QuantizedArgs {
  const float* x = nullptr;       // [m, k]
  const float* xperm = nullptr;   // [m, kpad]: x in plane order (PermuteRows), zero past k
  const float* xsum = nullptr;    // [m, groups]: the sum of x over each group
  const uint32_t* w = nullptr;    // [n, words]
  const float* scales = nullptr;  // [n, groups]
  const float* biases = nullptr;  // [n, groups]; null: -zero_point * scales (symmetric)
  float zero_point = 8.0f;        // the implicit zero point of a symmetric weight: 2^(bits - 1)
  const int8_t* xq = nullptr;     // [m, kpad]: x rounded to int8 in byte-plane order (int8 GEMV)
  const float* xscale = nullptr;  // [m, groups]: the scale of each group of xq
  float* y = nullptr;             // [m, n]
  int64_t m = 0, k = 0, n = 0, kpad = 0;
  int bits = 4, group_size = 64;

  int64_t words() const { return k * bits / 32; }
  int64_t groups() const { return k / group_size; }
};

// Rows of x one GEMV pass shares each unpacked weight vector with.
inline constexpr int64_t kGemvRows = 3;
// Columns of one GEMV task: 32 rows of w (64 KiB at 4 bits, K = 4096) stay in
// L2 while each tile of rows passes over them.
inline constexpr int64_t kGemvColumns = 32;
// How far ahead of its loads the GEMV prefetches each row of w: 2 KiB. 512 bytes had measured faster
// than none or 2 KiB on 4096-wide rows (2026-12-02); on a small decoder's rows from memory (K = 576-1536,
// 288-1536 bytes a column, columns consecutive) 2 KiB keeps more lines in flight: quantized_matmul_bench
// --int8 --copies 64, 6 alternating rounds, 8-bit 1x576x3072 ~96 -> ~91 us, 1x1536x576 ~58 -> ~48, 4-bit
// 1x576x3072 ~68 -> ~52 (5 of 6 rounds faster); 4096x4096 within noise either way; SmolLM2 decode int8 1.06x,
// int4 ~1.1x the tokens/s (6 alternating rounds each).
inline constexpr int64_t kPrefetchWords = 512;
// Depth of one dequantized slice: a block of 4 GEMM panels (64 columns with
// AVX2, 128 with AVX-512) x 256 floats (64 or 128 KiB) stays in L2 while the
// GEMM passes over it (kDepthBlock of gemm.cpp).
inline constexpr int64_t kSliceDepth = 256;
// Rows of one GEMM task: the rows reuse each dequantized slice; a slice of x
// (192 x 256 floats) is re-read once per block of columns.
inline constexpr int64_t kGemmRowBlock = 192;

}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<D>;
using DI = hn::RebindToSigned<D>;
using V = hn::Vec<D>;
using VU = hn::Vec<DU>;

// The most lanes of any target (AVX-512: 16 floats).
constexpr size_t kMaxLanes = 16;

// Values of x (and of w) one vector of words covers: planes x lanes.
int64_t ChunkValues(int bits) {
  return static_cast<int64_t>(32 / bits) * static_cast<int64_t>(hn::Lanes(D()));
}

// Plane J of a vector of words: lane i holds value (32 / kBits) * i + J of
// the lane's word.
template <int kBits, int J>
HWY_INLINE VU Plane(VU words, VU mask) {
  if constexpr (J == 0) {
    return hn::And(words, mask);
  } else if constexpr (J == 32 / kBits - 1) {
    return hn::ShiftRight<J * kBits>(words);  // the top field needs no mask
  } else {
    return hn::And(hn::ShiftRight<J * kBits>(words), mask);
  }
}

// dot[r][c] += x[r] plane J * w[c] plane J for planes J.. of one chunk of
// words (recursion, not a loop or lambda, so the accumulators stay in registers).
template <int kBits, int R, int C, int J = 0>
HWY_INLINE void PlaneProducts(const VU (&words)[C], const float* const (&x)[R], int64_t offset, VU mask,
                              V (&dot)[R][C]) {
  if constexpr (J < 32 / kBits) {
    const D d;
    const DI di;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    V xv[R];
    for (int r = 0; r < R; ++r) xv[r] = hn::LoadU(d, x[r] + offset + J * lanes);
    for (int c = 0; c < C; ++c) {
      const V q = hn::ConvertTo(d, hn::BitCast(di, Plane<kBits, J>(words[c], mask)));
      for (int r = 0; r < R; ++r) dot[r][c] = hn::MulAdd(xv[r], q, dot[r][c]);
    }
    PlaneProducts<kBits, R, C, J + 1>(words, x, offset, mask, dot);
  }
}

// dot += the products of chunk `chunk` of C rows of w with R rows of xperm: its
// first `valid` words (the rest read as 0, against zeros of xperm).
template <int kBits, int R, int C>
HWY_INLINE void ChunkProducts(const uint32_t* const (&w)[C], const float* const (&x)[R], int64_t chunk,
                              int64_t valid, VU mask, V (&dot)[R][C]) {
  const DU du;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  VU words[C];
  for (int c = 0; c < C; ++c) {
    // The rows of w come from memory once per call: a few cache lines ahead of the loads.
    hwy::Prefetch(w[c] + chunk * lanes + kPrefetchWords);
    words[c] = valid == lanes ? hn::LoadU(du, w[c] + chunk * lanes)
                              : LoadFirst(du, w[c] + chunk * lanes, static_cast<size_t>(valid));
  }
  PlaneProducts<kBits, R, C>(words, x, chunk * (32 / kBits) * lanes, mask, dot);
}

// Stores the L columns of plane J.. of one gathered vector of words,
// dequantized (q * s + b, zero in lanes past `present`), one panel row apart.
template <int kBits, int J = 0>
HWY_INLINE void StorePlanes(VU words, VU mask, V s, V b, hn::Mask<D> present, int64_t width, float* row) {
  if constexpr (J < 32 / kBits) {
    const D d;
    const DI di;
    const V q = hn::ConvertTo(d, hn::BitCast(di, Plane<kBits, J>(words, mask)));
    hn::StoreU(hn::IfThenElseZero(present, hn::MulAdd(q, s, b)), d, row + J * width);
    StorePlanes<kBits, J + 1>(words, mask, s, b, present, width, row);
  }
}

// x rows in plane order: xperm[r, c * V + j * L + i] = x[r, c * V + P * i + j]
// for chunk c of V = P * L values (P = 32 / bits planes, L lanes), zero past
// k; and xsum[r, g] = sum of x[r, group g].
void PermuteRows(const float* x, int64_t m, int64_t k, int bits, int group_size, int64_t kpad, float* xperm,
                 float* xsum) {
  const int64_t planes = 32 / bits;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(D()));
  const int64_t chunk = planes * lanes;
  const int64_t groups = k / group_size;
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * k;
    float* out = xperm + r * kpad;
    for (int64_t c0 = 0; c0 < kpad; c0 += chunk) {
      for (int64_t j = 0; j < planes; ++j) {
        for (int64_t i = 0; i < lanes; ++i) {
          const int64_t src = c0 + planes * i + j;
          out[c0 + j * lanes + i] = src < k ? row[src] : 0.0f;
        }
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int64_t i = 0; i < group_size; ++i) sum += row[g * group_size + i];
      xsum[r * groups + g] = sum;
    }
  }
}

// The groups of one chunk of words when a group is shorter than a vector of words: lane i belongs to the
// chunk's group i >> shift (powers of two: shifts, not divisions, in the loops), `table` gathers each
// lane's group value from the chunk's per_chunk values.
using LaneTable = decltype(hn::SetTableIndices(D(), static_cast<const int32_t*>(nullptr)));
struct ChunkGroups {
  int shift;
  int64_t per_chunk;
  LaneTable table;

  explicit ChunkGroups(int64_t words_per_group)
      : shift(__builtin_ctzll(static_cast<unsigned long long>(words_per_group))),
        per_chunk(static_cast<int64_t>(hn::Lanes(D())) >> shift),
        table(MakeTable(shift)) {}

 private:
  static LaneTable MakeTable(int shift) {
    HWY_ALIGN int32_t index[kMaxLanes];
    for (size_t i = 0; i < hn::Lanes(D()); ++i) index[i] = static_cast<int32_t>(i >> shift);
    return hn::SetTableIndices(D(), index);
  }
};

// y[row0 + r, col0 + c] for r < R, c < C: one pass over C rows of w, each
// vector of words unpacked once and multiplied into R rows of x.
template <int kBits, int R, int C>
HWY_INLINE void Columns(const QuantizedArgs& a, int64_t row0, int64_t col0, const ChunkGroups& split) {
  const D d;
  const DU du;
  constexpr int kPlanes = 32 / kBits;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t words = a.words(), groups = a.groups();
  const int64_t words_per_group = a.group_size / kPlanes;
  const VU mask = hn::Set(du, (1u << kBits) - 1);
  const uint32_t* w[C];
  const float* scales[C];
  const float* biases[C];  // null: the bias is -zero_point * scale
  for (int c = 0; c < C; ++c) {
    w[c] = a.w + (col0 + c) * words;
    scales[c] = a.scales + (col0 + c) * groups;
    biases[c] = a.biases != nullptr ? a.biases + (col0 + c) * groups : nullptr;
  }
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = a.xperm + (row0 + r) * a.kpad;
  V acc[R][C], dot[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(d);
  }
  if (words_per_group >= lanes) {
    // A group spans whole chunks: its dot product is scaled once.
    const int64_t chunks_per_group = words_per_group / lanes;
    for (int64_t g = 0; g < groups; ++g) {
      for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) dot[r][c] = hn::Zero(d);
      }
      for (int64_t i = 0; i < chunks_per_group; ++i)
        ChunkProducts<kBits, R, C>(w, x, g * chunks_per_group + i, lanes, mask, dot);
      for (int c = 0; c < C; ++c) {
        const V s = hn::Set(d, scales[c][g]);
        for (int r = 0; r < R; ++r) acc[r][c] = hn::MulAdd(dot[r][c], s, acc[r][c]);
      }
    }
  } else {
    // A chunk spans several groups: lane i's scale is that of group i / words_per_group of the chunk.
    const int64_t chunks = (words + lanes - 1) / lanes;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t valid = std::min(lanes, words - chunk * lanes);
      for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) dot[r][c] = hn::Zero(d);
      }
      ChunkProducts<kBits, R, C>(w, x, chunk, valid, mask, dot);
      const size_t present = static_cast<size_t>(valid >> split.shift);
      for (int c = 0; c < C; ++c) {
        const V s =
            hn::TableLookupLanes(LoadFirst(d, scales[c] + chunk * split.per_chunk, present), split.table);
        for (int r = 0; r < R; ++r) acc[r][c] = hn::MulAdd(dot[r][c], s, acc[r][c]);
      }
    }
  }
  // + sum over groups of biases[n, g] * sum(x in group g).
  const V negative_zero = hn::Set(d, -a.zero_point);
  for (int64_t g0 = 0; g0 < groups; g0 += lanes) {
    const size_t present = static_cast<size_t>(groups - g0);
    V xs[R];
    for (int r = 0; r < R; ++r) xs[r] = LoadFirst(d, a.xsum + (row0 + r) * groups + g0, present);
    for (int c = 0; c < C; ++c) {
      const V b = biases[c] != nullptr ? LoadFirst(d, biases[c] + g0, present)
                                       : hn::Mul(LoadFirst(d, scales[c] + g0, present), negative_zero);
      for (int r = 0; r < R; ++r) acc[r][c] = hn::MulAdd(b, xs[r], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) a.y[(row0 + r) * a.n + col0 + c] = hn::GetLane(hn::SumOfLanes(d, acc[r][c]));
  }
}

template <int kBits, int R, int C>
void ColumnRange(const QuantizedArgs& a, int64_t row0, int64_t col0, int64_t cols) {
  const ChunkGroups split(a.group_size * kBits / 32);
  int64_t c = col0;
  for (; c + C <= col0 + cols; c += C) Columns<kBits, R, C>(a, row0, c, split);
  for (; c < col0 + cols; ++c) Columns<kBits, R, 1>(a, row0, c, split);
}

// Columns [col0, col0 + cols) of y for every row: tiles of up to kGemvRows
// rows, each a pass over the block's rows of w (in L2 after the first).
// Columns at a time: with 2-3 rows, 2 (FMA chains and shared loads of x within
// the 16 vector registers of AVX2); with one row, 1: a decode step's weights
// come from memory, where one column's two sequential streams (weights, scales
// and biases) beat four columns' twelve (quantized_matmul_bench, 32 weights in
// turn, 2 threads: 4096x4096 1.16 -> 0.86 ms, 896x9728 0.62 -> 0.48; in cache
// 0.34 -> 0.43 at 896x9728).
template <int kBits>
void GemvBlockOf(const QuantizedArgs& a, int64_t col0, int64_t cols) {
  for (int64_t r = 0; r < a.m; r += kGemvRows) {
    switch (std::min(kGemvRows, a.m - r)) {
      case 3:
        ColumnRange<kBits, 3, 2>(a, r, col0, cols);
        break;
      case 2:
        ColumnRange<kBits, 2, 2>(a, r, col0, cols);
        break;
      default:  // one row: one column at a time, as ByteGemvColumns (sequential streams from memory)
        ColumnRange<kBits, 1, 1>(a, r, col0, cols);
        break;
    }
  }
}

void GemvBlock(const QuantizedArgs& a, int64_t col0, int64_t cols) {
  if (a.bits == 4) {
    GemvBlockOf<4>(a, col0, cols);
  } else {
    GemvBlockOf<8>(a, col0, cols);
  }
}

// One row of x rounded to int8 per group, round_row_to_int8's arithmetic: per group g, amax = max|x|,
// q = nearest-even(x * (127 / amax)) (0 for an all-zero group), scale[g] = amax / 127 and
// scaled_sum[g] = scale[g] * sum(q). k is a multiple of group_size, which is a multiple of the lanes.
void QuantizeGroupsInt8(const float* row, int64_t k, int group_size, int8_t* q, float* scale,
                        float* scaled_sum) {
  const D d;
  const DI di;
  const hn::Rebind<int8_t, DI> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t g = 0; g * group_size < k; ++g) {
    const float* v = row + g * group_size;
    V amax = hn::Zero(d);
    for (int64_t i = 0; i < group_size; i += lanes) amax = hn::Max(amax, hn::Abs(hn::LoadU(d, v + i)));
    const float top = hn::GetLane(hn::MaxOfLanes(d, amax));
    const V inverse = hn::Set(d, top != 0.0f ? 127.0f / top : 0.0f);
    hn::Vec<DI> sum = hn::Zero(di);
    for (int64_t i = 0; i < group_size; i += lanes) {
      // NearestInt: the current rounding mode, nearest-even as std::nearbyint; |x * inverse| <= 127.
      const hn::Vec<DI> values = hn::NearestInt(hn::Mul(hn::LoadU(d, v + i), inverse));
      hn::StoreU(hn::DemoteTo(d8, values), d8, q + g * group_size + i);
      sum = hn::Add(sum, values);
    }
    scale[g] = top / 127.0f;
    scaled_sum[g] = scale[g] * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, sum)));
  }
}

// --- The int8 GEMV (MatMulNBits accuracy_level 4: x rounded to int8 per group) ----------------------
//
// u8 x s8 dot products of four bytes into int32 lanes: vpdpbusd with AVX512-VNNI; vpmaddubsw + vpmaddwd
// elsewhere on x86, whose 16-bit pair sums saturate past 32767, so only for 4-bit weights there
// (2 x 15 x 127 = 3810). Other targets round x and run the float GEMV (same numbers, slower).
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
using DI8 = hn::Repartition<int8_t, DI>;
using DU8 = hn::Repartition<uint8_t, DI>;
using VI = hn::Vec<DI>;

#if HWY_TARGET == HWY_AVX3_DL
constexpr bool kByteDot = true, kByteDot8Bits = true;
// Inline assembly: Highway 1.0.3 compiles AVX3_DL for "avxvnni" (the VEX form, which Zen 4 lacks),
// not "avx512vnni", so the intrinsic cannot be used; the target's runtime check covers AVX512-VNNI.
HWY_INLINE VI DotBytes(VI acc, hn::Vec<DU8> u, hn::Vec<DI8> v) {
  __m512i sum = acc.raw;
  asm("vpdpbusd %[v], %[u], %[sum]" : [sum] "+v"(sum) : [u] "v"(u.raw), [v] "v"(v.raw));
  return VI{sum};
}
#elif HWY_TARGET == HWY_AVX3
constexpr bool kByteDot = true, kByteDot8Bits = false;
HWY_INLINE VI DotBytes(VI acc, hn::Vec<DU8> u, hn::Vec<DI8> v) {
  const __m512i pairs = _mm512_maddubs_epi16(u.raw, v.raw);
  return hn::Add(acc, VI{_mm512_madd_epi16(pairs, _mm512_set1_epi16(1))});
}
#else
constexpr bool kByteDot = true, kByteDot8Bits = false;
HWY_INLINE VI DotBytes(VI acc, hn::Vec<DU8> u, hn::Vec<DI8> v) {
  const __m256i pairs = _mm256_maddubs_epi16(u.raw, v.raw);
  return hn::Add(acc, VI{_mm256_madd_epi16(pairs, _mm256_set1_epi16(1))});
}
#endif

bool HasByteDot(int bits) { return bits == 4 ? kByteDot : (bits == 8 && kByteDot8Bits); }

// Bytes of one vector of weight words.
int64_t ByteVectorBytes() { return static_cast<int64_t>(hn::Lanes(DU8())); }

// The int32 dot product of one vector of words of a row of w with row r of xq, added to dot: lane i
// holds the sum over word i's values (8 at 4 bits, 4 at 8). Words past `valid` read as 0.
template <int kBits>
HWY_INLINE void ByteChunkDot(const uint32_t* w, const int8_t* x, int64_t chunk, int64_t valid, VI& dot) {
  const DU du;
  const DU8 du8;
  const DI8 di8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const int64_t bytes = static_cast<int64_t>(hn::Lanes(du8));
  const auto low_nibbles = hn::Set(du8, uint8_t{0x0F});
  hwy::Prefetch(w + chunk * lanes + kPrefetchWords);
  const VU words = valid == lanes ? hn::LoadU(du, w + chunk * lanes)
                                  : LoadFirst(du, w + chunk * lanes, static_cast<size_t>(valid));
  const auto packed = hn::BitCast(du8, words);
  if constexpr (kBits == 4) {
    const hn::Vec<DI8> xe = hn::LoadU(di8, x + chunk * 2 * bytes);
    const hn::Vec<DI8> xo = hn::LoadU(di8, x + chunk * 2 * bytes + bytes);
    const auto low = hn::And(packed, low_nibbles);
    const auto high =
        hn::And(hn::BitCast(du8, hn::ShiftRight<4>(hn::BitCast(hn::Repartition<uint16_t, DU>(), words))),
                low_nibbles);
    dot = DotBytes(DotBytes(dot, low, xe), high, xo);
  } else {
    dot = DotBytes(dot, packed, hn::LoadU(di8, x + chunk * bytes));
  }
}

// The permutations that spread a run's vector of group values to chunk j's lanes (ByteRunProducts):
// lane i of chunk j takes the run's group j * lanes / kRun + i / kRun. Built once per block of columns.
template <int kRun>
struct RunTables {
  LaneTable chunk[kRun > 0 ? kRun : 1];

  RunTables() {
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(D()));
    for (int j = 0; j < kRun; ++j) {
      HWY_ALIGN int32_t index[kMaxLanes];
      for (int64_t i = 0; i < lanes; ++i) index[i] = static_cast<int32_t>(j * (lanes / kRun) + i / kRun);
      chunk[j] = hn::SetTableIndices(D(), index);
    }
  }
};

// acc += the scaled products of a row of w with the int8 row x over runs [0, runs) of kRun chunks
// (kRun = words per group < lanes: a run covers one group per lane). A run's scales times x's scales
// are one vector, which each chunk spreads to its lanes with one permutation (instead of a masked
// load, a permutation and a product a chunk).
template <int kBits, int kRun>
HWY_INLINE void ByteRunProducts(const uint32_t* w, const float* scales, const int8_t* x, const float* xscale,
                                int64_t runs, const RunTables<kRun>& tables, V& acc) {
  const D d;
  const DI di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t run = 0; run < runs; ++run) {
    const V scale = hn::Mul(hn::LoadU(d, scales + run * lanes), hn::LoadU(d, xscale + run * lanes));
    for (int j = 0; j < kRun; ++j) {
      VI dot = hn::Zero(di);
      ByteChunkDot<kBits>(w, x, run * kRun + j, lanes, dot);
      acc = hn::MulAdd(hn::ConvertTo(d, dot), hn::TableLookupLanes(scale, tables.chunk[j]), acc);
    }
  }
}

// y[row, col] from the int8 row: per group, scale[col, g] * xscale[g] * (q . xq), and the biases as
// in Columns (biases[col, g] * xsum[g]). kRun: the words of a group when a chunk holds several groups
// and whole runs of groups are scaled a run at a time (ByteRunProducts), else 0.
template <int kBits, int kRun>
HWY_INLINE void ByteColumn(const QuantizedArgs& a, int64_t row, int64_t col, const RunTables<kRun>& tables,
                           const ChunkGroups& split) {
  const D d;
  const DI di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t words = a.words(), groups = a.groups();
  const int64_t words_per_group = a.group_size * kBits / 32;
  const uint32_t* w = a.w + col * words;
  const float* scales = a.scales + col * groups;
  const float* biases = a.biases != nullptr ? a.biases + col * groups : nullptr;
  const int8_t* x = a.xq + row * a.kpad;
  const float* xscale = a.xscale + row * groups;
  V acc = hn::Zero(d);
  if (words_per_group >= lanes) {
    // A group spans whole chunks: its integer dot product is scaled once.
    const int64_t chunks_per_group = words_per_group / lanes;
    for (int64_t g = 0; g < groups; ++g) {
      VI dot = hn::Zero(di);
      for (int64_t i = 0; i < chunks_per_group; ++i)
        ByteChunkDot<kBits>(w, x, g * chunks_per_group + i, lanes, dot);
      acc = hn::MulAdd(hn::ConvertTo(d, dot), hn::Set(d, scales[g] * xscale[g]), acc);
    }
  } else {
    // A chunk spans several groups: whole runs of `lanes` groups first, then chunk by chunk, lane i's
    // scales being those of group i / words_per_group of the chunk.
    int64_t chunk = 0;
    if constexpr (kRun > 0) {
      const int64_t runs = groups / lanes;
      ByteRunProducts<kBits, kRun>(w, scales, x, xscale, runs, tables, acc);
      chunk = runs * kRun;
    }
    const int64_t chunks = (words + lanes - 1) / lanes;
    for (; chunk < chunks; ++chunk) {
      const int64_t valid = std::min(lanes, words - chunk * lanes);
      VI dot = hn::Zero(di);
      ByteChunkDot<kBits>(w, x, chunk, valid, dot);
      const size_t present = static_cast<size_t>(valid >> split.shift);
      const V xs = hn::TableLookupLanes(LoadFirst(d, xscale + chunk * split.per_chunk, present), split.table);
      const V s = hn::TableLookupLanes(LoadFirst(d, scales + chunk * split.per_chunk, present), split.table);
      acc = hn::MulAdd(hn::Mul(hn::ConvertTo(d, dot), xs), s, acc);
    }
  }
  const V negative_zero = hn::Set(d, -a.zero_point);
  for (int64_t g0 = 0; g0 < groups; g0 += lanes) {
    const size_t present = static_cast<size_t>(groups - g0);
    const V xs = LoadFirst(d, a.xsum + row * groups + g0, present);
    const V b = biases != nullptr ? LoadFirst(d, biases + g0, present)
                                  : hn::Mul(LoadFirst(d, scales + g0, present), negative_zero);
    acc = hn::MulAdd(b, xs, acc);
  }
  a.y[row * a.n + col] = hn::GetLane(hn::SumOfLanes(d, acc));
}

// One column (row of w) at a time: its weights and scales are two sequential streams. Four at once
// (C = 4, sharing each load of x) read 12 streams a thread, 2 KiB apart at K = 4096, and ran slower
// whenever the weights came from memory, as in a decode step (quantized_matmul_bench --int8, 2 threads,
// 24-32 weights in turn: 4-bit 4096x4096 1.01 -> 0.66 ms, 4864x896 0.36 -> 0.20; 8-bit 4096x4096
// 1.15 -> 0.88, 896x9728 0.89 -> 0.51), for a few percent more time with the weights in cache.
// The lane tables are built once per block of columns, not per column: building one is a row of scalar
// stores read back as one vector, a store-forwarding stall that measured ~28 % of the GEMV's samples at
// K = 576 (perf annotate, quantized_matmul_bench 1x576x576).
template <int kBits, int kRun>
void ByteGemvColumns(const QuantizedArgs& a, int64_t col0, int64_t cols) {
  const RunTables<kRun> tables;
  const ChunkGroups split(a.group_size * kBits / 32);
  for (int64_t r = 0; r < a.m; ++r) {
    for (int64_t c = col0; c < col0 + cols; ++c) ByteColumn<kBits, kRun>(a, r, c, tables, split);
  }
}

// Picks ByteColumn's kRun: the words of a group when fewer than a vector's lanes (2, 4 or 8 with
// AVX-512's 16; 2 or 4 with AVX2's 8), else 0.
template <int kBits>
void ByteGemvBlockOf(const QuantizedArgs& a, int64_t col0, int64_t cols) {
  const int64_t words_per_group = a.group_size * kBits / 32;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(D()));
  if (words_per_group == 2 && lanes > 2) return ByteGemvColumns<kBits, 2>(a, col0, cols);
  if (words_per_group == 4 && lanes > 4) return ByteGemvColumns<kBits, 4>(a, col0, cols);
  if (words_per_group == 8 && lanes > 8) return ByteGemvColumns<kBits, 8>(a, col0, cols);
  ByteGemvColumns<kBits, 0>(a, col0, cols);
}

void ByteGemvBlock(const QuantizedArgs& a, int64_t col0, int64_t cols) {
  if (a.bits == 4) {
    ByteGemvBlockOf<4>(a, col0, cols);
  } else if constexpr (kByteDot8Bits) {
    ByteGemvBlockOf<8>(a, col0, cols);
  }
}

#else  // no byte dot products: HasByteDot is false, the rest is never called
bool HasByteDot(int) { return false; }
int64_t ByteVectorBytes() { return 1; }
void ByteGemvBlock(const QuantizedArgs&, int64_t, int64_t) {}
#endif

// The float GEMM's packed panels (gemm.h) of W's columns [col0, col0 + cols)
// and depths [k0, k0 + depth): panels[p, kk, j] = W[col0 + p * 2L + j, k0 + kk],
// zero for columns past cols. k0 and depth are multiples of the group size.
// A gather of one word from L rows of w gives, plane by plane, L columns of
// `planes` consecutive depths: a panel half-row each.
template <int kBits>
void DequantizePanelsOf(const QuantizedArgs& a, int64_t col0, int64_t cols, int64_t k0, int64_t depth,
                        float* panels) {
  const D d;
  const DU du;
  const DI di;
  constexpr int kPlanes = 32 / kBits;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t width = 2 * lanes;
  const int64_t words = a.words(), groups = a.groups();
  const VU mask = hn::Set(du, (1u << kBits) - 1);
  const int64_t halves = (cols + lanes - 1) / lanes;
  for (int64_t h = 0; h < halves; ++h) {
    const int64_t first = col0 + h * lanes;
    const int64_t valid = std::min(lanes, cols - h * lanes);
    // Lanes past the last column read its row again and store zeros.
    HWY_ALIGN int32_t word_offsets[kMaxLanes], group_offsets[kMaxLanes];
    for (int64_t i = 0; i < lanes; ++i) {
      word_offsets[i] = static_cast<int32_t>(std::min(i, valid - 1) * words);
      group_offsets[i] = static_cast<int32_t>(std::min(i, valid - 1) * groups);
    }
    const auto word_index = hn::Load(di, word_offsets);
    const auto group_index = hn::Load(di, group_offsets);
    const auto present = hn::FirstN(d, static_cast<size_t>(valid));
    const uint32_t* w = a.w + first * words;
    const float* scales = a.scales + first * groups;
    const float* biases = a.biases != nullptr ? a.biases + first * groups : nullptr;
    const V negative_zero = hn::Set(d, -a.zero_point);
    float* out = panels + (h / 2) * depth * width + (h % 2) * lanes;
    V s = hn::Zero(d), b = hn::Zero(d);
    for (int64_t word = k0 / kPlanes; word < (k0 + depth) / kPlanes; ++word) {
      const int64_t k = word * kPlanes;
      if (k % a.group_size == 0) {
        s = hn::GatherIndex(d, scales + k / a.group_size, group_index);
        b = biases != nullptr ? hn::GatherIndex(d, biases + k / a.group_size, group_index)
                              : hn::Mul(s, negative_zero);
      }
      const VU wv = hn::GatherIndex(du, w + word, word_index);
      float* row = out + (k - k0) * width;
      StorePlanes<kBits>(wv, mask, s, b, present, width, row);
    }
  }
  if (halves % 2 == 1) {  // the last panel's second half lies past cols
    float* out = panels + (halves / 2) * depth * width + lanes;
    for (int64_t kk = 0; kk < depth; ++kk) hn::StoreU(hn::Zero(d), d, out + kk * width);
  }
}

void DequantizePanels(const QuantizedArgs& a, int64_t col0, int64_t cols, int64_t k0, int64_t depth,
                      float* panels) {
  if (a.bits == 4) {
    DequantizePanelsOf<4>(a, col0, cols, k0, depth, panels);
  } else {
    DequantizePanelsOf<8>(a, col0, cols, k0, depth, panels);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(ChunkValues);
HWY_EXPORT(PermuteRows);
HWY_EXPORT(GemvBlock);
HWY_EXPORT(DequantizePanels);
HWY_EXPORT(QuantizeGroupsInt8);
HWY_EXPORT(HasByteDot);
HWY_EXPORT(ByteVectorBytes);
HWY_EXPORT(ByteGemvBlock);

namespace {

// Below this many multiply-adds a product runs on the calling thread: waking
// another thread costs more than it saves.
constexpr int64_t kParallelWork = 1 << 18;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Chunks of consecutive column blocks per thread. Each thread then reads long runs of the weight:
// claiming single blocks (11.5 KB of a K = 576 weight) in turn interleaved the two threads' reads,
// which defeated the hardware prefetcher; 2 threads ran a 576 x 49152 q4 GEMV from memory no faster
// than 1 (10.8 vs 11.4 GB/s) and 1536 x 576 at 4.8 GB/s. With contiguous chunks: 16.4 and 12.2 GB/s.
// A few chunks per thread (not one) keep the threads balanced when one of them starts late.
constexpr int64_t kChunksPerThread = 4;

// block(a, col0, cols) over the GEMV's blocks of kGemvColumns columns, across the threads when the
// product is large enough to pay for waking them.
template <typename Block>
void for_column_blocks(const QuantizedArgs& a, Block block) {
  const int64_t blocks = ceil_div(a.n, kGemvColumns);
  const int64_t grain = a.m * a.n * a.k < kParallelWork
                            ? blocks
                            : std::max<int64_t>(1, blocks / (kChunksPerThread * kernel_threads()));
  parallel_for(blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t col0 = b * kGemvColumns;
      block(a, col0, std::min(kGemvColumns, a.n - col0));
    }
  });
}

// GEMV over row tiles: x permuted once, then blocks of columns across the threads.
void run_gemv(QuantizedArgs a) {
  const int64_t chunk = HWY_DYNAMIC_DISPATCH(ChunkValues)(a.bits);
  a.kpad = ceil_div(a.k, chunk) * chunk;
  thread_local std::vector<float> xperm, xsum;
  xperm.resize(static_cast<size_t>(a.m * a.kpad));
  xsum.resize(static_cast<size_t>(a.m * a.groups()));
  HWY_DYNAMIC_DISPATCH(PermuteRows)(a.x, a.m, a.k, a.bits, a.group_size, a.kpad, xperm.data(), xsum.data());
  a.xperm = xperm.data();
  a.xsum = xsum.data();
  for_column_blocks(a, [](const QuantizedArgs& args, int64_t col0, int64_t cols) {
    HWY_DYNAMIC_DISPATCH(GemvBlock)(args, col0, cols);
  });
}

// The GEMVs of several products (a mixture of experts' routed experts, a few rows each) as one parallel loop
// over all their column blocks: each product's x permuted first, then one wake-up of the threads for all
// (a decode step's 2 k GEMVs would otherwise each wake and join them).
void run_gemvs(std::vector<QuantizedArgs>& products) {
  if (products.empty()) return;
  std::vector<int64_t> first_block(products.size() + 1, 0);
  int64_t permuted = 0, sums = 0, work = 0;
  for (size_t i = 0; i < products.size(); ++i) {
    QuantizedArgs& a = products[i];
    const int64_t chunk = HWY_DYNAMIC_DISPATCH(ChunkValues)(a.bits);
    a.kpad = ceil_div(a.k, chunk) * chunk;
    permuted += a.m * a.kpad;
    sums += a.m * a.groups();
    work += a.m * a.n * a.k;
    first_block[i + 1] = first_block[i] + ceil_div(a.n, kGemvColumns);
  }
  thread_local std::vector<float> xperm, xsum;
  xperm.resize(static_cast<size_t>(permuted));
  xsum.resize(static_cast<size_t>(sums));
  float* next_perm = xperm.data();
  float* next_sum = xsum.data();
  for (QuantizedArgs& a : products) {
    HWY_DYNAMIC_DISPATCH(PermuteRows)(a.x, a.m, a.k, a.bits, a.group_size, a.kpad, next_perm, next_sum);
    a.xperm = next_perm;
    a.xsum = next_sum;
    next_perm += a.m * a.kpad;
    next_sum += a.m * a.groups();
  }
  const int64_t blocks = first_block.back();
  const int64_t grain =
      work < kParallelWork ? blocks : std::max<int64_t>(1, blocks / (kChunksPerThread * kernel_threads()));
  parallel_for(blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const size_t i = static_cast<size_t>(std::upper_bound(first_block.begin(), first_block.end(), b) -
                                           first_block.begin() - 1);
      const QuantizedArgs& a = products[i];
      const int64_t col0 = (b - first_block[i]) * kGemvColumns;
      HWY_DYNAMIC_DISPATCH(GemvBlock)(a, col0, std::min(kGemvColumns, a.n - col0));
    }
  });
}

// x rounded to int8 per group as int8_group_rounded does (round_row_to_int8's arithmetic), into
// xq[r, kpad] in the order the dot products read it, xscale[r, g] = max|x| / 127 and xsum[r, g] =
// xscale * sum(xq in g) (for the biases). 4 bits: each chunk of 2B values (B = `bytes`, those of a vector of
// words) is its even values, then its odd ones: the low nibbles of B weight bytes hold the even values of a
// chunk, the high nibbles the odd ones. 8 bits: x's own order. Zero past k.
void prepare_int8_rows(const float* x, int64_t m, int64_t k, int bits, int group_size, int64_t bytes,
                       int64_t kpad, int8_t* xq, float* xscale, float* xsum) {
  const int64_t groups = k / group_size;
  thread_local std::vector<int8_t> row_q;
  row_q.resize(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    HWY_DYNAMIC_DISPATCH(QuantizeGroupsInt8)
    (x + r * k, k, group_size, row_q.data(), xscale + r * groups, xsum + r * groups);
    int8_t* out = xq + r * kpad;
    if (bits == 8) {
      for (int64_t i = 0; i < kpad; ++i) out[i] = i < k ? row_q[static_cast<size_t>(i)] : 0;
      continue;
    }
    for (int64_t c0 = 0; c0 < kpad; c0 += 2 * bytes) {
      for (int64_t t = 0; t < bytes; ++t) {
        const int64_t even = c0 + 2 * t, odd = even + 1;
        out[c0 + t] = even < k ? row_q[static_cast<size_t>(even)] : 0;
        out[c0 + bytes + t] = odd < k ? row_q[static_cast<size_t>(odd)] : 0;
      }
    }
  }
}

// The int8 GEMV: x rounded and laid out once, then blocks of columns across the threads.
void run_byte_gemv(QuantizedArgs a) {
  const int64_t bytes = HWY_DYNAMIC_DISPATCH(ByteVectorBytes)();
  const int64_t chunk = a.bits == 4 ? 2 * bytes : bytes;
  a.kpad = ceil_div(a.k, chunk) * chunk;
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xscale, xsum;
  xq.resize(static_cast<size_t>(a.m * a.kpad));
  xscale.resize(static_cast<size_t>(a.m * a.groups()));
  xsum.resize(static_cast<size_t>(a.m * a.groups()));
  prepare_int8_rows(a.x, a.m, a.k, a.bits, a.group_size, bytes, a.kpad, xq.data(), xscale.data(),
                    xsum.data());
  a.xq = xq.data();
  a.xscale = xscale.data();
  a.xsum = xsum.data();
  for_column_blocks(a, [](const QuantizedArgs& args, int64_t col0, int64_t cols) {
    HWY_DYNAMIC_DISPATCH(ByteGemvBlock)(args, col0, cols);
  });
}

// Blocks of W dequantized into GEMM panels, K slice by K slice, each slice's
// product accumulated into y (the GEMM's residual input is y itself: each tile
// reads its part of y before it stores it).
void run_dequantized_gemm(const QuantizedArgs& a) {
  const int64_t width = gemm_panel_width();
  const int64_t block_cols = 4 * width;
  const int64_t col_blocks = ceil_div(a.n, block_cols);
  const int64_t row_blocks = ceil_div(a.m, kGemmRowBlock);
  parallel_for(row_blocks * col_blocks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> panels;
    panels.resize(static_cast<size_t>(block_cols * kSliceDepth));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row0 = (t / col_blocks) * kGemmRowBlock;
      const int64_t col0 = (t % col_blocks) * block_cols;
      const int64_t cols = std::min(block_cols, a.n - col0);
      for (int64_t k0 = 0; k0 < a.k; k0 += kSliceDepth) {
        const int64_t depth = std::min(kSliceDepth, a.k - k0);
        HWY_DYNAMIC_DISPATCH(DequantizePanels)(a, col0, cols, k0, depth, panels.data());
        GemmArgs g;
        g.a = a.x + row0 * a.k + k0;
        g.lda = a.k;
        g.packed = panels.data();
        g.y = a.y + row0 * a.n + col0;
        g.ldy = a.n;
        g.residual = k0 > 0 ? g.y : nullptr;
        g.m = std::min(kGemmRowBlock, a.m - row0);
        g.k = depth;
        g.n = cols;
        run_gemm(g);  // inline: the pool is busy with this loop
      }
    }
  });
}

// The float product of a's rows: the GEMV for a few, the dequantized GEMM from quantized_matmul_gemm_rows().
void run_float_product(const QuantizedArgs& a) {
  if (a.m >= quantized_matmul_gemm_rows()) {
    run_dequantized_gemm(a);
  } else {
    run_gemv(a);
  }
}

float symmetric_zero_point(int bits) { return static_cast<float>(1 << (bits - 1)); }

// $TRANSMUTER_INT8_GEMV=0 runs int8 activations through the float GEMV on the rounded x instead
// (the same numbers): for benchmarks and for the tests that compare the two.
bool byte_gemv_disabled() {
  static const bool disabled = [] {
    const char* text = std::getenv("TRANSMUTER_INT8_GEMV");
    return text != nullptr && std::string(text) == "0";
  }();
  return disabled;
}

// mx::quantized_matmul of {x, w, scales[, biases]}: the kernel's math as MLX ops.
mx::array affine_product(const std::vector<mx::array>& in, int group_size, int bits, Activations activations,
                         mx::StreamOrDevice s) {
  const mx::array biases = in.size() > 3 ? in[3] : symmetric_biases(in[2], bits, s);
  const mx::array x =
      activations == Activations::int8_per_group ? int8_group_rounded(in[0], group_size, s) : in[0];
  return mx::quantized_matmul(x, in[1], in[2], biases, true, group_size, bits, "affine", s);
}

// One row of x rounded per group as int8_group_rounded does, in place of the row in `out`:
// MLAS's order of operations (the scale and its inverse each one float32 division).
void round_row_to_int8(const float* x, int64_t k, int group, float* out) {
  for (int64_t g0 = 0; g0 < k; g0 += group) {
    const int64_t end = std::min<int64_t>(k, g0 + group);
    float amax = 0.0f;
    for (int64_t i = g0; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / 127.0f;
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = g0; i < end; ++i) out[i] = std::nearbyint(x[i] * inverse) * scale;
  }
}

// MLX's quantized product has no derivative with respect to w (its vjp throws): the reference is
// differentiated with respect to the inputs asked for only.
class QuantizedMatmulKernel : public PartiallyDifferentiableKernel {
 public:
  QuantizedMatmulKernel(mx::Stream stream, Reference reference, int group_size, int bits,
                        Activations activations)
      : PartiallyDifferentiableKernel(stream, std::move(reference)),
        group_size_(group_size),
        bits_(bits),
        activations_(activations) {}
  const char* name() const override { return "transmuter::QuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const QuantizedMatmulKernel*>(&other);
    return o != nullptr && o->group_size_ == group_size_ && o->bits_ == bits_ &&
           o->activations_ == activations_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    QuantizedArgs a;
    a.x = in[0].data<float>();
    a.w = in[1].data<uint32_t>();
    a.scales = in[2].data<float>();
    a.biases = in.size() > 3 ? in[3].data<float>() : nullptr;
    a.zero_point = symmetric_zero_point(bits_);
    a.y = out[0].data<float>();
    a.k = in[0].shape(-1);
    a.m = static_cast<int64_t>(in[0].size()) / a.k;  // x's rows, any leading axes
    a.n = in[1].shape(0);
    a.bits = bits_;
    a.group_size = group_size_;
    const bool int8_x = activations_ == Activations::int8_per_group;
    return [a, int8_x]() mutable {
      const bool gemm = a.m >= quantized_matmul_gemm_rows();
      if (int8_x && !gemm && HWY_DYNAMIC_DISPATCH(HasByteDot)(a.bits) && !byte_gemv_disabled()) {
        run_byte_gemv(a);
        return;
      }
      thread_local std::vector<float> rounded;
      if (int8_x) {
        rounded.resize(static_cast<size_t>(a.m * a.k));
        for (int64_t r = 0; r < a.m; ++r)
          round_row_to_int8(a.x + r * a.k, a.k, a.group_size, rounded.data() + r * a.k);
        a.x = rounded.data();
      }
      run_float_product(a);
    };
  }

 private:
  int group_size_, bits_;
  Activations activations_;
};

// mx::gather_qmm of {x [R, K], experts [P], w, scales[, biases]} as routed_quantized_matmul defines it.
mx::array routed_reference(const std::vector<mx::array>& in, int group_size, int bits, mx::StreamOrDevice s) {
  const mx::array &x = in[0], &experts = in[1];
  const int pairs = experts.shape(0), rows = x.shape(0), k = x.shape(1);
  const mx::array per_pair = rows == pairs ? x : mx::repeat(x, pairs / rows, 0, s);
  const mx::array biases = in.size() > 4 ? in[4] : symmetric_biases(in[3], bits, s);
  mx::array y = mx::gather_qmm(mx::reshape(per_pair, {pairs, 1, k}, s), in[2], in[3], biases, std::nullopt,
                               experts, true, group_size, bits, "affine", std::nullopt, false, s);
  return mx::reshape(y, {pairs, in[2].shape(1)}, s);
}

// routed_quantized_matmul's kernel: the pairs grouped by expert, each group one product (run_float_product)
// over its expert's slice of w, scales and biases; rows are gathered into a block (and the results
// scattered back) only for experts with more than one pair.
// As QuantizedMatmulKernel, differentiated with respect to the inputs asked for only (no derivative
// with respect to w, nor for the indices).
class RoutedQuantizedMatmulKernel : public PartiallyDifferentiableKernel {
 public:
  RoutedQuantizedMatmulKernel(mx::Stream stream, Reference reference, int group_size, int bits)
      : PartiallyDifferentiableKernel(stream, std::move(reference)), group_size_(group_size), bits_(bits) {}
  const char* name() const override { return "transmuter::RoutedQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const RoutedQuantizedMatmulKernel*>(&other);
    return o != nullptr && o->group_size_ == group_size_ && o->bits_ == bits_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    QuantizedArgs a;
    a.k = in[0].shape(1);
    a.n = in[2].shape(1);
    a.bits = bits_;
    a.group_size = group_size_;
    a.zero_point = symmetric_zero_point(bits_);
    const float* x = in[0].data<float>();
    const uint32_t* experts = in[1].data<uint32_t>();  // read in the task: computed before it runs
    const uint32_t* w = in[2].data<uint32_t>();
    const float* scales = in[3].data<float>();
    const float* biases = in.size() > 4 ? in[4].data<float>() : nullptr;
    float* y = out[0].data<float>();
    const int64_t pairs = in[1].shape(0), share = pairs / in[0].shape(0), count = in[2].shape(0);
    return [=]() mutable {
      const int64_t words = a.words(), groups = a.groups();
      // The pairs of each expert, in order (a counting sort by expert).
      std::vector<int64_t> start(static_cast<size_t>(count + 1), 0), order(static_cast<size_t>(pairs));
      for (int64_t p = 0; p < pairs; ++p) {
        if (experts[p] < count) ++start[experts[p] + 1];
      }
      for (int64_t e = 0; e < count; ++e) start[e + 1] += start[e];
      std::vector<int64_t> next(start.begin(), start.end() - 1);
      for (int64_t p = 0; p < pairs; ++p) {
        if (experts[p] < count) {
          order[static_cast<size_t>(next[experts[p]]++)] = p;
        } else {
          std::fill(y + p * a.n, y + (p + 1) * a.n, std::numeric_limits<float>::quiet_NaN());
        }
      }
      // An expert with one pair reads its row and writes its output in place; the rows of an expert with
      // more are gathered into `rows` (and its results scattered back from `results`) in expert order.
      int64_t gathered = 0;
      for (int64_t e = 0; e < count; ++e) {
        if (start[e + 1] - start[e] > 1) gathered += start[e + 1] - start[e];
      }
      thread_local std::vector<float> rows, results;
      rows.resize(static_cast<size_t>(gathered * a.k));
      results.resize(static_cast<size_t>(gathered * a.n));
      std::vector<QuantizedArgs> gemvs;  // run together: one wake-up of the threads
      int64_t offset = 0;
      for (int64_t e = 0; e < count; ++e) {
        const int64_t m = start[e + 1] - start[e];
        if (m == 0) continue;
        const int64_t* mine = order.data() + start[e];
        QuantizedArgs expert = a;
        expert.w = w + e * a.n * words;
        expert.scales = scales + e * a.n * groups;
        expert.biases = biases != nullptr ? biases + e * a.n * groups : nullptr;
        expert.m = m;
        if (m == 1) {
          expert.x = x + mine[0] / share * a.k;
          expert.y = y + mine[0] * a.n;
        } else {
          expert.x = rows.data() + offset * a.k;
          expert.y = results.data() + offset * a.n;
          for (int64_t i = 0; i < m; ++i)
            std::copy_n(x + mine[i] / share * a.k, a.k, rows.data() + (offset + i) * a.k);
          offset += m;
        }
        if (m >= quantized_matmul_gemm_rows()) {
          run_dequantized_gemm(expert);
        } else {
          gemvs.push_back(expert);
        }
      }
      run_gemvs(gemvs);
      offset = 0;
      for (int64_t e = 0; e < count; ++e) {
        const int64_t m = start[e + 1] - start[e];
        if (m < 2) continue;
        const int64_t* mine = order.data() + start[e];
        for (int64_t i = 0; i < m; ++i)
          std::copy_n(results.data() + (offset + i) * a.n, a.n, y + mine[i] * a.n);
        offset += m;
      }
    };
  }

 private:
  int group_size_, bits_;
};

}  // namespace

int64_t quantized_matmul_gemm_rows() {
  // $TRANSMUTER_QUANTIZED_GEMM_ROWS overrides it for benchmarks (bench/q4_bench.py).
  static const int64_t rows = [] {
    if (const char* text = std::getenv("TRANSMUTER_QUANTIZED_GEMM_ROWS")) {
      char* end = nullptr;
      const long v = std::strtol(text, &end, 10);
      if (end != text && *end == '\0' && v > 0) return static_cast<int64_t>(v);
    }
    return int64_t{6};
  }();
  return rows;
}

mx::array int8_group_rounded(const mx::array& x, int group, mx::StreamOrDevice s) {
  auto rounded = [group, s](const mx::array& v) {
    const int k = v.shape(-1), groups = (k + group - 1) / group;
    mx::array padded = v;
    if (groups * group != k) {
      std::vector<int> axes = {static_cast<int>(v.ndim()) - 1};
      padded = mx::pad(v, axes, {0}, {groups * group - k}, mx::array(0.0f), "constant", s);
    }
    mx::Shape blocked = padded.shape();
    blocked.back() = groups;
    blocked.push_back(group);
    mx::array blocks = mx::reshape(padded, blocked, s);
    mx::array amax = mx::max(mx::abs(blocks, s), -1, true, s);
    mx::array scale = mx::divide(amax, mx::array(127.0f), s);
    mx::array inverse = mx::where(mx::equal(amax, mx::array(0.0f), s), mx::array(0.0f),
                                  mx::divide(mx::array(127.0f), amax, s), s);
    mx::array q = mx::multiply(mx::round(mx::multiply(blocks, inverse, s), 0, s), scale, s);
    mx::array out = mx::reshape(q, padded.shape(), s);
    if (groups * group == k) return out;
    mx::Shape start(v.ndim(), 0);
    return mx::slice(out, start, v.shape(), s);
  };
  auto straight_through = mx::custom_vjp(
      [rounded](const std::vector<mx::array>& in) { return std::vector<mx::array>{rounded(in[0])}; },
      [](const std::vector<mx::array>&, const std::vector<mx::array>& cotangents,
         const std::vector<mx::array>&) { return cotangents; });
  return straight_through({x})[0];
}

mx::array symmetric_biases(const mx::array& scales, int bits, mx::StreamOrDevice s) {
  // Exact: the zero point is a power of two.
  return mx::multiply(scales, mx::array(-symmetric_zero_point(bits)), s);
}

bool quantized_matmul_fits(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int group_size, int bits,
                           mx::StreamOrDevice s) {
  if (!is_cpu_stream(s) || (bits != 4 && bits != 8)) return false;
  if (group_size != 32 && group_size != 64 && group_size != 128) return false;
  if (x.dtype() != mx::float32 || x.ndim() < 1 || x.size() == 0) return false;
  const int64_t k = x.shape(-1);
  if (k % group_size != 0 || w.dtype() != mx::uint32 || w.ndim() != 2) return false;
  const int64_t n = w.shape(0), words = k * bits / 32, groups = k / group_size;
  if (n < 1 || w.shape(1) != words) return false;
  // Gathers index w, scales and biases with int32 offsets.
  if (n * words > (int64_t{1} << 31) - 1) return false;
  for (const mx::array* t : {&scales, biases ? &*biases : &scales}) {
    if (t->dtype() != mx::float32 || t->ndim() != 2 || t->shape(0) != n || t->shape(1) != groups)
      return false;
  }
  return true;
}

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int group_size, int bits,
                           mx::StreamOrDevice s, Activations activations) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [group_size, bits, activations, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{affine_product(in, group_size, bits, activations, stream)};
  };
  std::vector<mx::array> inputs = {x, w, scales};
  if (biases) inputs.push_back(*biases);
  if (!quantized_matmul_fits(x, w, scales, biases, group_size, bits, stream)) return reference(inputs)[0];
  mx::Shape shape = x.shape();
  shape.back() = w.shape(0);
  // x keeps its leading axes: one primitive per call, no reshapes around it.
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<QuantizedMatmulKernel>(kernel_stream, reference, group_size, bits,
                                                       activations);
      },
      reference, std::move(inputs), {shape}, {mx::float32}, stream)[0];
}

bool routed_quantized_matmul_fits(const mx::array& x, const mx::array& experts, const mx::array& w,
                                  const mx::array& scales, const std::optional<mx::array>& biases,
                                  int group_size, int bits, mx::StreamOrDevice s) {
  if (!is_cpu_stream(s) || (bits != 4 && bits != 8)) return false;
  if (group_size != 32 && group_size != 64 && group_size != 128) return false;
  if (x.dtype() != mx::float32 || x.ndim() != 2 || x.size() == 0) return false;
  if (experts.dtype() != mx::uint32 || experts.ndim() != 1 || experts.shape(0) % x.shape(0) != 0)
    return false;
  const int64_t k = x.shape(1);
  if (k % group_size != 0 || w.dtype() != mx::uint32 || w.ndim() != 3) return false;
  const int64_t count = w.shape(0), n = w.shape(1), words = k * bits / 32, groups = k / group_size;
  if (count < 1 || n < 1 || w.shape(2) != words) return false;
  for (const mx::array* t : {&scales, biases ? &*biases : &scales}) {
    if (t->dtype() != mx::float32 ||
        t->shape() != mx::Shape{static_cast<int>(count), static_cast<int>(n), static_cast<int>(groups)})
      return false;
  }
  return true;
}

mx::array routed_quantized_matmul(const mx::array& x, const mx::array& experts, const mx::array& w,
                                  const mx::array& scales, const std::optional<mx::array>& biases,
                                  int group_size, int bits, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [group_size, bits, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{routed_reference(in, group_size, bits, stream)};
  };
  std::vector<mx::array> inputs = {x, experts, w, scales};
  if (biases) inputs.push_back(*biases);
  if (!routed_quantized_matmul_fits(x, experts, w, scales, biases, group_size, bits, stream))
    return reference(inputs)[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<RoutedQuantizedMatmulKernel>(kernel_stream, reference, group_size, bits);
      },
      reference, std::move(inputs), {{experts.shape(0), w.shape(1)}}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
