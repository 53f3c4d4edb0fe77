// Loads and stores of the first `count` lanes of a vector at any address, for
// the tails of rows: the lanes past `count` are neither read nor written.
//
// Why not hn::MaskedLoad / hn::BlendedStore: in Highway 1.0.3 (Debian 12's
// libhwy-dev) they only mask memory on AVX2 (4- and 8-byte lanes) and AVX-512.
// On SSE4, NEON and the emulated targets MaskedLoad is an *aligned* load of the
// whole vector (a fault on an unaligned tail, a read past the end of the
// buffer), and NEON's BlendedStore rewrites the lanes it masks off (a race with
// the thread that owns them). There, the lanes go through a stack buffer.
//
// Highway per-target code: include it after hwy/highway.h inside a file that
// foreach_target re-includes (the guard toggles per target).
#if defined(TRANSMUTER_KERNELS_CPU_PARTIAL_VECTORS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TRANSMUTER_KERNELS_CPU_PARTIAL_VECTORS_INL_H_
#undef TRANSMUTER_KERNELS_CPU_PARTIAL_VECTORS_INL_H_
#else
#define TRANSMUTER_KERNELS_CPU_PARTIAL_VECTORS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstring>

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether the target's MaskedLoad and BlendedStore touch only the lanes of
// the mask for lanes of T.
template <typename T>
constexpr bool MasksMemory() {
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3)
  return true;
#elif HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2)
  return sizeof(T) >= 4;
#else
  return false;
#endif
}

// Lanes [0, count) of p, zeros after; count may exceed the lanes (a full load).
template <class D>
HWY_INLINE hn::Vec<D> LoadFirst(D d, const hn::TFromD<D>* HWY_RESTRICT p, size_t count) {
  using T = hn::TFromD<D>;
  const size_t lanes = hn::Lanes(d);
  if (count >= lanes) return hn::LoadU(d, p);
  if constexpr (MasksMemory<T>()) {
    return hn::MaskedLoad(hn::FirstN(d, count), d, p);
  } else {
    HWY_ALIGN T buffer[HWY_MAX_BYTES / sizeof(T)] = {};
    std::memcpy(buffer, p, count * sizeof(T));
    return hn::Load(d, buffer);
  }
}

// Stores lanes [0, count) of v to p; count may exceed the lanes (a full store).
template <class D>
HWY_INLINE void StoreFirst(hn::Vec<D> v, D d, hn::TFromD<D>* HWY_RESTRICT p, size_t count) {
  using T = hn::TFromD<D>;
  const size_t lanes = hn::Lanes(d);
  if (count >= lanes) {
    hn::StoreU(v, d, p);
  } else if constexpr (MasksMemory<T>()) {
    hn::BlendedStore(v, hn::FirstN(d, count), d, p);
  } else {
    HWY_ALIGN T buffer[HWY_MAX_BYTES / sizeof(T)];
    hn::Store(v, d, buffer);
    std::memcpy(p, buffer, count * sizeof(T));
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
