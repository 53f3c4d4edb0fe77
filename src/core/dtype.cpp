#include "transmuter/dtype.h"

#include <mlx/mlx.h>

namespace transmuter {

namespace mx = mlx::core;

std::string onnx_type_name(OnnxType type) {
  switch (type) {
    case OnnxType::kFloat: return "float32";
    case OnnxType::kUint8: return "uint8";
    case OnnxType::kInt8: return "int8";
    case OnnxType::kUint16: return "uint16";
    case OnnxType::kInt16: return "int16";
    case OnnxType::kInt32: return "int32";
    case OnnxType::kInt64: return "int64";
    case OnnxType::kString: return "string";
    case OnnxType::kBool: return "bool";
    case OnnxType::kFloat16: return "float16";
    case OnnxType::kDouble: return "float64";
    case OnnxType::kUint32: return "uint32";
    case OnnxType::kUint64: return "uint64";
    case OnnxType::kComplex64: return "complex64";
    case OnnxType::kComplex128: return "complex128";
    case OnnxType::kBfloat16: return "bfloat16";
    case OnnxType::kFloat8E4M3FN: return "float8e4m3fn";
    case OnnxType::kFloat8E4M3FNUZ: return "float8e4m3fnuz";
    case OnnxType::kFloat8E5M2: return "float8e5m2";
    case OnnxType::kFloat8E5M2FNUZ: return "float8e5m2fnuz";
    case OnnxType::kUint4: return "uint4";
    case OnnxType::kInt4: return "int4";
    case OnnxType::kFloat4E2M1: return "float4e2m1";
    case OnnxType::kFloat8E8M0: return "float8e8m0";
    case OnnxType::kUint2: return "uint2";
    case OnnxType::kInt2: return "int2";
    case OnnxType::kUndefined: break;
  }
  return "type" + std::to_string(static_cast<int>(type));
}

std::optional<mx::Dtype> to_mlx_dtype(OnnxType type) {
  switch (type) {
    case OnnxType::kFloat: return mx::float32;
    case OnnxType::kUint8: return mx::uint8;
    case OnnxType::kInt8: return mx::int8;
    case OnnxType::kUint16: return mx::uint16;
    case OnnxType::kInt16: return mx::int16;
    case OnnxType::kInt32: return mx::int32;
    case OnnxType::kInt64: return mx::int64;
    case OnnxType::kBool: return mx::bool_;
    case OnnxType::kFloat16: return mx::float16;
    case OnnxType::kDouble: return mx::float64;
    case OnnxType::kUint32: return mx::uint32;
    case OnnxType::kUint64: return mx::uint64;
    case OnnxType::kComplex64: return mx::complex64;
    case OnnxType::kBfloat16: return mx::bfloat16;
    // Widened at load: MLX has no 4-bit or 8-bit float element types.
    case OnnxType::kUint4: case OnnxType::kUint2: return mx::uint8;
    case OnnxType::kInt4: case OnnxType::kInt2: return mx::int8;
    case OnnxType::kFloat8E4M3FN: case OnnxType::kFloat8E4M3FNUZ: case OnnxType::kFloat8E5M2:
    case OnnxType::kFloat8E5M2FNUZ: case OnnxType::kFloat4E2M1: case OnnxType::kFloat8E8M0:
      return mx::float32;
    default: return std::nullopt;
  }
}

OnnxType to_onnx_type(mx::Dtype dtype) {
  switch (dtype.val()) {
    case mx::Dtype::Val::bool_: return OnnxType::kBool;
    case mx::Dtype::Val::uint8: return OnnxType::kUint8;
    case mx::Dtype::Val::uint16: return OnnxType::kUint16;
    case mx::Dtype::Val::uint32: return OnnxType::kUint32;
    case mx::Dtype::Val::uint64: return OnnxType::kUint64;
    case mx::Dtype::Val::int8: return OnnxType::kInt8;
    case mx::Dtype::Val::int16: return OnnxType::kInt16;
    case mx::Dtype::Val::int32: return OnnxType::kInt32;
    case mx::Dtype::Val::int64: return OnnxType::kInt64;
    case mx::Dtype::Val::float16: return OnnxType::kFloat16;
    case mx::Dtype::Val::float32: return OnnxType::kFloat;
    case mx::Dtype::Val::float64: return OnnxType::kDouble;
    case mx::Dtype::Val::bfloat16: return OnnxType::kBfloat16;
    case mx::Dtype::Val::complex64: return OnnxType::kComplex64;
  }
  return OnnxType::kUndefined;
}

}  // namespace transmuter
