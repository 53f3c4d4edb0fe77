#include "transmuter/value.h"

#include <mlx/mlx.h>

#include "transmuter/error.h"

namespace transmuter {

Value::Value(mx::array tensor, OnnxType type) : v_(std::move(tensor)) {
  const mx::Dtype dtype = std::get<mx::array>(v_).dtype();
  if (to_onnx_type(dtype) == type) return;
  const std::optional<mx::Dtype> storage = to_mlx_dtype(type);
  if (!storage || *storage != dtype) {
    std::ostringstream held;
    held << dtype;
    throw Error(str("a ", held.str(), " tensor cannot hold ", onnx_type_name(type), " values"));
  }
  narrow_type_ = type;
}

OnnxType Value::element_type() const {
  return is_widened() ? narrow_type_ : to_onnx_type(tensor().dtype());
}

const mx::array& Value::tensor() const {
  if (!is_tensor()) throw Error(str("expected a tensor, got ", describe()));
  return std::get<mx::array>(v_);
}

const StringTensor& Value::strings() const {
  if (!is_strings()) throw Error(str("expected a string tensor, got ", describe()));
  return std::get<StringTensor>(v_);
}

const Sequence& Value::sequence_items() const {
  if (!is_sequence()) throw Error(str("expected a sequence, got ", describe()));
  return *std::get<std::shared_ptr<Sequence>>(v_);
}

namespace {
template <typename Dims>
std::string dims_text(const Dims& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}
}  // namespace

std::string Value::describe() const {
  switch (kind()) {
    case Kind::kNone:
      return "none";
    case Kind::kTensor: {
      std::ostringstream dtype;
      dtype << tensor().dtype();
      std::string type = is_widened() ? onnx_type_name(narrow_type_) + " (as " + dtype.str() + ")" : dtype.str();
      return "tensor " + type + dims_text(tensor().shape());
    }
    case Kind::kStrings:
      return "strings" + dims_text(strings().shape);
    case Kind::kSequence:
      return str("sequence(", sequence_items().size(), ")");
  }
  return "?";
}

}  // namespace transmuter
