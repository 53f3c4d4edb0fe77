// Moves a com.microsoft QLinearAdd into the group-1 QLinearConvNhwc whose output it reads (the projection
// that ends an inverted-residual block, added to the block's input):
//
//      X ... B (8 inputs)                          X ... B   A' A_scale A_zp B' B_scale B_zp C_scale C_zp
//            |                                          \       (the convolution's own slot, A' or B', "")
//     QLinearConvNhwc                =>              QLinearConvNhwc (ai.transmuter, inputs 8..15)
//            | y          R                                   |
//            QLinearAdd(y, .., R, ..)                         C
//            |                    (or R first)
//            C
//
// The kernel then adds each block of output bytes to R's while they are in cache, with QLinearAdd's own
// arithmetic (ops/microsoft/qlinear_add.h): the bytes are those of the two operators. Applies when y is
// read by the QLinearAdd alone (once, as A or as B) and is no graph output, and the convolution is not
// depthwise (group 1). An R of another shape (broadcast) runs the add after the convolution, as before.
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";
constexpr size_t kConvInputs =
    8;  // X, x_zero_point, W, W_column_sums, W_column_zeros, multiplier, y_zero_point, B
constexpr size_t kAddInputs = 8;  // A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point

bool is_group_one_qlinear_conv(const Node& node) {
  return node.domain == kDomain && node.op_type == "QLinearConvNhwc" && node.outputs.size() == 1 &&
         node.inputs.size() <= kConvInputs && int_attribute_or(node, "group", 1) == 1;
}

bool is_qlinear_add(const Node& node) {
  return node.domain == "com.microsoft" && node.op_type == "QLinearAdd" && node.outputs.size() == 1 &&
         node.inputs.size() >= 7 && node.inputs.size() <= kAddInputs;
}

// The QLinearAdd's slot (0: A, 3: B) holding `value`, when exactly one does.
std::optional<size_t> operand_slot(const Node& add, const std::string& value) {
  const bool as_a = add.inputs[0] == value, as_b = add.inputs[3] == value;
  if (as_a == as_b) return std::nullopt;
  return as_a ? 0 : 3;
}

}  // namespace

size_t fuse_qlinear_conv_add(Graph& graph) {
  GraphIndex index(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  size_t rewrites = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& conv = graph.nodes[i];
    if (!is_group_one_qlinear_conv(conv)) continue;
    const std::optional<size_t> reader = sole_consumer(index, conv.outputs[0]);
    if (!reader) continue;
    const Node& add = graph.nodes[*reader];
    if (!is_qlinear_add(add)) continue;
    const std::optional<size_t> slot = operand_slot(add, conv.outputs[0]);
    if (!slot) continue;
    Node fused = conv;
    fused.name = str(add.name.empty() ? add.outputs[0] : add.name, "/QLinearConvNhwcAdd");
    fused.inputs.resize(kConvInputs);  // an absent bias as ""
    std::vector<std::string> add_inputs = add.inputs;
    add_inputs.resize(kAddInputs);  // an absent C_zero_point as ""
    add_inputs[*slot].clear();
    fused.inputs.insert(fused.inputs.end(), add_inputs.begin(), add_inputs.end());
    fused.outputs = add.outputs;
    // The fused node takes the add's place: the other operand is computed before it, the convolution's
    // inputs before the convolution.
    graph.nodes[*reader] = std::move(fused);
    removed[i] = true;
    ++rewrites;
  }
  if (rewrites == 0) return 0;
  erase_nodes(graph, removed);
  return rewrites;
}

}  // namespace transmuter
