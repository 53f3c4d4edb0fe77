#include "expected_failures.h"

#include <fstream>

#include "transmuter/error.h"

namespace transmuter::cli {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

ExpectedFailures ExpectedFailures::read(const std::string& path) {
  ExpectedFailures out;
  if (path.empty()) return out;
  std::ifstream in(path);
  if (!in) throw Error(str(path, ": cannot open the expected-failures file"));
  std::string line, reason;
  for (int number = 1; std::getline(in, line); ++number) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']') throw Error(str(path, ":", number, ": unterminated [reason]"));
      reason = line.substr(1, line.size() - 2);
      continue;
    }
    if (reason.empty()) throw Error(str(path, ":", number, ": case '", line, "' listed before any [reason]"));
    std::string key = line;
    auto at = line.find(" @");
    if (at != std::string::npos) key = trim(line.substr(0, at)) + "@" + trim(line.substr(at + 2));
    if (!out.reason_by_key_.emplace(key, reason).second) {
      throw Error(str(path, ":", number, ": '", key, "' listed twice"));
    }
  }
  return out;
}

const std::string* ExpectedFailures::find(const std::string& name, const std::string& mode) const {
  for (const std::string& key : {name + "@" + mode, name + "@" + mode.substr(0, mode.find('-')), name}) {
    auto it = reason_by_key_.find(key);
    if (it != reason_by_key_.end()) return &it->second;
  }
  return nullptr;
}

}  // namespace transmuter::cli
