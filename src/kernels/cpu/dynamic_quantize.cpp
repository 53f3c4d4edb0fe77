// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); dynamic_quantize_linear picks the best target at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/dynamic_quantize.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The smallest and largest of x[0, n) folded into *low and *high.
void RangeOf(const float* x, int64_t n, float* low, float* high) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto lo = hn::Set(d, *low), hi = hn::Set(d, *high);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    lo = hn::Min(lo, v);
    hi = hn::Max(hi, v);
  }
  float l = hn::GetLane(hn::MinOfLanes(d, lo)), h = hn::GetLane(hn::MaxOfLanes(d, hi));
  for (; i < n; ++i) {
    l = std::min(l, x[i]);
    h = std::max(h, x[i]);
  }
  *low = l;
  *high = h;
}

// y[i] = clip(round(x[i] / scale) + zero, 0, 255) for i in [0, n).
void QuantizeRange(const float* x, int64_t n, float scale, int32_t zero, uint8_t* y) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(di)> du8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, scale);
  const auto z = hn::Set(di, zero), top = hn::Set(di, 255), bottom = hn::Zero(di);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    // NearestInt: the current rounding mode, nearest-even as the composition's round; |x / scale| <= 255.
    const auto q = hn::Add(hn::NearestInt(hn::Div(hn::LoadU(d, x + i), s)), z);
    hn::StoreU(hn::DemoteTo(du8, hn::Min(hn::Max(q, bottom), top)), du8, y + i);
  }
  for (; i < n; ++i) {
    const float q = std::nearbyint(x[i] / scale) + static_cast<float>(zero);
    y[i] = static_cast<uint8_t>(std::clamp(q, 0.0f, 255.0f));
  }
}

// y[i] = (clip(round(x[i] / scale) + zero, low, high) - zero) * scale for i in [0, n), in float32.
void QuantizeDequantizeRange(const float* x, int64_t n, float scale, float zero, float low, float high, float* y) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, scale), z = hn::Set(d, zero), lo = hn::Set(d, low), hi = hn::Set(d, high);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    // Round: to nearest, ties to even (the composition's mx::round), in float: no integer overflow for
    // quotients far outside the range, which the clip then saturates.
    const auto q = hn::Min(hn::Max(hn::Add(hn::Round(hn::Div(hn::LoadU(d, x + i), s)), z), lo), hi);
    hn::StoreU(hn::Mul(hn::Sub(q, z), s), d, y + i);
  }
  for (; i < n; ++i) {
    const float q = std::clamp(std::nearbyint(x[i] / scale) + zero, low, high);
    y[i] = (q - zero) * scale;
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/dynamic_quantize.h"

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(RangeOf);
HWY_EXPORT(QuantizeRange);
HWY_EXPORT(QuantizeDequantizeRange);

namespace {

// Elements per task of each pass (a few per thread for tensors of activations' size).
constexpr int64_t kChunk = 1 << 14;

class DynamicQuantizeKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "transmuter::DynamicQuantizeLinear"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* x = in[0].data<float>();
    const int64_t n = static_cast<int64_t>(in[0].size());
    uint8_t* y = out[0].data<uint8_t>();
    float* scale_out = out[1].data<float>();
    uint8_t* zero_out = out[2].data<uint8_t>();
    return [x, n, y, scale_out, zero_out] {
      const int64_t chunks = (n + kChunk - 1) / kChunk;
      std::vector<float> lows(static_cast<size_t>(chunks), 0.0f), highs(static_cast<size_t>(chunks), 0.0f);
      parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          // Starting from 0 folds the range's min(., 0) and max(., 0) in.
          HWY_DYNAMIC_DISPATCH(RangeOf)(x + c * kChunk, std::min(kChunk, n - c * kChunk), &lows[c], &highs[c]);
        }
      });
      const float low = *std::min_element(lows.begin(), lows.end());
      const float high = *std::max_element(highs.begin(), highs.end());
      const float range = high - low == 0.0f ? 1.0f : high - low;
      const float scale = range / 255.0f;
      const float zero = std::nearbyint(std::clamp(-(low / scale), 0.0f, 255.0f));
      *scale_out = scale;
      *zero_out = static_cast<uint8_t>(zero);
      parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          HWY_DYNAMIC_DISPATCH(QuantizeRange)
          (x + c * kChunk, std::min(kChunk, n - c * kChunk), scale, static_cast<int32_t>(zero), y + c * kChunk);
        }
      });
    };
  }
};

// quantize_dequantize's kernel: inputs x, scale, zero (the scalars read in the task, where they are computed).
class QuantizeDequantizeKernel : public CpuKernel {
 public:
  QuantizeDequantizeKernel(mx::Stream stream, Reference reference, float low, float high)
      : CpuKernel(stream, std::move(reference)), low_(low), high_(high) {}
  const char* name() const override { return "transmuter::QuantizeDequantize"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const QuantizeDequantizeKernel*>(&other);
    return o != nullptr && o->low_ == low_ && o->high_ == high_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* x = in[0].data<float>();
    const float* scale = in[1].data<float>();
    const float* zero = in[2].data<float>();
    const int64_t n = static_cast<int64_t>(in[0].size());
    float* y = out[0].data<float>();
    return [x, scale, zero, n, y, low = low_, high = high_] {
      const float s = *scale, z = *zero;
      parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          HWY_DYNAMIC_DISPATCH(QuantizeDequantizeRange)
          (x + c * kChunk, std::min(kChunk, n - c * kChunk), s, z, low, high, y + c * kChunk);
        }
      });
    };
  }

 private:
  float low_, high_;
};

mx::array quantize_dequantize_reference(const mx::array& x, const mx::array& scale, const mx::array& zero, float low,
                                        float high, mx::StreamOrDevice s) {
  mx::array q = mx::add(mx::round(mx::divide(x, scale, s), 0, s), zero, s);
  q = mx::clip(q, mx::array(low), mx::array(high), s);
  return mx::multiply(mx::subtract(q, zero, s), scale, s);
}

}  // namespace

mx::array quantize_dequantize(const mx::array& x, const mx::array& scale, const mx::array& zero, float low,
                              float high, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [low, high, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{quantize_dequantize_reference(in[0], in[1], in[2], low, high, stream)};
  };
  const bool scalars = scale.size() == 1 && zero.size() == 1 && scale.dtype() == mx::float32 &&
                       zero.dtype() == mx::float32;
  if (!is_cpu_stream(stream) || x.dtype() != mx::float32 || x.size() == 0 || !scalars)
    return reference({x, scale, zero})[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<QuantizeDequantizeKernel>(kernel_stream, reference, low, high);
      },
      reference, {x, mx::reshape(scale, {}, stream), mx::reshape(zero, {}, stream)}, {x.shape()}, {mx::float32},
      stream)[0];
}

std::vector<mx::array> dynamic_quantize_linear_reference(const mx::array& x, mx::StreamOrDevice s) {
  const mx::array zero(0.0f);
  mx::array high = mx::maximum(mx::max(x, s), zero, s);
  mx::array low = mx::minimum(mx::min(x, s), zero, s);
  mx::array range = mx::subtract(high, low, s);
  range = mx::where(mx::equal(range, zero, s), mx::array(1.0f), range, s);
  mx::array scale = mx::divide(range, mx::array(255.0f), s);
  mx::array zero_point =
      mx::round(mx::clip(mx::negative(mx::divide(low, scale, s), s), zero, mx::array(255.0f), s), 0, s);
  mx::array y = mx::add(mx::round(mx::divide(x, scale, s), 0, s), zero_point, s);
  y = mx::clip(y, zero, mx::array(255.0f), s);
  return {mx::astype(y, mx::uint8, s), scale, mx::astype(zero_point, mx::uint8, s)};
}

std::vector<mx::array> dynamic_quantize_linear(const mx::array& x, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [stream](const std::vector<mx::array>& in) {
    return dynamic_quantize_linear_reference(in[0], stream);
  };
  if (!is_cpu_stream(stream) || x.dtype() != mx::float32 || x.size() == 0) return reference({x});
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<DynamicQuantizeKernel>(kernel_stream, reference); },
      reference, {x}, {x.shape(), {}, {}}, {mx::uint8, mx::float32, mx::uint8}, stream);
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
