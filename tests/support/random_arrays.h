// Seeded arrays and distances for the tests that compare a kernel, fused op or
// pass with a reference composition (tests/kernels, tests/ops/microsoft,
// tests/passes).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include <mlx/mlx.h>

#include "mlx_bridge/buffers.h"

namespace transmuter::testing {

namespace mx = mlx::core;

/** Standard normal float32 values times `scale`, the same for the same seed. */
inline mx::array random_array(const mx::Shape& shape, uint64_t seed, float scale = 1.0f) {
  return mx::multiply(mx::random::normal(shape, mx::float32, 0, 1, mx::random::key(seed)), mx::array(scale));
}

/** Uniform float32 values in [-scale, scale), the same for the same seed. */
inline mx::array random_uniform(const mx::Shape& shape, uint64_t seed, float scale = 1.0f) {
  return mx::random::uniform(-scale, scale, shape, mx::float32, mx::random::key(seed));
}

/** `a`, evaluated now: an initializer or input as a loaded model holds it, rather than an MLX computation
 * that every run's graph would contain (and that keeps a graph off the calling thread's evaluation). */
inline mx::array evaluated(mx::array a) {
  mx::eval(a);
  return a;
}

/** Uniform uint8 values (packed quantized weights, zero points), the same for the same seed. */
inline mx::array random_bytes(const mx::Shape& shape, uint64_t seed) {
  return mx::astype(mx::random::randint(0, 256, shape, mx::int32, mx::random::key(seed)), mx::uint8);
}

/** `values` as the loader gives a large tensor whose bytes lie misaligned in
 * its file: an unevaluated deferred_copy over a copy of the bytes placed one
 * byte past an 8-byte boundary. */
inline mx::array misaligned_deferred(mx::array values) {
  values = mx::contiguous(values);
  values.eval();
  auto storage = std::make_shared<std::vector<uint8_t>>(values.nbytes() + 16);
  const size_t offset = 9 - reinterpret_cast<uintptr_t>(storage->data()) % 8;  // address = 1 mod 8
  std::memcpy(storage->data() + offset, values.data<uint8_t>(), values.nbytes());
  return deferred_copy(std::span<const uint8_t>(storage->data() + offset, values.nbytes()), storage,
                       values.shape(), values.dtype(), nullptr, std::span<const uint8_t>(*storage));
}

/** max |a - b| over all elements, computed in float32 (half inputs widen). */
inline float max_abs_diff(const mx::array& a, const mx::array& b) {
  return mx::max(mx::abs(mx::subtract(mx::astype(a, mx::float32), mx::astype(b, mx::float32)))).item<float>();
}

}  // namespace transmuter::testing
