// An ONNX value: a tensor, a string tensor, a sequence, or an empty optional.
// Only tensors cross a compiled boundary; the other kinds are plain C++ values.
//
// A tensor also knows its ONNX element type where MLX stores it wider: MLX has
// no float8, float4 or sub-byte integer dtypes, so those are held widened
// (to_mlx_dtype: float8/float4 as float32, int4/int2 as int8, uint4/uint2 as
// uint8), each element exactly a value of the narrow type, and the Value
// remembers the narrow type. Everything else reads it from the MLX dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <mlx/array.h>

#include "transmuter/dtype.h"

namespace transmuter {

namespace mx = mlx::core;

/** A tensor of strings (ONNX dtype STRING); row-major, `data.size()` equals
 * the product of `shape`. */
struct StringTensor {
  std::vector<int64_t> shape;
  std::vector<std::string> data;
};

class Value;
/** An ONNX sequence: an ordered list of values (usually tensors). */
using Sequence = std::vector<Value>;

/** One ONNX value. Default-constructed it is an empty optional (`none`). */
class Value {
 public:
  enum class Kind { kNone, kTensor, kStrings, kSequence };

  Value() = default;
  Value(mx::array tensor) : v_(std::move(tensor)) {}  // NOLINT: implicit by design
  /** A tensor holding values of ONNX element type `type`: a narrow type held
   * widened (its MLX dtype must be to_mlx_dtype(type)) or the type the MLX
   * dtype stands for. Throws transmuter::Error on any other pairing. */
  Value(mx::array tensor, OnnxType type);
  Value(StringTensor strings) : v_(std::move(strings)) {}  // NOLINT
  static Value sequence(Sequence items) {
    Value out;
    out.v_ = std::make_shared<Sequence>(std::move(items));
    return out;
  }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_tensor() const { return kind() == Kind::kTensor; }
  bool is_strings() const { return kind() == Kind::kStrings; }
  bool is_sequence() const { return kind() == Kind::kSequence; }

  /** The tensor; throws transmuter::Error when this value is not a tensor. */
  const mx::array& tensor() const;
  const StringTensor& strings() const;
  const Sequence& sequence_items() const;
  /** A tensor's ONNX element type: the narrow type it holds widened, else
   * the type of its MLX dtype. Throws when this value is not a tensor. */
  OnnxType element_type() const;
  /** True for a tensor held wider than its element type (int4 as int8...). */
  bool is_widened() const { return narrow_type_ != OnnxType::kUndefined; }

  /** "tensor float32[2,3]", "tensor int4 (as int8)[5]", "strings[4]",
   * "sequence(3)", "none": for messages. */
  std::string describe() const;

 private:
  std::variant<std::monostate, mx::array, StringTensor, std::shared_ptr<Sequence>> v_;
  OnnxType narrow_type_ = OnnxType::kUndefined;  // set only for widened tensors
};

}  // namespace transmuter
