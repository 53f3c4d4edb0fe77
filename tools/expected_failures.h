// Lists of expected failures grouped by reason (tests/onnx_backend/
// expected_failures.txt, tests/gradients/expected_failures.txt):
//
//   [reason]            a header; the cases below fail for this reason
//   case_name           in every mode
//   case_name @mode     in one mode ("@compiled" also covers "compiled-static"
//                       and "compiled-traced")
//   # comment
#pragma once

#include <map>
#include <string>

namespace transmuter::cli {

class ExpectedFailures {
 public:
  /** Reads `path` ("" gives an empty list); throws transmuter::Error naming
   * the file and line of a malformed or duplicate entry. */
  static ExpectedFailures read(const std::string& path);

  /** The reason `name` is expected to fail in `mode`, or nullptr: the entry
   * for exactly that mode, then for the mode's family (the part before '-'),
   * then for every mode. */
  const std::string* find(const std::string& name, const std::string& mode) const;

 private:
  std::map<std::string, std::string> reason_by_key_;  // "name" or "name@mode"
};

}  // namespace transmuter::cli
