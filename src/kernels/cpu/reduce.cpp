// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); the kernel picks the best target of the CPU at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/reduce.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/lane_sums-inl.h"
#include "kernels/cpu/reduce.h"

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// y[i] = scale * sum of x[i * n, (i + 1) * n), for i < rows.
void SumRows(const float* x, int64_t rows, int64_t n, float scale, float* y) {
  for (int64_t i = 0; i < rows; ++i) y[i] = SumOfRow(x + i * n, n) * scale;
}

// y[j] = scale * sum over r < n of x[r * stride + j], for j < count.
void SumOfRows(const float* x, int64_t n, int64_t stride, int64_t count, float scale, float* y) {
  const hn::ScalableTag<float> d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto k = hn::Set(d, scale);
  int64_t j = 0;
  for (; j + lanes <= count; j += lanes) {
    auto sum = hn::Zero(d);
    for (int64_t r = 0; r < n; ++r) sum = hn::Add(sum, hn::LoadU(d, x + r * stride + j));
    hn::StoreU(hn::Mul(sum, k), d, y + j);
  }
  for (; j < count; ++j) {
    float sum = 0.0f;
    for (int64_t r = 0; r < n; ++r) sum += x[r * stride + j];
    y[j] = sum * scale;
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <memory>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(SumRows);
HWY_EXPORT(SumOfRows);

namespace {

// About this many elements read a task: a few microseconds, enough to pay for waking a thread.
constexpr int64_t kTaskElements = 16384;
// Columns a task sums when the reduced axes are not the last (inner > 1): a few vectors wide, so that the
// rows' loads stay in L1 while n grows.
constexpr int64_t kColumns = 256;

// x as [outer, n, inner] for a reduction over `axes`, or false when they are not adjacent once extents of
// 1 are set aside.
bool split(const mx::Shape& shape, const std::vector<int>& axes, int64_t& outer, int64_t& n, int64_t& inner) {
  outer = n = inner = 1;
  int stage = 0;  // 0: before the reduced axes, 1: in them, 2: after
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (shape[d] == 1) continue;
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (reduced && stage == 2) return false;
    if (reduced) stage = 1;
    if (!reduced && stage == 1) stage = 2;
    (stage == 0 ? outer : stage == 1 ? n : inner) *= shape[d];
  }
  return true;
}

class SumOverAxesKernel : public CpuKernel {
 public:
  SumOverAxesKernel(mx::Stream stream, Reference reference, std::vector<int> axes, bool mean)
      : CpuKernel(stream, std::move(reference)), axes_(std::move(axes)), mean_(mean) {}
  const char* name() const override { return mean_ ? "transmuter::Mean" : "transmuter::Sum"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const SumOverAxesKernel*>(&other);
    return o != nullptr && o->axes_ == axes_ && o->mean_ == mean_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    int64_t outer = 1, n = 1, inner = 1;
    split(in[0].shape(), axes_, outer, n, inner);  // checked by sum_over_axes_fits
    const float* x = in[0].data<float>();
    float* y = out[0].data<float>();
    const float scale = mean_ ? static_cast<float>(1.0 / static_cast<double>(n)) : 1.0f;
    return [x, y, outer, n, inner, scale] {
      if (inner == 1) {
        parallel_for(outer, std::max<int64_t>(1, kTaskElements / n), [&](int64_t begin, int64_t end) {
          HWY_DYNAMIC_DISPATCH(SumRows)(x + begin * n, end - begin, n, scale, y + begin);
        });
        return;
      }
      const int64_t blocks = (inner + kColumns - 1) / kColumns;
      const int64_t grain = std::max<int64_t>(1, kTaskElements / (n * std::min(inner, kColumns)));
      parallel_for(outer * blocks, grain, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          const int64_t o = item / blocks, j = (item % blocks) * kColumns;
          HWY_DYNAMIC_DISPATCH(SumOfRows)(x + o * n * inner + j, n, inner, std::min(kColumns, inner - j),
                                          scale, y + o * inner + j);
        }
      });
    };
  }

 private:
  std::vector<int> axes_;
  bool mean_;
};

}  // namespace

bool sum_over_axes_fits(const mx::array& x, const std::vector<int>& axes) {
  int64_t outer = 1, n = 1, inner = 1;
  return x.dtype() == mx::float32 && x.size() > 0 && !axes.empty() && split(x.shape(), axes, outer, n, inner);
}

mx::array sum_over_axes(const mx::array& x, const std::vector<int>& axes, bool keepdims, bool mean,
                        mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [axes, keepdims, mean, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mean ? mx::mean(in[0], axes, keepdims, stream)
                                       : mx::sum(in[0], axes, keepdims, stream)};
  };
  if (!sum_over_axes_fits(x, axes)) return reference({x})[0];
  mx::Shape shape;
  for (int d = 0; d < static_cast<int>(x.ndim()); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced)
      shape.push_back(x.shape(d));
    else if (keepdims)
      shape.push_back(1);
  }
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<SumOverAxesKernel>(kernel_stream, reference, axes, mean);
      },
      reference, {x}, {shape}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
