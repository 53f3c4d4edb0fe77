// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); normalize_last_axis picks the best target of the CPU at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/layer_norm.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include "kernels/cpu/lane_sums-inl.h"

#include <cmath>
#include <cstdint>

#ifndef TRANSMUTER_KERNELS_CPU_LAYER_NORM_ARGS
#define TRANSMUTER_KERNELS_CPU_LAYER_NORM_ARGS
namespace transmuter::kernels {
// The pointers of one call; null for absent optional inputs/outputs. (Outside
// the per-target namespaces: every target's code takes the same struct.)
struct NormalizeRowsArgs {
  const float* x;
  const float* skip;
  const float* bias;
  const float* gamma;
  const float* beta;
  float* y;
  float* sum;  // x + skip + bias, when asked for
  int64_t d;
  float epsilon;
  bool rms;
};

}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Writes x + skip + bias of one row to `out`; returns the row to normalize.
const float* SumRow(const NormalizeRowsArgs& a, int64_t row, float* out) {
  const float* x = a.x + row * a.d;
  if (a.skip == nullptr && a.bias == nullptr) return x;
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const float* skip = a.skip != nullptr ? a.skip + row * a.d : nullptr;
  int64_t i = 0;
  for (; i + lanes <= a.d; i += lanes) {
    auto v = hn::LoadU(df, x + i);
    if (skip != nullptr) v = hn::Add(v, hn::LoadU(df, skip + i));
    if (a.bias != nullptr) v = hn::Add(v, hn::LoadU(df, a.bias + i));
    hn::StoreU(v, df, out + i);
  }
  for (; i < a.d; ++i) out[i] = x[i] + (skip != nullptr ? skip[i] : 0.0f) + (a.bias != nullptr ? a.bias[i] : 0.0f);
  return out;
}

// Sum of (v - center)^2 over the row.
float SquaredDeviations(const float* v, int64_t d, float center) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto c = hn::Set(df, center);
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * lanes <= d; i += 2 * lanes) {
    const auto a = hn::Sub(hn::LoadU(df, v + i), c);
    const auto b = hn::Sub(hn::LoadU(df, v + i + lanes), c);
    acc0 = hn::MulAdd(a, a, acc0);
    acc1 = hn::MulAdd(b, b, acc1);
  }
  for (; i + lanes <= d; i += lanes) {
    const auto a = hn::Sub(hn::LoadU(df, v + i), c);
    acc0 = hn::MulAdd(a, a, acc0);
  }
  float total = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < d; ++i) total += (v[i] - center) * (v[i] - center);
  return total;
}

// y = (v - center) * scale * gamma [+ beta]
void ScaleRow(const NormalizeRowsArgs& a, const float* v, float center, float scale, float* y) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto c = hn::Set(df, center);
  const auto k = hn::Set(df, scale);
  int64_t i = 0;
  for (; i + lanes <= a.d; i += lanes) {
    auto out = hn::Mul(hn::Mul(hn::Sub(hn::LoadU(df, v + i), c), k), hn::LoadU(df, a.gamma + i));
    if (a.beta != nullptr) out = hn::Add(out, hn::LoadU(df, a.beta + i));
    hn::StoreU(out, df, y + i);
  }
  for (; i < a.d; ++i) y[i] = (v[i] - center) * scale * a.gamma[i] + (a.beta != nullptr ? a.beta[i] : 0.0f);
}

void NormalizeRows(const NormalizeRowsArgs& a, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    float* y = a.y + row * a.d;
    // The sum goes to the sum output when asked for, else into y (overwritten below).
    const float* v = SumRow(a, row, a.sum != nullptr ? a.sum + row * a.d : y);
    const float n = static_cast<float>(a.d);
    const float center = a.rms ? 0.0f : SumOfRow(v, a.d) / n;
    const float variance = SquaredDeviations(v, a.d, center) / n;
    ScaleRow(a, v, center, 1.0f / std::sqrt(variance + a.epsilon), y);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/layer_norm.h"

#include <algorithm>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(NormalizeRows);

namespace {

// Which optional inputs a call has, in the order they follow x.
struct NormalizeInputs {
  bool skip, bias, beta;
};

std::vector<mx::array> normalize_reference(const std::vector<mx::array>& in, NormalizeInputs has,
                                           const NormalizeOptions& options, mx::Stream s) {
  size_t next = 1;
  mx::array sum = in[0];
  if (has.skip) sum = mx::add(sum, in[next++], s);
  if (has.bias) sum = mx::add(sum, in[next++], s);
  const mx::array& gamma = in[next++];
  mx::array centered = options.rms ? sum : mx::subtract(sum, mx::mean(sum, -1, true, s), s);
  mx::array variance = mx::mean(mx::square(centered, s), -1, true, s);
  mx::array inv_std = mx::rsqrt(mx::add(variance, mx::array(options.epsilon, sum.dtype()), s), s);
  mx::array y = mx::multiply(mx::multiply(centered, inv_std, s), gamma, s);
  if (has.beta) y = mx::add(y, in[next++], s);
  if (options.return_sum) return {y, sum};
  return {y};
}

class NormalizeKernel : public CpuKernel {
 public:
  NormalizeKernel(mx::Stream stream, Reference reference, NormalizeInputs has, NormalizeOptions options)
      : CpuKernel(stream, std::move(reference)), has_(has), options_(options) {}
  const char* name() const override { return options_.rms ? "transmuter::RmsNorm" : "transmuter::LayerNorm"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    NormalizeRowsArgs args{};
    size_t next = 0;
    args.x = in[next++].data<float>();
    args.skip = has_.skip ? in[next++].data<float>() : nullptr;
    args.bias = has_.bias ? in[next++].data<float>() : nullptr;
    args.gamma = in[next++].data<float>();
    args.beta = has_.beta ? in[next++].data<float>() : nullptr;
    args.y = out[0].data<float>();
    args.sum = options_.return_sum ? out[1].data<float>() : nullptr;
    args.d = in[0].shape().back();
    args.epsilon = options_.epsilon;
    args.rms = options_.rms;
    const int64_t rows = args.d == 0 ? 0 : static_cast<int64_t>(in[0].size()) / args.d;
    return [args, rows] {
      // About 16K elements a chunk: enough work to pay for waking a thread.
      const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(args.d, 1));
      parallel_for(rows, grain, [&](int64_t begin, int64_t end) { HWY_DYNAMIC_DISPATCH(NormalizeRows)(args, begin, end); });
    };
  }

 private:
  NormalizeInputs has_;
  NormalizeOptions options_;
};

bool is_vector_of(const std::optional<mx::array>& a, int64_t d) {
  return !a || (a->ndim() == 1 && a->shape(0) == d && a->dtype() == mx::float32);
}

}  // namespace

std::vector<mx::array> normalize_last_axis(const mx::array& x, const std::optional<mx::array>& skip,
                                           const std::optional<mx::array>& bias, const mx::array& gamma,
                                           const std::optional<mx::array>& beta, const NormalizeOptions& options,
                                           mx::StreamOrDevice s) {
  const NormalizeInputs has{skip.has_value(), bias.has_value(), beta.has_value()};
  std::vector<mx::array> inputs = {x};
  for (const auto& optional : {skip, bias}) {
    if (optional) inputs.push_back(*optional);
  }
  inputs.push_back(gamma);
  if (beta) inputs.push_back(*beta);
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [has, options, stream](const std::vector<mx::array>& in) {
    return normalize_reference(in, has, options, stream);
  };

  const int64_t d = x.ndim() == 0 ? 0 : x.shape().back();
  const bool kernel_fits = x.ndim() >= 1 && x.dtype() == mx::float32 && d > 0 &&
                           (!skip || (skip->shape() == x.shape() && skip->dtype() == mx::float32)) &&
                           is_vector_of(bias, d) && is_vector_of(gamma, d) && is_vector_of(beta, d);
  if (!kernel_fits) return reference(inputs);
  std::vector<mx::Shape> shapes(options.return_sum ? 2 : 1, x.shape());
  std::vector<mx::Dtype> dtypes(shapes.size(), mx::float32);
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<NormalizeKernel>(kernel_stream, reference, has, options); },
      reference, inputs, shapes, dtypes, stream);
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
