#include "graph/subgraphs.h"

#include <set>
#include <unordered_set>

namespace transmuter {

namespace {

void collect_free_names(const Graph& graph, std::set<std::string>& out) {
  std::unordered_set<std::string> defined;
  for (const ValueInfo& input : graph.inputs) defined.insert(input.name);
  for (const auto& [name, value] : graph.initializers) defined.insert(name);
  for (const Node& node : graph.nodes) defined.insert(node.outputs.begin(), node.outputs.end());
  auto add = [&](const std::string& name) {
    if (!name.empty() && !defined.contains(name)) out.insert(name);
  };
  for (const Node& node : graph.nodes) {
    for (const std::string& input : node.inputs) add(input);
    for_each_subgraph(node, [&](const Graph& sub) {
      std::set<std::string> inner;
      collect_free_names(sub, inner);
      for (const std::string& name : inner) add(name);
    });
  }
}

}  // namespace

std::vector<std::string> free_names(const Graph& graph) {
  std::set<std::string> names;
  collect_free_names(graph, names);
  return {names.begin(), names.end()};
}

std::vector<std::string> node_reads(const Node& node) {
  std::vector<std::string> reads;
  for (const std::string& input : node.inputs) {
    if (!input.empty()) reads.push_back(input);
  }
  for_each_subgraph(node, [&](const Graph& sub) {
    std::vector<std::string> outer = free_names(sub);
    reads.insert(reads.end(), outer.begin(), outer.end());
  });
  return reads;
}

}  // namespace transmuter
