// Expands calls to model-local functions (ModelProto.functions) in place.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace transmuter {

/** A model-local FunctionProto. Body nodes already carry their opset (from
 * the function's opset_import, falling back to the model's). */
struct Function {
  std::string name;    // the op_type callers use
  std::string domain;  // "" for ai.onnx
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<std::string> attribute_names;   // FunctionProto.attribute (no default)
  std::vector<Attribute> attribute_defaults;  // FunctionProto.attribute_proto
  std::vector<Node> nodes;
  std::map<std::string, int64_t> opsets;
};

/** Caps on what inlining may create: models whose functions call each other
 * so often that the expansion explodes (f calls g twice, g calls h twice,
 * ... 16 deep) are refused before the expansion starts. */
inline constexpr uint64_t kMaxInlinedNodes = uint64_t{1} << 22;
inline constexpr uint64_t kMaxInlinedCalls = uint64_t{1} << 22;
inline constexpr uint64_t kMaxInlinedNameBytes = uint64_t{1} << 30;

/** Replaces every node of `graph` (and of its subgraphs) whose (domain,
 * op_type) names a function in `functions` by the function's body:
 * - formal inputs/outputs are bound to the caller's names (a formal input
 *   the caller omits becomes "", an omitted output gets a fresh name);
 * - every other value the body defines gets a fresh name unique in the graph;
 * - attributes with ref_attr_name take the caller's attribute of that name,
 *   else the function's default, else are dropped (ONNX IR spec, Functions);
 * - bodies that call functions are expanded too.
 * Throws ModelFormatError on a recursive function, a call with more
 * inputs/outputs than the function declares, or an expansion over
 * kMaxInlinedNodes nodes or kMaxInlinedCalls calls (naming the function
 * and the cap) or over kMaxInlinedNameBytes of generated names. Time is linear in the nodes
 * created. */
void inline_functions(Graph& graph, const std::vector<Function>& functions);

}  // namespace transmuter
