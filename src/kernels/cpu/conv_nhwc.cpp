// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file) for the depthwise loop; the group-1 convolution runs on the GEMM.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/conv_nhwc.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/conv_activation-inl.h"
#include "kernels/cpu/partial_vectors-inl.h"

#include "kernels/cpu/conv_nhwc_args.h"

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
// Vectors of at most 8 lanes (256 bits), for channel counts that are no
// multiple of the full vector (see DepthwiseColumnsAllChannels, DirectConvRow).
using DD = hn::CappedTag<float, 8>;

template <class DA = D>
HWY_INLINE hn::Vec<DA> Activate(const NhwcConvArgs& a, hn::Vec<DA> v) {
  return ApplyConvActivation(DA(), v, static_cast<ConvActivation>(a.activation), a.clip_min, a.clip_max);
}

// Output columns ox whose tap kx reads inside the input row: [first, last).
HWY_INLINE void ValidColumns(const NhwcConvArgs& a, int64_t kx, int64_t& first, int64_t& last) {
  const int64_t shift = kx * a.dilation_w - a.pad_left;  // ix = ox * sW + shift
  first = shift >= 0 ? 0 : (-shift + a.stride_w - 1) / a.stride_w;
  const int64_t room = a.in_w - shift;
  last = room <= 0 ? 0 : std::min(a.out_w, (room + a.stride_w - 1) / a.stride_w);
  first = std::min(first, last);
}

// Output columns ox whose every tap reads inside the input row: [lo, hi)
// (empty when the kernel is wider than the padded margins allow).
HWY_INLINE void InteriorColumns(const NhwcConvArgs& a, int64_t& lo, int64_t& hi) {
  int64_t unused;
  ValidColumns(a, 0, lo, unused);
  ValidColumns(a, a.kernel_w - 1, unused, hi);
  if (hi <= lo) lo = hi = 0;
}

// kCols output columns ox0.. of one output row, one vector of channels c0..
// (its first `valid` lanes; all of them when kFull): the bias plus every tap's
// weight vector times the input vector under it, in registers; each weight
// load serves all kCols columns. kChecked: some taps fall outside the row
// (the border columns).
template <class DT, int kCols, bool kChecked, bool kFull>
HWY_INLINE void DepthwiseColumns(const NhwcConvArgs& a, const float* const* rows, float* out_row, int64_t ox0,
                                 int64_t c0, size_t valid) {
  using V = hn::Vec<DT>;
  const DT d;
  const int64_t C = a.channels;
  auto load = [&](const float* p) { return kFull ? hn::LoadU(d, p) : LoadFirst(d, p, valid); };
  const V start = a.bias != nullptr ? load(a.bias + c0) : hn::Zero(d);
  V acc[kCols];
  for (int j = 0; j < kCols; ++j) acc[j] = start;
  const int64_t column_step = a.stride_w * C;  // between neighbouring output columns
  for (int64_t ky = 0; ky < a.kernel_h; ++ky) {
    if (rows[ky] == nullptr) continue;  // in the padding
    const float* row = rows[ky] + c0;
    const float* w = a.w + ky * a.kernel_w * C + c0;
    for (int64_t kx = 0; kx < a.kernel_w; ++kx, w += C) {
      const V wv = load(w);
      const int64_t ix0 = a.input_col(ox0) + kx * a.dilation_w;
      if constexpr (kChecked) {
        for (int j = 0; j < kCols; ++j) {
          const int64_t ix = ix0 + j * a.stride_w;
          if (ix >= 0 && ix < a.in_w) acc[j] = hn::MulAdd(wv, load(row + ix * C), acc[j]);
        }
      } else {
        const float* in = row + ix0 * C;
        for (int j = 0; j < kCols; ++j) acc[j] = hn::MulAdd(wv, load(in + j * column_step), acc[j]);
      }
    }
  }
  float* out = out_row + ox0 * C + c0;
  for (int j = 0; j < kCols; ++j) {
    const V v = Activate<DT>(a, acc[j]);
    if constexpr (kFull) {
      hn::StoreU(v, d, out + j * C);
    } else {
      StoreFirst(v, d, out + j * C, valid);
    }
  }
}

// Output columns [ox0, ox0 + kCols) across every channel vector: full
// vectors of the target, then the rest in vectors of at most 8 lanes. With
// AVX-512, 8, 24 or 88 channels (PP-LCNet's) then end on a full 8-lane
// vector instead of a masked 16-lane one.
template <int kCols, bool kChecked>
HWY_INLINE void DepthwiseColumnsAllChannels(const NhwcConvArgs& a, const float* const* rows, float* out_row,
                                            int64_t ox0) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(D()));
  const int64_t short_lanes = static_cast<int64_t>(hn::Lanes(DD()));
  int64_t c0 = 0;
  for (; c0 + lanes <= a.channels; c0 += lanes)
    DepthwiseColumns<D, kCols, kChecked, true>(a, rows, out_row, ox0, c0, static_cast<size_t>(lanes));
  for (; c0 + short_lanes <= a.channels; c0 += short_lanes)
    DepthwiseColumns<DD, kCols, kChecked, true>(a, rows, out_row, ox0, c0, static_cast<size_t>(short_lanes));
  if (c0 < a.channels)
    DepthwiseColumns<DD, kCols, kChecked, false>(a, rows, out_row, ox0, c0,
                                                 static_cast<size_t>(a.channels - c0));
}

// One output row of the depthwise convolution, from the input rows under
// its taps (rows[ky]: the row under tap row ky, null in the padding) into
// out_row: interior columns eight at a time (eight independent multiply-add
// chains keep both FMA units busy; four left them waiting on the latency:
// 8 % less time in MobileNetV2's depthwise convs), the border columns with
// their taps checked. Each group of columns runs over all channels before the
// next, so the input window it reads stays in L1.
void DepthwiseRowFrom(const NhwcConvArgs& a, const float* const* rows, float* out_row) {
  int64_t lo, hi;
  InteriorColumns(a, lo, hi);
  for (int64_t ox = 0; ox < lo; ++ox) DepthwiseColumnsAllChannels<1, true>(a, rows, out_row, ox);
  int64_t ox = lo;
  for (; ox + 8 <= hi; ox += 8) DepthwiseColumnsAllChannels<8, false>(a, rows, out_row, ox);
  for (; ox + 4 <= hi; ox += 4) DepthwiseColumnsAllChannels<4, false>(a, rows, out_row, ox);
  for (; ox < hi; ++ox) DepthwiseColumnsAllChannels<1, false>(a, rows, out_row, ox);
  for (ox = std::max(hi, lo); ox < a.out_w; ++ox) DepthwiseColumnsAllChannels<1, true>(a, rows, out_row, ox);
}

// ---- group 1, direct: few input channels (a CNN's stem over RGB) ----
//
// With C = 3 an unfolded row is 27 values (3x3) or 147 (7x7) copied in runs of
// 3 to 21 floats, and the GEMM's panels are half empty when M is 8: the
// unfold and the tile loop took 72 % of PP-LCNet's stem run alone (its
// transpose into NHWC 13 % more). Here each output
// value is accumulated in registers straight from the input: for every tap
// (ky, kx, c), one input value per output column is broadcast and multiplied
// with the tap's row of the packed weight (the GEMM's panels, read in place).
// The input is read through strides, so the stem can read the graph's NCHW
// input without the transpose into NHWC.
//
// Vectors of at most 8 lanes (256 bits) for few output channels (every panel
// width, 8, 16 or 32, is a multiple of them, and an 8-filter stem fills one),
// the target's full vectors for 32 and more (AVX-512: twice the multiply-adds
// an instruction; ResNet's 64-filter stem was 16-20 % slower than the GEMM on 256-bit vectors).
//
// Output channels per register group: as many accumulators as the target's
// registers hold for kDirectCols columns.
constexpr int kDirectVecs = HWY_TARGET <= HWY_AVX3 ? 4 : 2;
constexpr int kDirectCols = 6;

// Output columns [ox0, ox0 + kCols) of output row (n, oy), output channels
// [m0, m0 + count) (kVecs vectors of DT; m0 on a vector boundary of one
// panel). kChecked: some taps fall outside the input row (border columns).
// kChannels: the input's channels when known at compile time (3: an RGB stem, whose tap loop then
// unrolls; perf had the loop's counters and a spilled register beside its 12 multiply-adds), else 0.
template <class DT, int kCols, int kVecs, bool kChecked, int kChannels = 0>
HWY_INLINE void DirectColumns(const NhwcConvArgs& a, int64_t n, int64_t oy, int64_t ox0, int64_t m0,
                              int64_t count) {
  using VT = hn::Vec<DT>;
  const DT d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t width = a.panel_width;
  // Vector v's weights: its panel's column of output channel m0 + v * lanes (a group may span panels).
  const float* column[kVecs];
  for (int v = 0; v < kVecs; ++v) {
    const int64_t m = m0 + v * lanes;
    column[v] = a.w + (m / width) * a.window() * width + (m % width);
  }
  auto valid = [&](int v) { return static_cast<size_t>(std::clamp<int64_t>(count - v * lanes, 0, lanes)); };
  VT acc[kCols][kVecs];
  for (int v = 0; v < kVecs; ++v) {
    const VT start = a.bias != nullptr ? LoadFirst(d, a.bias + m0 + v * lanes, valid(v)) : hn::Zero(d);
    for (int j = 0; j < kCols; ++j) acc[j][v] = start;
  }
  const int64_t C = kChannels > 0 ? kChannels : a.channels;
  for (int64_t ky = 0; ky < a.kernel_h; ++ky) {
    const int64_t iy = a.input_row(oy) + ky * a.dilation_h;
    if (iy < 0 || iy >= a.in_h) continue;
    const float* row = a.x + n * a.x_stride_n + iy * a.x_stride_h;
    for (int64_t kx = 0; kx < a.kernel_w; ++kx) {
      const int64_t ix0 = a.input_col(ox0) + kx * a.dilation_w;
      // Row (ky, kx, c) of the packed weight, from c = 0.
      int64_t weight_row = (ky * a.kernel_w + kx) * C * width;
#pragma GCC unroll 4
      for (int64_t c = 0; c < C; ++c, weight_row += width) {
        VT w[kVecs];
        for (int v = 0; v < kVecs; ++v)
          w[v] = hn::LoadU(d, column[v] + weight_row);  // zeros past M: in the panel
        const float* in = row + c * a.x_stride_c;
        for (int j = 0; j < kCols; ++j) {
          const int64_t ix = ix0 + j * a.stride_w;
          if (kChecked && (ix < 0 || ix >= a.in_w)) continue;
          const VT x = hn::Set(d, in[ix * a.x_stride_w]);
          for (int v = 0; v < kVecs; ++v) acc[j][v] = hn::MulAdd(x, w[v], acc[j][v]);
        }
      }
    }
  }
  const int64_t m = a.out_channels;
  const int64_t first = ((n * a.out_h + oy) * a.out_w + ox0) * m + m0;
  for (int j = 0; j < kCols; ++j) {
    for (int v = 0; v < kVecs; ++v) {
      const int64_t at = first + j * m + v * lanes;
      VT y = acc[j][v];
      if (a.residual != nullptr) y = hn::Add(y, LoadFirst(d, a.residual + at, valid(v)));
      StoreFirst(Activate<DT>(a, y), d, a.y + at, valid(v));
    }
  }
}

// Columns per register block for kVecs vectors of output channels: at least
// 8 accumulators (two FMA units times four cycles of latency; with one vector,
// 6 columns left PP-LCNet's 8-channel stem waiting on it) within the
// target's registers.
template <int kVecs>
constexpr int DirectCols() {
  return kVecs == 1 ? 12 : kDirectCols;
}

// One output row (image n, row oy), output channels [m0, m0 + count) (kVecs
// vectors of DT): interior columns a register block at a time, the border
// columns one at a time with their taps checked.
template <class DT, int kVecs, int kChannels>
HWY_INLINE void DirectRowChannels(const NhwcConvArgs& a, int64_t n, int64_t oy, int64_t m0, int64_t count) {
  constexpr int kCols = DirectCols<kVecs>();
  int64_t lo, hi;
  InteriorColumns(a, lo, hi);
  for (int64_t ox = 0; ox < lo; ++ox) DirectColumns<DT, 1, kVecs, true, kChannels>(a, n, oy, ox, m0, count);
  int64_t ox = lo;
  for (; ox + kCols <= hi; ox += kCols)
    DirectColumns<DT, kCols, kVecs, false, kChannels>(a, n, oy, ox, m0, count);
  // The rest four at a time: one column alone waits out each multiply-add's latency.
  for (; ox + 4 <= hi; ox += 4) DirectColumns<DT, 4, kVecs, false, kChannels>(a, n, oy, ox, m0, count);
  for (; ox < hi; ++ox) DirectColumns<DT, 1, kVecs, false, kChannels>(a, n, oy, ox, m0, count);
  for (ox = std::max(hi, lo); ox < a.out_w; ++ox)
    DirectColumns<DT, 1, kVecs, true, kChannels>(a, n, oy, ox, m0, count);
}

// Every output channel of one output row, a register group at a time. A group
// may span panels (AVX-512: 64 channels over two 32-column panels, so each
// broadcast input value feeds four multiply-adds: ResNet's 7x7 stem to 64
// channels had been two groups of 32); a vector never does, the panel width
// being a multiple of DT's lanes.
template <class DT, int kChannels>
void DirectConvRowOf(const NhwcConvArgs& a, int64_t n, int64_t oy) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DT()));
  const int64_t group = kDirectVecs * lanes;
  for (int64_t m0 = 0; m0 < a.out_channels; m0 += group) {
    const int64_t count = std::min(group, a.out_channels - m0);
    switch ((count + lanes - 1) / lanes) {
      case 1:
        DirectRowChannels<DT, 1, kChannels>(a, n, oy, m0, count);
        break;
      case 2:
        DirectRowChannels<DT, 2, kChannels>(a, n, oy, m0, count);
        break;
#if HWY_TARGET <= HWY_AVX3
      case 3:
        DirectRowChannels<DT, 3, kChannels>(a, n, oy, m0, count);
        break;
      case 4:
        DirectRowChannels<DT, 4, kChannels>(a, n, oy, m0, count);
        break;
#endif
      default:
        HWY_ASSERT(false);
    }
  }
}

void DirectConvRow(const NhwcConvArgs& a, int64_t n, int64_t oy) {
  const int64_t full = static_cast<int64_t>(hn::Lanes(D()));
  const bool wide = full > 8 && a.out_channels >= 2 * full && a.panel_width % full == 0;
  if (wide && a.channels == 3) {
    DirectConvRowOf<D, 3>(a, n, oy);
  } else if (wide) {
    DirectConvRowOf<D, 0>(a, n, oy);
  } else if (a.channels == 3) {
    DirectConvRowOf<DD, 3>(a, n, oy);
  } else {
    DirectConvRowOf<DD, 0>(a, n, oy);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/conv_nhwc.h"
#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "mlx_bridge/buffers.h"

namespace transmuter::kernels {

HWY_EXPORT(DepthwiseRowFrom);
HWY_EXPORT(DirectConvRow);


NhwcConvArgs nhwc_conv_geometry(const NhwcConvOptions& o, int64_t batch, int64_t in_h, int64_t in_w,
                                int64_t channels, int64_t out_h, int64_t out_w, int64_t out_channels) {
  NhwcConvArgs a{};
  a.batch = batch;
  a.in_h = in_h;
  a.in_w = in_w;
  a.channels = channels;
  a.x_stride_c = 1, a.x_stride_h = in_w * channels, a.x_stride_w = channels;
  a.x_stride_n = channels * in_h * in_w;
  a.out_h = out_h;
  a.out_w = out_w;
  a.out_channels = out_channels;
  a.kernel_h = o.kernel[0];
  a.kernel_w = o.kernel[1];
  a.stride_h = o.strides[0];
  a.stride_w = o.strides[1];
  a.dilation_h = o.dilations[0];
  a.dilation_w = o.dilations[1];
  a.pad_top = o.pads_begin[0];
  a.pad_left = o.pads_begin[1];
  a.activation = static_cast<int>(o.activation);
  a.clip_min = o.clip_min;
  a.clip_max = o.clip_max;
  return a;
}

void depthwise_row_from(const NhwcConvArgs& a, const float* const* input_rows, float* out_row) {
  HWY_DYNAMIC_DISPATCH(DepthwiseRowFrom)(a, input_rows, out_row);
}

NhwcConvArgs nhwc_conv_args_of(const NhwcConvOptions& o, const mx::array& x, const mx::array& y) {
  const bool channels_first = o.channels_first_input;
  NhwcConvArgs a =
      nhwc_conv_geometry(o, x.shape(0), x.shape(channels_first ? 2 : 1), x.shape(channels_first ? 3 : 2),
                         x.shape(channels_first ? 1 : 3), y.shape(1), y.shape(2), y.shape(3));
  if (channels_first) {
    a.channels_first = true;
    a.x_stride_c = a.in_h * a.in_w, a.x_stride_h = a.in_w, a.x_stride_w = 1;
  }
  return a;
}

namespace {

// Copies n floats. Windows over few channels copy a few floats at a time
// (a 3x3 kernel over 3 channels: 9 per kernel row), where a libc call per
// copy was 8 % of PP-LCNet; constant-size copies compile to register moves.
inline void copy_floats(float* dst, const float* src, int64_t n) {
  if (n >= 64) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (; n >= 8; n -= 8, dst += 8, src += 8) std::memcpy(dst, src, 8 * sizeof(float));
  if (n >= 4) {
    std::memcpy(dst, src, 4 * sizeof(float));
    n -= 4, dst += 4, src += 4;
  }
  for (; n > 0; --n) *dst++ = *src++;
}

// Row of the unfolded input [positions, kH * kW * C] for output position
// (n, oy, ox): the window under it, tap-major, zeros where a tap falls in the
// padding. With dilation 1 the taps of one kernel row are one copy.
void unfold_position(const NhwcConvArgs& a, int64_t n, int64_t oy, int64_t ox, float* dst) {
  const int64_t C = a.channels;
  const int64_t ix0 = a.input_col(ox);
  // Kernel columns [kx_first, kx_last) read inside the row.
  int64_t kx_first = 0, kx_last = a.kernel_w;
  while (kx_first < a.kernel_w && ix0 + kx_first * a.dilation_w < 0) ++kx_first;
  while (kx_last > kx_first && ix0 + (kx_last - 1) * a.dilation_w >= a.in_w) --kx_last;
  const int64_t row_values = a.kernel_w * C;
  for (int64_t ky = 0; ky < a.kernel_h; ++ky, dst += row_values) {
    const int64_t iy = a.input_row(oy) + ky * a.dilation_h;
    if (iy < 0 || iy >= a.in_h || kx_first >= kx_last) {
      std::fill(dst, dst + row_values, 0.0f);
      continue;
    }
    const float* row = a.x + ((n * a.in_h + iy) * a.in_w) * C;
    std::fill(dst, dst + kx_first * C, 0.0f);
    std::fill(dst + kx_last * C, dst + row_values, 0.0f);
    if (a.dilation_w == 1) {
      copy_floats(dst + kx_first * C, row + (ix0 + kx_first) * C, (kx_last - kx_first) * C);
    } else {
      for (int64_t kx = kx_first; kx < kx_last; ++kx)
        copy_floats(dst + kx * C, row + (ix0 + kx * a.dilation_w) * C, C);
    }
  }
}

// Rows [first, first + count) of the unfolded input into dst, walking the
// output positions in order (no division per position).
void unfold_positions(const NhwcConvArgs& a, int64_t first, int64_t count, float* dst) {
  const int64_t k = a.window();
  a.for_each_position(first, count, [&](int64_t n, int64_t oy, int64_t ox, int64_t r) {
    unfold_position(a, n, oy, ox, dst + r * k);
  });
}

GemmArgs product_of(const NhwcConvArgs& a, const float* rows, int64_t lda, int64_t first_position,
                    int64_t count) {
  GemmArgs g;
  g.a = rows;
  g.lda = lda;
  g.packed = a.w;
  g.col_bias = a.bias;
  g.residual = a.residual != nullptr ? a.residual + first_position * a.out_channels : nullptr;
  g.y = a.y + first_position * a.out_channels;
  g.ldy = g.n = a.out_channels;
  g.m = count;
  g.k = a.window();
  g.conv_activation = static_cast<ConvActivation>(a.activation);
  g.clip_min = a.clip_min;
  g.clip_max = a.clip_max;
  return g;
}

// The unfolded input of the evaluating thread, kept between calls (no page
// faults in steady state) up to kKeepBytes; at most kUnfoldBytes at a time.
constexpr size_t kKeepBytes = size_t{64} << 20;
constexpr int64_t kUnfoldFloats = int64_t{8} << 20;

// The direct kernel for few input channels (kConvDirectMaxChannels), measured
// against the unfold + GEMM on stems over RGB, 2 threads, in- and output
// transposes included: PP-LCNet's 3x3 stride 2 to 8 channels (batch 8,
// 48x192) 0.78-1.12 -> 0.45-0.62 ms; MobileNetV2's to 32 (224x224)
// 0.50-0.56 -> 0.32-0.42; ResNet's 7x7 to 64 1.74-2.99 -> 1.96-2.13 (equal
// within noise, after its 512-bit path).
bool runs_direct(const NhwcConvArgs& a) {
  return a.channels_first || (!a.pointwise() && a.channels <= kConvDirectMaxChannels);
}

void run_direct_conv(const NhwcConvArgs& a) {
  const int64_t rows = a.batch * a.out_h;
  // About 64K multiply-adds a chunk.
  const int64_t grain =
      std::max<int64_t>(1, 65536 / std::max<int64_t>(1, a.out_w * a.window() * a.out_channels));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) HWY_DYNAMIC_DISPATCH(DirectConvRow)(a, r / a.out_h, r % a.out_h);
  });
}

// The unfolded rows one task of run_unfolded_conv multiplies: 256 KiB, in the core's L2 while its
// product reads them.
constexpr int64_t kUnfoldTaskBytes = int64_t{256} << 10;

// Unfolded matrices this many times the packed weight's size, and larger than L2, are unfolded per
// task instead of whole: a ResNet-50 3x3 conv at 56x56 unfolds 7.2 MB, which went to memory and came
// back for the product, against 147 KB of weights that every task then reads from its own L2
// (1.30 -> 0.93 ms; ResNet-50 b8 0.90x in 3 alternating rounds). Small images with large weights (7x7x512:
// 0.9 MB unfolded, 9.4 MB of weights) keep the whole unfold, whose product splits the weights' panels
// between the threads instead of streaming all of them once per task.
constexpr int64_t kUnfoldPerTaskRatio = 4;

bool unfolds_per_task(const NhwcConvArgs& a) {
  const int64_t unfolded = a.positions() * a.window() * static_cast<int64_t>(sizeof(float));
  const int64_t weights = a.window() * ((a.out_channels + a.panel_width - 1) / a.panel_width) *
                          a.panel_width * static_cast<int64_t>(sizeof(float));
  return unfolded > 4 * kUnfoldTaskBytes && unfolded >= kUnfoldPerTaskRatio * weights;
}

// Each task unfolds a block of output positions into its thread's buffer and multiplies it there
// (all output channels), at least four tasks per thread.
void run_unfolded_conv(const NhwcConvArgs& a) {
  const int64_t positions = a.positions(), k = a.window();
  constexpr int64_t kRowMultiple = kGemmTileRows;
  int64_t rows = std::min(kUnfoldTaskBytes / (k * static_cast<int64_t>(sizeof(float))),
                          (positions + 4 * kernel_threads() - 1) / (4 * kernel_threads()));
  rows = std::max(kRowMultiple, (rows + kRowMultiple - 1) / kRowMultiple * kRowMultiple);
  parallel_for((positions + rows - 1) / rows, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> unfolded;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t * rows, count = std::min(rows, positions - first);
      unfolded.resize(static_cast<size_t>(count * k));
      unfold_positions(a, first, count, unfolded.data());
      run_gemm_on_this_thread(product_of(a, unfolded.data(), k, first, count));
    }
  });
}

void run_conv2d_nhwc(const NhwcConvArgs& a) {
  const int64_t positions = a.positions();
  if (runs_direct(a)) {
    run_direct_conv(a);
    return;
  }
  if (a.pointwise()) {  // the image is the product's left-hand side as it lies
    run_gemm(product_of(a, a.x, a.channels, 0, positions));
    return;
  }
  if (unfolds_per_task(a)) {
    run_unfolded_conv(a);
    return;
  }
  thread_local std::vector<float> unfolded;
  const int64_t k = a.window();
  const int64_t rows_per_pass = std::clamp<int64_t>(kUnfoldFloats / k, 6, positions);
  unfolded.resize(static_cast<size_t>(rows_per_pass * k));
  float* buffer = unfolded.data();
  // About 32K values a chunk: enough work to pay for waking a thread.
  const int64_t grain = std::max<int64_t>(1, 32768 / k);
  for (int64_t first = 0; first < positions; first += rows_per_pass) {
    const int64_t count = std::min(rows_per_pass, positions - first);
    parallel_for(count, grain, [&](int64_t begin, int64_t end) {
      unfold_positions(a, first + begin, end - begin, buffer + begin * k);
    });
    run_gemm(product_of(a, buffer, k, first, count));
  }
  if (unfolded.capacity() * sizeof(float) > kKeepBytes) std::vector<float>().swap(unfolded);
}

void run_depthwise_nhwc(const NhwcConvArgs& a) {
  const int64_t rows = a.batch * a.out_h;
  // About 16K outputs a chunk.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, a.out_w * a.channels));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<const float*> input_rows(static_cast<size_t>(a.kernel_h));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / a.out_h, oy = r % a.out_h;
      for (int64_t ky = 0; ky < a.kernel_h; ++ky) {
        const int64_t iy = a.input_row(oy) + ky * a.dilation_h;
        input_rows[ky] = iy >= 0 && iy < a.in_h ? a.x + ((n * a.in_h + iy) * a.in_w) * a.channels : nullptr;
      }
      depthwise_row_from(a, input_rows.data(), a.y + r * a.out_w * a.channels);
    }
  });
}


class NhwcConvKernel : public CpuKernel {
 public:
  NhwcConvKernel(mx::Stream stream, Reference reference, NhwcConvOptions options, bool depthwise,
                 bool has_bias, bool has_residual)
      : CpuKernel(stream, std::move(reference)),
        options_(options),
        depthwise_(depthwise),
        has_bias_(has_bias),
        has_residual_(has_residual) {}
  const char* name() const override {
    return depthwise_ ? "transmuter::DepthwiseConvNhwc" : "transmuter::ConvNhwc";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const NhwcConvKernel*>(&other);
    return o != nullptr && o->options_ == options_ && o->depthwise_ == depthwise_ &&
           o->has_bias_ == has_bias_ && o->has_residual_ == has_residual_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    NhwcConvArgs a = nhwc_conv_args_of(options_, in[0], out[0]);
    a.x = in[0].data<float>();
    a.w = in[1].data<float>();
    if (!depthwise_) a.panel_width = in[1].shape(2);
    a.bias = has_bias_ ? in[2].data<float>() : nullptr;
    a.residual = has_residual_ ? in.back().data<float>() : nullptr;
    a.y = out[0].data<float>();
    if (depthwise_) return [a] { run_depthwise_nhwc(a); };
    return [a] { run_conv2d_nhwc(a); };
  }
  // The output takes the residual's buffer when nothing else holds it (a ResNet block's shortcut): each
  // output element is written only after its tile has read the residual under it, and the memory is
  // in cache and owned already instead of a fresh buffer's lines fetched only to be overwritten.
  int donor_of(size_t) const override { return has_residual_ ? (has_bias_ ? 3 : 2) : -1; }

 private:
  NhwcConvOptions options_;
  bool depthwise_, has_bias_, has_residual_;
};

mx::array activate(const mx::array& v, const NhwcConvOptions& o, mx::Stream s) {
  return apply_conv_activation(v, o.activation, o.clip_min, o.clip_max, s);
}


std::vector<mx::array> operands(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                                const std::optional<mx::array>& residual) {
  std::vector<mx::array> inputs = {x, w};
  if (bias) inputs.push_back(*bias);
  if (residual) inputs.push_back(*residual);
  return inputs;
}

mx::array run_kernel(std::vector<mx::array> inputs, const Reference& reference, const mx::Shape& shape,
                     const NhwcConvOptions& o, bool depthwise, bool has_bias, bool has_residual,
                     mx::Stream stream) {
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<NhwcConvKernel>(kernel_stream, reference, o, depthwise, has_bias,
                                                has_residual);
      },
      reference, std::move(inputs), {shape}, {mx::float32}, stream)[0];
}

// Sums each image's positions row by row into a channel-long accumulator
// (a loop the compiler vectorizes), then scales by 1 / positions.
class SpatialMeanKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "transmuter::SpatialMeanNhwc"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const SpatialMeanKernel*>(&other) != nullptr;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* x = in[0].data<float>();
    float* y = out[0].data<float>();
    const int64_t batch = in[0].shape(0), positions = int64_t{in[0].shape(1)} * in[0].shape(2),
                  channels = in[0].shape(3);
    return [x, y, batch, positions, channels] {
      parallel_for(batch, 1, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
          float* acc = y + n * channels;
          std::fill(acc, acc + channels, 0.0f);
          const float* image = x + n * positions * channels;
          for (int64_t p = 0; p < positions; ++p) {
            const float* row = image + p * channels;
            for (int64_t c = 0; c < channels; ++c) acc[c] += row[c];
          }
          const float scale = 1.0f / static_cast<float>(positions);
          for (int64_t c = 0; c < channels; ++c) acc[c] *= scale;
        }
      });
    };
  }
};

}  // namespace

// x = in[0] [N, H, W, C] with an MLX-layout weight [M, kH, kW, C / groups],
// + the bias in[2] when given, + the residual (the last input) when given.
mx::array reference_conv_nhwc(const std::vector<mx::array>& in, const mx::array& weight, int groups,
                              bool has_bias, bool has_residual, const NhwcConvOptions& o, mx::Stream s) {
  mx::array y = mx::conv_general(in[0], weight, {o.strides[0], o.strides[1]},
                                 {o.pads_begin[0], o.pads_begin[1]}, {o.pads_end[0], o.pads_end[1]},
                                 {o.dilations[0], o.dilations[1]}, {}, groups, false, s);
  if (has_bias) y = mx::add(y, in[2], s);
  if (has_residual) y = mx::add(y, in.back(), s);
  return activate(y, o, s);
}

// x's height and width: axes 1, 2 (NHWC) or 2, 3 (NCHW, channels_first_input).
std::array<int, 2> spatial_size(const mx::array& x, const NhwcConvOptions& o) {
  const int first = o.channels_first_input ? 2 : 1;
  return {x.shape(first), x.shape(first + 1)};
}

mx::Shape nhwc_conv_output_shape(const mx::array& x, int64_t m, const NhwcConvOptions& o) {
  const auto [h, w] = spatial_size(x, o);
  const int64_t oh =
      conv_output_length(h, o.kernel[0], o.strides[0], o.pads_begin[0], o.pads_end[0], o.dilations[0]);
  const int64_t ow =
      conv_output_length(w, o.kernel[1], o.strides[1], o.pads_begin[1], o.pads_end[1], o.dilations[1]);
  if (oh <= 0 || ow <= 0) throw std::invalid_argument("convolution window does not fit the input");
  return {x.shape(0), static_cast<int>(oh), static_cast<int>(ow), static_cast<int>(m)};
}

void check_conv_options(const NhwcConvOptions& o) {
  for (int i = 0; i < 2; ++i) {
    if (o.kernel[i] < 1 || o.strides[i] < 1 || o.dilations[i] < 1 || o.pads_begin[i] < 0 ||
        o.pads_end[i] < 0) {
      throw std::invalid_argument(
          "convolution needs positive kernel, strides and dilations and non-negative pads");
    }
  }
}

void check_conv_bias(const std::optional<mx::array>& bias, int64_t m) {
  if (bias && (bias->dtype() != mx::float32 || bias->ndim() != 1 || bias->shape(0) != m)) {
    throw std::invalid_argument("convolution bias must be float32 [" + std::to_string(m) + "]");
  }
}

mx::array spatial_mean_nhwc(const mx::array& x, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::mean(in[0], {1, 2}, true, stream)};
  };
  if (x.ndim() != 4 || x.dtype() != mx::float32 || x.size() == 0 || !is_cpu_stream(stream))
    return reference({x})[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<SpatialMeanKernel>(kernel_stream, reference); },
      reference, {x}, {{x.shape(0), 1, 1, x.shape(3)}}, {mx::float32}, stream)[0];
}

int64_t conv_output_length(int64_t in, int kernel, int stride, int pad_begin, int pad_end, int dilation) {
  const int64_t span = static_cast<int64_t>(dilation) * (kernel - 1) + 1;
  const int64_t room = in + pad_begin + pad_end - span;
  return room < 0 ? 0 : room / stride + 1;
}

mx::Shape packed_conv_weight_shape(const mx::Shape& w) {
  const int width = static_cast<int>(gemm_panel_width());
  return {(w.at(0) + width - 1) / width, w.at(1) * w.at(2) * w.at(3), width};
}

void filter_panel_by_channel(const uint8_t* weight, int64_t m, int64_t k, int64_t p, float* by_channel) {
  constexpr int64_t kItem = sizeof(float);
  const int64_t width = gemm_panel_width(), cols = std::min(width, m - p * width);
  std::vector<const uint8_t*> filters(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) filters[j] = weight + (p * width + j) * k * kItem;  // [C, taps]
  if (cols < width) std::fill(by_channel, by_channel + k * width, 0.0f);
  transpose_rows_into_panel(filters.data(), cols, k, width, by_channel);
}

mx::array pack_conv_weight_nhwc(const mx::array& w) {
  if (w.ndim() != 4 || w.size() == 0 || !mx::issubdtype(w.dtype(), mx::floating)) {
    throw std::invalid_argument("pack_conv_weight_nhwc: the weight must be a non-empty 4-D float array");
  }
  mx::array source = w;
  const uint8_t* weight = host_bytes(w, /*as_float32=*/true, source).data();  // at any alignment
  const int64_t m = w.shape(0), channels = w.shape(1), taps = int64_t{w.shape(2)} * w.shape(3);
  const int64_t k = taps * channels, width = gemm_panel_width(), panels = (m + width - 1) / width;
  // MLX's own buffer: an array built over foreign memory would be copied.
  MlxBuffer buffer(static_cast<size_t>(panels * k * width) * sizeof(float), BufferLifetime::kPacked);
  float* packed = buffer.as<float>();
  // packed[p, tap * C + c, j] = w[p * width + j, c, tap]: the panel's `width` filters transposed by
  // register transposes, each filter a row of its [C, taps] values, into rows in (c, tap) order; a
  // kernel over several taps then reorders those rows to (tap, c) through a scratch panel (ResNet-50's
  // 3x3 weights had gone one float at a time).
  constexpr int64_t kItem = sizeof(float);
  parallel_for(panels, packing_grain(k * width * kItem), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(taps == 1 ? 0 : static_cast<size_t>(k * width));
    for (int64_t p = begin; p < end; ++p) {
      float* panel = packed + p * k * width;
      float* by_channel = taps == 1 ? panel : scratch.data();  // rows (c, tap)
      filter_panel_by_channel(weight, m, k, p, by_channel);
      if (taps == 1) continue;  // (c, tap) is (tap, c)
      for (int64_t t = 0; t < taps; ++t) {
        for (int64_t c = 0; c < channels; ++c) {
          std::memcpy(panel + (t * channels + c) * width, by_channel + (c * taps + t) * width,
                      static_cast<size_t>(width) * kItem);
        }
      }
    }
  });
  return buffer.into_array(packed_conv_weight_shape(w.shape()), mx::float32);
}

mx::array depthwise_weight_nhwc(const mx::array& w) {
  if (w.ndim() != 4 || w.shape(1) != 1 || !mx::issubdtype(w.dtype(), mx::floating))
    throw std::invalid_argument("depthwise weight must be a float [C, 1, kH, kW]");
  mx::array source = w;
  const uint8_t* weight = host_bytes(w, /*as_float32=*/true, source).data();  // at any alignment
  const int64_t channels = w.shape(0), taps = int64_t{w.shape(2)} * w.shape(3);
  MlxBuffer buffer(static_cast<size_t>(channels * taps) * sizeof(float), BufferLifetime::kPacked);
  // out[tap, c] = w[c, tap]: the channels' rows of taps transposed on this thread, not through an MLX
  // graph and its evaluation (MobileNetV2's 17 depthwise weights had taken ~100 us each that way).
  std::vector<const uint8_t*> filters(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) filters[c] = weight + c * taps * static_cast<int64_t>(sizeof(float));
  transpose_rows_into_panel(filters.data(), channels, taps, channels, buffer.as<float>());
  return buffer.into_array({w.shape(2), w.shape(3), w.shape(0)}, mx::float32);
}

mx::array conv2d_nhwc(const mx::array& x, const mx::array& packed, const std::optional<mx::array>& bias,
                      int64_t m, const NhwcConvOptions& o, mx::StreamOrDevice s,
                      const std::optional<mx::array>& residual) {
  check_conv_options(o);
  check_conv_bias(bias, m);
  if (x.dtype() != mx::float32 || x.ndim() != 4) {
    throw std::invalid_argument(o.channels_first_input ? "convolution input must be float32 [N, C, H, W]"
                                                       : "convolution input must be float32 [N, H, W, C]");
  }
  const int channels = x.shape(o.channels_first_input ? 1 : 3);
  const int64_t k = int64_t{o.kernel[0]} * o.kernel[1] * channels;
  if (!packed_rhs_fits(packed, m) || packed.shape(1) != k) {
    throw std::invalid_argument("packed convolution weight does not match " + std::to_string(m) +
                                " output channels over a window of " + std::to_string(k) + " values");
  }
  const mx::Stream stream = mx::to_stream(s);
  const mx::Shape shape = nhwc_conv_output_shape(x, m, o);
  const bool has_bias = bias.has_value();
  // A residual that broadcasts (not of the output's shape) is added by MLX.
  const bool fused_residual = residual && residual->shape() == shape && residual->dtype() == mx::float32;
  Reference reference = [o, m, channels, has_bias, fused_residual, stream](const std::vector<mx::array>& in) {
    // packed -> [kH * kW * C, M] -> [kH, kW, C, M] -> [M, kH, kW, C]
    mx::array rows = unpack_gemm_rhs(in[1], m, stream);
    mx::array w = mx::reshape(rows, {o.kernel[0], o.kernel[1], channels, static_cast<int>(m)}, stream);
    std::vector<mx::array> nhwc = in;
    if (o.channels_first_input) nhwc[0] = mx::transpose(in[0], {0, 2, 3, 1}, stream);
    return std::vector<mx::array>{reference_conv_nhwc(nhwc, mx::transpose(w, {3, 0, 1, 2}, stream), 1,
                                                      has_bias, fused_residual, o, stream)};
  };
  if (residual && !fused_residual) {
    NhwcConvOptions linear = o;
    linear.activation = ConvActivation::kNone;
    mx::array y = conv2d_nhwc(x, packed, bias, m, linear, s);
    return activate(mx::add(y, *residual, stream), o, stream);
  }
  std::vector<mx::array> inputs = operands(x, packed, bias, fused_residual ? residual : std::nullopt);
  if (!is_cpu_stream(stream) || x.size() == 0) return reference(inputs)[0];
  return run_kernel(std::move(inputs), reference, shape, o, false, has_bias, fused_residual, stream);
}

mx::array depthwise_conv_nhwc(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                              const NhwcConvOptions& o, mx::StreamOrDevice s) {
  check_conv_options(o);
  if (o.channels_first_input)
    throw std::invalid_argument("a depthwise convolution reads channels-last input only");
  if (x.dtype() != mx::float32 || x.ndim() != 4)
    throw std::invalid_argument("convolution input must be float32 [N, H, W, C]");
  const int64_t c = x.shape(3);
  if (w.dtype() != mx::float32 || w.ndim() != 3 || w.shape(0) != o.kernel[0] || w.shape(1) != o.kernel[1] ||
      w.shape(2) != c) {
    throw std::invalid_argument("depthwise weight must be float32 [" + std::to_string(o.kernel[0]) + ", " +
                                std::to_string(o.kernel[1]) + ", " + std::to_string(c) + "]");
  }
  check_conv_bias(bias, c);
  const mx::Stream stream = mx::to_stream(s);
  const mx::Shape shape = nhwc_conv_output_shape(x, c, o);
  const bool has_bias = bias.has_value();
  Reference reference = [o, has_bias, stream](const std::vector<mx::array>& in) {
    // [kH, kW, C] -> [C, kH, kW, 1]
    mx::array weight = mx::expand_dims(mx::transpose(in[1], {2, 0, 1}, stream), 3, stream);
    return std::vector<mx::array>{
        reference_conv_nhwc(in, weight, in[0].shape(3), has_bias, false, o, stream)};
  };
  std::vector<mx::array> inputs = operands(x, w, bias, std::nullopt);
  if (!is_cpu_stream(stream) || x.size() == 0) return reference(inputs)[0];
  return run_kernel(std::move(inputs), reference, shape, o, true, has_bias, false, stream);
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
