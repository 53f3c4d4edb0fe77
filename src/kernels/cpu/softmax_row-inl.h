// The softmax of one row with scale, additive mask and a causal limit, as
// Highway per-target code shared by the softmax and attention kernels. Include
// it after hwy/highway.h inside a file that foreach_target re-includes (the
// include guard below toggles per target, Highway's "-inl.h" convention).
//
//   v_j = x_j * scale [+ mask_j]   for j < allowed
//   y_j = exp(v_j - max v) / sum_k exp(v_k - max v)   for j < allowed, 0 after
//
// exp is ExpNonPositive below (the exponents v - max are <= 0): at most 1.02
// ulp of error, flushing to 0 below -87.33 (exp < FLT_MIN there). Three passes
// over the row, which stays in L1 (scaled values, exponentials,
// normalization).
#if defined(TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_
#undef TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_
#else
#define TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_
#endif

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

// exp(x) for x <= 0 (and NaN), the softmax's shifted values; 0 below kExpFlushBelow, where exp(x) <
// FLT_MIN. Highway's Exp (full range) took 36 instructions a vector, which Zen 4's double-pumped
// 512-bit units issue at about one a cycle; this one takes 15:
//   n = round(x / ln 2) by one multiply-add of kExpShifter (the sum's low mantissa bits hold n + 127),
//   r = x - n ln 2 (in two parts, Cody and Waite: n * 0.693359375 is exact),
//   exp(r) = 1 + r + r^2 P(r) on |r| <= ln(2) / 2, P of degree 4 fitted for the least relative error
//   (3.1e-9 in exact arithmetic), times 2^n: n + 127 shifted into the exponent bits.
// Measured against exp in double over every float32 in [ln(FLT_MIN), 0]: at most 1.019 ulp (x =
// -27.378, AVX-512 and AVX2); tests/kernels/cpu/softmax_test.cpp checks every 257th (all with
// TRANSMUTER_EXP_STRIDE=1).
constexpr float kExpFlushBelow = -87.33654f;         // ln(FLT_MIN)
constexpr float kExpShifter = 12582912.0f + 127.0f;  // 1.5 * 2^23: ulp 1, so adding it rounds to an integer

template <class D>
HWY_INLINE hn::Vec<D> ExpNonPositive(D d, hn::Vec<D> x) {
  const hn::RebindToSigned<D> di;
  const auto shifted = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), hn::Set(d, kExpShifter));
  const auto n = hn::Sub(shifted, hn::Set(d, kExpShifter));
  auto r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  auto p = hn::MulAdd(hn::Set(d, 1.3816467253491282e-3f), r, hn::Set(d, 8.36894754320383e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1668377816677094e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.66665181517601e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.999999403953552e-1f));
  const auto e = hn::Add(hn::MulAdd(hn::Mul(r, r), p, r), hn::Set(d, 1.0f));
  // Shifting by 23 drops the shifter's exponent and leading mantissa bit: 2^n for n in [-126, 0].
  const auto scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, shifted)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, kExpFlushBelow)), hn::Mul(e, scale));
}

// y[0, n) = exp(x - row_max), row_max finite and >= every x (y may be x); returns their sum. Two
// accumulators for latency; a partial last vector goes through a buffer padded with -inf (exp(-inf) = 0).
inline float ExpInto(const float* x, int64_t n, float row_max, float* y) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
  const int64_t full = n - n % lanes;
  const int64_t rest = n - full;
  const auto m = hn::Set(df, row_max);
  auto sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  int64_t j = 0;
  for (; j + 2 * lanes <= full; j += 2 * lanes) {
    const auto e0 = ExpNonPositive(df, hn::Sub(hn::LoadU(df, x + j), m));
    const auto e1 = ExpNonPositive(df, hn::Sub(hn::LoadU(df, x + j + lanes), m));
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
    hn::StoreU(e0, df, y + j);
    hn::StoreU(e1, df, y + j + lanes);
  }
  for (; j < full; j += lanes) {
    const auto e = ExpNonPositive(df, hn::Sub(hn::LoadU(df, x + j), m));
    sum0 = hn::Add(sum0, e);
    hn::StoreU(e, df, y + j);
  }
  if (rest > 0) {
    for (int64_t i = 0; i < lanes; ++i)
      tail[i] = i < rest ? x[full + i] : -std::numeric_limits<float>::infinity();
    const auto e = ExpNonPositive(df, hn::Sub(hn::Load(df, tail), m));
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

  // Pass 1: the running max of v = x * scale + mask; v is written to y unless it is x itself (scale 1,
  // no mask), which pass 2 then reads in place of y.
  const bool plain = scale == 1.0f && mask == nullptr;
  const auto k = hn::Set(df, scale);
  auto vmax = hn::Set(df, kNegInf);
  int64_t j = 0;
  if (plain) {
    for (; j < full; j += lanes) vmax = hn::Max(vmax, hn::LoadU(df, x + j));
  } else {
    for (; j < full; j += lanes) {
      auto v = hn::Mul(hn::LoadU(df, x + j), k);
      if (mask != nullptr) v = hn::Add(v, hn::LoadU(df, mask + j));
      vmax = hn::Max(vmax, v);
      hn::StoreU(v, df, y + j);
    }
  }
  float row_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; j < allowed; ++j) {
    const float v = x[j] * scale + (mask != nullptr ? mask[j] : 0.0f);
    if (!plain) y[j] = v;
    row_max = std::max(row_max, v);
  }
  if (row_max == kNegInf) {
    const float fill = empty == EmptyRow::kZeros ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    for (j = 0; j < n; ++j) y[j] = fill;  // the composition's -inf row: all NaN
    return;
  }

  // Pass 2: e = exp(v - max) into y; the sum.
  const float sum = ExpInto(plain ? x : y, allowed, row_max, y);

  // Pass 3: normalize (sum >= 1: the max contributes exp(0)).
  const auto inv = hn::Set(df, 1.0f / sum);
  for (j = 0; j < full; j += lanes) hn::StoreU(hn::Mul(hn::LoadU(df, y + j), inv), df, y + j);
  for (; j < allowed; ++j) y[j] *= 1.0f / sum;
  for (j = allowed; j < n; ++j) y[j] = 0.0f;
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TRANSMUTER_KERNELS_CPU_SOFTMAX_ROW_INL_H_ toggle
