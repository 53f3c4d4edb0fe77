// Stacks the packed products that read the same input (a decoder's q, k and v projections) into one
// product over their panels, followed by a Split of its columns:
//
//            X                                         X
//      /     |      \                                  |
//   PM(Wq)  PM(Wk)  PM(Wv)          =>        PackedMatMul([Wq | Wk | Wv])
//     |      |       |                                 |
//     Q      K       V                         Split(axis = -1, [nq, nk, nv])
//                                                  /   |   \
//                                                 Q    K    V
//
// PM: ai.transmuter PackedMatMul without bias, residual or activation (what pack_matmul_weights makes of a
// MatMul by a constant weight). In a decode step the products are GEMVs of a few hundred KB each, whose
// per-call set-up and thread hand-off weigh as much as the streaming of their weights; one call streams
// them all. The packed layout is [panels, K, P]: the panels of each weight one after the other are the
// packing of the weights side by side when every weight but the last fills its last panel (N a multiple
// of P), so each output column is computed exactly as before. The Split's outputs are views of the
// stacked output (one row per token: contiguous in a decode step).
//
// Runs after pack_matmul_weights and fuse_gated_mlp (whose gate and up products also share their input).
// Members are taken in node order; a product whose N does not fill its last panel ends a group; the
// default domain's Split must take its sizes as an input (opset 13+) or attribute (2-12).
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";

bool is_constant(const Graph& graph, const std::string& name) {
  auto it = graph.initializers.find(name);
  return it != graph.initializers.end() && it->second.is_tensor() && !it->second.is_widened();
}

/** The packed weight [panels, K, P] of a PackedMatMul without epilogue, or null. */
const mx::array* plain_packed_weight(const Graph& graph, const Node& node) {
  if (node.domain != kDomain || node.op_type != "PackedMatMul" || node.inputs.size() != 2) return nullptr;
  const Attribute* activation = node.find_attribute("activation");
  if ((activation != nullptr && !activation->s.empty()) || !is_constant(graph, node.inputs[1])) return nullptr;
  const mx::array& w = graph.initializers.at(node.inputs[1]).tensor();
  return w.ndim() == 3 ? &w : nullptr;
}

int64_t columns(const Node& node) { return int_attribute_or(node, "n", -1); }

/** Groups of at least two plain products reading one input, with one K and panel width, in node order;
 * every member but the last fills its last panel. */
std::vector<std::vector<size_t>> groups_of(const Graph& graph) {
  std::map<std::string, std::vector<size_t>> by_input;
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (plain_packed_weight(graph, graph.nodes[i]) != nullptr) by_input[graph.nodes[i].inputs[0]].push_back(i);
  std::vector<std::vector<size_t>> groups;
  for (const auto& [input, members] : by_input) {
    std::vector<size_t> group;
    auto flush = [&] {
      if (group.size() >= 2) groups.push_back(group);
      group.clear();
    };
    for (size_t i : members) {
      const mx::array& w = *plain_packed_weight(graph, graph.nodes[i]);
      if (!group.empty()) {
        const Node& last = graph.nodes[group.back()];
        const mx::array& lw = *plain_packed_weight(graph, last);
        const bool aligned = columns(last) == int64_t{lw.shape(0)} * lw.shape(2);
        if (!aligned || lw.shape(1) != w.shape(1) || lw.shape(2) != w.shape(2)) flush();
      }
      group.push_back(i);
    }
    flush();
  }
  return groups;
}

}  // namespace

size_t stack_shared_products(Graph& graph) {
  int64_t opset = 0;
  for (const char* domain : {"", "ai.onnx"})
    if (auto it = graph.opsets.find(domain); it != graph.opsets.end()) opset = it->second;
  if (opset < 2) return 0;  // Split before opset 2 takes its sizes only as a second input of its own kind
  const std::vector<std::vector<size_t>> groups = groups_of(graph);
  if (groups.empty()) return 0;
  ValueNames names(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  std::map<size_t, std::vector<Node>> replacements;  // a group's first member -> the product and the Split
  std::vector<std::string> replaced_weights;
  for (const std::vector<size_t>& group : groups) {
    std::vector<mx::array> panels;
    std::vector<int64_t> sizes;
    std::vector<std::string> outputs;
    for (size_t i : group) {
      const Node& member = graph.nodes[i];
      panels.push_back(graph.initializers.at(member.inputs[1]).tensor());
      sizes.push_back(columns(member));
      outputs.push_back(member.outputs[0]);
      replaced_weights.push_back(member.inputs[1]);
    }
    mx::array stacked = mx::concatenate(panels, 0);
    mx::eval(stacked);
    const Node& first = graph.nodes[group.front()];
    const std::string weight = fresh_initializer_name(graph, first.inputs[1] + "/stacked");
    names.reserve(weight);
    graph.initializers[weight] = Value(stacked);
    int64_t total = 0;
    for (int64_t n : sizes) total += n;

    Node product = first;
    product.name = first.name + "/stacked";
    product.inputs = {first.inputs[0], weight};
    product.outputs = {names.fresh(first.outputs[0] + "/stacked")};
    for (Attribute& a : product.attributes)
      if (a.name == "n") a = int_attribute("n", total);

    Node split;
    split.op_type = "Split";
    split.opset = static_cast<int>(opset);
    split.name = first.name + "/split";
    split.inputs = {product.outputs[0]};
    split.outputs = outputs;
    split.attributes.push_back(int_attribute("axis", -1));
    if (opset >= 13) {
      const std::string sizes_name = fresh_initializer_name(graph, weight + "/sizes");
      names.reserve(sizes_name);
      graph.initializers[sizes_name] = Value(mx::array(sizes.begin(), {static_cast<int>(sizes.size())}, mx::int64));
      split.inputs.push_back(sizes_name);
    } else {
      split.attributes.push_back(ints_attribute("split", sizes));
    }
    // Both at the first member's place: its input is ready there, and every reader of a member's output
    // comes after that member.
    replacements[group.front()] = {std::move(product), std::move(split)};
    for (size_t i = 1; i < group.size(); ++i) removed[group[i]] = true;
  }
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size() + replacements.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (auto r = replacements.find(i); r != replacements.end()) {
      for (Node& node : r->second) nodes.push_back(std::move(node));
    } else if (!removed[i]) {
      nodes.push_back(std::move(graph.nodes[i]));
    }
  }
  graph.nodes = std::move(nodes);
  const GraphIndex rewritten(graph);
  for (const std::string& name : replaced_weights)
    if (graph.initializers.contains(name) && rewritten.consumers(name).empty() && !rewritten.is_graph_output(name))
      drop_weight(graph, name);
  return groups.size();
}

}  // namespace transmuter
