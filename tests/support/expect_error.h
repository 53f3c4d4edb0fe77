// Captures the message of an expected exception, for tests that check what
// an error says (the field, tensor or node it names).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "transmuter/error.h"

namespace transmuter::testing {

/** Runs `fn`; returns the message of the `E` it throws, or records a test
 * failure and returns "" when it throws nothing. */
template <typename E = ModelFormatError, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

}  // namespace transmuter::testing
