#include "graph/topological_sort.h"

#include <functional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "graph/subgraphs.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

std::string describe(const Node& node, size_t index) {
  if (node.name.empty()) return str("node #", index, " (", node.op_type, ")");
  return str("node '", node.name, "' (", node.op_type, ")");
}

std::string graph_label(const Graph& graph) {
  return graph.name.empty() ? std::string("graph") : str("graph '", graph.name, "'");
}

}  // namespace

void topological_sort(Graph& graph, const std::set<std::string>& outer_scope) {
  const size_t n = graph.nodes.size();
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& output : graph.nodes[i].outputs) {
      if (output.empty()) continue;
      auto [it, inserted] = producer.emplace(output, i);
      if (!inserted) {
        throw ModelFormatError(str(graph_label(graph), ": value '", output, "' is produced by both ",
                                   describe(graph.nodes[it->second], it->second), " and ",
                                   describe(graph.nodes[i], i)));
      }
    }
  }
  std::unordered_set<std::string> available(outer_scope.begin(), outer_scope.end());
  for (const ValueInfo& input : graph.inputs) available.insert(input.name);
  for (const auto& [name, value] : graph.initializers) available.insert(name);

  // Edges producer -> consumer; a value produced in this graph shadows the
  // same name from an enclosing scope.
  std::vector<std::vector<size_t>> consumers(n);
  std::vector<size_t> waiting_on(n, 0);
  std::vector<std::vector<std::string>> needed(n);
  for (size_t i = 0; i < n; ++i) {
    needed[i] = node_reads(graph.nodes[i]);
    std::unordered_set<size_t> producers;
    for (const std::string& name : needed[i]) {
      auto found = producer.find(name);
      if (found != producer.end()) {
        producers.insert(found->second);
      } else if (!available.contains(name)) {
        throw ModelFormatError(str(graph_label(graph), ": ", describe(graph.nodes[i], i),
                                   ": input '", name,
                                   "' is produced by no node and is not a graph input, "
                                   "initializer or outer-scope value"));
      }
    }
    for (size_t p : producers) consumers[p].push_back(i);
    waiting_on[i] = producers.size();
  }

  // Kahn's algorithm, always taking the lowest original index that is ready,
  // so an already valid order is kept as is.
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i) {
    if (waiting_on[i] == 0) ready.push(i);
  }
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t c : consumers[i]) {
      if (--waiting_on[c] == 0) ready.push(c);
    }
  }
  if (order.size() != n) {
    // Walk back through unsorted producers until a node repeats: that node
    // lies on a cycle.
    auto unsorted_producer = [&](size_t i) -> std::pair<size_t, const std::string*> {
      for (const std::string& name : needed[i]) {
        auto found = producer.find(name);
        if (found != producer.end() && waiting_on[found->second] != 0) return {found->second, &name};
      }
      return {n, nullptr};
    };
    size_t current = 0;
    while (waiting_on[current] == 0) ++current;
    std::vector<bool> seen(n, false);
    while (!seen[current]) {
      seen[current] = true;
      current = unsorted_producer(current).first;
    }
    const auto [from, name] = unsorted_producer(current);
    throw ModelFormatError(str(graph_label(graph), ": ", describe(graph.nodes[current], current),
                               " is in a cycle: its input '", *name, "' comes from ",
                               describe(graph.nodes[from], from), ", which depends on it"));
  }
  std::vector<Node> sorted;
  sorted.reserve(n);
  for (size_t i : order) sorted.push_back(std::move(graph.nodes[i]));
  graph.nodes = std::move(sorted);

  // Subgraphs see everything visible here.
  bool has_subgraphs = false;
  for (const Node& node : graph.nodes) for_each_subgraph(node, [&](const Graph&) { has_subgraphs = true; });
  if (!has_subgraphs) return;
  std::set<std::string> scope(available.begin(), available.end());
  for (const auto& [name, index] : producer) scope.insert(name);
  for (Node& node : graph.nodes) {
    for (Attribute& attribute : node.attributes) {
      if (attribute.g) topological_sort(*attribute.g, scope);
      for (auto& g : attribute.graphs) {
        if (g) topological_sort(*g, scope);
      }
    }
  }
}

}  // namespace transmuter
