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

// Values of ConvActivation (the enum is declared in the header, included below
// HWY_ONCE only); checked against it there.
constexpr int kActivationNone = 0, kActivationRelu = 1, kActivationClip = 2, kActivationHardSwish = 3;

// The scratch copy of one input plane: for every input row, stride_w phases of
// phase_len values each, phase p holding padded-row elements p, p + sW,
// p + 2 sW, ... (the padded row is the input row with pad_left zeros before
// and zeros after). Output element ox under kernel column kx then reads phase
// (kx dW) mod sW at position ox + (kx dW) div sW: contiguous for every stride.
// phase_len leaves room for whole vectors past the last output (zeros).
struct PlaneScratch {
  int64_t phase_len = 0;
  int64_t row_len = 0;  // stride_w * phase_len
  std::vector<float> values;
};

int64_t RoundUp(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

void SizeScratch(const DepthwiseConvArgs& a, int64_t lanes, PlaneScratch& s) {
  s.phase_len = RoundUp(a.out_w, lanes) + (a.kernel_w - 1) * a.dilation_w / a.stride_w + 1;
  s.row_len = a.stride_w * s.phase_len;
  s.values.resize(static_cast<size_t>(a.in_h * s.row_len));
}

void FillScratch(const DepthwiseConvArgs& a, const float* plane, PlaneScratch& s) {
  for (int64_t iy = 0; iy < a.in_h; ++iy) {
    const float* row = plane + iy * a.in_w;
    float* dst = s.values.data() + iy * s.row_len;
    if (a.stride_w == 1) {
      // Padded position i holds row[i - pad_left]: zeros, the row, zeros.
      const int64_t lo = std::min(a.pad_left, s.phase_len);
      const int64_t hi = std::min(a.pad_left + a.in_w, s.phase_len);
      std::fill(dst, dst + lo, 0.0f);
      std::memcpy(dst + lo, row, static_cast<size_t>(hi - lo) * sizeof(float));
      std::fill(dst + hi, dst + s.phase_len, 0.0f);
      continue;
    }
    for (int64_t p = 0; p < a.stride_w; ++p) {
      float* phase = dst + p * s.phase_len;
      for (int64_t j = 0; j < s.phase_len; ++j) {
        const int64_t ix = p + j * a.stride_w - a.pad_left;
        phase[j] = ix >= 0 && ix < a.in_w ? row[ix] : 0.0f;
      }
    }
  }
}

FloatVec Activate(const DepthwiseConvArgs& a, FloatVec v) {
  const FloatTag df;
  switch (a.activation) {
    case kActivationRelu:
      return hn::Max(v, hn::Zero(df));
    case kActivationClip:
      return hn::Min(hn::Max(v, hn::Set(df, a.clip_min)), hn::Set(df, a.clip_max));
    case kActivationHardSwish: {
      const FloatVec gate = hn::MulAdd(v, hn::Set(df, 1.0f / 6.0f), hn::Set(df, 0.5f));
      return hn::Mul(v, hn::Min(hn::Max(gate, hn::Zero(df)), hn::Set(df, 1.0f)));
    }
    default:
      return v;
  }
}

// Stores the first `count` (<= lanes) values of v at out, writing nothing past them.
void StoreFirst(FloatVec v, float* out, int64_t count) {
  const FloatTag df;
  if (count == static_cast<int64_t>(hn::Lanes(df))) {
    hn::StoreU(v, df, out);
    return;
  }
  HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, df, tail);
  std::memcpy(out, tail, static_cast<size_t>(count) * sizeof(float));
}

// The kernel rows that land inside the input for output row oy: scratch rows
// and the matching weight rows.
struct RowTaps {
  std::vector<const float*> input;
  std::vector<const float*> weights;
};

void CollectRowTaps(const DepthwiseConvArgs& a, const PlaneScratch& s, const float* w, int64_t oy,
                    RowTaps& taps) {
  taps.input.clear();
  taps.weights.clear();
  for (int64_t ky = 0; ky < a.kernel_h; ++ky) {
    const int64_t iy = oy * a.stride_h - a.pad_top + ky * a.dilation_h;
    if (iy < 0 || iy >= a.in_h) continue;
    taps.input.push_back(s.values.data() + iy * s.row_len);
    taps.weights.push_back(w + ky * a.kernel_w);
  }
}

// kBlock vectors of outputs starting at ox: bias + sum over the taps, activated,
// stored (the last block only up to out_w). `offsets[kx]` is where kernel
// column kx reads in a scratch row (see PlaneScratch).
template <int kBlock>
void ConvolveBlock(const DepthwiseConvArgs& a, const RowTaps& taps, const int64_t* offsets, float bias,
                   int64_t ox, float* out_row) {
  const FloatTag df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  FloatVec acc[kBlock];
  for (int b = 0; b < kBlock; ++b) acc[b] = hn::Set(df, bias);
  for (size_t r = 0; r < taps.input.size(); ++r) {
    const float* in = taps.input[r] + ox;
    const float* wr = taps.weights[r];
    for (int64_t kx = 0; kx < a.kernel_w; ++kx) {
      const FloatVec weight = hn::Set(df, wr[kx]);
      const float* src = in + offsets[kx];
      for (int b = 0; b < kBlock; ++b) acc[b] = hn::MulAdd(weight, hn::LoadU(df, src + b * lanes), acc[b]);
    }
  }
  for (int b = 0; b < kBlock; ++b) {
    const int64_t start = ox + b * lanes;
    if (start >= a.out_w) break;
    StoreFirst(Activate(a, acc[b]), out_row + start, std::min(lanes, a.out_w - start));
  }
}

void ConvolvePlane(const DepthwiseConvArgs& a, const PlaneScratch& s, const int64_t* offsets,
                   int64_t out_channel, float* out, RowTaps& taps) {
  const FloatTag df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const float* w = a.w + out_channel * a.kernel_h * a.kernel_w;
  const float bias = a.bias != nullptr ? a.bias[out_channel] : 0.0f;
  // Four vectors at a time keep four independent FMA chains in flight.
  constexpr int kWide = 4;
  for (int64_t oy = 0; oy < a.out_h; ++oy) {
    CollectRowTaps(a, s, w, oy, taps);
    float* out_row = out + oy * a.out_w;
    int64_t ox = 0;
    for (; ox + kWide * lanes <= a.out_w; ox += kWide * lanes)
      ConvolveBlock<kWide>(a, taps, offsets, bias, ox, out_row);
    for (; ox < a.out_w; ox += lanes) ConvolveBlock<1>(a, taps, offsets, bias, ox, out_row);
  }
}

void DepthwiseConvPlanes(const DepthwiseConvArgs& a, int64_t begin, int64_t end) {
  const FloatTag df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  // Per thread, reused across calls: no allocation once warmed up.
  thread_local PlaneScratch scratch;
  thread_local RowTaps taps;
  SizeScratch(a, lanes, scratch);
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
    ConvolvePlane(a, scratch, offsets.data(), m, a.y + plane * plane_out, taps);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/depthwise_conv.h"

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(DepthwiseConvPlanes);

static_assert(static_cast<int>(ConvActivation::kNone) == HWY_NAMESPACE::kActivationNone &&
              static_cast<int>(ConvActivation::kRelu) == HWY_NAMESPACE::kActivationRelu &&
              static_cast<int>(ConvActivation::kClip) == HWY_NAMESPACE::kActivationClip &&
              static_cast<int>(ConvActivation::kHardSwish) == HWY_NAMESPACE::kActivationHardSwish);

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

mx::array activate(const mx::array& v, const DepthwiseConvOptions& o, mx::Stream s) {
  const mx::Dtype t = v.dtype();
  switch (o.activation) {
    case ConvActivation::kRelu:
      return mx::maximum(v, mx::array(0.0f, t), s);
    case ConvActivation::kClip:
      return mx::minimum(mx::maximum(v, mx::array(o.clip_min, t), s), mx::array(o.clip_max, t), s);
    case ConvActivation::kHardSwish: {
      mx::array gate = mx::add(mx::multiply(v, mx::array(1.0f / 6.0f, t), s), mx::array(0.5f, t), s);
      return mx::multiply(v, mx::clip(gate, mx::array(0.0f, t), mx::array(1.0f, t), s), s);
    }
    case ConvActivation::kNone:
      break;
  }
  return v;
}

// The composition the kernel replaces; inputs {x, w[, bias]} in ONNX layout.
mx::array depthwise_reference(const std::vector<mx::array>& in, const DepthwiseConvOptions& o, mx::Stream s) {
  mx::array y = mx::conv_general(channels_last(in[0], s), channels_last(in[1], s), o.strides, o.pads_begin,
                                 o.pads_end, o.dilations, {}, o.groups, false, s);
  y = channels_first(y, s);
  if (in.size() > 2) {
    mx::Shape per_channel(y.ndim() - 1, 1);
    per_channel[0] = y.shape(1);
    y = mx::add(y, mx::reshape(in[2], per_channel, s), s);
  }
  return activate(y, o, s);
}

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
  return (in + pad_begin + pad_end - static_cast<int64_t>(dilation) * (k - 1) - 1) / stride + 1;
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
    if (output_length(x.shape(2 + i), w.shape(2 + i), o.strides[i], o.pads_begin[i], o.pads_end[i],
                      o.dilations[i]) <= 0) {
      return false;
    }
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
  if (!kernel_takes(x, w, bias, options)) return depthwise_reference(inputs, options, stream);

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
    return std::vector<mx::array>{depthwise_reference(in, o, stream)};
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
