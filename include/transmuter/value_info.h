// Declared types of graph inputs and outputs (ValueInfoProto), as the model states them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transmuter/dtype.h"

namespace transmuter {

/** A dimension of a declared shape: a number, a symbol ("batch"), or unknown. */
struct Dim {
  std::optional<int64_t> value;
  std::string symbol;
};

/** The declared type of a graph input/output (ValueInfoProto). */
struct ValueInfo {
  std::string name;
  enum class Kind { kTensor, kSequence, kOptional, kMap, kUnknown } kind = Kind::kUnknown;
  OnnxType elem_type = OnnxType::kUndefined;  // for sequences/optionals: of the element
  bool has_shape = false;
  std::vector<Dim> shape;
};

}  // namespace transmuter
