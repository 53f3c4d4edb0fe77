// Seeded arrays and distances for the tests that compare a kernel, fused op or
// pass with a reference composition (tests/kernels, tests/ops/microsoft,
// tests/passes).
#pragma once

#include <cstdint>

#include <mlx/mlx.h>

namespace transmuter::testing {

namespace mx = mlx::core;

/** Standard normal float32 values times `scale`, the same for the same seed. */
inline mx::array random_array(const mx::Shape& shape, uint64_t seed, float scale = 1.0f) {
  return mx::multiply(mx::random::normal(shape, mx::float32, 0, 1, mx::random::key(seed)), mx::array(scale));
}

/** Uniform uint8 values (packed quantized weights, zero points), the same for the same seed. */
inline mx::array random_bytes(const mx::Shape& shape, uint64_t seed) {
  return mx::astype(mx::random::randint(0, 256, shape, mx::int32, mx::random::key(seed)), mx::uint8);
}

/** max |a - b| over all elements, computed in float32 (half inputs widen). */
inline float max_abs_diff(const mx::array& a, const mx::array& b) {
  return mx::max(mx::abs(mx::subtract(mx::astype(a, mx::float32), mx::astype(b, mx::float32)))).item<float>();
}

}  // namespace transmuter::testing
