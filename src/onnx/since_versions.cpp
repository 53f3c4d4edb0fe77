#include "onnx/since_versions.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace transmuter {

namespace {

struct Schema {
  std::string_view domain;
  std::string_view op_type;
  std::vector<int> since;
};

const std::map<std::pair<std::string_view, std::string_view>, std::vector<int>>& table() {
  static const auto by_key = [] {
    static const Schema kSchemas[] = {
#include "onnx/since_versions.inc"
    };
    std::map<std::pair<std::string_view, std::string_view>, std::vector<int>> out;
    for (const Schema& s : kSchemas) out.emplace(std::pair{s.domain, s.op_type}, s.since);
    return out;
  }();
  return by_key;
}

}  // namespace

std::span<const int> onnx_since_versions(std::string_view domain, std::string_view op_type) {
  if (domain == "ai.onnx") domain = "";
  auto it = table().find({domain, op_type});
  if (it == table().end()) return {};
  return it->second;
}

std::vector<std::string_view> onnx_schema_ops(std::string_view domain) {
  if (domain == "ai.onnx") domain = "";
  std::vector<std::string_view> out;
  for (const auto& [key, since] : table()) {
    if (key.first == domain) out.push_back(key.second);
  }
  return out;
}

}  // namespace transmuter
