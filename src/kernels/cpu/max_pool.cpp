// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); the kernel class and entry points at the end are compiled once.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/max_pool.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/partial_vectors-inl.h"

#ifndef TRANSMUTER_KERNELS_CPU_MAX_POOL_ARGS_
#define TRANSMUTER_KERNELS_CPU_MAX_POOL_ARGS_
namespace transmuter::kernels {
// One call's pointers and geometry (outside the per-target namespaces: every
// target's code reads the same struct).
struct MaxPoolArgs {
  const float* x;
  float* y;
  int64_t in_h, in_w, channels, out_h, out_w;
  int kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left;
};
}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Output rows [begin, end) (row = n * out_h + oy), every column and channel.
void MaxPoolRows(const MaxPoolArgs& a, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto lowest = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto nan = hn::Set(d, std::numeric_limits<float>::quiet_NaN());
  const int64_t c_count = a.channels;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t n = row / a.out_h, oy = row % a.out_h;
    const int64_t y0 = oy * a.stride_h - a.pad_top;
    for (int64_t ox = 0; ox < a.out_w; ++ox) {
      const int64_t x0 = ox * a.stride_w - a.pad_left;
      float* out = a.y + (row * a.out_w + ox) * c_count;
      for (int64_t c = 0; c < c_count; c += lanes) {
        const size_t count = static_cast<size_t>(std::min(lanes, c_count - c));
        auto best = lowest;
        auto any_nan = hn::Lt(best, best);  // all false
        for (int ky = 0; ky < a.kernel_h; ++ky) {
          const int64_t iy = y0 + int64_t{ky} * a.dilation_h;
          if (iy < 0 || iy >= a.in_h) continue;
          const float* in_row = a.x + ((n * a.in_h + iy) * a.in_w) * c_count + c;
          for (int kx = 0; kx < a.kernel_w; ++kx) {
            const int64_t ix = x0 + int64_t{kx} * a.dilation_w;
            if (ix < 0 || ix >= a.in_w) continue;
            const auto v = LoadFirst(d, in_row + ix * c_count, count);
            best = hn::Max(best, v);
            any_nan = hn::Or(any_nan, hn::IsNaN(v));  // Max's NaN result differs across targets
          }
        }
        StoreFirst(hn::IfThenElse(any_nan, nan, best), d, out + c, count);
      }
    }
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <memory>
#include <optional>
#include <vector>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/max_pool.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(MaxPoolRows);

mx::array lowest_value(mx::Dtype dtype) {
  if (mx::issubdtype(dtype, mx::inexact)) return mx::array(-std::numeric_limits<double>::infinity(), dtype);
  return mx::array(mx::iinfo(dtype).min, dtype);
}

mx::array max_pool_nhwc_reference(const mx::array& x, const MaxPoolOptions& o, mx::Stream s) {
  // Pad each spatial axis far enough for the last window (ceil_mode's may
  // reach past the end) with the lowest value: it never wins a max.
  mx::Shape low = {0, o.pads_begin[0], o.pads_begin[1], 0}, high = {0, 0, 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int reach = (o.output[i] - 1) * o.strides[i] + (o.kernel[i] - 1) * o.dilations[i] + 1;
    high[1 + i] = std::max(0, reach - o.pads_begin[i] - x.shape(1 + i));
  }
  const mx::array padded =
      mx::pad(x, std::vector<int>{0, 1, 2, 3}, low, high, lowest_value(x.dtype()), "constant", s);
  std::optional<mx::array> result;
  for (int ky = 0; ky < o.kernel[0]; ++ky) {
    for (int kx = 0; kx < o.kernel[1]; ++kx) {
      const mx::Shape start = {0, ky * o.dilations[0], kx * o.dilations[1], 0};
      const mx::Shape stop = {x.shape(0), start[1] + (o.output[0] - 1) * o.strides[0] + 1,
                              start[2] + (o.output[1] - 1) * o.strides[1] + 1, x.shape(3)};
      mx::array tap = mx::slice(padded, start, stop, {1, o.strides[0], o.strides[1], 1}, s);
      result = result ? mx::maximum(*result, tap, s) : tap;
    }
  }
  return *result;
}

namespace {

class MaxPoolKernel : public CpuKernel {
 public:
  MaxPoolKernel(mx::Stream stream, Reference reference, MaxPoolOptions options)
      : CpuKernel(stream, std::move(reference)), options_(options) {}
  const char* name() const override { return "transmuter::MaxPoolNhwc"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array& x = in[0];
    const MaxPoolOptions& o = options_;
    const MaxPoolArgs args{x.data<float>(), out[0].data<float>(), x.shape(1),     x.shape(2),
                           x.shape(3),      o.output[0],          o.output[1],    o.kernel[0],
                           o.kernel[1],     o.strides[0],         o.strides[1],   o.dilations[0],
                           o.dilations[1],  o.pads_begin[0],      o.pads_begin[1]};
    const int64_t rows = int64_t{x.shape(0)} * o.output[0];
    // About 64K elements read a chunk: enough to pay for waking a thread.
    const int64_t per_row = std::max<int64_t>(1, o.output[1] * args.channels * o.kernel[0] * o.kernel[1]);
    const int64_t grain = std::max<int64_t>(1, 65536 / per_row);
    return [args, rows, grain] {
      parallel_for(rows, grain,
                   [&](int64_t begin, int64_t end) { HWY_DYNAMIC_DISPATCH(MaxPoolRows)(args, begin, end); });
    };
  }

 private:
  MaxPoolOptions options_;
};

bool kernel_takes(const mx::array& x, const MaxPoolOptions& o) {
  if (x.ndim() != 4 || x.dtype() != mx::float32 || x.size() == 0) return false;
  for (int i = 0; i < 2; ++i) {
    if (o.kernel[i] <= 0 || o.strides[i] <= 0 || o.dilations[i] <= 0 || o.pads_begin[i] < 0 ||
        o.output[i] <= 0)
      return false;
  }
  return true;
}

}  // namespace

mx::array max_pool_nhwc(const mx::array& x, const MaxPoolOptions& options, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  if (!kernel_takes(x, options)) return max_pool_nhwc_reference(x, options, stream);
  Reference reference = [options, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{max_pool_nhwc_reference(in[0], options, stream)};
  };
  const mx::Shape out_shape = {x.shape(0), options.output[0], options.output[1], x.shape(3)};
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<MaxPoolKernel>(kernel_stream, reference, options);
      },
      reference, {x}, {out_shape}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
