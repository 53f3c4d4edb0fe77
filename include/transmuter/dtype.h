// ONNX element types (TensorProto.DataType) and their mapping onto MLX dtypes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <mlx/dtype.h>

namespace transmuter {

/** TensorProto.DataType, numbered as in onnx.proto. */
enum class OnnxType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kUint8 = 2,
  kInt8 = 3,
  kUint16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUint32 = 12,
  kUint64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBfloat16 = 16,
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
  kUint4 = 21,
  kInt4 = 22,
  kFloat4E2M1 = 23,
  kFloat8E8M0 = 24,
  kUint2 = 25,
  kInt2 = 26,
};

/** "float32", "int64", "float8e4m3fn", ...: the name used in messages. */
std::string onnx_type_name(OnnxType type);

/** The MLX dtype that holds values of `type` at run time. Sub-byte and float8
 * types are widened (int4 -> int8, float8 -> float32 at load; see
 * src/onnx/tensor.cpp); string and undefined have none. */
std::optional<mlx::core::Dtype> to_mlx_dtype(OnnxType type);

/** The ONNX type that an MLX dtype stands for. */
OnnxType to_onnx_type(mlx::core::Dtype dtype);

}  // namespace transmuter
