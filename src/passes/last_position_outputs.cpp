// Computes the outputs named in LoadOptions::last_position_outputs at the last position of their
// last-but-one axis only: a decoder's logits [batch, sequence, vocabulary], of which generation
// reads the last position. On a 128-token prompt of a 49152-word vocabulary the whole logits are
// 25 MB and the lm_head's product 3.6 GFLOP; the last position's are 1/128th of both.
//
//   h [.., S, K]                          h [.., S, K]
//        |                                     |
//   MatMul(W const [K, V])                Slice(starts -1, ends max, axes -2)
//   or MatMulNBits                  =>         |
//        |                                 MatMul ...   (the same nodes, on one position)
//   position-wise tail (optional):             |
//   Cast, Tanh, Neg, Identity,             logits [.., 1, V]
//   Add/Sub/Mul/Div by a constant of rank <= 1
//        |
//   logits [.., S, V]
//
// The tail is followed up from the output while each of its values is read by the next node alone,
// so no other reader sees fewer positions. Without such a projection (the output comes from
// anything else) the Slice goes at the output itself: the shape is the same, nothing is saved.
// Unlike the default passes this one changes what the model returns (the output's declared
// dimension becomes 1), so it runs only when asked for, with or without run_passes.
#include <limits>
#include <optional>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

bool is_constant_of_rank_at_most(const GraphIndex& index, const std::string& value, int rank) {
  std::optional<mx::array> c = index.constant(value);
  return c && c->ndim() <= static_cast<size_t>(rank);
}

// A node whose output at position s depends on its main input at position s alone: that input.
std::optional<std::string> position_wise_input(const Node& node, const GraphIndex& index) {
  if (node.outputs.size() != 1) return std::nullopt;
  for (const char* unary : {"Cast", "Tanh", "Neg", "Identity"}) {
    if (is_onnx_op(node, unary) && node.inputs.size() == 1) return node.inputs[0];
  }
  for (const char* binary : {"Add", "Sub", "Mul", "Div"}) {
    if (!is_onnx_op(node, binary) || node.inputs.size() != 2) continue;
    // Sub and Div are position-wise with the constant on either side.
    if (is_constant_of_rank_at_most(index, node.inputs[1], 1)) return node.inputs[0];
    if (is_constant_of_rank_at_most(index, node.inputs[0], 1)) return node.inputs[1];
  }
  return std::nullopt;
}

// A product of the positions' features with a constant weight: its activation input.
std::optional<std::string> projection_input(const Node& node, const GraphIndex& index) {
  if (is_onnx_op(node, "MatMul") && node.inputs.size() == 2) {
    std::optional<mx::array> weight = index.constant(node.inputs[1]);
    if (weight && weight->ndim() == 2) return node.inputs[0];
    return std::nullopt;
  }
  if (node.domain == "com.microsoft" && node.op_type == "MatMulNBits" && node.inputs.size() >= 2 &&
      index.constant(node.inputs[1]))
    return node.inputs[0];
  return std::nullopt;
}

// Where the Slice goes: the node and input slot it feeds, or nullopt for the output itself.
struct CutPoint {
  size_t node;
  size_t input;
};

std::optional<CutPoint> cut_point(const Graph& graph, const GraphIndex& index, const std::string& output) {
  std::string value = output;
  std::optional<size_t> at = index.producer(value);
  while (at) {
    const Node& node = graph.nodes[*at];
    if (projection_input(node, index)) return CutPoint{*at, 0};
    std::optional<std::string> in = position_wise_input(node, index);
    if (!in) return std::nullopt;
    std::optional<size_t> before = index.producer(*in);
    if (!before || !index.read_only_by(*in, *at)) return std::nullopt;
    value = *in;
    at = before;
  }
  return std::nullopt;
}

Node int64_constant(const Graph& graph, const std::string& name, int64_t value) {
  Node c;
  c.name = name;
  c.op_type = "Constant";
  c.outputs = {name};
  Attribute a;
  a.name = "value";
  a.type = AttrType::kTensor;
  a.t = Value(mx::array({value}, {1}, mx::int64));
  c.attributes = {a};
  c.opset = static_cast<int>(graph.opsets.at(""));
  return c;
}

// Slice(input) -> output keeping the last position of axis -2; Slice-1's attributes before opset 10.
std::vector<Node> last_position_slice(const Graph& graph, ValueNames& names, const std::string& input,
                                      const std::string& output) {
  constexpr int64_t kStart = -1, kEnd = std::numeric_limits<int64_t>::max(), kAxis = -2;
  Node slice;
  slice.name = output;
  slice.op_type = "Slice";
  slice.outputs = {output};
  slice.opset = static_cast<int>(graph.opsets.at(""));
  if (slice.opset < 10) {
    slice.inputs = {input};
    slice.attributes = {ints_attribute("starts", {kStart}), ints_attribute("ends", {kEnd}),
                        ints_attribute("axes", {kAxis})};
    return {slice};
  }
  std::vector<Node> nodes;
  for (auto [suffix, value] : {std::pair{"starts", kStart}, {"ends", kEnd}, {"axes", kAxis}})
    nodes.push_back(int64_constant(graph, names.fresh(output + "/" + suffix), value));
  slice.inputs = {input, nodes[0].outputs[0], nodes[1].outputs[0], nodes[2].outputs[0]};
  nodes.push_back(slice);
  return nodes;
}

ValueInfo& declared_output(Graph& graph, const std::string& name) {
  for (ValueInfo& v : graph.outputs) {
    if (v.name == name) return v;
  }
  std::string list;
  for (const ValueInfo& v : graph.outputs) list += (list.empty() ? "" : ", ") + v.name;
  throw Error(
      str("last_position_outputs names '", name, "', which is no output of the model (outputs: ", list, ")"));
}

void cut_output(Graph& graph, ValueNames& names, const std::string& name) {
  ValueInfo& declared = declared_output(graph, name);
  if (declared.has_shape && declared.shape.size() < 2)
    throw Error(str("last_position_outputs: output '", name, "' has rank ", declared.shape.size(),
                    "; it needs a positions axis before its last"));
  const GraphIndex index(graph);
  std::optional<size_t> producer = index.producer(name);
  if (!producer) throw Error(str("last_position_outputs: output '", name, "' is no node's output"));
  if (!index.consumers(name).empty())
    throw Error(str("last_position_outputs: output '", name, "' is also read inside the graph (by ",
                    graph.nodes[index.consumers(name).front()].label(), "), which needs every position"));
  std::vector<Node> slice;
  size_t insert_at = 0;
  if (std::optional<CutPoint> cut = cut_point(graph, index, name)) {
    std::string& feed = graph.nodes[cut->node].inputs[cut->input];
    const std::string sliced = names.fresh(feed + "/last_position");
    slice = last_position_slice(graph, names, feed, sliced);
    feed = sliced;
    insert_at = cut->node;
  } else {
    const std::string all_positions = names.fresh(name + "/all_positions");
    for (std::string& out : graph.nodes[*producer].outputs) {
      if (out == name) out = all_positions;
    }
    slice = last_position_slice(graph, names, all_positions, name);
    insert_at = *producer + 1;
  }
  graph.nodes.insert(graph.nodes.begin() + static_cast<std::ptrdiff_t>(insert_at), slice.begin(),
                     slice.end());
  if (declared.has_shape) declared.shape[declared.shape.size() - 2] = Dim{.value = 1, .symbol = ""};
}

}  // namespace

size_t last_position_outputs(Graph& graph, const std::vector<std::string>& outputs) {
  ValueNames names(graph);
  for (const std::string& name : outputs) cut_output(graph, names, name);
  return outputs.size();
}

}  // namespace transmuter
