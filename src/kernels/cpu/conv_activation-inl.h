// A convolution's activation (ConvActivation: none, Relu, Clip, HardSwish) on
// one vector, shared by the GEMM's epilogue and the convolution kernels.
// Highway per-target code: include it after hwy/highway.h inside a file that
// foreach_target re-includes (the guard toggles per target).
#include "kernels/cpu/depthwise_conv.h"  // ConvActivation

#if defined(TRANSMUTER_KERNELS_CPU_CONV_ACTIVATION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TRANSMUTER_KERNELS_CPU_CONV_ACTIVATION_INL_H_
#undef TRANSMUTER_KERNELS_CPU_CONV_ACTIVATION_INL_H_
#else
#define TRANSMUTER_KERNELS_CPU_CONV_ACTIVATION_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// `kind` applied to v; lo and hi bound kClip.
template <class D>
HWY_INLINE hn::Vec<D> ApplyConvActivation(D d, hn::Vec<D> v, ConvActivation kind, float lo, float hi) {
  switch (kind) {
    case ConvActivation::kNone:
      return v;
    case ConvActivation::kRelu:
      return hn::Max(v, hn::Zero(d));
    case ConvActivation::kClip:
      return hn::Min(hn::Max(v, hn::Set(d, lo)), hn::Set(d, hi));
    case ConvActivation::kHardSwish: {
      const auto gate = hn::MulAdd(v, hn::Set(d, 1.0f / 6.0f), hn::Set(d, 0.5f));
      return hn::Mul(v, hn::Min(hn::Max(gate, hn::Zero(d)), hn::Set(d, 1.0f)));
    }
  }
  return v;
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
