// Exceptions thrown by Transmuter. Every message names where the problem is:
// the file and field for a bad model, the op, version and node for a failing
// operator, the input name for a bad input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

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

/** The model uses operators (or versions) that Transmuter does not implement. */
class UnsupportedError : public Error {
 public:
  using Error::Error;
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
