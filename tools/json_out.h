// JSON output of the text commands: strings escaped, floats in the shortest form that reads back
// as the same float32.
#pragma once

#include <cstdio>
#include <ostream>
#include <string>

namespace transmuter::cli {

/** A JSON string: UTF-8 passes through, quotes, backslashes and control characters are escaped. */
inline void write_json_string(std::ostream& out, const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  out << '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out << '\\' << c;
    } else if (c < 0x20) {
      out << "\\u00" << kHex[c >> 4] << kHex[c & 15];
    } else {
      out << c;
    }
  }
  out << '"';
}

/** 9 significant digits: enough to read back every float32 exactly. */
inline void write_json_float(std::ostream& out, float value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", static_cast<double>(value));
  out << buffer;
}

}  // namespace transmuter::cli
