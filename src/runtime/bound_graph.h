// A graph bound to the operator registry: what the interpreter and the compile
// planner run. Binding happens in one place, after load-time passes (load.cpp).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/graph.h"
#include "ops/registry.h"

namespace transmuter {

/** An index for each name of one graph (its inputs, initializers, outputs, and every node's inputs and
 * outputs): an Environment that keeps that graph's values in slots (Environment::use_slots) finds them by
 * index, where a name would be hashed and compared at each lookup (a quarter of an eager run's
 * interpretation of int8 MiniLM-L6). */
struct NameSlots {
  std::unordered_map<std::string, uint32_t> slot_of;
  std::vector<std::string> names;                  // by slot
  std::vector<std::vector<int32_t>> node_inputs;   // by node, by input: its slot, -1 when omitted
  std::vector<std::vector<int32_t>> node_outputs;  // by node, by output: its slot, -1 when unnamed
};

/** The NameSlots of `graph` (not its subgraphs). */
NameSlots index_names(const Graph& graph);

struct BoundGraph {
  const Graph* graph = nullptr;
  std::vector<const OpRow*> rows;  // rows[i] implements graph->nodes[i]
  // The bound bodies of this graph's nodes' GRAPH/GRAPHS attributes.
  std::unordered_map<const Graph*, std::unique_ptr<BoundGraph>> subgraphs;
  NameSlots slots;

  const Node& node(size_t i) const { return graph->nodes[i]; }
  size_t size() const { return rows.size(); }
  /** The bound form of `body`, a subgraph attribute of one of this graph's
   * nodes; throws transmuter::Error when it is not one. */
  const BoundGraph& subgraph(const Graph& body) const;
};

/** Names that some node of `graph` (not its subgraphs) reads on the host:
 * the inputs at its row's host_inputs positions. */
std::set<std::string> host_read_names(const BoundGraph& graph);

/** Binds every node of `graph` and its subgraphs to its row in `registry`.
 * Throws UnsupportedError listing every (domain, op_type, opset) without an
 * implementation; `source` names the model in that message. `graph` must
 * outlive the result. */
std::unique_ptr<BoundGraph> bind_graph(const Graph& graph, const OpRegistry& registry, const std::string& source);

}  // namespace transmuter
