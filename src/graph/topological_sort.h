// Orders a graph's nodes so that each runs after the producers of its inputs.
#pragma once

#include <set>
#include <string>

#include "graph/graph.h"

namespace transmuter {

/** Sorts `graph.nodes` in place, keeping the given order wherever it is
 * already valid, and sorts every subgraph the same way. Graph inputs,
 * initializers and `outer_scope` names (values visible from enclosing
 * graphs) count as available. A node also depends on the outer-scope values
 * its subgraphs use (an If branch reading a value computed before the If).
 * Throws ModelFormatError naming the node and the value when an input is
 * produced by nobody, when two nodes produce one value, or on a cycle. */
void topological_sort(Graph& graph, const std::set<std::string>& outer_scope = {});

}  // namespace transmuter
