// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); softmax_last_axis picks the best target of the CPU at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/softmax.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/mask_rows.h"
#include "kernels/cpu/softmax_row-inl.h"

#ifndef TRANSMUTER_KERNELS_CPU_SOFTMAX_ARGS
#define TRANSMUTER_KERNELS_CPU_SOFTMAX_ARGS
namespace transmuter::kernels {
// One call's pointers and sizes (outside the per-target namespaces: every
// target's code takes the same struct).
struct SoftmaxRowsArgs {
  const float* x;
  const float* mask;  // null: no mask
  MaskRows mask_rows;
  float* y;
  int64_t n;             // row length
  int64_t query_rows;    // x.shape(-2), for the causal limit
  bool causal;
  int64_t causal_offset;
  float scale;
  bool zero_empty_rows;
};
}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {

void SoftmaxRows(const SoftmaxRowsArgs& a, int64_t begin, int64_t end) {
  const EmptyRow empty = a.zero_empty_rows ? EmptyRow::kZeros : EmptyRow::kNaN;
  for (int64_t row = begin; row < end; ++row) {
    int64_t allowed = a.n;
    if (a.causal) allowed = std::clamp<int64_t>(row % a.query_rows + a.causal_offset + 1, 0, a.n);
    const float* mask = a.mask != nullptr ? a.mask + a.mask_rows.offset(row) : nullptr;
    SoftmaxRow(a.x + row * a.n, mask, a.scale, a.n, allowed, empty, a.y + row * a.n);
  }
}

void ExpNonPositiveArray(const float* x, int64_t n, float* y) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(ExpNonPositive(d, hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] = hn::GetLane(ExpNonPositive(d, hn::Set(d, x[i])));
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/softmax.h"

#include <limits>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(SoftmaxRows);
HWY_EXPORT(ExpNonPositiveArray);

void exp_non_positive(const float* x, int64_t n, float* y) {
  HWY_DYNAMIC_DISPATCH(ExpNonPositiveArray)(x, n, y);
}

namespace {

class SoftmaxKernel : public CpuKernel {
 public:
  SoftmaxKernel(mx::Stream stream, Reference reference, SoftmaxOptions options, bool has_mask)
      : CpuKernel(stream, std::move(reference)), options_(options), has_mask_(has_mask) {}
  const char* name() const override { return "transmuter::Softmax"; }
  // The rows are computed in place (SoftmaxRow's y may alias x): taking x's buffer saves the
  // write-allocate traffic of a fresh output (80 x 6625 logits: 2 MiB).
  int donor_of(size_t) const override { return 0; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array& x = in[0];
    SoftmaxRowsArgs args{};
    args.x = x.data<float>();
    args.mask = has_mask_ ? in[1].data<float>() : nullptr;
    if (has_mask_) args.mask_rows = *MaskRows::of(x.shape(), in[1].shape());  // checked when built
    args.y = out[0].data<float>();
    args.n = x.shape().back();
    args.query_rows = x.ndim() >= 2 ? x.shape(-2) : 1;
    args.causal = options_.causal;
    args.causal_offset = options_.causal_offset;
    args.scale = options_.scale;
    args.zero_empty_rows = options_.zero_fully_masked_rows;
    const int64_t rows = args.n == 0 ? 0 : static_cast<int64_t>(x.size()) / args.n;
    return [args, rows] {
      // About 8K elements a chunk: enough work to pay for waking a thread.
      const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(args.n, 1));
      parallel_for(rows, grain, [&](int64_t begin, int64_t end) { HWY_DYNAMIC_DISPATCH(SoftmaxRows)(args, begin, end); });
    };
  }

 private:
  SoftmaxOptions options_;
  bool has_mask_;
};

}  // namespace

mx::array softmax_last_axis_reference(const mx::array& x, const std::optional<mx::array>& mask,
                                      const SoftmaxOptions& options, mx::StreamOrDevice s) {
  mx::array v = options.scale != 1.0f ? mx::multiply(x, mx::array(options.scale, x.dtype()), s) : x;
  if (mask) v = mx::add(v, *mask, s);
  if (options.causal) {
    const int queries = v.shape(-2), keys = v.shape(-1);
    mx::array key = mx::reshape(mx::arange(0, keys, mx::int64, s), {1, keys}, s);
    mx::array query = mx::reshape(mx::arange(options.causal_offset, options.causal_offset + queries, mx::int64, s),
                                  {queries, 1}, s);
    v = mx::where(mx::less_equal(key, query, s), v,
                  mx::array(-std::numeric_limits<float>::infinity(), v.dtype()), s);
  }
  if (!options.zero_fully_masked_rows) return mx::softmax(v, -1, /*precise=*/true, s);
  // A row of -inf has no max to subtract: shift it by 0, and its sum of 0
  // becomes 1, so it gives zeros with zero gradient.
  const mx::array zero(0.0f, v.dtype()), one(1.0f, v.dtype());
  mx::array row_max = mx::stop_gradient(mx::max(v, -1, /*keepdims=*/true, s), s);
  mx::array shift = mx::where(mx::isneginf(row_max, s), zero, row_max, s);
  mx::array e = mx::exp(mx::subtract(v, shift, s), s);
  mx::array sum = mx::sum(e, -1, /*keepdims=*/true, s);
  return mx::divide(e, mx::where(mx::equal(sum, zero, s), one, sum, s), s);
}

mx::array softmax_last_axis(const mx::array& x, const std::optional<mx::array>& mask, const SoftmaxOptions& options,
                            mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  const bool has_mask = mask.has_value();
  Reference reference = [options, has_mask, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{softmax_last_axis_reference(
        in[0], has_mask ? std::optional<mx::array>(in[1]) : std::nullopt, options, stream)};
  };
  std::vector<mx::array> inputs = {x};
  if (mask) inputs.push_back(*mask);

  const bool kernel_fits = x.dtype() == mx::float32 && x.ndim() >= (options.causal ? 2 : 1) &&
                           (!mask || (mask->dtype() == mx::float32 && MaskRows::of(x.shape(), mask->shape())));
  if (!kernel_fits) return reference(inputs)[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<SoftmaxKernel>(kernel_stream, reference, options, has_mask);
      },
      reference, inputs, {x.shape()}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
