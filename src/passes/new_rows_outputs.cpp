// Computes the outputs named in LoadOptions::new_rows_outputs as the rows that their Concat appends
// to a graph input: a decoder's presents, Concat(past, new) along the sequence axis, become this
// step's new rows alone. A caller that keeps its own cache (TextGeneration's static cache writes each
// step's rows into its preallocated buffer) needs no more, and the copy of the whole past into every
// present, per layer and step, is never made. The graph's own readers of the Concat still see it:
// the attention reads its two inputs in place (fuse_attention), shape reads need no data, so the
// Concat is left with no reader that computes it.
//
//   past (graph input)                          past        new
//     [Identity | one-input Concat]...            \        /   \ (new rows)
//        \                                    Concat(axis)     Identity
//         Concat(axis) --- new          =>         |              |
//           |          \                       present/all_rows   present  (graph output)
//        present        the graph's            (the graph's readers)
//   (graph output)      readers
//
// A name may hold one '*' that stands for any text ("present.*.key": each layer's key; "present.*": each
// layer's key and value).
// All or nothing: when any named output is not such a Concat (or a subgraph reads it), no output
// changes and the pass returns 0; Model::passes_applied() lists "new_rows_outputs" when it changed them.
// The output's declared size along the Concat's axis becomes unknown.
#include <algorithm>
#include <optional>
#include <string_view>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

bool is_graph_input(const Graph& graph, const std::string& name) {
  return !graph.initializers.contains(name) &&
         std::any_of(graph.inputs.begin(), graph.inputs.end(), [&](const ValueInfo& v) { return v.name == name; });
}

// `value` is a graph input, or an identity of one (Identity, a Concat of one input).
bool comes_from_graph_input(const Graph& graph, const GraphIndex& index, std::string value) {
  for (size_t hops = 0; hops <= graph.nodes.size(); ++hops) {
    if (is_graph_input(graph, value)) return true;
    std::optional<size_t> producer = index.producer(value);
    if (!producer) return false;
    const Node& node = graph.nodes[*producer];
    const bool identity = (is_onnx_op(node, "Identity") || is_onnx_op(node, "Concat")) && node.inputs.size() == 1;
    if (!identity) return false;
    value = node.inputs[0];
  }
  return false;
}

// The Concat that makes output `name` from a graph input and new rows, when its readers read it as a
// plain input (a subgraph's capture would need renaming inside it).
std::optional<size_t> appending_concat(const Graph& graph, const GraphIndex& index, const std::string& name) {
  std::optional<size_t> producer = index.producer(name);
  if (!producer) return std::nullopt;
  const Node& concat = graph.nodes[*producer];
  if (!is_onnx_op(concat, "Concat") || concat.inputs.size() != 2 || concat.outputs.size() != 1 ||
      concat.inputs[1].empty() || !comes_from_graph_input(graph, index, concat.inputs[0]))
    return std::nullopt;
  for (size_t reader : index.consumers(name)) {
    const auto& inputs = graph.nodes[reader].inputs;
    if (std::find(inputs.begin(), inputs.end(), name) == inputs.end()) return std::nullopt;
  }
  return producer;
}

ValueInfo* declared_output(Graph& graph, const std::string& name) {
  auto it = std::find_if(graph.outputs.begin(), graph.outputs.end(), [&](const ValueInfo& v) { return v.name == name; });
  return it == graph.outputs.end() ? nullptr : &*it;
}

// `name` matches `pattern`: equal, or, where the pattern has a '*', what comes before it and what comes
// after it at the two ends ("present.*.key" matches "present.12.key").
bool matches(std::string_view pattern, std::string_view name) {
  const size_t star = pattern.find('*');
  if (star == std::string_view::npos) return name == pattern;
  const std::string_view head = pattern.substr(0, star), tail = pattern.substr(star + 1);
  return name.size() >= head.size() + tail.size() && name.starts_with(head) && name.ends_with(tail);
}

// The graph's outputs that `patterns` name.
std::vector<std::string> outputs_named(const Graph& graph, const std::vector<std::string>& patterns) {
  std::vector<std::string> names;
  for (const std::string& pattern : patterns) {
    bool found = false;
    for (const ValueInfo& output : graph.outputs) {
      if (matches(pattern, output.name)) {
        found = true;
        if (std::find(names.begin(), names.end(), output.name) == names.end()) names.push_back(output.name);
      }
    }
    if (!found) return {};  // all or nothing
  }
  return names;
}

}  // namespace

size_t new_rows_outputs(Graph& graph, const std::vector<std::string>& patterns) {
  const std::vector<std::string> outputs = outputs_named(graph, patterns);
  if (outputs.empty()) return 0;
  std::vector<size_t> concats;
  {
    const GraphIndex index(graph);
    for (const std::string& name : outputs) {
      std::optional<size_t> concat = declared_output(graph, name) ? appending_concat(graph, index, name) : std::nullopt;
      if (!concat || std::find(concats.begin(), concats.end(), *concat) != concats.end()) return 0;
      concats.push_back(*concat);
    }
  }
  ValueNames names(graph);
  std::vector<Node> identities;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& name = outputs[i];
    Node& concat = graph.nodes[concats[i]];
    const std::string all_rows = names.fresh(name + "/all_rows");
    concat.outputs[0] = all_rows;
    for (ValueInfo& info : graph.value_info) {
      if (info.name == name) info.name = all_rows;  // its declared shape is the Concat's
    }
    for (Node& node : graph.nodes) std::replace(node.inputs.begin(), node.inputs.end(), name, all_rows);
    Node identity;
    identity.name = name + "/new_rows";
    identity.op_type = "Identity";
    identity.opset = static_cast<int>(graph.opsets.at(""));
    identity.inputs = {concat.inputs[1]};
    identity.outputs = {name};
    identities.push_back(std::move(identity));
    ValueInfo& declared = *declared_output(graph, name);
    const int64_t rank = static_cast<int64_t>(declared.shape.size());
    const int64_t axis = int_attribute_or(concat, "axis", 0);
    if (declared.has_shape && axis >= -rank && axis < rank) declared.shape[(axis + rank) % rank] = Dim{};
  }
  // Each Identity reads a Concat input, which is computed before the Concat: appending them keeps the order.
  for (Node& identity : identities) graph.nodes.push_back(std::move(identity));
  return outputs.size();
}

}  // namespace transmuter
