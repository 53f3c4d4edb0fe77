// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); the kernel runs where the target has AVX512-VNNI (AVX3_DL).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/integer_gemm.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/integer_gemm_args.h"
#include "kernels/cpu/requantize_avx512-inl.h"

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3_DL
using DI = hn::ScalableTag<int32_t>;
using VI = hn::Vec<DI>;
using DI8 = hn::Repartition<int8_t, DI>;
using DU8 = hn::Repartition<uint8_t, DI>;

bool HasIntegerGemm() { return true; }

// acc + the sums of four u8 x s8 products per int32 lane. Inline assembly, as in quantized_matmul.cpp:
// Highway 1.0.3 compiles AVX3_DL for the VEX "avxvnni" form, which Zen 4 lacks; the target's run-time
// check covers AVX512-VNNI.
HWY_INLINE VI DotBytes(VI acc, hn::Vec<DU8> u, hn::Vec<DI8> v) {
  __m512i sum = acc.raw;
  asm("vpdpbusd %[v], %[u], %[sum]" : [sum] "+v"(sum) : [u] "v"(u.raw), [v] "v"(v.raw));
  return VI{sum};
}

// The first `valid` lanes of v to out (all of them without a copy).
template <class Tag, typename T>
HWY_INLINE void StoreColumns(hn::Vec<Tag> v, Tag d, T* out, int64_t valid) {
  if (valid == static_cast<int64_t>(hn::Lanes(d))) {
    hn::StoreU(v, d, out);
    return;
  }
  HWY_ALIGN T buffer[16];
  hn::Store(v, d, buffer);
  std::memcpy(out, buffer, static_cast<size_t>(valid) * sizeof(T));
}

// The exact sum of row r of a tile: the raw products minus zb' times the row's sum of A (when B has zero
// points), plus the column terms.
HWY_INLINE VI CenteredSum(const IntegerGemmArgs& g, VI raw, VI zeros, VI column_term, const int32_t* row_sums,
                          int r) {
  if (g.b_zero_free) return hn::Add(raw, column_term);
  return hn::Add(hn::Sub(raw, hn::Mul(zeros, hn::Set(DI(), row_sums[r]))), column_term);
}

// The requantizing epilogue of a tile's panel (columns col0 .. col0 + 32): per row, each vector's exact
// sum (the column offsets are in it) requantized (RequantizedBytes), the two vectors' bytes in one 32-byte
// store.
template <int R>
HWY_INLINE void RequantizePanel(const IntegerGemmArgs& g, const VI (&acc)[R][2], int64_t row, int64_t col0) {
  const hn::Rebind<float, DI> df;
  // In locals: the byte stores below may alias g's fields, which the compiler would otherwise reload.
  const int64_t n = g.n;
  uint8_t* const out = g.y_quant + row * n + col0;
  const int64_t valid = std::min(kIntPanelColumns, n - col0);
  const __m512 scale_low = hn::LoadU(df, g.column_scales + col0).raw;
  const __m512 scale_high = hn::LoadU(df, g.column_scales + col0 + hn::Lanes(df)).raw;
  const RequantizeBounds bounds(g.y_min, g.y_max, g.y_zero);
  auto row_bytes = [&](int r) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(RequantizedBytes(acc[r][0].raw, scale_low, bounds)),
                                   RequantizedBytes(acc[r][1].raw, scale_high, bounds), 1);
  };
  if (valid == kIntPanelColumns) {
    for (int r = 0; r < R; ++r) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * n), row_bytes(r));
    return;
  }
  const __mmask32 mask = (__mmask32{1} << valid) - 1;
  for (int r = 0; r < R; ++r) _mm256_mask_storeu_epi8(out + r * n, mask, row_bytes(r));
}

// acc[r][h] += the raw products of row row + r with panel p's columns h * 16 .. over the packed quads.
template <int R>
HWY_INLINE void IntProducts(const IntegerGemmArgs& g, int64_t row, int64_t p, VI (&acc)[R][2]) {
  const DU8 du8;
  const DI8 di8;
  const DI di;
  const int64_t quads = (g.k + 3) / 4;
  const int8_t* b = g.packed + p * quads * kIntQuadBytes;
  const uint8_t* a = g.a + row * g.lda;
  for (int64_t q = 0; q < quads; ++q) {
    const auto b0 = hn::LoadU(di8, b + q * kIntQuadBytes);
    const auto b1 = hn::LoadU(di8, b + q * kIntQuadBytes + kIntQuadBytes / 2);
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, a + r * g.lda + 4 * q, sizeof(four));
      const auto a4 = hn::BitCast(du8, hn::Set(di, four));
      acc[r][0] = DotBytes(acc[r][0], a4, b0);
      acc[r][1] = DotBytes(acc[r][1], a4, b1);
    }
  }
}

// y_quant[row .. row + R, panel p's columns]: the column offsets plus the products (less B's zero points
// times the row sums), then the requantizing epilogue. Apart from IntTile: there the other epilogues index
// the accumulators by a run-time vector, which kept them in memory (stored after the products, reloaded by
// the epilogue) for this one too.
template <int R>
HWY_INLINE void IntTileQuantized(const IntegerGemmArgs& g, int64_t row, int64_t p, const int32_t* row_sums) {
  const DI di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(di));
  const int64_t col0 = p * kIntPanelColumns;
  const VI offset_low = hn::LoadU(di, g.column_offsets + col0);
  const VI offset_high = hn::LoadU(di, g.column_offsets + col0 + lanes);
  VI acc[R][2];
  if (g.b_zero_free) {  // the sums start from the column offsets
    for (int r = 0; r < R; ++r) {
      acc[r][0] = offset_low;
      acc[r][1] = offset_high;
    }
    IntProducts<R>(g, row, p, acc);
  } else {
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = hn::Zero(di);
    IntProducts<R>(g, row, p, acc);
    const VI zeros_low = hn::LoadU(di, g.column_zeros + col0);
    const VI zeros_high = hn::LoadU(di, g.column_zeros + col0 + lanes);
    for (int r = 0; r < R; ++r) {
      const VI sum = hn::Set(di, row_sums[r]);
      acc[r][0] = hn::Sub(hn::Add(acc[r][0], offset_low), hn::Mul(zeros_low, sum));
      acc[r][1] = hn::Sub(hn::Add(acc[r][1], offset_high), hn::Mul(zeros_high, sum));
    }
  }
  RequantizePanel<R>(g, acc, row, col0);
}

// y or y_float [row .. row + R, panel p's columns]: the products, then the zero points through the row
// sums of A and the column sums of B', then the float epilogue if any.
template <int R>
HWY_INLINE void IntTile(const IntegerGemmArgs& g, int64_t row, int64_t p, const int32_t* row_sums) {
  const DI di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(di));  // 16: two vectors make a panel
  VI acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = hn::Zero(di);
  IntProducts<R>(g, row, p, acc);
  const VI za = hn::Set(di, g.a_zero);
  const VI k_za = hn::Set(di, static_cast<int32_t>(g.k) * g.a_zero);
  for (int h = 0; h < 2; ++h) {
    const int64_t col0 = p * kIntPanelColumns + h * lanes;
    if (col0 >= g.n) break;
    const VI sums = hn::LoadU(di, g.column_sums + col0);
    const VI zeros = hn::LoadU(di, g.column_zeros + col0);
    // - za sum_k b' + K za zb', the same for every row
    const VI column_term = hn::Sub(hn::Mul(k_za, zeros), hn::Mul(za, sums));
    const int64_t valid = std::min(lanes, g.n - col0);
    if (g.y_float != nullptr) {
      const hn::Rebind<float, DI> df;
      // The columns' scales and biases, through a padded copy at the last panel's end.
      auto columns = [&](const float* values) {
        if (valid == lanes) return hn::LoadU(df, values + col0);
        HWY_ALIGN float padded[16] = {};
        std::memcpy(padded, values + col0, static_cast<size_t>(valid) * sizeof(float));
        return hn::Load(df, padded);
      };
      auto scale = g.scale_per_column ? columns(g.scale) : hn::Set(df, g.scale[0]);
      if (g.factor != nullptr) scale = hn::Mul(scale, g.factor_per_column ? columns(g.factor) : hn::Set(df, g.factor[0]));
      const auto bias = g.bias != nullptr ? columns(g.bias) : hn::Zero(df);
      for (int r = 0; r < R; ++r) {
        const VI v = CenteredSum(g, acc[r][h], zeros, column_term, row_sums, r);
        auto f = hn::Mul(hn::ConvertTo(df, v), scale);
        // The product rounded before the bias is added, as the separate Mul and Add round it: the empty
        // asm keeps the compiler from contracting the two into a fused multiply-add.
        asm("" : "+v"(f.raw));
        if (g.bias != nullptr) f = hn::Add(f, bias);
        StoreColumns(f, df, g.y_float + (row + r) * g.n + col0, valid);
      }
      continue;
    }
    for (int r = 0; r < R; ++r) {
      const VI v = CenteredSum(g, acc[r][h], zeros, column_term, row_sums, r);
      StoreColumns(v, di, g.y + (row + r) * g.n + col0, valid);
    }
  }
}

// The tiles of rows [row0, row0 + rows) x panels [panel0, panel0 + panels), 6 rows at a time.
template <template <int> class Tile>
HWY_INLINE void Tiles(const IntegerGemmArgs& g, int64_t row0, int64_t rows, int64_t panel0, int64_t panels) {
  for (int64_t row = row0; row < row0 + rows; row += kIntTileRows) {
    const int64_t tile = std::min(kIntTileRows, row0 + rows - row);
    // Null when B has no zero points (b_zero_free): the row sums were not computed and are not read.
    const int32_t* row_sums = g.row_sums != nullptr ? g.row_sums + row : nullptr;
    for (int64_t p = panel0; p < panel0 + panels; ++p) {
      switch (tile) {
        case 6:
          Tile<6>::Run(g, row, p, row_sums);
          break;
        case 5:
          Tile<5>::Run(g, row, p, row_sums);
          break;
        case 4:
          Tile<4>::Run(g, row, p, row_sums);
          break;
        case 3:
          Tile<3>::Run(g, row, p, row_sums);
          break;
        case 2:
          Tile<2>::Run(g, row, p, row_sums);
          break;
        default:
          Tile<1>::Run(g, row, p, row_sums);
          break;
      }
    }
  }
}

template <int R>
struct QuantizedTile {
  static HWY_INLINE void Run(const IntegerGemmArgs& g, int64_t row, int64_t p, const int32_t* s) {
    IntTileQuantized<R>(g, row, p, s);
  }
};

template <int R>
struct OtherTile {
  static HWY_INLINE void Run(const IntegerGemmArgs& g, int64_t row, int64_t p, const int32_t* s) {
    IntTile<R>(g, row, p, s);
  }
};

// Rows [row0, row0 + rows) x panels [panel0, panel0 + panels): one task.
void IntegerGemmBlock(const IntegerGemmArgs& g, int64_t row0, int64_t rows, int64_t panel0, int64_t panels) {
  if (g.y_quant != nullptr) {
    Tiles<QuantizedTile>(g, row0, rows, panel0, panels);
  } else {
    Tiles<OtherTile>(g, row0, rows, panel0, panels);
  }
}
// sums[i] = sum_k a[i, k] for rows [row0, row0 + rows) (bytes summed eight at a time).
void RowSums(const IntegerGemmArgs& g, int64_t row0, int64_t rows, int32_t* sums) {
  const hn::ScalableTag<uint8_t> d8;
  const hn::Repartition<uint64_t, decltype(d8)> d64;
  const int64_t bytes = static_cast<int64_t>(hn::Lanes(d8));
  for (int64_t r = row0; r < row0 + rows; ++r) {
    const uint8_t* a = g.a + r * g.lda;
    auto acc = hn::Zero(d64);
    int64_t i = 0;
    for (; i + bytes <= g.k; i += bytes) acc = hn::Add(acc, hn::SumsOf8(hn::LoadU(d8, a + i)));
    int64_t sum = static_cast<int64_t>(hn::GetLane(hn::SumOfLanes(d64, acc)));
    for (; i < g.k; ++i) sum += a[i];
    sums[r] = static_cast<int32_t>(sum);
  }
}

// Rows [row0, row0 + rows) over every panel, their row sums first: a task of a kernel that made the rows.
void IntegerGemmRows(const IntegerGemmArgs& g, int64_t row0, int64_t rows) {
  IntegerGemmArgs local = g;
  local.a = g.a + row0 * g.lda;
  if (local.y != nullptr) local.y += row0 * g.n;
  if (local.y_float != nullptr) local.y_float += row0 * g.n;
  if (local.y_quant != nullptr) local.y_quant += row0 * g.n;
  local.m = rows;
  thread_local std::vector<int32_t> sums;
  if (!g.b_zero_free) {
    sums.resize(static_cast<size_t>(rows));
    RowSums(local, 0, rows, sums.data());
    local.row_sums = sums.data();
  }
  IntegerGemmBlock(local, 0, rows, 0, (g.n + kIntPanelColumns - 1) / kIntPanelColumns);
}
#else
bool HasIntegerGemm() { return false; }
void IntegerGemmBlock(const IntegerGemmArgs&, int64_t, int64_t, int64_t, int64_t) {}
void RowSums(const IntegerGemmArgs&, int64_t, int64_t, int32_t*) {}
void IntegerGemmRows(const IntegerGemmArgs&, int64_t, int64_t) {}
#endif

// The packed layout's quads of B (row-major [k, n] bytes, XORed with `flip`): quad q of panel p holds
// rows 4q..4q+3 of the panel's 32 columns, column j's four bytes at 4j. Four rows' vectors are stored
// interleaved, a vector of columns at a time; a panel past N or a quad past K is zeroed, then filled
// byte by byte (every byte of `packed` is written).
void PackIntegerQuads(const uint8_t* b, int64_t k, int64_t n, uint8_t flip, int8_t* packed) {
  const hn::CappedTag<uint8_t, kIntPanelColumns> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto flip_v = hn::Set(d, flip);
  const int64_t quads = (k + 3) / 4, panels = (n + kIntPanelColumns - 1) / kIntPanelColumns;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t col0 = p * kIntPanelColumns, cols = std::min(kIntPanelColumns, n - col0);
    for (int64_t q = 0; q < quads; ++q) {
      auto* quad = reinterpret_cast<uint8_t*>(packed + (p * quads + q) * kIntQuadBytes);
      const uint8_t* row = b + 4 * q * n + col0;
      if (cols == kIntPanelColumns && 4 * q + 4 <= k) {
        for (int64_t j = 0; j < kIntPanelColumns; j += lanes) {
          const auto r0 = hn::Xor(hn::LoadU(d, row + j), flip_v),
                     r1 = hn::Xor(hn::LoadU(d, row + n + j), flip_v);
          const auto r2 = hn::Xor(hn::LoadU(d, row + 2 * n + j), flip_v);
          const auto r3 = hn::Xor(hn::LoadU(d, row + 3 * n + j), flip_v);
          hn::StoreInterleaved4(r0, r1, r2, r3, d, quad + 4 * j);
        }
        continue;
      }
      std::memset(quad, 0, kIntQuadBytes);  // zeros past K and N
      for (int64_t r = 0; r < 4 && 4 * q + r < k; ++r) {
        for (int64_t j = 0; j < cols; ++j) quad[j * 4 + r] = row[r * n + j] ^ flip;
      }
    }
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/integer_gemm.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/dynamic_quantize.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "mlx_bridge/buffers.h"

namespace transmuter::kernels {

HWY_EXPORT(HasIntegerGemm);
HWY_EXPORT(IntegerGemmBlock);
HWY_EXPORT(RowSums);
HWY_EXPORT(PackIntegerQuads);
HWY_EXPORT(IntegerGemmRows);

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows and panels of one task: 16 row tiles over 4 panels (4 x K bytes of B each, in L2).
constexpr int64_t kBlockRows = 16 * kIntTileRows;
constexpr int64_t kBlockPanels = 4;

// B' [K, N] float32 (the packed values as they are) from the packed layout.
mx::array unpacked_rhs(const mx::array& packed, int64_t k, int64_t n, mx::StreamOrDevice s) {
  const int panels = packed.shape(0), quads = packed.shape(1);
  mx::array b = mx::reshape(packed, {panels, quads, static_cast<int>(kIntPanelColumns), 4}, s);
  b = mx::transpose(b, {1, 3, 0, 2}, s);  // [quads, 4, panels, 32]
  b = mx::reshape(b, {quads * 4, panels * static_cast<int>(kIntPanelColumns)}, s);
  return mx::astype(mx::slice(b, {0, 0}, {static_cast<int>(k), static_cast<int>(n)}, s), mx::float32, s);
}

// Which inputs a call has: a, packed, column sums, column zeros, [a_zero], [scale, [bias], [factor]].
struct IntegerInputs {
  bool has_zero, has_scale, has_bias, has_factor;
  size_t scale() const { return has_zero ? 5 : 4; }
  size_t factor() const { return scale() + (has_bias ? 2 : 1); }
};

// The kernel's reference: the centered operands in float32, multiplied exactly, then the epilogue.
mx::array reference_matmul(const std::vector<mx::array>& in, int64_t k, int64_t n, IntegerInputs kind,
                           mx::StreamOrDevice s) {
  mx::array a = mx::astype(in[0], mx::float32, s);
  if (kind.has_zero) a = mx::subtract(a, mx::astype(in[4], mx::float32, s), s);
  mx::array zeros = mx::astype(mx::slice(in[3], {0}, {static_cast<int>(n)}, s), mx::float32, s);
  mx::array y = exact_integer_matmul(a, mx::subtract(unpacked_rhs(in[1], k, n, s), zeros, s), s);
  if (!kind.has_scale) return y;
  mx::array scale = in[kind.scale()];
  if (kind.has_factor) scale = mx::multiply(scale, in[kind.factor()], s);
  y = mx::multiply(mx::astype(y, mx::float32, s), scale, s);
  return kind.has_bias ? mx::add(y, in[kind.scale() + 1], s) : y;
}

class IntegerMatmulKernel : public CpuKernel {
 public:
  IntegerMatmulKernel(mx::Stream stream, Reference reference, int64_t k, int64_t n, IntegerInputs kind)
      : CpuKernel(stream, std::move(reference)), k_(k), n_(n), kind_(kind) {}
  const char* name() const override { return "transmuter::IntegerMatmul"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    IntegerGemmArgs g{};
    g.a = in[0].data<uint8_t>();
    g.packed = in[1].data<int8_t>();
    g.column_sums = in[2].data<int32_t>();
    g.column_zeros = in[3].data<int32_t>();
    // The zero point's value is read in the task: inputs are computed by then, not when it is made.
    const uint8_t* a_zero = kind_.has_zero ? in[4].data<uint8_t>() : nullptr;
    g.k = k_;
    g.lda = k_;
    g.n = n_;
    g.m = static_cast<int64_t>(in[0].size()) / std::max<int64_t>(k_, 1);
    if (kind_.has_scale) {
      g.y_float = out[0].data<float>();
      g.scale = in[kind_.scale()].data<float>();
      g.scale_per_column = in[kind_.scale()].size() > 1;
      g.bias = kind_.has_bias ? in[kind_.scale() + 1].data<float>() : nullptr;
      if (kind_.has_factor) {
        g.factor = in[kind_.factor()].data<float>();
        g.factor_per_column = in[kind_.factor()].size() > 1;
      }
    } else {
      g.y = out[0].data<int32_t>();
    }
    return [g, a_zero]() mutable {
      g.a_zero = a_zero != nullptr ? static_cast<int32_t>(*a_zero) : 0;
      run_integer_gemm(g);
    };
  }

 private:
  int64_t k_, n_;
  IntegerInputs kind_;
};

}  // namespace

void set_zero_free_columns(IntegerGemmArgs& g) {
  g.b_zero_free = std::all_of(g.column_zeros, g.column_zeros + g.n, [](int32_t z) { return z == 0; });
}

void set_requantize_columns(IntegerGemmArgs& g, RequantizeColumns& storage) {
  const auto padded = static_cast<size_t>(ceil_div(g.n, kIntPanelColumns) * kIntPanelColumns);
  storage.offsets.assign(padded, 0);
  storage.scales.assign(padded, 0.0f);
  const int64_t za = g.a_zero, k_za = g.k * za;
  for (int64_t j = 0; j < g.n; ++j) {
    // Modulo 2^32, as the int32 sums they join: the exact sum fits.
    const int64_t offset =
        k_za * g.column_zeros[j] - za * g.column_sums[j] + (g.bias_int ? g.bias_int[j] : 0);
    storage.offsets[static_cast<size_t>(j)] = static_cast<int32_t>(offset);
    storage.scales[static_cast<size_t>(j)] = g.scale[g.scale_per_column ? j : 0];
  }
  g.column_offsets = storage.offsets.data();
  g.column_scales = storage.scales.data();
}

namespace {

// The QLinearAdd after the product (IntegerGemmArgs::add_other) over rows [row0, row0 + rows) and
// columns [col0, col0 + cols) of y_quant, once their bytes are stored.
void add_after_product(const IntegerGemmArgs& g, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  cols = std::min(cols, g.n - col0);
  const QLinearAddRatios ratios{g.add_a, g.add_b, g.add_fixed};
  auto add = [&](int64_t offset, int64_t count) {
    uint8_t* y = g.y_quant + offset;
    const uint8_t* other = g.add_other + offset;
    qlinear_add_bytes(g.add_product_first ? y : other, g.add_product_first ? other : y, count, ratios,
                      g.y_signed, y);
  };
  if (col0 == 0 && cols == g.n) {
    add(row0 * g.n, rows * g.n);
    return;
  }
  for (int64_t r = row0; r < row0 + rows; ++r) add(r * g.n + col0, cols);
}

}  // namespace

void integer_gemm_rows_on_this_thread(const IntegerGemmArgs& g, int64_t row0, int64_t rows) {
  HWY_DYNAMIC_DISPATCH(IntegerGemmRows)(g, row0, rows);
  if (g.add_other != nullptr) add_after_product(g, row0, rows, 0, g.n);
}

void run_integer_gemm(IntegerGemmArgs g) {
  set_zero_free_columns(g);
  RequantizeColumns columns;
  if (g.y_quant != nullptr) set_requantize_columns(g, columns);
  // A's row sums once per call (every panel block's tiles use them), unless B has no zero points.
  std::vector<int32_t> row_sums(g.b_zero_free ? 0 : static_cast<size_t>(g.m));
  if (!g.b_zero_free) {
    parallel_for(g.m, kBlockRows, [&](int64_t begin, int64_t end) {
      HWY_DYNAMIC_DISPATCH(RowSums)(g, begin, end - begin, row_sums.data());
    });
    g.row_sums = row_sums.data();
  }
  const BlockSplit split(g.m, ceil_div(g.n, kIntPanelColumns), kBlockRows, kIntTileRows, kBlockPanels);
  parallel_for(split.tasks(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t row0, rows, panel0, panels;
      split.task(t, row0, rows, panel0, panels);
      HWY_DYNAMIC_DISPATCH(IntegerGemmBlock)(g, row0, rows, panel0, panels);
      if (g.add_other != nullptr)
        add_after_product(g, row0, rows, panel0 * kIntPanelColumns, panels * kIntPanelColumns);
    }
  });
}

mx::array exact_integer_matmul(mx::array a, mx::array b, mx::StreamOrDevice s) {
  // The own GEMM on the CPU (MLX's matmul there is OpenBLAS, whose worker spins on the core the kernel
  // pool needs: a dynamically quantized MiniLM-L6 ran 2-40x slower than its float32 export).
  auto float_matmul = [&](const mx::array& x, const mx::array& y) {
    return batched_matmul_fits(x, y, s) ? batched_matmul(x, y, s) : mx::matmul(x, y, s);
  };
  const int k = a.shape(-1);
  if (k <= kExactIntegerTerms) return mx::astype(float_matmul(a, b), mx::int32, s);
  const int chunks = (k + kExactIntegerTerms - 1) / kExactIntegerTerms;
  const int chunk = (k + chunks - 1) / chunks;
  const int padded = chunk * chunks;
  if (padded != k) {
    std::vector<std::pair<int, int>> pad_a(a.ndim(), {0, 0}), pad_b(b.ndim(), {0, 0});
    pad_a.back() = {0, padded - k};
    pad_b[b.ndim() - 2] = {0, padded - k};
    a = mx::pad(a, pad_a, mx::array(0.0f), "constant", s);
    b = mx::pad(b, pad_b, mx::array(0.0f), "constant", s);
  }
  // a: [..., M, chunks, chunk] -> [..., chunks, M, chunk]; b: [..., chunks, chunk, N]
  mx::Shape a_shape(a.shape().begin(), a.shape().end() - 1);
  a_shape.push_back(chunks);
  a_shape.push_back(chunk);
  a = mx::swapaxes(mx::reshape(a, a_shape, s), -3, -2, s);
  mx::Shape b_shape(b.shape().begin(), b.shape().end() - 2);
  b_shape.insert(b_shape.end(), {chunks, chunk, b.shape(-1)});
  b = mx::reshape(b, b_shape, s);
  return mx::sum(mx::astype(float_matmul(a, b), mx::int32, s), -3, false, s);
}

bool integer_gemm_available() { return HWY_DYNAMIC_DISPATCH(HasIntegerGemm)(); }

namespace {

// column_zeros of a packing: b_zero - shift per column, padded with zeros to whole panels. The zero point
// (nullopt: 0; a scalar or [n], of B's type) is read on the host: an evaluation at load is a round trip
// to the stream.
std::vector<int32_t> column_zeros_of(const std::optional<mx::array>& b_zero_point, mx::Dtype type, int64_t n,
                                     int64_t padded_n, int32_t shift) {
  std::vector<int32_t> zeros(static_cast<size_t>(padded_n), 0);
  for (int64_t j = 0; j < n; ++j) zeros[static_cast<size_t>(j)] = -shift;
  if (!b_zero_point) return zeros;
  const mx::array& z = *b_zero_point;
  if (z.dtype() != type || (z.size() != 1 && !(z.ndim() == 1 && z.shape(0) == n)))
    throw std::invalid_argument("pack_integer_gemm_rhs: the zero point must be B's type, a scalar or [N]");
  mx::array keep_zero = z;
  const uint8_t* zb = host_bytes(z, /*as_float32=*/false, keep_zero).data();
  for (int64_t j = 0; j < n; ++j)
    zeros[static_cast<size_t>(j)] = byte_value(zb[z.size() == 1 ? 0 : j], type == mx::int8) - shift;
  return zeros;
}

// PackIntegerQuads' layout from B^T [n, k] (row j: column j's k values): each quad of a column is 4
// consecutive bytes of its row, moved whole and XORed with `flip` in every byte.
void pack_quads_from_columns(const uint8_t* bt, int64_t k, int64_t n, uint8_t flip, int8_t* packed) {
  const int64_t quads = ceil_div(k, 4), panels = ceil_div(n, kIntPanelColumns);
  const uint32_t flip4 = 0x01010101u * flip;
  for (int64_t p = 0; p < panels; ++p) {
    auto* panel = reinterpret_cast<uint8_t*>(packed + p * quads * kIntQuadBytes);
    const int64_t col0 = p * kIntPanelColumns, cols = std::min(kIntPanelColumns, n - col0);
    if (cols < kIntPanelColumns) std::memset(panel, 0, static_cast<size_t>(quads * kIntQuadBytes));
    for (int64_t j = 0; j < cols; ++j) {
      const uint8_t* column = bt + (col0 + j) * k;
      for (int64_t q = 0; q < k / 4; ++q) {
        uint32_t word;
        std::memcpy(&word, column + 4 * q, 4);
        word ^= flip4;
        std::memcpy(panel + q * kIntQuadBytes + 4 * j, &word, 4);
      }
      if (k % 4 != 0) {  // the last quad's bytes past K are zero
        uint8_t* quad = panel + (k / 4) * kIntQuadBytes + 4 * j;
        for (int64_t r = 0; r < 4; ++r) quad[r] = 4 * (k / 4) + r < k ? column[4 * (k / 4) + r] ^ flip : 0;
      }
    }
  }
}

}  // namespace

namespace {

// B stored as its rows [K, N] or, when `columns`, as B^T [N, K] (a convolution's filters), read where it
// lies (often the model file): int8 values, or uint8 ones that XOR 0x80 turns into value - 128.
PackedIntegerRhs pack_rhs(const mx::array& stored, bool columns,
                          const std::optional<mx::array>& b_zero_point) {
  const int64_t k = stored.shape(columns ? 1 : 0), n = stored.shape(columns ? 0 : 1);
  const int32_t shift = stored.dtype() == mx::uint8 ? 128 : 0;
  const int64_t panels = ceil_div(n, kIntPanelColumns), quads = ceil_div(k, 4);
  const int64_t padded_n = panels * kIntPanelColumns;
  const std::vector<int32_t> zeros = column_zeros_of(b_zero_point, stored.dtype(), n, padded_n, shift);
  mx::array keep = stored;
  const uint8_t* v = host_bytes(stored, /*as_float32=*/false, keep).data();
  const uint8_t flip = shift != 0 ? 0x80 : 0;
  MlxBuffer packed(static_cast<size_t>(panels * quads * kIntQuadBytes), BufferLifetime::kPacked);
  if (columns) {
    pack_quads_from_columns(v, k, n, flip, packed.as<int8_t>());
  } else {
    HWY_DYNAMIC_DISPATCH(PackIntegerQuads)(v, k, n, flip, packed.as<int8_t>());
  }
  std::vector<int32_t> sums(static_cast<size_t>(padded_n), 0);  // over B's bytes in memory order
  if (columns) {
    for (int64_t j = 0; j < n; ++j) {
      int32_t sum = 0;  // a local: stores to sums could alias the bytes read
      for (int64_t kk = 0; kk < k; ++kk) sum += static_cast<int8_t>(v[j * k + kk] ^ flip);
      sums[static_cast<size_t>(j)] = sum;
    }
  } else {
    for (int64_t kk = 0; kk < k; ++kk) {
      const uint8_t* row = v + kk * n;
      for (int64_t j = 0; j < n; ++j) sums[static_cast<size_t>(j)] += static_cast<int8_t>(row[j] ^ flip);
    }
  }
  return {std::move(packed).into_array(
              {static_cast<int>(panels), static_cast<int>(quads), static_cast<int>(kIntQuadBytes)}, mx::int8),
          mx::array(sums.data(), {static_cast<int>(padded_n)}, mx::int32),
          mx::array(zeros.data(), {static_cast<int>(padded_n)}, mx::int32)};
}

bool is_byte_matrix(const mx::array& a) {
  return a.ndim() == 2 && (a.dtype() == mx::int8 || a.dtype() == mx::uint8);
}

}  // namespace

PackedIntegerRhs pack_integer_gemm_rhs(const mx::array& b, const std::optional<mx::array>& b_zero_point) {
  if (!is_byte_matrix(b))
    throw std::invalid_argument("pack_integer_gemm_rhs: B must be int8 or uint8 [K, N]");
  return pack_rhs(b, /*columns=*/false, b_zero_point);
}

PackedIntegerRhs pack_integer_gemm_rhs_columns(const mx::array& bt,
                                               const std::optional<mx::array>& b_zero_point) {
  if (!is_byte_matrix(bt))
    throw std::invalid_argument("pack_integer_gemm_rhs_columns: B^T must be int8 or uint8 [N, K]");
  return pack_rhs(bt, /*columns=*/true, b_zero_point);
}

mx::array integer_matmul(const mx::array& a, const PackedIntegerRhs& b, int64_t k, int64_t n,
                         const std::optional<mx::array>& a_zero_point, mx::StreamOrDevice s,
                         const std::optional<IntegerEpilogue>& epilogue) {
  const mx::Stream stream = mx::to_stream(s);
  const IntegerInputs kind{a_zero_point.has_value(), epilogue.has_value(), epilogue && epilogue->bias,
                           epilogue && epilogue->scale_factor};
  Reference reference = [k, n, kind, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{reference_matmul(in, k, n, kind, stream)};
  };
  std::vector<mx::array> inputs = {a, b.packed, b.column_sums, b.column_zeros};
  if (a_zero_point) inputs.push_back(*a_zero_point);
  if (epilogue) inputs.push_back(epilogue->scale);
  if (kind.has_bias) inputs.push_back(*epilogue->bias);
  if (kind.has_factor) inputs.push_back(*epilogue->scale_factor);
  auto float_columns = [n](const mx::array& v, bool may_be_scalar) {
    return v.dtype() == mx::float32 && ((may_be_scalar && v.size() == 1) || (v.ndim() == 1 && v.shape(0) == n));
  };
  const bool fits = is_cpu_stream(stream) && integer_gemm_available() && a.dtype() == mx::uint8 &&
                    a.ndim() >= 1 && a.shape(-1) == k && k % 4 == 0 && a.size() > 0 &&
                    (!a_zero_point || (a_zero_point->dtype() == mx::uint8 && a_zero_point->size() == 1)) &&
                    (!epilogue || float_columns(epilogue->scale, true)) &&
                    (!kind.has_bias || float_columns(*epilogue->bias, false)) &&
                    (!kind.has_factor || float_columns(*epilogue->scale_factor, true));
  if (!fits) return reference(inputs)[0];
  mx::Shape shape = a.shape();
  shape.back() = static_cast<int>(n);
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<IntegerMatmulKernel>(kernel_stream, reference, k, n, kind);
      },
      reference, inputs, {shape}, {epilogue ? mx::float32 : mx::int32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
