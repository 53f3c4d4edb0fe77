// Sums across the lanes of several vectors at once, as Highway per-target code for kernels that end
// many short dot products (the GQA kernel's scores; tried in the quantized GEMV's columns, where it
// measured no faster); and the sum of one row (layer norm's mean, the reduction kernel's rows). Include it
// after hwy/highway.h inside a file that foreach_target re-includes (the include guard below toggles per
// target, Highway's "-inl.h" convention). Not for HWY_SCALAR.
#if defined(TRANSMUTER_KERNELS_CPU_LANE_SUMS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TRANSMUTER_KERNELS_CPU_LANE_SUMS_INL_H_
#undef TRANSMUTER_KERNELS_CPU_LANE_SUMS_INL_H_
#else
#define TRANSMUTER_KERNELS_CPU_LANE_SUMS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// The sums across the lanes of a0..a3, in lanes 0-3 of one 128-bit vector: pairs interleaved and added
// within each 128-bit block (the four sums of a block's lanes side by side), then the blocks added. About
// a third of the instructions of four separate reductions.
template <class D, class V = hn::Vec<D>>
HWY_INLINE hn::Vec<hn::Full128<float>> SumsOfFour(D d, V a0, V a1, V a2, V a3) {
  const hn::Repartition<uint64_t, D> du;
  const V t0 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const V t1 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto w0 = hn::BitCast(du, t0), w1 = hn::BitCast(du, t1);
  const V u =
      hn::Add(hn::BitCast(d, hn::InterleaveLower(du, w0, w1)), hn::BitCast(d, hn::InterleaveUpper(du, w0, w1)));
  const hn::Full128<float> d4;
  HWY_ALIGN float blocks[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(u, d, blocks);
  auto sums = hn::Load(d4, blocks);
  for (size_t b = 4; b < hn::Lanes(d); b += 4) sums = hn::Add(sums, hn::Load(d4, blocks + b));
  return sums;
}
#endif

// The sum of v[0, d), in two vector accumulators.
HWY_INLINE float SumOfRow(const float* v, int64_t d) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * lanes <= d; i += 2 * lanes) {
    acc0 = hn::Add(acc0, hn::LoadU(df, v + i));
    acc1 = hn::Add(acc1, hn::LoadU(df, v + i + lanes));
  }
  for (; i + lanes <= d; i += lanes) acc0 = hn::Add(acc0, hn::LoadU(df, v + i));
  float total = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < d; ++i) total += v[i];
  return total;
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TRANSMUTER_KERNELS_CPU_LANE_SUMS_INL_H_ toggle
