#include "ops/onnx/narrow_types.h"

#include <cstdint>
#include <limits>
#include <stdexcept>

namespace transmuter {
namespace {

mx::array u32(uint32_t v) { return mx::array(v, mx::uint32); }

/** A small binary float format: sign, exponent, `mantissa_bits` of mantissa. */
struct MiniFloat {
  int mantissa_bits;
  int min_exponent;  // unbiased exponent of the smallest normal number
  float max_value;
  bool has_inf;        // overflow without saturation gives inf, else NaN
  bool unsigned_zero;  // the FNUZ formats have no -0
  bool has_nan;        // float4e2m1 has no NaN: NaN becomes 0
};

constexpr MiniFloat kE4M3FN{3, -6, 448.0f, false, false, true};
constexpr MiniFloat kE4M3FNUZ{3, -7, 240.0f, false, true, true};
constexpr MiniFloat kE5M2{2, -14, 57344.0f, true, false, true};
constexpr MiniFloat kE5M2FNUZ{2, -15, 57344.0f, false, true, true};
constexpr MiniFloat kE2M1{1, 0, 6.0f, false, false, false};

/** Rounds float32 `x` to the nearest value of `format` (ties to even), as
 * float32. Out of range: the largest finite value when saturating (the Cast-19
 * default), else inf or NaN as the format allows (spec table in Cast-19). */
mx::array round_to_minifloat(const mx::array& x, const MiniFloat& format, bool saturate,
                             mx::StreamOrDevice s) {
  mx::array bits = mx::view(x, mx::uint32, s);
  mx::array sign = mx::bitwise_and(bits, u32(0x80000000u), s);
  mx::array biased =
      mx::astype(mx::bitwise_and(mx::right_shift(bits, u32(23), s), u32(0xFF), s), mx::int32, s);
  // Spacing of representable values around x: 2^(exponent - mantissa_bits),
  // with the exponent held at the subnormal floor below the normal range.
  mx::array exponent =
      mx::maximum(mx::subtract(biased, mx::array(127), s), mx::array(format.min_exponent), s);
  mx::array quantum_bits =
      mx::left_shift(mx::add(exponent, mx::array(127 - format.mantissa_bits), s), mx::array(23), s);
  mx::array quantum = mx::view(mx::astype(quantum_bits, mx::uint32, s), mx::float32, s);
  mx::array magnitude = mx::abs(x, s);
  mx::array rounded = mx::multiply(mx::round(mx::divide(magnitude, quantum, s), 0, s), quantum, s);

  mx::array overflow = mx::greater(rounded, mx::array(format.max_value), s);
  float overflow_value = format.max_value;
  if (!saturate) {
    overflow_value =
        format.has_inf ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  }
  rounded = mx::where(overflow, mx::array(overflow_value), rounded, s);
  if (!format.has_nan) rounded = mx::where(mx::isnan(rounded, s), mx::array(0.0f), rounded, s);
  if (format.unsigned_zero) sign = mx::where(mx::equal(rounded, mx::array(0.0f), s), u32(0), sign, s);
  // Rounding is piecewise constant: its gradient is 0 almost everywhere, and
  // stop_gradient keeps mx::vjp away from mx::view, which it cannot differentiate.
  mx::array signed_bits = mx::bitwise_or(mx::view(rounded, mx::uint32, s), sign, s);
  return mx::stop_gradient(mx::view(signed_bits, mx::float32, s), s);
}

}  // namespace

bool is_narrow_float(OnnxType type) {
  switch (type) {
    case OnnxType::kFloat8E4M3FN: case OnnxType::kFloat8E4M3FNUZ: case OnnxType::kFloat8E5M2:
    case OnnxType::kFloat8E5M2FNUZ: case OnnxType::kFloat4E2M1:
      return true;
    default:
      return false;
  }
}

mx::array round_to_narrow_float(const mx::array& x, OnnxType type, bool saturate, mx::StreamOrDevice s) {
  mx::array x32 = mx::astype(x, mx::float32, s);
  switch (type) {
    case OnnxType::kFloat8E4M3FN: return round_to_minifloat(x32, kE4M3FN, saturate, s);
    case OnnxType::kFloat8E4M3FNUZ: return round_to_minifloat(x32, kE4M3FNUZ, saturate, s);
    case OnnxType::kFloat8E5M2: return round_to_minifloat(x32, kE5M2, saturate, s);
    case OnnxType::kFloat8E5M2FNUZ: return round_to_minifloat(x32, kE5M2FNUZ, saturate, s);
    // float4e2m1 has neither inf nor NaN: it always saturates.
    case OnnxType::kFloat4E2M1: return round_to_minifloat(x32, kE2M1, true, s);
    default: throw std::invalid_argument("round_to_narrow_float: not a float8/float4 type");
  }
}

std::optional<IntRange> sub_byte_range(OnnxType type) {
  switch (type) {
    case OnnxType::kInt4: return IntRange{-8, 7};
    case OnnxType::kUint4: return IntRange{0, 15};
    case OnnxType::kInt2: return IntRange{-2, 1};
    case OnnxType::kUint2: return IntRange{0, 3};
    default: return std::nullopt;
  }
}

mx::array wrap_to_bits(const mx::array& x, int bits, bool is_signed, mx::StreamOrDevice s) {
  mx::array v = mx::astype(x, mx::int64, s);
  int64_t modulus = int64_t{1} << bits;
  v = mx::bitwise_and(v, mx::array(modulus - 1, mx::int64), s);
  if (is_signed) {
    mx::array half = mx::array(modulus / 2, mx::int64);
    v = mx::subtract(mx::bitwise_xor(v, half, s), half, s);
  }
  return mx::astype(v, is_signed ? mx::int8 : mx::uint8, s);
}


}  // namespace transmuter
