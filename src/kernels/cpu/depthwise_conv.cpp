// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); depthwise_conv picks the best target of the CPU at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/depthwise_conv.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/conv_activation-inl.h"

#ifndef TRANSMUTER_KERNELS_CPU_DEPTHWISE_CONV_ARGS
#define TRANSMUTER_KERNELS_CPU_DEPTHWISE_CONV_ARGS
namespace transmuter::kernels {
// One call's pointers and geometry (outside the per-target namespaces: every
// target's code takes the same struct). Planes are numbered n * out_channels + m.
struct DepthwiseConvArgs {
  const float* x;     // [N, C, in_h, in_w]
  const float* w;     // [out_channels, 1, kernel_h, kernel_w]
  const float* bias;  // [out_channels] or null
  float* y;           // [N, out_channels, out_h, out_w]
  int64_t channels, multiplier, out_channels;
  int64_t in_h, in_w, out_h, out_w;
  int64_t kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left;
  int activation;  // a ConvActivation
  float clip_min, clip_max;
};

}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using FloatTag = hn::ScalableTag<float>;
using FloatVec = hn::Vec<FloatTag>;

// The scratch copy of one input plane: for every input row, stride_w phases of
// phase_len values each, phase p holding padded-row elements p, p + sW,
// p + 2 sW, ... (the padded row is the input row with pad_left zeros before
// and zeros after). Output element ox under kernel column kx then reads phase
// (kx dW) mod sW at position ox + (kx dW) div sW: contiguous for every stride.
// phase_len leaves room for whole vectors past the last output. One more row
// stands for the rows above and below the input, so every output row sums all
// kernel_h rows without a branch. Padding positions are zeroed once per call:
// each plane then writes only where input values go.
struct PlaneScratch {
  int64_t phase_len = 0;
  int64_t row_len = 0;  // stride_w * phase_len
  int64_t rows = 0;     // input rows; row `rows` is all zeros
  std::vector<float> values;

  const float* row(int64_t iy) const { return values.data() + (iy >= 0 && iy < rows ? iy : rows) * row_len; }
};

int64_t RoundUp(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

void PrepareScratch(const DepthwiseConvArgs& a, int64_t lanes, PlaneScratch& s) {
  s.phase_len = RoundUp(a.out_w, lanes) + (a.kernel_w - 1) * a.dilation_w / a.stride_w + 1;
  s.row_len = a.stride_w * s.phase_len;
  s.rows = a.in_h;
  s.values.assign(static_cast<size_t>((a.in_h + 1) * s.row_len), 0.0f);
}

// Stride 2, the common strided case: even and odd input elements split with
// vector de-interleaving loads while whole vectors fit their phases, the rest
// one by one. Element ix goes to phase (ix + pad_left) mod 2, index
// (ix + pad_left) div 2.
void FillStride2Row(const DepthwiseConvArgs& a, const float* row, float* dst, int64_t phase_len) {
  const FloatTag df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  float* even_phase = dst + (a.pad_left % 2) * phase_len;       // where ix = 0, 2, 4, ... go
  float* odd_phase = dst + ((a.pad_left + 1) % 2) * phase_len;  // where ix = 1, 3, 5, ... go
  const int64_t even_start = a.pad_left / 2, odd_start = (a.pad_left + 1) / 2;
  int64_t pairs = 0;  // pairs (ix = 2k, 2k + 1) done
  for (; 2 * (pairs + lanes) <= a.in_w && odd_start + pairs + lanes <= phase_len &&
         even_start + pairs + lanes <= phase_len;
       pairs += lanes) {
    FloatVec even, odd;
    hn::LoadInterleaved2(df, row + 2 * pairs, even, odd);
    hn::StoreU(even, df, even_phase + even_start + pairs);
    hn::StoreU(odd, df, odd_phase + odd_start + pairs);
  }
  for (int64_t ix = 2 * pairs; ix < a.in_w; ++ix) {
    const int64_t padded = ix + a.pad_left;
    if (padded / 2 < phase_len) dst[(padded % 2) * phase_len + padded / 2] = row[ix];
  }
}

// Input row element ix goes to padded position ix + pad_left, that is phase
// (ix + pad_left) mod sW, index (ix + pad_left) div sW, when that index is
// within phase_len (beyond it no output reads).
void FillScratch(const DepthwiseConvArgs& a, const float* plane, PlaneScratch& s) {
  for (int64_t iy = 0; iy < a.in_h; ++iy) {
    const float* row = plane + iy * a.in_w;
    float* dst = s.values.data() + iy * s.row_len;
    if (a.stride_w == 1) {
      const int64_t count = std::max<int64_t>(0, std::min(a.in_w, s.phase_len - a.pad_left));
      if (count > 0) std::copy(row, row + count, dst + a.pad_left);
      continue;
    }
    if (a.stride_w == 2) {
      FillStride2Row(a, row, dst, s.phase_len);
      continue;
    }
    // Phase p takes every sW-th element from the first ix whose padded
    // position falls in it.
    for (int64_t p = 0; p < a.stride_w; ++p) {
      const int64_t first = ((p - a.pad_left) % a.stride_w + a.stride_w) % a.stride_w;
      float* phase = dst + p * s.phase_len;
      int64_t j = (first + a.pad_left) / a.stride_w;
      for (int64_t ix = first; ix < a.in_w && j < s.phase_len; ix += a.stride_w, ++j) phase[j] = row[ix];
    }
  }
}

HWY_INLINE FloatVec Activate(const DepthwiseConvArgs& a, FloatVec v) {
  return ApplyConvActivation(FloatTag(), v, static_cast<ConvActivation>(a.activation), a.clip_min,
                             a.clip_max);
}

// Stores the first `count` (<= lanes) values of v at out, writing nothing past
// them (the next values may be another thread's plane).
HWY_INLINE void StoreFirst(FloatVec v, float* out, int64_t count) {
  const FloatTag df;
  if (count == static_cast<int64_t>(hn::Lanes(df))) {
    hn::StoreU(v, df, out);
    return;
  }
  HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, df, tail);
  std::memcpy(out, tail, static_cast<size_t>(count) * sizeof(float));
}

// The scratch rows under each kernel row for every output row:
// table[oy * kernel_h + ky]. The same for every plane a thread convolves (the
// scratch stays in place), and laid out so that a tile of rows from oy reads
// its rows at table + oy * kernel_h.
void GatherRows(const DepthwiseConvArgs& a, const PlaneScratch& s, std::vector<const float*>& table) {
  table.resize(static_cast<size_t>(a.out_h * a.kernel_h));
  for (int64_t oy = 0; oy < a.out_h; ++oy) {
    for (int64_t ky = 0; ky < a.kernel_h; ++ky) {
      table[oy * a.kernel_h + ky] = s.row(oy * a.stride_h - a.pad_top + ky * a.dilation_h);
    }
  }
}

// A tile of kRows output rows x kVecs vectors from column ox: bias + the
// kernel_h x kernel_w taps, activated, stored up to out_w. The kRows * kVecs
// accumulators are independent FMA chains, which is what keeps the FMA units
// busy (one chain would wait out each FMA's latency). `offsets[kx]` is where
// kernel column kx reads in a scratch row (see PlaneScratch).
template <int kRows, int kVecs>
void ConvolveTile(const DepthwiseConvArgs& a, const float* const* rows, const float* w,
                  const int64_t* offsets, float bias, int64_t ox, float* out) {
  const FloatTag df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  FloatVec acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::Set(df, bias);
  }
  for (int64_t ky = 0; ky < a.kernel_h; ++ky) {
    const float* in[kRows];
    for (int r = 0; r < kRows; ++r) in[r] = rows[r * a.kernel_h + ky] + ox;
    const float* weights = w + ky * a.kernel_w;
    for (int64_t kx = 0; kx < a.kernel_w; ++kx) {
      const FloatVec weight = hn::Set(df, weights[kx]);
      const int64_t offset = offsets[kx];
      for (int r = 0; r < kRows; ++r) {
        for (int v = 0; v < kVecs; ++v) {
          acc[r][v] = hn::MulAdd(weight, hn::LoadU(df, in[r] + offset + v * lanes), acc[r][v]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) {
      const int64_t start = ox + v * lanes;
      StoreFirst(Activate(a, acc[r][v]), out + r * a.out_w + start, std::min(lanes, a.out_w - start));
    }
  }
}

// One output row in tiles of 4 vectors, then the 1-3 vectors left.
void ConvolveRow(const DepthwiseConvArgs& a, const float* const* rows, const float* w, const int64_t* offsets,
                 float bias, int64_t vectors, float* out) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(FloatTag()));
  int64_t v = 0;
  for (; v + 4 <= vectors; v += 4) ConvolveTile<1, 4>(a, rows, w, offsets, bias, v * lanes, out);
  switch (vectors - v) {
    case 3:
      return ConvolveTile<1, 3>(a, rows, w, offsets, bias, v * lanes, out);
    case 2:
      return ConvolveTile<1, 2>(a, rows, w, offsets, bias, v * lanes, out);
    case 1:
      return ConvolveTile<1, 1>(a, rows, w, offsets, bias, v * lanes, out);
    default:
      return;
  }
}

void ConvolvePlane(const DepthwiseConvArgs& a, const std::vector<const float*>& row_table,
                   const int64_t* offsets, int64_t out_channel, float* out) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(FloatTag()));
  const float* w = a.w + out_channel * a.kernel_h * a.kernel_w;
  const float bias = a.bias != nullptr ? a.bias[out_channel] : 0.0f;
  const int64_t vectors = (a.out_w + lanes - 1) / lanes;
  int64_t oy = 0;
  // Rows of at most 3 vectors (late, narrow layers) go 4 or 2 rows at a time,
  // for 4 to 6 independent accumulators.
  if (vectors <= 3) {
    const int tile_rows = vectors == 1 ? 4 : 2;
    for (; oy + tile_rows <= a.out_h; oy += tile_rows) {
      const float* const* rows = row_table.data() + oy * a.kernel_h;
      float* tile_out = out + oy * a.out_w;
      if (vectors == 1) ConvolveTile<4, 1>(a, rows, w, offsets, bias, 0, tile_out);
      if (vectors == 2) ConvolveTile<2, 2>(a, rows, w, offsets, bias, 0, tile_out);
      if (vectors == 3) ConvolveTile<2, 3>(a, rows, w, offsets, bias, 0, tile_out);
    }
  }
  for (; oy < a.out_h; ++oy) {
    ConvolveRow(a, row_table.data() + oy * a.kernel_h, w, offsets, bias, vectors, out + oy * a.out_w);
  }
}

void DepthwiseConvPlanes(const DepthwiseConvArgs& a, int64_t begin, int64_t end) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(FloatTag()));
  // Per thread, reused across calls: no allocation once warmed up.
  thread_local PlaneScratch scratch;
  thread_local std::vector<const float*> row_table;
  PrepareScratch(a, lanes, scratch);
  GatherRows(a, scratch, row_table);
  std::vector<int64_t> offsets(static_cast<size_t>(a.kernel_w));
  for (int64_t kx = 0; kx < a.kernel_w; ++kx) {
    const int64_t reach = kx * a.dilation_w;
    offsets[kx] = (reach % a.stride_w) * scratch.phase_len + reach / a.stride_w;
  }
  const int64_t plane_in = a.in_h * a.in_w, plane_out = a.out_h * a.out_w;
  int64_t filled = -1;  // the input plane now in the scratch
  for (int64_t plane = begin; plane < end; ++plane) {
    const int64_t n = plane / a.out_channels, m = plane % a.out_channels;
    const int64_t input_plane = n * a.channels + m / a.multiplier;
    if (input_plane != filled) {
      FillScratch(a, a.x + input_plane * plane_in, scratch);
      filled = input_plane;
    }
    ConvolvePlane(a, row_table, offsets.data(), m, a.y + plane * plane_out);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/depthwise_conv.h"

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

#include <limits>

namespace transmuter::kernels {

HWY_EXPORT(DepthwiseConvPlanes);


namespace {

// [N, C, D...] -> [N, D..., C]
mx::array channels_last(const mx::array& x, mx::Stream s) {
  std::vector<int> perm = {0};
  for (int i = 2; i < static_cast<int>(x.ndim()); ++i) perm.push_back(i);
  perm.push_back(1);
  return mx::transpose(x, perm, s);
}

// [N, D..., C] -> [N, C, D...]
mx::array channels_first(const mx::array& y, mx::Stream s) {
  std::vector<int> perm = {0, static_cast<int>(y.ndim()) - 1};
  for (int i = 1; i < static_cast<int>(y.ndim()) - 1; ++i) perm.push_back(i);
  return mx::transpose(y, perm, s);
}

}  // namespace

mx::array apply_conv_activation(const mx::array& v, ConvActivation activation, float clip_min, float clip_max,
                                mx::Stream s) {
  const mx::Dtype t = v.dtype();
  switch (activation) {
    case ConvActivation::kRelu:
      return mx::maximum(v, mx::array(0.0f, t), s);
    case ConvActivation::kClip:
      return mx::minimum(mx::maximum(v, mx::array(clip_min, t), s), mx::array(clip_max, t), s);
    case ConvActivation::kHardSwish: {
      mx::array gate = mx::add(mx::multiply(v, mx::array(1.0f / 6.0f, t), s), mx::array(0.5f, t), s);
      return mx::multiply(v, mx::clip(gate, mx::array(0.0f, t), mx::array(1.0f, t), s), s);
    }
    case ConvActivation::kNone:
      break;
  }
  return v;
}

mx::array grouped_conv_reference(const std::vector<mx::array>& in, const DepthwiseConvOptions& o, mx::Stream s) {
  mx::array y = mx::conv_general(channels_last(in[0], s), channels_last(in[1], s), o.strides, o.pads_begin,
                                 o.pads_end, o.dilations, {}, o.groups, false, s);
  y = channels_first(y, s);
  if (in.size() > 2) {
    mx::Shape per_channel(y.ndim() - 1, 1);
    per_channel[0] = y.shape(1);
    y = mx::add(y, mx::reshape(in[2], per_channel, s), s);
  }
  return apply_conv_activation(y, o.activation, o.clip_min, o.clip_max, s);
}

namespace {

class DepthwiseConvKernel : public CpuKernel {
 public:
  DepthwiseConvKernel(mx::Stream stream, Reference reference, DepthwiseConvOptions options)
      : CpuKernel(stream, std::move(reference)), options_(std::move(options)) {}
  const char* name() const override { return "transmuter::DepthwiseConv"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array& x = in[0];
    const mx::array& w = in[1];
    const mx::array& y = out[0];
    DepthwiseConvArgs args{};
    args.x = x.data<float>();
    args.w = w.data<float>();
    args.bias = in.size() > 2 ? in[2].data<float>() : nullptr;
    args.y = out[0].data<float>();
    args.channels = x.shape(1);
    args.out_channels = w.shape(0);
    args.multiplier = args.out_channels / args.channels;
    args.in_h = x.shape(2);
    args.in_w = x.shape(3);
    args.out_h = y.shape(2);
    args.out_w = y.shape(3);
    args.kernel_h = w.shape(2);
    args.kernel_w = w.shape(3);
    args.stride_h = options_.strides[0];
    args.stride_w = options_.strides[1];
    args.dilation_h = options_.dilations[0];
    args.dilation_w = options_.dilations[1];
    args.pad_top = options_.pads_begin[0];
    args.pad_left = options_.pads_begin[1];
    args.activation = static_cast<int>(options_.activation);
    args.clip_min = options_.clip_min;
    args.clip_max = options_.clip_max;
    const int64_t planes = static_cast<int64_t>(x.shape(0)) * args.out_channels;
    return [args, planes] {
      // About 64K multiply-adds a chunk: enough work to pay for waking a thread.
      const int64_t per_plane = std::max<int64_t>(1, args.out_h * args.out_w * args.kernel_h * args.kernel_w);
      const int64_t grain = std::max<int64_t>(1, 65536 / per_plane);
      parallel_for(planes, grain, [&](int64_t begin, int64_t end) {
        HWY_DYNAMIC_DISPATCH(DepthwiseConvPlanes)(args, begin, end);
      });
    };
  }

 private:
  DepthwiseConvOptions options_;
};

// Output length of one spatial axis, or <= 0 when the window does not fit.
int64_t output_length(int64_t in, int64_t k, int stride, int pad_begin, int pad_end, int dilation) {
  const int64_t room = in + pad_begin + pad_end - static_cast<int64_t>(dilation) * (k - 1) - 1;
  return room < 0 ? 0 : room / stride + 1;  // (division truncates toward zero: test the sign first)
}

bool all_positive(const std::vector<int>& v) {
  return std::all_of(v.begin(), v.end(), [](int x) { return x > 0; });
}

bool all_non_negative(const std::vector<int>& v) {
  return std::all_of(v.begin(), v.end(), [](int x) { return x >= 0; });
}

// The kernel's case: float32, 1 or 2 spatial axes, one input channel per
// group, an output size that is a whole multiple of it, non-empty sizes, sane
// window attributes. Anything else goes to the reference (and its errors).
bool kernel_takes(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                  const DepthwiseConvOptions& o) {
  const size_t spatial = x.ndim() - 2;
  if ((x.ndim() != 3 && x.ndim() != 4) || w.ndim() != x.ndim() || x.dtype() != mx::float32 ||
      w.dtype() != mx::float32) {
    return false;
  }
  if (o.strides.size() != spatial || o.dilations.size() != spatial || o.pads_begin.size() != spatial ||
      o.pads_end.size() != spatial || !all_positive(o.strides) || !all_positive(o.dilations) ||
      !all_non_negative(o.pads_begin) || !all_non_negative(o.pads_end)) {
    return false;
  }
  const int channels = x.shape(1);
  if (o.groups != channels || w.shape(1) != 1 || w.shape(0) % channels != 0 || x.size() == 0 ||
      w.size() == 0) {
    return false;
  }
  if (bias && (bias->ndim() != 1 || bias->shape(0) != w.shape(0) || bias->dtype() != mx::float32))
    return false;
  for (size_t i = 0; i < spatial; ++i) {
    // An output length must be positive and an MLX (int32) dimension.
    const int64_t length = output_length(x.shape(2 + i), w.shape(2 + i), o.strides[i], o.pads_begin[i],
                                         o.pads_end[i], o.dilations[i]);
    if (length <= 0 || length > std::numeric_limits<int32_t>::max()) return false;
  }
  return true;
}

// A 1-D problem as a 2-D one of height 1: [N, C, L] -> [N, C, 1, L].
DepthwiseConvOptions with_unit_height(DepthwiseConvOptions o) {
  o.strides.insert(o.strides.begin(), 1);
  o.dilations.insert(o.dilations.begin(), 1);
  o.pads_begin.insert(o.pads_begin.begin(), 0);
  o.pads_end.insert(o.pads_end.begin(), 0);
  return o;
}

mx::array insert_unit_height(const mx::array& a, mx::Stream s) { return mx::expand_dims(a, 2, s); }

}  // namespace

mx::array depthwise_conv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                         const DepthwiseConvOptions& options, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {x, w};
  if (bias) inputs.push_back(*bias);
  if (!kernel_takes(x, w, bias, options)) return grouped_conv_reference(inputs, options, stream);

  const bool one_d = x.ndim() == 3;
  const DepthwiseConvOptions o = one_d ? with_unit_height(options) : options;
  if (one_d) {
    inputs[0] = insert_unit_height(x, stream);
    inputs[1] = insert_unit_height(w, stream);
  }
  const mx::array& x4 = inputs[0];
  const mx::array& w4 = inputs[1];
  mx::Shape out_shape = {x4.shape(0), w4.shape(0)};
  for (int i = 0; i < 2; ++i) {
    out_shape.push_back(static_cast<int>(output_length(x4.shape(2 + i), w4.shape(2 + i), o.strides[i],
                                                       o.pads_begin[i], o.pads_end[i], o.dilations[i])));
  }
  Reference reference = [o, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{grouped_conv_reference(in, o, stream)};
  };
  mx::array y = make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<DepthwiseConvKernel>(kernel_stream, reference, o);
      },
      reference, inputs, {out_shape}, {mx::float32}, stream)[0];
  return one_d ? mx::squeeze(y, 2, stream) : y;
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
