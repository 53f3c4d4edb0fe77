// Fuses each depthwise ConvNhwc (made by channels_last_convs) with the 1x1
// ConvNhwc that feeds it and the 1x1 ConvNhwc it feeds, when they read
// nothing else (MobileNetV2's inverted residual; PP-LCNet's and MobileNetV1's
// depthwise-separable pairs have no expand):
//
//        X                                    X   We Be  Wd Bd  Wp Bp  Z
//        |                                     \   |  |   |  |   |  |  /
//   ConvNhwc 1x1 (We, Be, act_e)  expand        ai.transmuter DepthwiseBlockNhwc
//        |                                      (the depthwise geometry and
//   ConvNhwc depthwise (Wd, Bd, act)     =>      activation; expand_channels,
//        |                                       expand_activation, out_channels,
//   ConvNhwc 1x1 (Wp, Bp, Z, act_p) project      project_activation)
//        |                                             |
//        Y                                             Y
//
// At least one of expand and project must be there. The block's kernel keeps
// the expanded and depthwise rows in cache instead of writing them to memory
// (src/kernels/cpu/depthwise_block.h). Depthwise convs are taken in graph
// order, so in a chain dw -> 1x1 -> dw -> 1x1 each 1x1 joins the block before it
// (as its project), never two blocks.
//
// A 1x1 stage qualifies when it is a group-1 ConvNhwc with a 1x1 kernel,
// stride 1, no padding, channels-last input; the expand has no residual, and
// its output and the depthwise output are read by the next stage alone (as its
// X) and are no graph outputs.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";

bool is_conv_nhwc(const Node& node) {
  return node.domain == kDomain && node.op_type == "ConvNhwc" && node.outputs.size() == 1 &&
         node.inputs.size() >= 2;
}

bool is_depthwise(const Node& node) { return is_conv_nhwc(node) && int_attribute_or(node, "group", 1) != 1; }

bool is_pointwise(const Node& node) {
  if (!is_conv_nhwc(node) || int_attribute_or(node, "group", 1) != 1) return false;
  if (const Attribute* layout = node.find_attribute("input_layout"); layout != nullptr && layout->s != "NHWC")
    return false;
  return ints_attribute_or(node, "kernel_shape", {}) == std::vector<int64_t>{1, 1} &&
         ints_attribute_or(node, "strides", {1, 1}) == std::vector<int64_t>{1, 1} &&
         ints_attribute_or(node, "dilations", {1, 1}) == std::vector<int64_t>{1, 1} &&
         ints_attribute_or(node, "pads", {0, 0, 0, 0}) == std::vector<int64_t>{0, 0, 0, 0};
}

// `value` is read by node `reader` alone, as its first input, and is no graph output.
bool feeds_only(const Graph& graph, const GraphIndex& index, const std::string& value, size_t reader) {
  return index.read_only_by(value, reader) && graph.nodes[reader].inputs[0] == value &&
         std::count(graph.nodes[reader].inputs.begin(), graph.nodes[reader].inputs.end(), value) == 1;
}

std::string input_or_empty(const Node& node, size_t i) {
  return i < node.inputs.size() ? node.inputs[i] : "";
}

// A stage's activation attributes under the fused node's names for them.
void copy_activation(const Node& from, const std::string& prefix, Node& to) {
  if (const Attribute* a = from.find_attribute("activation")) {
    to.attributes.push_back(string_attribute(prefix + "activation", a->s));
    if (const Attribute* p = from.find_attribute("activation_params"))
      to.attributes.push_back(floats_attribute(prefix + "activation_params", p->floats));
  }
}

Node block_node(const Node* expand, const Node& depthwise, const Node* project) {
  Node n;
  n.op_type = "DepthwiseBlockNhwc";
  n.domain = kDomain;
  n.opset = 1;
  n.name = (depthwise.name.empty() ? depthwise.outputs[0] : depthwise.name) + "/block";
  n.inputs = {expand != nullptr ? expand->inputs[0] : depthwise.inputs[0],
              expand != nullptr ? expand->inputs[1] : "",
              expand != nullptr ? input_or_empty(*expand, 2) : "",
              depthwise.inputs[1],
              input_or_empty(depthwise, 2),
              project != nullptr ? project->inputs[1] : "",
              project != nullptr ? input_or_empty(*project, 2) : "",
              project != nullptr ? input_or_empty(*project, 3) : ""};
  while (n.inputs.back().empty()) n.inputs.pop_back();
  n.outputs = project != nullptr ? project->outputs : depthwise.outputs;
  for (const char* name :
       {"kernel_shape", "strides", "pads", "dilations", "activation", "activation_params"}) {
    if (const Attribute* a = depthwise.find_attribute(name)) n.attributes.push_back(*a);
  }
  if (expand != nullptr) {
    n.attributes.push_back(int_attribute("expand_channels", int_attribute_or(*expand, "out_channels", 0)));
    copy_activation(*expand, "expand_", n);
  }
  if (project != nullptr) {
    n.attributes.push_back(int_attribute("out_channels", int_attribute_or(*project, "out_channels", 0)));
    copy_activation(*project, "project_", n);
  }
  return n;
}

}  // namespace

size_t fuse_depthwise_blocks(Graph& graph) {
  const GraphIndex index(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  size_t fused = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& depthwise = graph.nodes[i];
    if (!is_depthwise(depthwise) || depthwise.inputs.size() > 3) continue;
    std::optional<size_t> expand = index.producer(depthwise.inputs[0]);
    if (expand && (!is_pointwise(graph.nodes[*expand]) || graph.nodes[*expand].inputs.size() > 3 ||
                   !feeds_only(graph, index, depthwise.inputs[0], i))) {
      expand.reset();
    }
    std::optional<size_t> project = sole_consumer(index, depthwise.outputs[0]);
    if (project &&
        (!is_pointwise(graph.nodes[*project]) || !feeds_only(graph, index, depthwise.outputs[0], *project)))
      project.reset();
    if (!expand && !project) continue;
    const size_t last = project ? *project : i;
    Node block = block_node(expand ? &graph.nodes[*expand] : nullptr, depthwise,
                            project ? &graph.nodes[*project] : nullptr);
    if (expand) removed[*expand] = true;
    if (project) removed[i] = true;
    graph.nodes[last] = std::move(block);
    ++fused;
  }
  if (fused > 0) erase_nodes(graph, removed);
  return fused;
}

}  // namespace transmuter
