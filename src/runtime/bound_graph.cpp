#include "runtime/bound_graph.h"

#include <set>
#include <tuple>

#include "graph/subgraphs.h"
#include "transmuter/error.h"

namespace transmuter {

const BoundGraph& BoundGraph::subgraph(const Graph& body) const {
  auto it = subgraphs.find(&body);
  if (it == subgraphs.end()) throw Error(str("subgraph '", body.name, "' is not a subgraph of this graph"));
  return *it->second;
}

std::set<std::string> host_read_names(const BoundGraph& graph) {
  std::set<std::string> names;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.node(i);
    for (int h : graph.rows[i]->host_inputs) {
      if (h < static_cast<int>(node.inputs.size()) && !node.inputs[h].empty()) names.insert(node.inputs[h]);
    }
  }
  return names;
}

NameSlots index_names(const Graph& graph) {
  NameSlots slots;
  auto slot = [&slots](const std::string& name) -> int32_t {
    if (name.empty()) return -1;
    auto [it, added] = slots.slot_of.emplace(name, static_cast<uint32_t>(slots.names.size()));
    if (added) slots.names.push_back(name);
    return static_cast<int32_t>(it->second);
  };
  for (const ValueInfo& in : graph.inputs) slot(in.name);
  for (const auto& [name, value] : graph.initializers) slot(name);
  for (const Node& node : graph.nodes) {
    std::vector<int32_t>& inputs = slots.node_inputs.emplace_back();
    for (const std::string& name : node.inputs) inputs.push_back(slot(name));
    std::vector<int32_t>& outputs = slots.node_outputs.emplace_back();
    for (const std::string& name : node.outputs) outputs.push_back(slot(name));
  }
  for (const ValueInfo& out : graph.outputs) slot(out.name);
  return slots;
}

namespace {

using MissingKey = std::tuple<std::string, std::string, int64_t>;

std::unique_ptr<BoundGraph> bind_collecting(const Graph& graph, const OpRegistry& registry,
                                            std::set<MissingKey>& missing) {
  auto bound = std::make_unique<BoundGraph>();
  bound->graph = &graph;
  bound->slots = index_names(graph);
  bound->rows.reserve(graph.nodes.size());
  for (const Node& node : graph.nodes) {
    const OpRow* row = registry.find(node.domain, node.op_type, node.opset);
    if (row == nullptr) missing.insert({node.domain.empty() ? "ai.onnx" : node.domain, node.op_type, node.opset});
    bound->rows.push_back(row);
    for_each_subgraph(node, [&](const Graph& body) {
      bound->subgraphs.emplace(&body, bind_collecting(body, registry, missing));
    });
  }
  return bound;
}

}  // namespace

std::unique_ptr<BoundGraph> bind_graph(const Graph& graph, const OpRegistry& registry, const std::string& source) {
  std::set<MissingKey> missing;
  std::unique_ptr<BoundGraph> bound = bind_collecting(graph, registry, missing);
  if (missing.empty()) return bound;
  std::string list;
  std::vector<MissingOperator> ops;
  for (const auto& [domain, op_type, opset] : missing) {
    list += str("\n  ", domain, " ", op_type, " (opset ", opset, ")");
    ops.push_back({domain, op_type, opset});
  }
  throw UnsupportedError(str(source, ": ", missing.size(), " operator(s) have no implementation:", list),
                         std::move(ops));
}

}  // namespace transmuter
