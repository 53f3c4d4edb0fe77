// Splits a graph into compiled segments and eager graph breaks.
//
// A value is *traced* when it depends on the data of a non-static graph input;
// under mx::compile it is a placeholder whose values cannot be read. Shape and
// Size (rows marked reads_only_shapes) cut that dependency (shapes are concrete while tracing) unless their
// input's shape itself depends on data (an output of a graph break). A node is
// a graph break when its row is eager_only or when one of its host_inputs is
// traced; it then runs eagerly between two compiled segments.
#pragma once

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/graph.h"
#include "runtime/bound_graph.h"
#include "transmuter/runtime.h"

namespace transmuter {

/** One step of a plan: a run of nodes compiled together, or one eager node. */
struct Step {
  size_t begin = 0;
  size_t end = 0;  // exclusive
  bool eager = false;
  // For compiled steps: traced tensors read from earlier steps (the compiled
  // function's inputs) and produced for later steps (its outputs).
  std::vector<std::string> traced_inputs;
  std::vector<std::string> traced_outputs;
  // Values produced here that do not depend on data (shapes, constants,
  // non-tensors): captured once while tracing and reused on later calls.
  std::vector<std::string> host_outputs;
};

struct SegmentLayout {
  std::vector<Step> steps;
  size_t compiled_segments = 0;
  size_t graph_breaks = 0;
};

/** Splits `graph` for the given static inputs (their values are host values).
 * Decides from registry-row traits only (host_inputs, eager_only,
 * reads_only_shapes, makes_non_tensor): it knows no op names. */
SegmentLayout plan_segments(const BoundGraph& graph, const std::set<std::string>& static_inputs,
                            const std::set<std::string>& traced_params = {});

/** For each node of `graph` (top level, not subgraph bodies), which inputs
 * hold values that depend only on the input signature (shapes, dtypes, which
 * optional inputs are given), initializers and constants: not traced when
 * every graph input is data. Eager runs remember their host reads per
 * signature (runtime/host_reads.h). */
std::vector<std::vector<bool>> signature_determined_inputs(const BoundGraph& graph);

/** By node of the top-level graph: true when every output of the node is a
 * tensor that depends only on the input signature and the initializers, and
 * the node is deterministic (no random or other eager-only op, no subgraph,
 * no input computed by a node that is not so): an eager run may keep its
 * outputs and later runs with that signature skip it. */
std::vector<bool> signature_determined_nodes(const BoundGraph& graph);

/** Key of an input signature: names, dtypes, shapes (kinds and sizes of
 * non-tensors), and the values of `static_inputs`. */
std::string signature_of(const Inputs& inputs, const std::set<std::string>& static_inputs);

/** Float initializers that no op reads on the host: with
 * CompileOptions::params_as_arguments they are arguments of the compiled
 * segments (traced), so new values need no new plan and gradients reach them. */
std::set<std::string> trainable_params(const BoundGraph& graph);

}  // namespace transmuter
