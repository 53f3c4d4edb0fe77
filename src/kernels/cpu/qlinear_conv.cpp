// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file) for the depthwise loop; group 1 runs on the integer GEMM.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/qlinear_conv.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/partial_vectors-inl.h"
#include "kernels/cpu/requantize_avx512-inl.h"

#include "kernels/cpu/conv_nhwc_args.h"

#ifndef TRANSMUTER_KERNELS_CPU_QLINEAR_DEPTHWISE_ARGS
#define TRANSMUTER_KERNELS_CPU_QLINEAR_DEPTHWISE_ARGS
namespace transmuter::kernels {
// One depthwise call (outside the per-target namespaces).
struct QLinearDepthwiseArgs {
  NhwcConvArgs geometry;  // its pointers unused
  const uint8_t* x;       // [N, in_h, in_w, C] bytes, int8 when x_signed
  bool x_signed;
  const int16_t* w;        // [kH, kW, C]: w - w_zero
  const int32_t* offsets;  // [C]: bias - x_zero * (the sum of the channel's weights), per call
  const float* multiplier;
  bool multiplier_per_channel;
  const int32_t* bias;  // [C] or null
  uint8_t* y;           // [N, out_h, out_w, C] bytes, int8 when y_signed
  int32_t x_zero, y_zero, y_min, y_max;
  bool y_signed;
  int64_t interior_lo, interior_hi;  // output columns whose every tap reads inside the row
};
}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
using DI = hn::Rebind<int32_t, D>;
using DU8 = hn::Rebind<uint8_t, D>;
using DI8 = hn::Rebind<int8_t, D>;

// kCols output columns ox0.. of one output row, the channel vector at c0 (its first `valid` lanes; all
// of them when kFull): the sum of every tap's x times its weight (w - w_zero), less x_zero times the sum of
// the weights of the taps inside the image, in float32 (exact: integers of at most kExactIntegerTerms
// products of 8-bit values), then requantized to bytes. kChecked: some taps fall outside the row (the
// border columns, one at a time: kCols is 1 there, so one weight sum serves). kSigned: x is int8.
template <bool kSigned, int kCols, bool kChecked, bool kFull>
HWY_INLINE void QDepthwiseColumns(const QLinearDepthwiseArgs& a, const uint8_t* const* rows, uint8_t* out_row,
                                  int64_t ox0, int64_t c0, size_t valid) {
  static_assert(!kChecked || kCols == 1, "border columns go one at a time");
  const D d;
  const DI di;
  const DU8 du8;
  const NhwcConvArgs& g = a.geometry;
  const int64_t C = g.channels;
  auto load_x = [&](const uint8_t* p) {
    if constexpr (kSigned) {
      const DI8 di8;
      const auto* q = reinterpret_cast<const int8_t*>(p);
      return hn::ConvertTo(d, hn::PromoteTo(di, kFull ? hn::LoadU(di8, q) : LoadFirst(di8, q, valid)));
    } else {
      return hn::ConvertTo(d, hn::PromoteTo(di, kFull ? hn::LoadU(du8, p) : LoadFirst(du8, p, valid)));
    }
  };
  auto load_w = [&](const int16_t* p) {
    const hn::Rebind<int16_t, D> di16;
    return hn::ConvertTo(d, hn::PromoteTo(di, kFull ? hn::LoadU(di16, p) : LoadFirst(di16, p, valid)));
  };
  V acc[kCols];
  for (int j = 0; j < kCols; ++j) acc[j] = hn::Zero(d);
  V weight_sum = hn::Zero(d);
  const int64_t column_step = g.stride_w * C;
  for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
    if (rows[ky] == nullptr) continue;  // in the padding: x_zero - x_zero adds nothing
    const uint8_t* row = rows[ky] + c0;
    const int16_t* w = a.w + ky * g.kernel_w * C + c0;
    for (int64_t kx = 0; kx < g.kernel_w; ++kx, w += C) {
      const V wv = load_w(w);
      const int64_t ix0 = g.input_col(ox0) + kx * g.dilation_w;
      if constexpr (kChecked) {
        if (ix0 >= 0 && ix0 < g.in_w) {
          acc[0] = hn::MulAdd(wv, load_x(row + ix0 * C), acc[0]);
          weight_sum = hn::Add(weight_sum, wv);
        }
      } else {
        const uint8_t* in = row + ix0 * C;
        for (int j = 0; j < kCols; ++j) acc[j] = hn::MulAdd(wv, load_x(in + j * column_step), acc[j]);
        weight_sum = hn::Add(weight_sum, wv);
      }
    }
  }
  const V zero_term = hn::Mul(weight_sum, hn::Set(d, static_cast<float>(a.x_zero)));
  for (int j = 0; j < kCols; ++j) acc[j] = hn::Sub(acc[j], zero_term);
  auto channel_values = [&](const auto* p, auto tag) {
    return kFull ? hn::LoadU(tag, p) : LoadFirst(tag, p, valid);
  };
  const V multiplier =
      a.multiplier_per_channel ? channel_values(a.multiplier + c0, d) : hn::Set(d, a.multiplier[0]);
  const auto bias = a.bias != nullptr ? channel_values(a.bias + c0, di) : hn::Zero(di);
#if HWY_TARGET <= HWY_AVX3
  static_assert(sizeof(hn::TFromD<D>) * hn::MaxLanes(D()) == 64, "16 float lanes");
  const RequantizeBounds bounds(a.y_min, a.y_max, a.y_zero);
  const __mmask16 mask = static_cast<__mmask16>(kFull ? 0xFFFFu : (1u << valid) - 1);
  for (int j = 0; j < kCols; ++j) {
    const __m512i sum = _mm512_add_epi32(_mm512_cvttps_epi32(acc[j].raw), bias.raw);
    const __m128i bytes = RequantizedBytes(sum, multiplier.raw, bounds);
    uint8_t* out = out_row + (ox0 + j) * C + c0;
    if constexpr (kFull) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bytes);
    } else {
      _mm_mask_storeu_epi8(out, mask, bytes);
    }
  }
#else
  const auto y_zero = hn::Set(di, a.y_zero), y_min = hn::Set(di, a.y_min), y_max = hn::Set(di, a.y_max);
  for (int j = 0; j < kCols; ++j) {
    // The sum as int32 (exact) plus the bias, then as ONNX Runtime requantizes: float, scaled, rounded
    // half to even, shifted by the zero point, saturated.
    const auto sum = hn::Add(hn::ConvertTo(di, acc[j]), bias);
    const auto q = hn::Min(
        hn::Max(hn::Add(hn::NearestInt(hn::Mul(hn::ConvertTo(d, sum), multiplier)), y_zero), y_min), y_max);
    uint8_t* out = out_row + (ox0 + j) * C + c0;
    if (a.y_signed) {
      const DI8 di8;
      StoreFirst(hn::DemoteTo(di8, q), di8, reinterpret_cast<int8_t*>(out), valid);
    } else {
      StoreFirst(hn::DemoteTo(du8, q), du8, out, valid);
    }
  }
#endif
}

#if HWY_TARGET == HWY_AVX3_DL
// acc + x * w per int32 lane, on words (vpdpwssd): x's low word the value, w's high word zero, so x's high
// word (a sign extension) adds nothing. Inline assembly, as integer_gemm.cpp's DotBytes.
HWY_INLINE __m512i DotWords(__m512i acc, __m512i x, __m512i w) {
  asm("vpdpwssd %[w], %[x], %[acc]" : [acc] "+v"(acc) : [x] "v"(x), [w] "v"(w));
  return acc;
}

// The channel vector at c0 of one call's VNNI depthwise (its first `valid` lanes; all of them when kFull):
// loads that widen bytes and int16 weights to int32 lanes, the sums' starting offsets, and the requantizing
// epilogue (RequantizedBytes).
template <bool kSigned, bool kFull>
struct VnniChannels {
  const QLinearDepthwiseArgs& a;
  int64_t c0;
  __mmask16 mask;

  VnniChannels(const QLinearDepthwiseArgs& args, int64_t first, size_t valid)
      : a(args), c0(first), mask(static_cast<__mmask16>(kFull ? 0xFFFFu : (1u << valid) - 1)) {}

  HWY_INLINE __m512i x(const uint8_t* p) const {
    const __m128i bytes =
        kFull ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)) : _mm_maskz_loadu_epi8(mask, p);
    return kSigned ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes);
  }
  HWY_INLINE __m512i w(const int16_t* p) const {  // zero-extended: the high words stay zero
    const __m256i words =
        kFull ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(mask, p);
    return _mm512_cvtepu16_epi32(words);
  }
  HWY_INLINE __m512i offset() const {
    return kFull ? _mm512_loadu_si512(a.offsets + c0) : _mm512_maskz_loadu_epi32(mask, a.offsets + c0);
  }
  template <int kCols>
  HWY_INLINE void Store(const __m512i (&acc)[kCols], uint8_t* out_row, int64_t ox0) const {
    const int64_t C = a.geometry.channels;
    const __m512 multiplier =
        !a.multiplier_per_channel
            ? _mm512_set1_ps(a.multiplier[0])
            : (kFull ? _mm512_loadu_ps(a.multiplier + c0) : _mm512_maskz_loadu_ps(mask, a.multiplier + c0));
    const RequantizeBounds bounds(a.y_min, a.y_max, a.y_zero);
    uint8_t* out = out_row + ox0 * C + c0;
    for (int j = 0; j < kCols; ++j, out += C) {
      const __m128i bytes = RequantizedBytes(acc[j], multiplier, bounds);
      if constexpr (kFull) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bytes);
      } else {
        _mm_mask_storeu_epi8(out, mask, bytes);
      }
    }
  }
};

// QDepthwiseColumns in int32 on VNNI: each tap's 16 bytes widened to int32 lanes (one load-extend) and
// multiplied-added with the tap's weights (one vpdpwssd), where the float path converts and fuses (three).
// The sums start from the channel's offset (bias - x_zero * the weights' sum), and a tap in the padding
// multiplies x_zero, so every output subtracts the same x_zero term.
template <bool kSigned, int kCols, bool kChecked, bool kFull>
HWY_INLINE void QDepthwiseColumnsVnni(const QLinearDepthwiseArgs& a, const uint8_t* const* rows,
                                      uint8_t* out_row, int64_t ox0, int64_t c0, size_t valid) {
  static_assert(!kChecked || kCols == 1, "border columns go one at a time");
  const NhwcConvArgs& g = a.geometry;
  const int64_t C = g.channels;
  const VnniChannels<kSigned, kFull> v(a, c0, valid);
  const __m512i x_zero = _mm512_set1_epi32(a.x_zero);
  __m512i acc[kCols];
  for (int j = 0; j < kCols; ++j) acc[j] = v.offset();
  const int64_t column_step = g.stride_w * C;
  for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
    const uint8_t* row = rows[ky] != nullptr ? rows[ky] + c0 : nullptr;
    const int16_t* w = a.w + ky * g.kernel_w * C + c0;
    for (int64_t kx = 0; kx < g.kernel_w; ++kx, w += C) {
      const __m512i wv = v.w(w);
      const int64_t ix0 = g.input_col(ox0) + kx * g.dilation_w;
      if (row == nullptr) {  // a padding row: x_zero under every column
        for (int j = 0; j < kCols; ++j) acc[j] = DotWords(acc[j], x_zero, wv);
      } else if constexpr (kChecked) {
        acc[0] = DotWords(acc[0], ix0 >= 0 && ix0 < g.in_w ? v.x(row + ix0 * C) : x_zero, wv);
      } else {
        const uint8_t* in = row + ix0 * C;
        for (int j = 0; j < kCols; ++j) acc[j] = DotWords(acc[j], v.x(in + j * column_step), wv);
      }
    }
  }
  v.template Store<kCols>(acc, out_row, ox0);
}

// kCols interior output columns of a kKernelW-wide kernel at stride kStride (dilation 1): each input column
// under them widened once and multiplied into every output whose window holds it (three at stride 1), where
// QDepthwiseColumnsVnni widens it once per tap.
template <bool kSigned, int kKernelW, int kStride, bool kFull>
HWY_INLINE void QDepthwiseSharedColumns(const QLinearDepthwiseArgs& a, const uint8_t* const* rows,
                                        uint8_t* out_row, int64_t ox0, int64_t c0, size_t valid) {
  constexpr int kCols = 8, kInputs = (kCols - 1) * kStride + kKernelW;
  const NhwcConvArgs& g = a.geometry;
  const int64_t C = g.channels;
  const VnniChannels<kSigned, kFull> v(a, c0, valid);
  __m512i acc[kCols];
  for (int j = 0; j < kCols; ++j) acc[j] = v.offset();
  for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
    const int16_t* w_row = a.w + ky * kKernelW * C + c0;
    __m512i w[kKernelW];
    for (int kx = 0; kx < kKernelW; ++kx) w[kx] = v.w(w_row + kx * C);
    if (rows[ky] == nullptr) {  // a padding row: x_zero under every column
      const __m512i x_zero = _mm512_set1_epi32(a.x_zero);
      for (int kx = 0; kx < kKernelW; ++kx) {
        for (int j = 0; j < kCols; ++j) acc[j] = DotWords(acc[j], x_zero, w[kx]);
      }
      continue;
    }
    const uint8_t* in = rows[ky] + g.input_col(ox0) * C + c0;
#pragma GCC unroll 32
    for (int i = 0; i < kInputs; ++i) {
      const __m512i x = v.x(in + i * C);
#pragma GCC unroll 8
      for (int j = 0; j < kCols; ++j) {
        const int kx = i - j * kStride;
        if (kx >= 0 && kx < kKernelW) acc[j] = DotWords(acc[j], x, w[kx]);
      }
    }
  }
  v.template Store<kCols>(acc, out_row, ox0);
}
#endif

// columns(full, c0, valid) over the channel vectors: std::true_type for each whole vector, then
// std::false_type for the tail's `valid` channels, if any.
template <class Columns>
HWY_INLINE void ForEachChannelVector(int64_t channels, const Columns& columns) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(D()));
  int64_t c0 = 0;
  for (; c0 + lanes <= channels; c0 += lanes) columns(std::true_type{}, c0, static_cast<size_t>(lanes));
  if (c0 < channels) columns(std::false_type{}, c0, static_cast<size_t>(channels - c0));
}

template <bool kSigned, int kCols, bool kChecked>
HWY_INLINE void QDepthwiseAllChannels(const QLinearDepthwiseArgs& a, const uint8_t* const* rows,
                                      uint8_t* out_row, int64_t ox0) {
  ForEachChannelVector(a.geometry.channels, [&](auto full, int64_t c0, size_t valid) {
#if HWY_TARGET == HWY_AVX3_DL
    QDepthwiseColumnsVnni<kSigned, kCols, kChecked, decltype(full)::value>(a, rows, out_row, ox0, c0, valid);
#else
    QDepthwiseColumns<kSigned, kCols, kChecked, decltype(full)::value>(a, rows, out_row, ox0, c0, valid);
#endif
  });
}

#if HWY_TARGET == HWY_AVX3_DL
template <bool kSigned, int kKernelW, int kStride>
HWY_INLINE void QDepthwiseSharedAllChannels(const QLinearDepthwiseArgs& a, const uint8_t* const* rows,
                                            uint8_t* out_row, int64_t ox0) {
  ForEachChannelVector(a.geometry.channels, [&](auto full, int64_t c0, size_t valid) {
    QDepthwiseSharedColumns<kSigned, kKernelW, kStride, decltype(full)::value>(a, rows, out_row, ox0, c0,
                                                                               valid);
  });
}
#endif

// One output row from the input rows under its taps (rows[ky], null in the padding): interior columns
// eight at a time (eight independent multiply-add chains), the border columns with their taps checked.
template <bool kSigned>
HWY_INLINE void QLinearDepthwiseRowOf(const QLinearDepthwiseArgs& a, const uint8_t* const* rows,
                                      uint8_t* out_row) {
  const int64_t lo = a.interior_lo, hi = a.interior_hi, out_w = a.geometry.out_w;
  for (int64_t ox = 0; ox < lo; ++ox) QDepthwiseAllChannels<kSigned, 1, true>(a, rows, out_row, ox);
  int64_t ox = lo;
#if HWY_TARGET == HWY_AVX3_DL
  const NhwcConvArgs& g = a.geometry;
  if (g.dilation_w == 1 && (g.kernel_w == 3 || g.kernel_w == 5) && (g.stride_w == 1 || g.stride_w == 2)) {
    const int shape = static_cast<int>(g.kernel_w * 10 + g.stride_w);
    for (; ox + 8 <= hi; ox += 8) {
      switch (shape) {
        case 31:
          QDepthwiseSharedAllChannels<kSigned, 3, 1>(a, rows, out_row, ox);
          break;
        case 32:
          QDepthwiseSharedAllChannels<kSigned, 3, 2>(a, rows, out_row, ox);
          break;
        case 51:
          QDepthwiseSharedAllChannels<kSigned, 5, 1>(a, rows, out_row, ox);
          break;
        default:
          QDepthwiseSharedAllChannels<kSigned, 5, 2>(a, rows, out_row, ox);
          break;
      }
    }
  }
#endif
  for (; ox + 8 <= hi; ox += 8) QDepthwiseAllChannels<kSigned, 8, false>(a, rows, out_row, ox);
  for (; ox + 4 <= hi; ox += 4) QDepthwiseAllChannels<kSigned, 4, false>(a, rows, out_row, ox);
  for (; ox < hi; ++ox) QDepthwiseAllChannels<kSigned, 1, false>(a, rows, out_row, ox);
  for (ox = std::max(hi, lo); ox < out_w; ++ox) QDepthwiseAllChannels<kSigned, 1, true>(a, rows, out_row, ox);
}

void QLinearDepthwiseRow(const QLinearDepthwiseArgs& a, const uint8_t* const* rows, uint8_t* out_row) {
  if (a.x_signed) {
    QLinearDepthwiseRowOf<true>(a, rows, out_row);
  } else {
    QLinearDepthwiseRowOf<false>(a, rows, out_row);
  }
}

// dst [count, channels] from `channels` planes of `count` bytes, plane_stride apart (1 to 4 channels: an
// NCHW stem input's row of pixels into NHWC), a vector of pixels per interleaved store.
void InterleavePlanes(const uint8_t* src, int64_t plane_stride, int64_t count, int64_t channels,
                      uint8_t* dst) {
  const hn::ScalableTag<uint8_t> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d8));
  const uint8_t* p0 = src;
  const uint8_t* p1 = src + plane_stride;
  const uint8_t* p2 = src + 2 * plane_stride;
  const uint8_t* p3 = src + 3 * plane_stride;
  int64_t i = 0;
  if (channels == 1) {
    std::memcpy(dst, src, static_cast<size_t>(count));
    return;
  }
  for (; i + lanes <= count; i += lanes) {
    if (channels == 2) {
      hn::StoreInterleaved2(hn::LoadU(d8, p0 + i), hn::LoadU(d8, p1 + i), d8, dst + 2 * i);
    } else if (channels == 3) {
      hn::StoreInterleaved3(hn::LoadU(d8, p0 + i), hn::LoadU(d8, p1 + i), hn::LoadU(d8, p2 + i), d8,
                            dst + 3 * i);
    } else {
      hn::StoreInterleaved4(hn::LoadU(d8, p0 + i), hn::LoadU(d8, p1 + i), hn::LoadU(d8, p2 + i),
                            hn::LoadU(d8, p3 + i), d8, dst + 4 * i);
    }
  }
  for (; i < count; ++i) {
    for (int64_t c = 0; c < channels; ++c) dst[i * channels + c] = src[c * plane_stride + i];
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/qlinear_conv.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/integer_gemm_args.h"
#include "kernels/cpu/thread_pool.h"
#include "mlx_bridge/buffers.h"

namespace transmuter::kernels {

HWY_EXPORT(QLinearDepthwiseRow);
HWY_EXPORT(InterleavePlanes);

namespace {

int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

// Output columns whose every tap reads inside the input row: [lo, hi), empty when none does.
void interior_columns(const NhwcConvArgs& g, int64_t& lo, int64_t& hi) {
  lo = g.pad_left <= 0 ? 0 : (g.pad_left + g.stride_w - 1) / g.stride_w;
  const int64_t last_tap = (g.kernel_w - 1) * g.dilation_w - g.pad_left;  // ix = ox * sW + last_tap
  const int64_t room = g.in_w - last_tap;
  hi = room <= 0 ? 0 : std::min(g.out_w, (room + g.stride_w - 1) / g.stride_w);
  if (hi <= lo) lo = hi = 0;
}

// The output bytes' type and range from y_zero_point.
struct OutputRange {
  int32_t min, max;
  bool is_signed;
};

OutputRange output_range(mx::Dtype y_type) {
  return y_type == mx::int8 ? OutputRange{-128, 127, true} : OutputRange{0, 255, false};
}

// ---- group 1 ----

// One call's operands for the integer GEMM; the rows (a, lda, m) are set per use.
IntegerGemmArgs product_args(const std::vector<mx::array>& in, uint8_t* y, int64_t k, int64_t m,
                             bool has_bias, mx::Dtype y_type) {
  IntegerGemmArgs g{};
  g.packed = in[2].data<int8_t>();
  g.column_sums = in[3].data<int32_t>();
  g.column_zeros = in[4].data<int32_t>();
  g.k = k;
  g.n = m;
  g.y_quant = y;
  g.scale = in[5].data<float>();
  g.scale_per_column = in[5].size() > 1;
  g.bias_int = has_bias ? in[7].data<int32_t>() : nullptr;
  const OutputRange range = output_range(y_type);
  g.y_min = range.min;
  g.y_max = range.max;
  g.y_signed = range.is_signed;
  return g;
}


// Copies n bytes. A stem's window rows are a few bytes each (3x3 over RGB: 9), where a libc call per copy
// costs more than the copy; fixed-size copies compile to register moves.
inline void copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n) {
  if (n >= 64) {
    std::memcpy(dst, src, static_cast<size_t>(n));
    return;
  }
  for (; n >= 8; n -= 8, dst += 8, src += 8) std::memcpy(dst, src, 8);
  for (; n > 0; --n) *dst++ = *src++;
}

inline void fill_bytes(uint8_t* dst, uint8_t value, int64_t n) {
  if (n >= 64) {
    std::memset(dst, value, static_cast<size_t>(n));
    return;
  }
  for (; n > 0; --n) *dst++ = value;
}

// Bytes an unfolded buffer holds beyond its last row (see unfold_position).
constexpr int64_t kUnfoldSlack = 16;

// Row of the unfolded input for output position (n, oy, ox): the window under it, tap-major, x_zero where
// a tap falls in the padding, zeros from the window's end to lda. With dilation 1 the taps of one kernel
// row inside the image are one copy.
void unfold_position(const NhwcConvArgs& a, const uint8_t* x, uint8_t x_zero, int64_t lda, int64_t n,
                     int64_t oy, int64_t ox, uint8_t* dst) {
  const int64_t C = a.channels, ix0 = a.input_col(ox);
  // Kernel columns [kx_first, kx_last) read inside the row.
  int64_t kx_first = 0, kx_last = a.kernel_w;
  while (kx_first < a.kernel_w && ix0 + kx_first * a.dilation_w < 0) ++kx_first;
  while (kx_last > kx_first && ix0 + (kx_last - 1) * a.dilation_w >= a.in_w) --kx_last;
  const int64_t row_bytes = a.kernel_w * C;
  // A window row of at most 16 bytes wholly inside the image (a stem's 3 x 3 over RGB: 9) is one 16-byte
  // copy; the bytes past it land where the next row, the tail or the next position's row is written
  // after (the buffer has kUnfoldSlack bytes beyond its last row), and it must not read past the input.
  const bool whole_rows =
      a.dilation_w == 1 && row_bytes <= kUnfoldSlack && kx_first == 0 && kx_last == a.kernel_w;
  const uint8_t* x_end = x + a.batch * a.in_h * a.in_w * C;
  uint8_t* out = dst;
  for (int64_t ky = 0; ky < a.kernel_h; ++ky, out += row_bytes) {
    const int64_t iy = a.input_row(oy) + ky * a.dilation_h;
    if (iy < 0 || iy >= a.in_h || kx_first >= kx_last) {
      fill_bytes(out, x_zero, row_bytes);
      continue;
    }
    const uint8_t* row = x + (n * a.in_h + iy) * a.in_w * C;
    if (whole_rows && row + ix0 * C + kUnfoldSlack <= x_end) {
      std::memcpy(out, row + ix0 * C, kUnfoldSlack);
      continue;
    }
    fill_bytes(out, x_zero, kx_first * C);
    fill_bytes(out + kx_last * C, x_zero, row_bytes - kx_last * C);
    if (a.dilation_w == 1) {
      copy_bytes(out + kx_first * C, row + (ix0 + kx_first) * C, (kx_last - kx_first) * C);
    } else {
      for (int64_t kx = kx_first; kx < kx_last; ++kx)
        copy_bytes(out + kx * C, row + (ix0 + kx * a.dilation_w) * C, C);
    }
  }
  fill_bytes(out, 0, lda - (out - dst));
}

// Unfolded rows per task: about 64 KiB (in L1/L2 while the product reads them), whole tiles, at least four
// tasks a thread.
int64_t unfold_task_rows(int64_t positions, int64_t lda) {
  int64_t rows = std::min<int64_t>((int64_t{64} << 10) / lda,
                                   (positions + 4 * kernel_threads() - 1) / (4 * kernel_threads()));
  return std::max(kIntTileRows, round_up(rows, kIntTileRows));
}

// An NCHW input over at most 4 channels in NHWC: interleaved a row of pixels at a time, then unfolded
// with whole-window-row copies (a byte-by-byte unfold through NCHW's strides cost 4x the product).
void run_qlinear_conv(const NhwcConvArgs& a, const uint8_t* x, uint8_t x_zero, bool x_signed,
                      IntegerGemmArgs g);

void run_qlinear_conv_channels_first(const NhwcConvArgs& a, const uint8_t* x, uint8_t x_zero, bool x_signed,
                                     const IntegerGemmArgs& g) {
  const int64_t rows = a.batch * a.in_h, plane = a.in_h * a.in_w;
  thread_local std::vector<uint8_t> nhwc;  // the calling thread's, kept between calls: no fresh pages a run
  nhwc.resize(static_cast<size_t>(rows * a.in_w * a.channels));
  // By pointer: in the pool's threads the name `nhwc` would be their own (empty) thread_local.
  uint8_t* staging = nhwc.data();
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, a.in_w * a.channels)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   const int64_t n = r / a.in_h, y = r % a.in_h;
                   HWY_DYNAMIC_DISPATCH(InterleavePlanes)(x + n * a.channels * plane + y * a.in_w, plane,
                                                          a.in_w, a.channels,
                                                          staging + r * a.in_w * a.channels);
                 }
               });
  NhwcConvArgs channels_last = a;
  channels_last.channels_first = false;
  run_qlinear_conv(channels_last, staging, x_zero, x_signed, g);
}

// x_zero: the zero point's byte (two's complement when x_signed). VNNI multiplies unsigned bytes of A: int8
// activations are unfolded with their sign bits flipped (x + 128 as uint8) and the zero point moved by 128,
// the same differences x - x_zero.
void run_qlinear_conv(const NhwcConvArgs& a, const uint8_t* x, uint8_t x_zero, bool x_signed,
                      IntegerGemmArgs g) {
  if (a.channels_first) {
    run_qlinear_conv_channels_first(a, x, x_zero, x_signed, g);
    return;
  }
  g.a_zero = x_signed ? static_cast<int8_t>(x_zero) + 128 : x_zero;
  const int64_t positions = a.positions();
  if (a.pointwise() && a.channels % 4 == 0 &&
      !x_signed) {  // the image's rows are the product's left-hand side
    g.a = x;
    g.lda = a.channels;
    g.m = positions;
    run_integer_gemm(g);
    return;
  }
  set_zero_free_columns(g);
  RequantizeColumns columns;
  set_requantize_columns(g, columns);
  const int64_t lda = round_up(a.window(), 4);
  const int64_t rows = unfold_task_rows(positions, lda);
  uint8_t* y = g.y_quant;
  parallel_for((positions + rows - 1) / rows, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint8_t> unfolded;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t * rows, count = std::min(rows, positions - first);
      unfolded.resize(static_cast<size_t>(count * lda + kUnfoldSlack));
      a.for_each_position(first, count, [&](int64_t n, int64_t oy, int64_t ox, int64_t r) {
        unfold_position(a, x, x_zero, lda, n, oy, ox, unfolded.data() + r * lda);
      });
      if (x_signed) {  // the tails' zeros flip too: B is zero there, and the row sums stop at K
        for (uint8_t& byte : unfolded) byte ^= 0x80;
      }
      IntegerGemmArgs task = g;
      task.a = unfolded.data();
      task.lda = lda;
      task.m = count;
      task.y_quant = y + first * g.n;
      if (g.add_other != nullptr) task.add_other = g.add_other + first * g.n;
      integer_gemm_rows_on_this_thread(task, 0, count);
    }
  });
}

// ---- depthwise ----

void run_qlinear_depthwise(QLinearDepthwiseArgs a) {
  const NhwcConvArgs& g = a.geometry;
  interior_columns(g, a.interior_lo, a.interior_hi);
  // bias - x_zero * sum of the weights, per channel: the integer kernel's sums start there and read x_zero
  // for the taps in the padding.
  std::vector<int32_t> offsets(static_cast<size_t>(g.channels));
  for (int64_t c = 0; c < g.channels; ++c) offsets[c] = a.bias != nullptr ? a.bias[c] : 0;
  const int64_t taps = g.kernel_h * g.kernel_w;
  for (int64_t t = 0; t < taps; ++t) {
    for (int64_t c = 0; c < g.channels; ++c) offsets[c] -= a.x_zero * a.w[t * g.channels + c];
  }
  a.offsets = offsets.data();
  const int64_t rows = g.batch * g.out_h;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.out_w * g.channels));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<const uint8_t*> input_rows(static_cast<size_t>(g.kernel_h));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.out_h, oy = r % g.out_h;
      for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
        const int64_t iy = g.input_row(oy) + ky * g.dilation_h;
        input_rows[ky] = iy >= 0 && iy < g.in_h ? a.x + ((n * g.in_h + iy) * g.in_w) * g.channels : nullptr;
      }
      HWY_DYNAMIC_DISPATCH(QLinearDepthwiseRow)(a, input_rows.data(), a.y + r * g.out_w * g.channels);
    }
  });
}

// ---- the kernel ----

// What a group-1 kernel adds to its output (QLinearAddAfter less the operands).
struct AddAfter {
  QLinearAddRatios ratios;
  bool conv_first;
  bool operator==(const AddAfter&) const = default;
};

// Inputs: x, x_zero, then group 1: packed, column sums, column zeros; depthwise: w; then multiplier,
// y_zero, [bias], [the add's other operand].
class QLinearConvKernel : public CpuKernel {
 public:
  QLinearConvKernel(mx::Stream stream, Reference reference, NhwcConvOptions options, bool depthwise,
                    bool has_bias, std::optional<AddAfter> add = std::nullopt)
      : CpuKernel(stream, std::move(reference)),
        options_(options),
        depthwise_(depthwise),
        has_bias_(has_bias),
        add_(add) {}
  const char* name() const override {
    return depthwise_ ? "transmuter::QLinearDepthwiseConvNhwc" : "transmuter::QLinearConvNhwc";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const QLinearConvKernel*>(&other);
    return o != nullptr && o->options_ == options_ && o->depthwise_ == depthwise_ &&
           o->has_bias_ == has_bias_ && o->add_ == add_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array& x = in[0];
    const mx::array& y = out[0];
    NhwcConvArgs geometry = nhwc_conv_args_of(options_, x, y);
    const uint8_t* x_data = x.data<uint8_t>();
    const bool x_signed = x.dtype() == mx::int8;
    // Zero points are read in the task: inputs are computed by then, not when it is made.
    const uint8_t* x_zero = in[1].data<uint8_t>();
    auto* y_data = static_cast<uint8_t*>(static_cast<void*>(out[0].data<uint8_t>()));
    const OutputRange range = output_range(y.dtype());
    if (!depthwise_) {
      const uint8_t* y_zero = in[6].data<uint8_t>();
      IntegerGemmArgs g =
          product_args(in, y_data, geometry.window(), geometry.out_channels, has_bias_, y.dtype());
      if (add_) {
        g.add_other = in.back().data<uint8_t>();
        g.add_a = add_->ratios.a;
        g.add_b = add_->ratios.b;
        g.add_fixed = add_->ratios.fixed;
        g.add_product_first = add_->conv_first;
      }
      return [geometry, x_data, x_zero, x_signed, y_zero, g, range]() mutable {
        g.y_zero = range.is_signed ? static_cast<int8_t>(*y_zero) : *y_zero;
        run_qlinear_conv(geometry, x_data, *x_zero, x_signed, g);
      };
    }
    QLinearDepthwiseArgs a{};
    a.geometry = geometry;
    a.x = x_data;
    a.x_signed = x_signed;
    a.w = in[2].data<int16_t>();
    a.multiplier = in[3].data<float>();
    a.multiplier_per_channel = in[3].size() > 1;
    const uint8_t* y_zero = in[4].data<uint8_t>();
    a.bias = has_bias_ ? in[5].data<int32_t>() : nullptr;
    a.y = y_data;
    a.y_min = range.min;
    a.y_max = range.max;
    a.y_signed = range.is_signed;
    return [a, x_zero, y_zero]() mutable {
      a.x_zero = a.x_signed ? static_cast<int8_t>(*x_zero) : *x_zero;
      a.y_zero = a.y_signed ? static_cast<int8_t>(*y_zero) : *y_zero;
      run_qlinear_depthwise(a);
    };
  }

 private:
  NhwcConvOptions options_;
  bool depthwise_, has_bias_;
  std::optional<AddAfter> add_;
};

// ---- the reference: the same integers through exact MLX and integer_matmul paths ----

// The unfolded input [N * oH * oW, kH * kW * C] (tap-major rows, x_zero in the padding), uint8.
mx::array unfold_reference(const mx::array& x, const mx::array& x_zero, const NhwcConvOptions& o,
                           const mx::Shape& y, mx::Stream s) {
  mx::array padded =
      mx::pad(x, {{0, 0}, {o.pads_begin[0], o.pads_end[0]}, {o.pads_begin[1], o.pads_end[1]}, {0, 0}},
              mx::reshape(x_zero, {}, s), "constant", s);
  const int n = x.shape(0), c = x.shape(3), oh = y[1], ow = y[2];
  std::vector<mx::array> taps;
  for (int ky = 0; ky < o.kernel[0]; ++ky) {
    for (int kx = 0; kx < o.kernel[1]; ++kx) {
      const int y0 = ky * o.dilations[0], x0 = kx * o.dilations[1];
      taps.push_back(mx::slice(padded, {0, y0, x0, 0},
                               {n, y0 + (oh - 1) * o.strides[0] + 1, x0 + (ow - 1) * o.strides[1] + 1, c},
                               {1, o.strides[0], o.strides[1], 1}, s));
    }
  }
  const int taps_count = static_cast<int>(taps.size());
  return mx::reshape(mx::stack(taps, 3, s), {n * oh * ow, taps_count * c}, s);
}

// saturate(round_half_even(float(acc + bias) * multiplier) + y_zero) as y_zero's type; acc int32 [..., M].
mx::array requantize_reference(mx::array acc, const mx::array& multiplier,
                               const std::optional<mx::array>& bias, const mx::array& y_zero, mx::Stream s) {
  if (bias) acc = mx::add(acc, *bias, s);
  mx::array scaled =
      mx::round(mx::multiply(mx::astype(acc, mx::float32, s), mx::reshape(multiplier, {-1}, s), s), s);
  const OutputRange range = output_range(y_zero.dtype());
  mx::array q = mx::add(scaled, mx::astype(mx::reshape(y_zero, {}, s), mx::float32, s), s);
  q = mx::clip(q, mx::array(static_cast<float>(range.min)), mx::array(static_cast<float>(range.max)), s);
  return mx::astype(q, y_zero.dtype(), s);
}

void check_common(const mx::array& x, const mx::array& x_zero, const QLinearRequantize& r, int64_t m,
                  const NhwcConvOptions& o) {
  check_conv_options(o);
  if (o.activation != ConvActivation::kNone) throw std::invalid_argument("QLinearConv takes no activation");
  if ((x.dtype() != mx::uint8 && x.dtype() != mx::int8) || x.ndim() != 4) {
    throw std::invalid_argument(o.channels_first_input ? "QLinearConv input must be 8-bit [N, C, H, W]"
                                                       : "QLinearConv input must be 8-bit [N, H, W, C]");
  }
  if (x_zero.dtype() != x.dtype() || x_zero.size() != 1)
    throw std::invalid_argument("QLinearConv x_zero_point must be one value of x's type");
  if ((r.y_zero_point.dtype() != mx::uint8 && r.y_zero_point.dtype() != mx::int8) ||
      r.y_zero_point.size() != 1)
    throw std::invalid_argument("QLinearConv y_zero_point must be one uint8 or int8 value");
  if (r.multiplier.dtype() != mx::float32 ||
      (r.multiplier.size() != 1 && !(r.multiplier.ndim() == 1 && r.multiplier.shape(0) == m)))
    throw std::invalid_argument("QLinearConv multiplier must be float32, one value or [" + std::to_string(m) +
                                "]");
  if (r.bias && (r.bias->dtype() != mx::int32 || r.bias->ndim() != 1 || r.bias->shape(0) != m))
    throw std::invalid_argument("QLinearConv bias must be int32 [" + std::to_string(m) + "]");
}

mx::array run_kernel(std::vector<mx::array> inputs, const Reference& reference, const mx::Shape& shape,
                     mx::Dtype y_type, const NhwcConvOptions& o, bool depthwise, bool has_bias,
                     mx::Stream stream, std::optional<AddAfter> add = std::nullopt) {
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<QLinearConvKernel>(kernel_stream, reference, o, depthwise, has_bias, add);
      },
      reference, std::move(inputs), {shape}, {y_type}, stream)[0];
}

}  // namespace

mx::array qlinear_conv_weight_rows(const mx::array& w) {
  if (w.ndim() != 4 || (w.dtype() != mx::int8 && w.dtype() != mx::uint8))
    throw std::invalid_argument("QLinearConv weight must be 8-bit [M, C, kH, kW]");
  // On the host, not as MLX ops: each evaluation at load is a round trip to the stream's thread, and an
  // int8 CNN has one weight per convolution.
  const int64_t m = w.shape(0), c = w.shape(1), taps = int64_t{w.shape(2)} * w.shape(3);
  mx::array keep = w;
  const uint8_t* v = host_bytes(w, /*as_float32=*/false, keep).data();  // [M, C, kH, kW]
  MlxBuffer buffer(static_cast<size_t>(m * c * taps), BufferLifetime::kRun);  // a reference's, not a model's
  auto* rows = buffer.as<uint8_t>();
  // rows[(t * C + c) * M + m] = w[m, c, t] (row (ky * kW + kx) * C + c): 64 output channels at a time, so
  // that each row's writes are a run of 64 bytes.
  constexpr int64_t kBlock = 64;
  for (int64_t m0 = 0; m0 < m; m0 += kBlock) {
    const int64_t m1 = std::min(m, m0 + kBlock);
    for (int64_t ci = 0; ci < c; ++ci) {
      for (int64_t t = 0; t < taps; ++t) {
        uint8_t* row = rows + (t * c + ci) * m;
        const uint8_t* from = v + ci * taps + t;
        for (int64_t mi = m0; mi < m1; ++mi) row[mi] = from[mi * c * taps];
      }
    }
  }
  return std::move(buffer).into_array({static_cast<int>(c * taps), static_cast<int>(m)}, w.dtype());
}

mx::array qlinear_conv_weight_columns(const mx::array& w) {
  if (w.ndim() != 4 || (w.dtype() != mx::int8 && w.dtype() != mx::uint8))
    throw std::invalid_argument("QLinearConv weight must be 8-bit [M, C, kH, kW]");
  const int64_t m = w.shape(0), c = w.shape(1), taps = int64_t{w.shape(2)} * w.shape(3);
  const mx::Shape shape{static_cast<int>(m), static_cast<int>(c * taps)};
  if (taps == 1) return mx::reshape(w, shape, mx::Device::cpu);
  mx::array keep = w;
  const uint8_t* v = host_bytes(w, /*as_float32=*/false, keep).data();        // [M, C, taps]
  MlxBuffer buffer(static_cast<size_t>(m * c * taps), BufferLifetime::kRun);  // packed next, then dropped
  auto* columns = buffer.as<uint8_t>();
  // columns[mi, t * C + ci] = w[mi, ci, t]: one filter's C x taps bytes transposed at a time.
  for (int64_t mi = 0; mi < m; ++mi) {
    const uint8_t* filter = v + mi * c * taps;
    uint8_t* column = columns + mi * c * taps;
    for (int64_t ci = 0; ci < c; ++ci) {
      for (int64_t t = 0; t < taps; ++t) column[t * c + ci] = filter[ci * taps + t];
    }
  }
  return std::move(buffer).into_array(shape, w.dtype());
}

mx::array qlinear_depthwise_weight(const mx::array& w, const std::optional<mx::array>& w_zero_point) {
  if (w.ndim() != 4 || w.shape(1) != 1 || (w.dtype() != mx::int8 && w.dtype() != mx::uint8))
    throw std::invalid_argument("depthwise QLinearConv weight must be 8-bit [C, 1, kH, kW]");
  const int64_t c = w.shape(0), taps = int64_t{w.shape(2)} * w.shape(3);
  const bool is_signed = w.dtype() == mx::int8;
  std::vector<int32_t> zero(static_cast<size_t>(c), 0);
  if (w_zero_point) {
    const mx::array& z = *w_zero_point;
    if (z.dtype() != w.dtype() || (z.size() != 1 && !(z.ndim() == 1 && z.shape(0) == w.shape(0))))
      throw std::invalid_argument("depthwise QLinearConv w_zero_point must be w's type, one value or [C]");
    mx::array keep_zero = z;
    const uint8_t* zb = host_bytes(z, /*as_float32=*/false, keep_zero).data();
    for (int64_t ci = 0; ci < c; ++ci) zero[ci] = byte_value(zb[z.size() == 1 ? 0 : ci], is_signed);
  }
  mx::array keep = w;
  const uint8_t* v = host_bytes(w, /*as_float32=*/false, keep).data();  // [M, C, kH, kW]
  MlxBuffer buffer(static_cast<size_t>(taps * c) * sizeof(int16_t));
  auto* out = buffer.as<int16_t>();
  for (int64_t ci = 0; ci < c; ++ci) {
    for (int64_t t = 0; t < taps; ++t)
      out[t * c + ci] = static_cast<int16_t>(byte_value(v[ci * taps + t], is_signed) - zero[ci]);
  }
  return std::move(buffer).into_array({w.shape(2), w.shape(3), static_cast<int>(c)}, mx::int16);
}

mx::array qlinear_conv_nhwc(const mx::array& x, const mx::array& x_zero_point, const PackedIntegerRhs& w,
                            int64_t m, const QLinearRequantize& r, const NhwcConvOptions& o,
                            mx::StreamOrDevice s, const std::optional<QLinearAddAfter>& add) {
  check_common(x, x_zero_point, r, m, o);
  const int64_t k = int64_t{o.kernel[0]} * o.kernel[1] * x.shape(o.channels_first_input ? 1 : 3);
  if (o.channels_first_input && x.shape(1) > 4)
    throw std::invalid_argument("QLinearConv reads NCHW input over at most 4 channels");
  const int64_t panels = (m + kIntPanelColumns - 1) / kIntPanelColumns;
  if (w.packed.dtype() != mx::int8 || w.packed.ndim() != 3 || w.packed.shape(0) != panels ||
      w.packed.shape(1) != (k + 3) / 4 || w.packed.shape(2) != kIntQuadBytes ||
      w.column_sums.size() != static_cast<size_t>(panels * kIntPanelColumns) ||
      w.column_zeros.size() != static_cast<size_t>(panels * kIntPanelColumns)) {
    throw std::invalid_argument("packed QLinearConv weight does not match " + std::to_string(m) +
                                " output channels over a window of " + std::to_string(k) + " values");
  }
  const mx::Stream stream = mx::to_stream(s);
  const mx::Shape shape = nhwc_conv_output_shape(x, m, o);
  const bool has_bias = r.bias.has_value();
  if (add && add->other.dtype() != r.y_zero_point.dtype())
    throw std::invalid_argument("the QLinearAdd after a QLinearConv takes an operand of the output's type");
  if (add && add->other.shape() != shape) {  // broadcast: the convolution, then the add's reference
    mx::array y = qlinear_conv_nhwc(x, x_zero_point, w, m, r, o, s);
    return (add->conv_first ? add->reference({y, add->other}) : add->reference({add->other, y}))[0];
  }
  const Reference add_reference = add ? add->reference : Reference{};
  const bool conv_first = add && add->conv_first;
  Reference reference = [o, k, m, has_bias, shape, stream, add_reference,
                         conv_first](const std::vector<mx::array>& in) {
    const mx::array x = o.channels_first_input ? mx::transpose(in[0], {0, 2, 3, 1}, stream) : in[0];
    mx::array rows = unfold_reference(x, in[1], o, shape, stream);
    mx::array acc = integer_matmul(rows, PackedIntegerRhs{in[2], in[3], in[4]}, k, m, in[1], stream);
    acc = mx::reshape(acc, shape, stream);
    const std::optional<mx::array> bias = has_bias ? std::optional<mx::array>(in[7]) : std::nullopt;
    mx::array y = requantize_reference(acc, in[5], bias, in[6], stream);
    if (!add_reference) return std::vector<mx::array>{y};
    return conv_first ? add_reference({y, in.back()}) : add_reference({in.back(), y});
  };
  std::vector<mx::array> inputs = {
      x, x_zero_point, w.packed, w.column_sums, w.column_zeros, r.multiplier, r.y_zero_point};
  if (has_bias) inputs.push_back(*r.bias);
  if (add) inputs.push_back(add->other);
  if (!is_cpu_stream(stream) || x.size() == 0 || !integer_gemm_available()) return reference(inputs)[0];
  const std::optional<AddAfter> kernel_add =
      add ? std::optional<AddAfter>(AddAfter{add->ratios, add->conv_first}) : std::nullopt;
  return run_kernel(std::move(inputs), reference, shape, r.y_zero_point.dtype(), o, false, has_bias, stream,
                    kernel_add);
}

mx::array qlinear_depthwise_conv_nhwc(const mx::array& x, const mx::array& x_zero_point, const mx::array& w,
                                      const QLinearRequantize& r, const NhwcConvOptions& o,
                                      mx::StreamOrDevice s) {
  const int64_t c = x.ndim() == 4 ? x.shape(3) : 0;
  check_common(x, x_zero_point, r, c, o);
  if (o.channels_first_input)
    throw std::invalid_argument("a depthwise QLinearConv reads channels-last input only");
  if (w.dtype() != mx::int16 || w.ndim() != 3 || w.shape(0) != o.kernel[0] || w.shape(1) != o.kernel[1] ||
      w.shape(2) != c) {
    throw std::invalid_argument("depthwise QLinearConv weight must be int16 [" + std::to_string(o.kernel[0]) +
                                ", " + std::to_string(o.kernel[1]) + ", " + std::to_string(c) + "]");
  }
  if (int64_t{o.kernel[0]} * o.kernel[1] > kExactIntegerTerms)
    throw std::invalid_argument("depthwise QLinearConv window has more taps than float32 sums exactly");
  const mx::Stream stream = mx::to_stream(s);
  const mx::Shape shape = nhwc_conv_output_shape(x, c, o);
  const bool has_bias = r.bias.has_value();
  Reference reference = [o, has_bias, stream](const std::vector<mx::array>& in) {
    mx::array centered =
        mx::subtract(mx::astype(in[0], mx::float32, stream),
                     mx::astype(mx::reshape(in[1], {}, stream), mx::float32, stream), stream);
    // [kH, kW, C] -> [C, kH, kW, 1]; the float32 sums of at most kExactIntegerTerms products are exact.
    mx::array weight =
        mx::expand_dims(mx::transpose(mx::astype(in[2], mx::float32, stream), {2, 0, 1}, stream), 3, stream);
    mx::array sums = mx::conv_general(centered, weight, {o.strides[0], o.strides[1]},
                                      {o.pads_begin[0], o.pads_begin[1]}, {o.pads_end[0], o.pads_end[1]},
                                      {o.dilations[0], o.dilations[1]}, {}, in[0].shape(3), false, stream);
    const std::optional<mx::array> bias = has_bias ? std::optional<mx::array>(in[5]) : std::nullopt;
    return std::vector<mx::array>{
        requantize_reference(mx::astype(sums, mx::int32, stream), in[3], bias, in[4], stream)};
  };
  std::vector<mx::array> inputs = {x, x_zero_point, w, r.multiplier, r.y_zero_point};
  if (has_bias) inputs.push_back(*r.bias);
  if (!is_cpu_stream(stream) || x.size() == 0) return reference(inputs)[0];
  return run_kernel(std::move(inputs), reference, shape, r.y_zero_point.dtype(), o, true, has_bias, stream);
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
