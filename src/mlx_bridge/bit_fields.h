// Sub-byte integer fields as com.microsoft's quantized-weight operators pack them
// (MatMulNBits, GatherBlockQuantized, QMoE): 2, 4 or 8 bits per field, the low
// bits of each byte first.
#pragma once

#include <cstdint>
#include <vector>

#include <mlx/mlx.h>

namespace transmuter {

/** The `bits`-bit fields of each byte of `packed` along its last axis, low bits
 * first: [..., n] uint8 -> [..., n * 8 / bits] uint8. */
inline mlx::core::array unpack_bit_fields(const mlx::core::array& packed, int bits,
                                          mlx::core::StreamOrDevice s) {
  namespace mx = mlx::core;
  if (bits == 8) return packed;
  const int per_byte = 8 / bits;
  std::vector<uint8_t> shift_values(per_byte);
  for (int j = 0; j < per_byte; ++j) shift_values[j] = static_cast<uint8_t>(j * bits);
  mx::array shifts(shift_values.begin(), {per_byte}, mx::uint8);
  mx::array fields = mx::bitwise_and(mx::right_shift(mx::expand_dims(packed, -1, s), shifts, s),
                                     mx::array(static_cast<uint8_t>((1 << bits) - 1), mx::uint8), s);
  mx::Shape shape = packed.shape();
  shape.back() *= per_byte;
  return mx::reshape(fields, shape, s);
}

}  // namespace transmuter
