// Runs channels_last_convs' 3x3 stride-1 convolutions by Winograd's minimal
// filtering F(2x2, 3x3) (src/kernels/cpu/winograd_conv.h): 16 products of the
// transformed tiles instead of one over the unfolded windows, 2.25x fewer
// multiply-adds.
//
//   X     W (packed)  B  Z                X     U  B  Z
//    \      |        /  /                  \    |  /  /
//   ai.transmuter ConvNhwc        =>   ai.transmuter ConvWinogradNhwc
//   (3x3, strides 1, dilations 1,      (the same attributes; U = the weight
//    group 1, input_layout NHWC,        transformed at load, float32
//    C > kConvDirectMaxChannels)        [16, panels, C, P])
//          |                                    |
//          Y                                    Y
//
// The transform reads the filters (channels_last_convs leaves the packing of
// such weights for later: deferred_repack) or else the packed weight, which
// goes when this convolution alone read it; convolutions sharing a weight
// share its transform. Stems over few channels stay on the
// direct kernel, which reads the input in place.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/winograd_conv.h"
#include "mlx_bridge/buffers.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";

// The packed weight of a ConvNhwc the Winograd kernel runs, or nullptr.
const mx::array* winograd_candidate_weight(const Graph& graph, const Node& node) {
  if (node.domain != kDomain || node.op_type != "ConvNhwc" || node.inputs.size() < 2 ||
      node.outputs.size() != 1 || int_attribute_or(node, "group", 1) != 1) {
    return nullptr;
  }
  if (const Attribute* layout = node.find_attribute("input_layout"); layout != nullptr && layout->s != "NHWC")
    return nullptr;
  if (ints_attribute_or(node, "kernel_shape", {}) != std::vector<int64_t>{3, 3} ||
      ints_attribute_or(node, "strides", {1, 1}) != std::vector<int64_t>{1, 1} ||
      ints_attribute_or(node, "dilations", {1, 1}) != std::vector<int64_t>{1, 1}) {
    return nullptr;
  }
  const mx::array* packed = stored_initializer(graph, node.inputs[1]);
  if (packed == nullptr || packed->dtype() != mx::float32 || packed->ndim() != 3 || packed->shape(1) % 9 != 0)
    return nullptr;
  const int64_t channels = packed->shape(1) / 9;
  return channels > kernels::kConvDirectMaxChannels ? packed : nullptr;
}

}  // namespace

size_t winograd_convs(Graph& graph) {
  const GraphIndex index(graph);
  std::map<std::string, std::string>
      transformed_names;  // packed weight -> its transform (shared weights once)
  size_t converted = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& node = graph.nodes[i];
    const mx::array* packed = winograd_candidate_weight(graph, node);
    if (packed == nullptr) continue;
    const std::string weight_name = node.inputs[1];
    std::string& transformed_name = transformed_names[weight_name];
    if (transformed_name.empty()) {
      transformed_name = fresh_initializer_name(graph, weight_name + "/winograd");
      // From the filters when channels_last_convs left the packing for later (never made, then).
      const std::optional<mx::array> filters = pending_repack_source(*packed);
      mx::array transformed = filters ? kernels::winograd_weight_from_filters(*filters)
                                      : kernels::winograd_weight_from_packed(*packed, packed->shape(1) / 9);
      graph.initializers.insert_or_assign(transformed_name, Value(transformed));
    }
    node.op_type = "ConvWinogradNhwc";
    node.name += "/winograd";
    node.inputs[1] = transformed_name;
    if (index.read_only_by(weight_name, i) &&
        std::count(node.inputs.begin(), node.inputs.end(), weight_name) == 0)
      drop_weight(graph, weight_name);
    ++converted;
  }
  return converted;
}

}  // namespace transmuter
