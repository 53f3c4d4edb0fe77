// The 8-bit convolutions' requantization of one vector of 16 exact int32 sums (bias included) on AVX-512, as
// ONNX Runtime's QLinearConv computes it: float32, times the multiplier, clamped to the output's range less
// the zero point (the same as saturating after rounding, the bounds being integers), rounded half to even
// (vcvtps2dq under the default rounding mode), plus the zero point, narrowed with vpmovdb (the values fit):
// no overflow fix-ups and packs, as a portable form needs. Shared by the integer GEMM's epilogue
// (integer_gemm.cpp) and the depthwise kernels (qlinear_conv.cpp).
//
// Highway per-target code: include it after hwy/highway.h inside a file that foreach_target re-includes
// (the guard toggles per target); it defines nothing below AVX3.
#if defined(TRANSMUTER_KERNELS_CPU_REQUANTIZE_AVX512_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TRANSMUTER_KERNELS_CPU_REQUANTIZE_AVX512_INL_H_
#undef TRANSMUTER_KERNELS_CPU_REQUANTIZE_AVX512_INL_H_
#else
#define TRANSMUTER_KERNELS_CPU_REQUANTIZE_AVX512_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {

#if HWY_TARGET <= HWY_AVX3
// The output's range less its zero point, and the zero point, broadcast for RequantizedBytes.
struct RequantizeBounds {
  __m512 low, high;
  __m512i zero;
  RequantizeBounds(int32_t y_min, int32_t y_max, int32_t y_zero)
      : low(_mm512_set1_ps(static_cast<float>(y_min - y_zero))),
        high(_mm512_set1_ps(static_cast<float>(y_max - y_zero))),
        zero(_mm512_set1_epi32(y_zero)) {}
};

// The 16 output bytes of `sum` (two's complement when the output is int8). vpmovdb writes a register here:
// its memory form, which the compiler would otherwise fuse with the caller's store, is slow on Zen 4 (a
// fifth of a pointwise convolution's time).
HWY_INLINE __m128i RequantizedBytes(__m512i sum, __m512 multiplier, const RequantizeBounds& b) {
  const __m512 f =
      _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), multiplier), b.low), b.high);
  __m128i bytes = _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), b.zero));
  asm("" : "+v"(bytes));
  return bytes;
}
#endif

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
