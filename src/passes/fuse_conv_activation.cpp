// Fuses an activation into the Conv that feeds it, as ONNX Runtime's
// optimizer does:
//
//        X   W   B                            X   W   B
//         \  |  /                              \  |  /
//          Conv           =>     FusedConv(activation, activation_params)
//           |                     (com.microsoft, version 1)
//   Relu | Clip | HardSwish |                  |
//   LeakyRelu | Sigmoid                        Y
//           |
//           Y
//
// The Conv's bias add and the activation then run inside the convolution
// kernels while the output is in cache (src/ops/microsoft/conv.cpp), instead
// of as passes of their own over the activations (the Maximum/Minimum of
// Relu/Relu6 were 8% of MobileNetV2's compiled profile).
// Matches only when the Conv's output is read by the activation alone and is
// not a graph output, the Conv is in the default domain, and Clip's bounds are
// attributes (before opset 11) or scalar constants (from 11).
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

constexpr const char* kMicrosoftDomain = "com.microsoft";

// Clip's [min, max], or nullopt when a bound is not a known scalar.
std::optional<std::vector<float>> clip_bounds(const Node& clip, const GraphIndex& index) {
  if (clip.opset < 11) {
    return std::vector<float>{float_attribute_or(clip, "min", std::numeric_limits<float>::lowest()),
                              float_attribute_or(clip, "max", std::numeric_limits<float>::max())};
  }
  std::vector<float> bounds = {std::numeric_limits<float>::lowest(), std::numeric_limits<float>::max()};
  for (size_t k = 1; k < 3 && k < clip.inputs.size(); ++k) {
    if (clip.inputs[k].empty()) continue;
    std::optional<float> v = index.scalar(clip.inputs[k]);
    if (!v) return std::nullopt;
    bounds[k - 1] = *v;
  }
  return bounds;
}

// FusedConv's activation and activation_params for `node`, or nullopt when
// it is not an activation this pass fuses.
std::optional<std::pair<std::string, std::vector<float>>> activation_of(const Node& node, const GraphIndex& index) {
  if (node.inputs.empty() || node.outputs.size() != 1) return std::nullopt;
  if (is_onnx_op(node, "Relu") || is_onnx_op(node, "HardSwish") || is_onnx_op(node, "Sigmoid")) {
    return std::make_pair(node.op_type, std::vector<float>{});
  }
  if (is_onnx_op(node, "LeakyRelu")) {
    return std::make_pair(node.op_type, std::vector<float>{float_attribute_or(node, "alpha", 0.01f)});
  }
  if (is_onnx_op(node, "Clip")) {
    if (auto bounds = clip_bounds(node, index)) return std::make_pair(node.op_type, *bounds);
  }
  return std::nullopt;
}

}  // namespace

size_t fuse_conv_activation(Graph& graph) {
  GraphIndex index(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  size_t rewrites = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& conv = graph.nodes[i];
    if (!is_onnx_op(conv, "Conv") || conv.outputs.size() != 1 || conv.inputs.size() < 2) continue;
    const std::vector<size_t>& readers = index.consumers(conv.outputs[0]);
    if (readers.size() != 1 || !index.read_only_by(conv.outputs[0], readers[0])) continue;
    const size_t act = readers[0];
    // The activation reads the Conv as its data input (not as a Clip bound).
    if (graph.nodes[act].inputs[0] != conv.outputs[0]) continue;
    auto activation = activation_of(graph.nodes[act], index);
    if (!activation) continue;
    Node fused = conv;
    fused.name = str(conv.name.empty() ? conv.outputs[0] : conv.name, "/FusedConv");
    fused.op_type = "FusedConv";
    fused.domain = kMicrosoftDomain;
    fused.opset = 1;
    fused.outputs = graph.nodes[act].outputs;
    fused.attributes.push_back(string_attribute("activation", activation->first));
    if (!activation->second.empty()) fused.attributes.push_back(floats_attribute("activation_params", activation->second));
    // The fused node takes the activation's place: everything reading its
    // output comes after it, and the Conv's inputs come before the Conv.
    graph.nodes[act] = std::move(fused);
    removed[i] = true;
    ++rewrites;
  }
  if (rewrites == 0) return 0;
  erase_nodes(graph, removed);
  import_domain(graph, kMicrosoftDomain, 1);
  return rewrites;
}

}  // namespace transmuter
