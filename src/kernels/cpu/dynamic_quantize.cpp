// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); dynamic_quantize_linear picks the best target at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/dynamic_quantize.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
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
void QuantizeDequantizeRange(const float* x, int64_t n, float scale, float zero, float low, float high,
                             float* y) {
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

// y[i] = clip(round(x[i] / scale) + zero, low, high) for i in [0, n), as bytes (int8 when is_signed): in
// float until the clip, so quotients far outside the range saturate instead of overflowing an integer.
void QuantizePerTensorRange(const float* x, int64_t n, float scale, float zero, float low, float high,
                            bool is_signed, uint8_t* y) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(di)> du8;
  const hn::Rebind<int8_t, decltype(di)> di8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, scale), z = hn::Set(d, zero), lo = hn::Set(d, low), hi = hn::Set(d, high);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto q =
        hn::ConvertTo(di, hn::Min(hn::Max(hn::Add(hn::Round(hn::Div(hn::LoadU(d, x + i), s)), z), lo), hi));
    if (is_signed) {
      hn::StoreU(hn::DemoteTo(di8, q), di8, reinterpret_cast<int8_t*>(y + i));
    } else {
      hn::StoreU(hn::DemoteTo(du8, q), du8, y + i);
    }
  }
  for (; i < n; ++i) {
    const auto q = static_cast<int32_t>(std::clamp(std::nearbyint(x[i] / scale) + zero, low, high));
    y[i] = static_cast<uint8_t>(q);  // two's complement bytes for int8
  }
}

// y[i] = (float(x[i]) - zero) * scale for i in [0, n), x uint8 or int8.
template <typename T>
void DequantizeRangeOf(const T* x, int64_t n, float scale, float zero, float* y) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<T, decltype(di)> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, scale), z = hn::Set(d, zero);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::Mul(hn::Sub(hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, x + i))), z), s), d, y + i);
  for (; i < n; ++i) y[i] = (static_cast<float>(x[i]) - zero) * scale;
}

void DequantizeRange(const void* x, bool is_signed, int64_t n, float scale, float zero, float* y) {
  if (is_signed) {
    DequantizeRangeOf(static_cast<const int8_t*>(x), n, scale, zero, y);
  } else {
    DequantizeRangeOf(static_cast<const uint8_t*>(x), n, scale, zero, y);
  }
}

// y = saturate(round(v * m) + zero) for `rows` rows of `c` values, m one value (m_count 1) or c of them.
// y = saturate(round(v * m) + zero) as T; with `dequantized`, (that integer - dq_zero) * dq_scale as float32
// instead (the DequantizeLinear that reads it), the integer never stored.
template <typename T, bool kDequantize>
void RequantizeRowsOf(const float* v, int64_t rows, int64_t c, const float* m, int64_t m_count, float zero,
                      float dq_scale, float dq_zero, void* y_out) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<T, decltype(di)> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float low = static_cast<float>(std::numeric_limits<T>::min());
  const float high = static_cast<float>(std::numeric_limits<T>::max());
  const auto z = hn::Set(d, zero), lo = hn::Set(d, low), hi = hn::Set(d, high);
  const auto dz = hn::Set(d, dq_zero), ds = hn::Set(d, dq_scale);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = v + r * c;
    int64_t j = 0;
    for (; j + lanes <= c; j += lanes) {
      const auto mv = m_count == 1 ? hn::Set(d, m[0]) : hn::LoadU(d, m + j);
      // Round in float (ties to even, no integer overflow), clip, then the exact integer conversion.
      const auto q = hn::Min(hn::Max(hn::Add(hn::Round(hn::Mul(hn::LoadU(d, row + j), mv)), z), lo), hi);
      if constexpr (kDequantize) {
        hn::StoreU(hn::Mul(hn::Sub(q, dz), ds), d, static_cast<float*>(y_out) + r * c + j);
      } else {
        hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, q)), d8, static_cast<T*>(y_out) + r * c + j);
      }
    }
    for (; j < c; ++j) {
      const float q = std::clamp(std::nearbyint(row[j] * m[m_count == 1 ? 0 : j]) + zero, low, high);
      if constexpr (kDequantize) {
        static_cast<float*>(y_out)[r * c + j] = (q - dq_zero) * dq_scale;
      } else {
        static_cast<T*>(y_out)[r * c + j] = static_cast<T>(q);
      }
    }
  }
}

void RequantizeRows(const float* v, int64_t rows, int64_t c, const float* m, int64_t m_count, float zero,
                    bool is_signed, const float* dequantize, void* y) {
  if (dequantize != nullptr) {  // {scale, zero point} of the DequantizeLinear that reads the integers
    if (is_signed)
      return RequantizeRowsOf<int8_t, true>(v, rows, c, m, m_count, zero, dequantize[0], dequantize[1], y);
    return RequantizeRowsOf<uint8_t, true>(v, rows, c, m, m_count, zero, dequantize[0], dequantize[1], y);
  }
  if (is_signed) return RequantizeRowsOf<int8_t, false>(v, rows, c, m, m_count, zero, 0, 0, y);
  RequantizeRowsOf<uint8_t, false>(v, rows, c, m, m_count, zero, 0, 0, y);
}

// QLinearAdd over n elements: y = saturate(round(fma(a, ra, fma(b, rb, fixed)))), the float32 fused
// multiply-adds of ONNX Runtime's kernel (each rounded once), round half to even. Targets without FMA
// instructions take the scalar std::fma, exact too.
template <typename T>
void QLinearAddRangeOf(const T* a, const T* b, int64_t n, float ra, float rb, float fixed, T* y) {
  const float low = static_cast<float>(std::numeric_limits<T>::min());
  const float high = static_cast<float>(std::numeric_limits<T>::max());
  int64_t j = 0;
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<T, decltype(di)> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, ra), vb = hn::Set(d, rb), vfixed = hn::Set(d, fixed);
  const auto lo = hn::Set(d, low), hi = hn::Set(d, high);
  for (; j + lanes <= n; j += lanes) {
    const auto av = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, a + j)));
    const auto bv = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, b + j)));
    const auto q = hn::Min(hn::Max(hn::Round(hn::MulAdd(av, va, hn::MulAdd(bv, vb, vfixed))), lo), hi);
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, q)), d8, y + j);
  }
#endif
  for (; j < n; ++j) {
    const float sum = std::fma(static_cast<float>(a[j]), ra, std::fma(static_cast<float>(b[j]), rb, fixed));
    y[j] = static_cast<T>(std::clamp(std::nearbyint(sum), low, high));
  }
}

void QLinearAddRange(const void* a, const void* b, int64_t n, float ra, float rb, float fixed, bool is_signed,
                     void* y) {
  if (is_signed) {
    QLinearAddRangeOf(static_cast<const int8_t*>(a), static_cast<const int8_t*>(b), n, ra, rb, fixed,
                      static_cast<int8_t*>(y));
  } else {
    QLinearAddRangeOf(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), n, ra, rb, fixed,
                      static_cast<uint8_t*>(y));
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
HWY_EXPORT(QuantizePerTensorRange);
HWY_EXPORT(DequantizeRange);
HWY_EXPORT(RequantizeRows);
HWY_EXPORT(QLinearAddRange);

namespace {

// Elements per task of each pass (a few per thread for tensors of activations' size).
constexpr int64_t kChunk = 1 << 14;

// body(c, first, count) for each chunk c of kChunk elements of [0, n) (the last may be shorter), split
// between the kernel threads.
template <typename Body>
void for_each_chunk(int64_t n, const Body& body) {
  parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) body(c, c * kChunk, std::min(kChunk, n - c * kChunk));
  });
}

class DynamicQuantizeKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "transmuter::DynamicQuantizeLinear"; }
  // No parameters: two quantizations of one input are the same (MLX's compile may merge equivalent
  // primitives over the same inputs).
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const DynamicQuantizeKernel*>(&other) != nullptr;
  }

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
      for_each_chunk(n, [&](int64_t c, int64_t first, int64_t count) {
        // Starting from 0 folds the range's min(., 0) and max(., 0) in.
        HWY_DYNAMIC_DISPATCH(RangeOf)(x + first, count, &lows[c], &highs[c]);
      });
      const float low = *std::min_element(lows.begin(), lows.end());
      const float high = *std::max_element(highs.begin(), highs.end());
      const float range = high - low == 0.0f ? 1.0f : high - low;
      const float scale = range / 255.0f;
      const float zero = std::nearbyint(std::clamp(-(low / scale), 0.0f, 255.0f));
      *scale_out = scale;
      *zero_out = static_cast<uint8_t>(zero);
      for_each_chunk(n, [&](int64_t, int64_t first, int64_t count) {
        HWY_DYNAMIC_DISPATCH(QuantizeRange)(x + first, count, scale, static_cast<int32_t>(zero), y + first);
      });
    };
  }
};

// quantize_dequantize's kernel: inputs x, scale, zero (the scalars read in the task, where they are
// computed).
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
  // In place when nothing else holds x (each element is read before its result is written): a convolution's
  // output of several MiB is then rounded where it lies instead of into a cold new buffer.
  int donor_of(size_t) const override { return 0; }

  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* x = in[0].data<float>();
    const float* scale = in[1].data<float>();
    const float* zero = in[2].data<float>();
    const int64_t n = static_cast<int64_t>(in[0].size());
    float* y = out[0].data<float>();
    return [x, scale, zero, n, y, low = low_, high = high_] {
      const float s = *scale, z = *zero;
      for_each_chunk(n, [&](int64_t, int64_t first, int64_t count) {
        HWY_DYNAMIC_DISPATCH(QuantizeDequantizeRange)(x + first, count, s, z, low, high, y + first);
      });
    };
  }

 private:
  float low_, high_;
};

// quantize_per_tensor's kernel: inputs x, scale, zero (float32 scalars, read in the task).
class QuantizeKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "transmuter::QuantizePerTensor"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const QuantizeKernel*>(&other) != nullptr;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* x = in[0].data<float>();
    const float* scale = in[1].data<float>();
    const float* zero = in[2].data<float>();
    const int64_t n = static_cast<int64_t>(in[0].size());
    const bool is_signed = out[0].dtype() == mx::int8;
    auto* y = static_cast<uint8_t*>(static_cast<void*>(out[0].data<uint8_t>()));
    return [x, scale, zero, n, is_signed, y] {
      const float s = *scale, z = *zero;
      const float low = is_signed ? -128.0f : 0.0f, high = is_signed ? 127.0f : 255.0f;
      for_each_chunk(n, [&](int64_t, int64_t first, int64_t count) {
        HWY_DYNAMIC_DISPATCH(QuantizePerTensorRange)(x + first, count, s, z, low, high, is_signed, y + first);
      });
    };
  }
};

mx::array quantize_dequantize_reference(const mx::array& x, const mx::array& scale, const mx::array& zero,
                                        float low, float high, mx::StreamOrDevice s) {
  mx::array q = mx::add(mx::round(mx::divide(x, scale, s), 0, s), zero, s);
  q = mx::clip(q, mx::array(low), mx::array(high), s);
  return mx::multiply(mx::subtract(q, zero, s), scale, s);
}

class DequantizeKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "transmuter::DequantizePerTensor"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const DequantizeKernel*>(&other) != nullptr;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const void* x = in[0].data<void>();
    const bool is_signed = in[0].dtype() == mx::int8;
    const float* scale = in[1].data<float>();
    const float* zero = in[2].data<float>();
    const int64_t n = static_cast<int64_t>(in[0].size());
    float* y = out[0].data<float>();
    return [x, is_signed, scale, zero, n, y] {
      const float s = *scale, z = *zero;
      const size_t width = is_signed ? sizeof(int8_t) : sizeof(uint8_t);
      for_each_chunk(n, [&](int64_t, int64_t first, int64_t count) {
        HWY_DYNAMIC_DISPATCH(DequantizeRange)
        (static_cast<const char*>(x) + first * width, is_signed, count, s, z, y + first);
      });
    };
  }
};

// inputs: v, multiplier, zero [, dequantize's scale, zero]; with the last two the output is float32.
class RequantizeKernel : public CpuKernel {
 public:
  RequantizeKernel(mx::Stream stream, Reference reference, bool is_signed)
      : CpuKernel(stream, std::move(reference)), is_signed_(is_signed) {}
  const char* name() const override { return "transmuter::Requantize"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const RequantizeKernel*>(&other);
    return o != nullptr && o->is_signed_ == is_signed_;
  }

 protected:
  // The dequantized float32 output takes V's buffer when nothing else holds V (elementwise, read first).
  int donor_of(size_t) const override { return 0; }

  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* v = in[0].data<float>();
    const float* m = in[1].data<float>();
    const int64_t m_count = static_cast<int64_t>(in[1].size());
    const float* zero = in[2].data<float>();
    const float* dq_scale = in.size() > 3 ? in[3].data<float>() : nullptr;
    const float* dq_zero = in.size() > 3 ? in[4].data<float>() : nullptr;
    const int64_t c = in[0].shape(-1);
    const int64_t rows = c == 0 ? 0 : static_cast<int64_t>(in[0].size()) / c;
    const size_t out_bytes = out[0].itemsize();
    void* y = out[0].data<void>();
    return [v, m, m_count, zero, dq_scale, dq_zero, c, rows, is_signed = is_signed_, out_bytes, y] {
      const float z = *zero;
      const float dequantize[2] = {dq_scale != nullptr ? *dq_scale : 0.0f,
                                   dq_zero != nullptr ? *dq_zero : 0.0f};
      const int64_t grain = std::max<int64_t>(1, kChunk / std::max<int64_t>(c, 1));
      parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
        HWY_DYNAMIC_DISPATCH(RequantizeRows)
        (v + begin * c, end - begin, c, m, m_count, z, is_signed, dq_scale != nullptr ? dequantize : nullptr,
         static_cast<char*>(y) + begin * c * static_cast<int64_t>(out_bytes));
      });
    };
  }

 private:
  bool is_signed_;
};

mx::array requantize_reference(const mx::array& v, const mx::array& multiplier, const mx::array& zero,
                               mx::Dtype type, mx::StreamOrDevice s) {
  const bool is_signed = type == mx::int8;
  mx::array q = mx::add(mx::round(mx::multiply(v, multiplier, s), 0, s), zero, s);
  q = mx::clip(q, mx::array(is_signed ? -128.0f : 0.0f), mx::array(is_signed ? 127.0f : 255.0f), s);
  return mx::astype(q, type, s);
}

class QLinearAddKernel : public CpuKernel {
 public:
  QLinearAddKernel(mx::Stream stream, Reference reference, QLinearAddRatios ratios)
      : CpuKernel(stream, std::move(reference)), ratios_(ratios) {}
  const char* name() const override { return "transmuter::QLinearAdd"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const QLinearAddKernel*>(&other);
    return o != nullptr && o->ratios_ == ratios_;
  }

 protected:
  // In place when nothing else holds A (elementwise: each element read before its result is written).
  int donor_of(size_t) const override { return 0; }

  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const char* a = in[0].data<char>();
    const char* b = in[1].data<char>();
    const int64_t n = static_cast<int64_t>(in[0].size());
    const bool is_signed = out[0].dtype() == mx::int8;
    char* y = out[0].data<char>();
    return [a, b, n, is_signed, y, r = ratios_] {
      parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
        const int64_t first = begin * kChunk, count = std::min(end * kChunk, n) - first;
        HWY_DYNAMIC_DISPATCH(QLinearAddRange)(a + first, b + first, count, r.a, r.b, r.fixed, is_signed,
                                              y + first);
      });
    };
  }

 private:
  QLinearAddRatios ratios_;
};

// Each image's channel sums in int32 (a loop over positions the compiler vectorizes), then the
// requantization of the reference, in its float32 order.
class QLinearGlobalAverageKernel : public CpuKernel {
 public:
  QLinearGlobalAverageKernel(mx::Stream stream, Reference reference, QGlobalAverage q)
      : CpuKernel(stream, std::move(reference)), q_(q) {}
  const char* name() const override { return "transmuter::QLinearGlobalAverageNhwc"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const QLinearGlobalAverageKernel*>(&other);
    return o != nullptr && o->q_ == q_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array& x = in[0];
    const int64_t batch = x.shape(0), channels = x.shape(-1);
    const int64_t positions = static_cast<int64_t>(x.size()) / (batch * channels);
    const bool is_signed = x.dtype() == mx::int8;
    return
        [x = x.data<uint8_t>(), y = out[0].data<uint8_t>(), batch, positions, channels, is_signed, q = q_] {
          std::vector<uint32_t> sums(static_cast<size_t>(channels));
          for (int64_t n = 0; n < batch; ++n) {
            const uint8_t* image = x + n * positions * channels;
            if (is_signed) {
              sum_positions(reinterpret_cast<const int8_t*>(image), positions, channels, sums.data());
            } else {
              sum_positions(image, positions, channels, sums.data());
            }
            requantize_sums(sums.data(), channels, positions, q, is_signed, y + n * channels);
          }
        };
  }

 private:
  // Sums in 32 bits that wrap as the reference's int32 sums do (2^24 positions of 255 pass 2^31).
  template <typename Byte>
  static void sum_positions(const Byte* image, int64_t positions, int64_t channels, uint32_t* sums) {
    std::fill(sums, sums + channels, 0u);
    for (int64_t p = 0; p < positions; ++p) {
      const Byte* row = image + p * channels;
      for (int64_t c = 0; c < channels; ++c) sums[c] += static_cast<uint32_t>(static_cast<int32_t>(row[c]));
    }
  }

  static void requantize_sums(const uint32_t* sums, int64_t channels, int64_t positions, QGlobalAverage q,
                              bool is_signed, uint8_t* y) {
    const auto centering = static_cast<uint32_t>(static_cast<int32_t>(q.x_zero * positions));
    const float low = is_signed ? -128.0f : 0.0f, high = is_signed ? 127.0f : 255.0f;
    for (int64_t c = 0; c < channels; ++c) {
      const float v = static_cast<float>(static_cast<int32_t>(sums[c] - centering)) * q.scale;
      const float r = std::clamp(std::nearbyint(v) + static_cast<float>(q.y_zero), low, high);
      y[c] = is_signed ? static_cast<uint8_t>(static_cast<int8_t>(r)) : static_cast<uint8_t>(r);
    }
  }

  QGlobalAverage q_;
};

}  // namespace

void qlinear_add_bytes(const void* a, const void* b, int64_t n, QLinearAddRatios r, bool is_signed, void* y) {
  HWY_DYNAMIC_DISPATCH(QLinearAddRange)(a, b, n, r.a, r.b, r.fixed, is_signed, y);
}

mx::array qlinear_global_average_nhwc(const mx::array& x, QGlobalAverage q, const Reference& reference,
                                      mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  const bool fits = is_cpu_stream(stream) && (x.dtype() == mx::uint8 || x.dtype() == mx::int8) &&
                    x.ndim() >= 3 && x.size() > 0;
  if (!fits) return reference({x})[0];
  mx::Shape shape(x.ndim(), 1);
  shape.front() = x.shape(0);
  shape.back() = x.shape(-1);
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<QLinearGlobalAverageKernel>(kernel_stream, reference, q);
      },
      reference, {x}, {shape}, {x.dtype()}, stream)[0];
}

mx::array qlinear_add(const mx::array& a, const mx::array& b, QLinearAddRatios ratios,
                      const Reference& reference, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  const bool fits = is_cpu_stream(stream) && (a.dtype() == mx::uint8 || a.dtype() == mx::int8) &&
                    b.dtype() == a.dtype() && a.shape() == b.shape() && a.size() > 0;
  if (!fits) return reference({a, b})[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<QLinearAddKernel>(kernel_stream, reference, ratios);
      },
      reference, {a, b}, {a.shape()}, {a.dtype()}, stream)[0];
}

mx::array dequantize_per_tensor(const mx::array& x, const mx::array& scale, const mx::array& zero,
                                mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        mx::multiply(mx::subtract(mx::astype(in[0], mx::float32, stream), in[2], stream), in[1], stream)};
  };
  const bool fits = is_cpu_stream(stream) && (x.dtype() == mx::uint8 || x.dtype() == mx::int8) &&
                    x.size() > 0 && scale.size() == 1 && zero.size() == 1 && scale.dtype() == mx::float32 &&
                    zero.dtype() == mx::float32;
  if (!fits) return reference({x, scale, zero})[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<DequantizeKernel>(kernel_stream, reference); },
      reference, {x, mx::reshape(scale, {}, stream), mx::reshape(zero, {}, stream)}, {x.shape()},
      {mx::float32}, stream)[0];
}

mx::array requantize(const mx::array& v, const mx::array& multiplier, const mx::array& zero, mx::Dtype type,
                     mx::StreamOrDevice s, const std::optional<Dequantization>& then) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [type, stream](const std::vector<mx::array>& in) {
    mx::array q = requantize_reference(in[0], in[1], in[2], type, stream);
    if (in.size() == 3) return std::vector<mx::array>{q};
    return std::vector<mx::array>{
        mx::multiply(mx::subtract(mx::astype(q, mx::float32, stream), in[4], stream), in[3], stream)};
  };
  const int64_t channels = v.ndim() > 0 ? v.shape(-1) : 0;
  const bool per_channel_last = multiplier.size() == static_cast<size_t>(channels) &&
                                (multiplier.ndim() == 0 || multiplier.shape(-1) == channels);
  const bool fits = is_cpu_stream(stream) && v.dtype() == mx::float32 && v.size() > 0 &&
                    multiplier.dtype() == mx::float32 && (multiplier.size() == 1 || per_channel_last) &&
                    zero.size() == 1 && zero.dtype() == mx::float32 &&
                    (type == mx::uint8 || type == mx::int8);
  std::vector<mx::array> inputs = {v, multiplier, zero};
  if (then) inputs.insert(inputs.end(), {then->scale, then->zero});
  const bool dequantize_fits = !then || (then->scale.dtype() == mx::float32 && then->scale.size() == 1 &&
                                         then->zero.dtype() == mx::float32 && then->zero.size() == 1);
  if (!fits || !dequantize_fits) return reference(inputs)[0];
  inputs[1] = mx::flatten(multiplier, stream);
  inputs[2] = mx::reshape(zero, {}, stream);
  if (then) {
    inputs[3] = mx::reshape(then->scale, {}, stream);
    inputs[4] = mx::reshape(then->zero, {}, stream);
  }
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<RequantizeKernel>(kernel_stream, reference, type == mx::int8);
      },
      reference, inputs, {v.shape()}, {then ? mx::float32 : type}, stream)[0];
}

mx::array quantize_per_tensor(const mx::array& x, const mx::array& scale, const mx::array& zero,
                              mx::Dtype type, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  const bool is_signed = type == mx::int8;
  Reference reference = [type, is_signed, stream](const std::vector<mx::array>& in) {
    mx::array q = mx::add(mx::round(mx::divide(in[0], in[1], stream), 0, stream), in[2], stream);
    q = mx::clip(q, mx::array(is_signed ? -128.0f : 0.0f), mx::array(is_signed ? 127.0f : 255.0f), stream);
    return std::vector<mx::array>{mx::astype(q, type, stream)};
  };
  if (type != mx::uint8 && type != mx::int8)
    throw std::invalid_argument("quantize_per_tensor: the output must be uint8 or int8");
  const bool scalars =
      scale.size() == 1 && zero.size() == 1 && scale.dtype() == mx::float32 && zero.dtype() == mx::float32;
  const std::vector<mx::array> inputs = {x, mx::reshape(scale, {}, stream), mx::reshape(zero, {}, stream)};
  if (!is_cpu_stream(stream) || x.dtype() != mx::float32 || x.size() == 0 || !scalars)
    return reference(inputs)[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<QuantizeKernel>(kernel_stream, reference); },
      reference, inputs, {x.shape()}, {type}, stream)[0];
}

mx::array quantize_dequantize(const mx::array& x, const mx::array& scale, const mx::array& zero, float low,
                              float high, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [low, high, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{quantize_dequantize_reference(in[0], in[1], in[2], low, high, stream)};
  };
  const bool scalars =
      scale.size() == 1 && zero.size() == 1 && scale.dtype() == mx::float32 && zero.dtype() == mx::float32;
  if (!is_cpu_stream(stream) || x.dtype() != mx::float32 || x.size() == 0 || !scalars)
    return reference({x, scale, zero})[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<QuantizeDequantizeKernel>(kernel_stream, reference, low, high);
      },
      reference, {x, mx::reshape(scale, {}, stream), mx::reshape(zero, {}, stream)}, {x.shape()},
      {mx::float32}, stream)[0];
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
