// An ONNX value: a tensor, a string tensor, a sequence, or an empty optional.
// Only tensors cross a compiled boundary; the other kinds are plain C++ values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <mlx/array.h>

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

  /** "tensor float32[2,3]", "strings[4]", "sequence(3)", "none": for messages. */
  std::string describe() const;

 private:
  std::variant<std::monostate, mx::array, StringTensor, std::shared_ptr<Sequence>> v_;
};

}  // namespace transmuter
