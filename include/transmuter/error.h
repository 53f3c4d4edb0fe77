// Exceptions thrown by Transmuter. Every message names where the problem is:
// the file and field for a bad model, the op, version and node for a failing
// operator, the input name for a bad input.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace transmuter {

/** Base of every exception Transmuter throws. */
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/** The model file (or its external data) is malformed or escapes its folder. */
class ModelFormatError : public Error {
 public:
  using Error::Error;
};

/** An operator (domain "ai.onnx" for the default one) at the opset a model imports. */
struct MissingOperator {
  std::string domain;
  std::string op_type;
  int64_t opset = 0;
};

/** The model uses operators (or versions) that Transmuter does not implement;
 * missing() lists every one (empty when the error is not about operators). */
class UnsupportedError : public Error {
 public:
  explicit UnsupportedError(const std::string& message, std::vector<MissingOperator> missing = {})
      : Error(message), missing_(std::move(missing)) {}
  const std::vector<MissingOperator>& missing() const { return missing_; }

 private:
  std::vector<MissingOperator> missing_;
};

/** An operator failed: bad attribute, shape or dtype. Message starts with
 * `[OpType vN] node 'name': `. */
class OpError : public Error {
 public:
  using Error::Error;
};

/** An input given to run/compile has the wrong name, dtype or shape. */
class InputError : public Error {
 public:
  using Error::Error;
};

/** Concatenates the streamable arguments into one string. */
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace transmuter
