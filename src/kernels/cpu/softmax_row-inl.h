// The softmax of one row with scale, additive mask and a causal limit, as
// Highway per-target code shared by the softmax and attention kernels. Include
// it after hwy/highway.h inside a file that foreach_target re-includes (the
// include guard below toggles per target, Highway's "-inl.h" convention).
//
//   v_j = x_j * scale [+ mask_j]   for j < allowed
//   y_j = exp(v_j - max v) / sum_k exp(v_k - max v)   for j < allowed, 0 after
//
// exp is Highway's hwy/contrib/math Exp: at most 1 ulp of error over
// [-FLT_MAX, 104] (its documented bound); results below -104 are 0, so the
// exponent v - max <= 0 is always in range. Three passes over the row, which
// stays in L1 (scaled values, exponentials, normalization).
#if defined(TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_
#undef TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_
#else
#define TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// What to do with a row in which every taking-part value is -inf (or none
// takes part): zeros (ONNX Attention) or NaN (ONNX Softmax, as exp(-inf -
// -inf) gives).
enum class EmptyRow { kZeros, kNaN };

// y[0, n) = exp(y - row_max) in place, row_max finite and >= every y; returns their sum. Two
// accumulators for latency; a partial last vector goes through a buffer padded with -inf (exp(-inf) = 0).
inline float ExpInPlace(float* y, int64_t n, float row_max) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
  const int64_t full = n - n % lanes;
  const int64_t rest = n - full;
  const auto m = hn::Set(df, row_max);
  auto sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  int64_t j = 0;
  for (; j + 2 * lanes <= full; j += 2 * lanes) {
    const auto e0 = hn::Exp(df, hn::Sub(hn::LoadU(df, y + j), m));
    const auto e1 = hn::Exp(df, hn::Sub(hn::LoadU(df, y + j + lanes), m));
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
    hn::StoreU(e0, df, y + j);
    hn::StoreU(e1, df, y + j + lanes);
  }
  for (; j < full; j += lanes) {
    const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, y + j), m));
    sum0 = hn::Add(sum0, e);
    hn::StoreU(e, df, y + j);
  }
  if (rest > 0) {
    for (int64_t i = 0; i < lanes; ++i)
      tail[i] = i < rest ? y[full + i] : -std::numeric_limits<float>::infinity();
    const auto e = hn::Exp(df, hn::Sub(hn::Load(df, tail), m));
    sum1 = hn::Add(sum1, e);
    hn::Store(e, df, tail);
    for (int64_t i = 0; i < rest; ++i) y[full + i] = tail[i];
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
}

// y[0, n) = softmax over x[0, allowed) * scale + mask (mask may be null), and
// zeros over [allowed, n). y may alias x.
inline void SoftmaxRow(const float* x, const float* mask, float scale, int64_t n, int64_t allowed,
                       EmptyRow empty, float* y) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t full = allowed - allowed % lanes;

  // Pass 1: v = x * scale + mask, written to y; the running max.
  const auto k = hn::Set(df, scale);
  auto vmax = hn::Set(df, kNegInf);
  int64_t j = 0;
  for (; j < full; j += lanes) {
    auto v = hn::Mul(hn::LoadU(df, x + j), k);
    if (mask != nullptr) v = hn::Add(v, hn::LoadU(df, mask + j));
    vmax = hn::Max(vmax, v);
    hn::StoreU(v, df, y + j);
  }
  float row_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; j < allowed; ++j) {
    y[j] = x[j] * scale + (mask != nullptr ? mask[j] : 0.0f);
    row_max = std::max(row_max, y[j]);
  }
  if (row_max == kNegInf) {
    const float fill = empty == EmptyRow::kZeros ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    for (j = 0; j < n; ++j) y[j] = fill;  // the composition's -inf row: all NaN
    return;
  }

  // Pass 2: e = exp(v - max) over y; the sum.
  const float sum = ExpInPlace(y, allowed, row_max);

  // Pass 3: normalize (sum >= 1: the max contributes exp(0)).
  const auto inv = hn::Set(df, 1.0f / sum);
  for (j = 0; j < full; j += lanes) hn::StoreU(hn::Mul(hn::LoadU(df, y + j), inv), df, y + j);
  for (; j < allowed; ++j) y[j] *= 1.0f / sum;
  for (j = allowed; j < n; ++j) y[j] = 0.0f;
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_ toggle
