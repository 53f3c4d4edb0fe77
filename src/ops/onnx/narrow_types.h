// Float8, float4 and sub-byte integer values as Transmuter holds them: widened
// (float8/float4 as float32, int4/int2 as int8, uint4/uint2 as uint8; see
// to_mlx_dtype), each element holding exactly a value the narrow type can
// represent. Shared by Cast/CastLike and the quantization ops, which produce
// such values.
#pragma once

#include <optional>

#include <mlx/mlx.h>

#include "transmuter/dtype.h"

namespace transmuter {

namespace mx = mlx::core;

/** True for float8e4m3fn/e4m3fnuz/e5m2/e5m2fnuz and float4e2m1 (not e8m0,
 * a bare power of two with its own rounding modes). */
bool is_narrow_float(OnnxType type);

/** Rounds float32 `x` to the nearest value of the narrow float `type` (ties to
 * even), held as float32. Out of range: the largest finite value when
 * `saturate` (float4e2m1 always saturates), else inf or NaN as the format
 * allows (the tables in the Cast-19 spec). Piecewise constant: its gradient
 * is stopped (0). */
mx::array round_to_narrow_float(const mx::array& x, OnnxType type, bool saturate, mx::StreamOrDevice s);

/** The [min, max] integer range of a sub-byte integer type (int4, uint4,
 * int2, uint2), or nullopt for other types. */
struct IntRange {
  int64_t min;
  int64_t max;
};
std::optional<IntRange> sub_byte_range(OnnxType type);

/** Keeps the low `bits` bits of integer `x` (two's complement when signed), as
 * the Cast spec asks for out-of-range integers; floats truncate toward zero
 * first. Held as int8 (signed) or uint8. */
mx::array wrap_to_bits(const mx::array& x, int bits, bool is_signed, mx::StreamOrDevice s);

}  // namespace transmuter
