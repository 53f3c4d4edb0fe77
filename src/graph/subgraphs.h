// The one walker over subgraph attributes (If branches, Loop/Scan bodies) and
// the outer-scope names they capture. Topological sorting and the compile
// planner both ask it what a node reads.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"

namespace transmuter {

/** Calls `fn(const Graph&)` for each GRAPH and GRAPHS attribute of `node`. */
template <typename Fn>
void for_each_subgraph(const Node& node, Fn&& fn) {
  for (const Attribute& attribute : node.attributes) {
    if (attribute.g) fn(*attribute.g);
    for (const auto& g : attribute.graphs) {
      if (g) fn(*g);
    }
  }
}

/** Names `graph` (or a subgraph nested in it) reads that `graph` does not
 * define itself as an input, initializer or node output: the outer-scope
 * values it captures. Order-independent (the graph need not be sorted);
 * sorted and unique. */
std::vector<std::string> free_names(const Graph& graph);

/** Everything `node` reads: its non-empty inputs (in order, repeats kept),
 * then the free names of its subgraphs. */
std::vector<std::string> node_reads(const Node& node);

}  // namespace transmuter
