// Computes each DequantizeLinear of a constant weight once, at load, into a float initializer: the QDQ
// format (quantize_static's default, Optimum's static quantization) stores a Conv's or MatMul's weight as
// int8 and dequantizes it in the graph, so the product's weight is no initializer and none of the passes
// that pack weights or change the layout (fold_batch_norm_into_conv, channels_last_convs,
// pack_matmul_weights...) could take it; run as written, every call would also dequantize every weight
// again (QDQ MobileNetV2: 28 ms a call against 4.6 for the float model).
//
//   w (int8/uint8/int16/uint16/int32 initializer)   scale   [zero_point]        w' (float initializer)
//                         \                           |        /           =>        |
//                          DequantizeLinear (axis; per tensor or per axis)          Conv / MatMul / ...
//                                    |
//                             Conv / MatMul / ...
//
//   w' = (float32(w) - float32(zero_point)) * float32(scale), rounded once to the scale's type: the
//   operator's own arithmetic (src/ops/onnx/quantization.cpp), so the result is bit-equal.
//
// The activations' QuantizeLinear -> DequantizeLinear pairs stay: they are what ONNX Runtime computes
// with graph optimizations off. Not folded: blocked scales (block_size; an int4 LLM weight would become
// 8 times its size), output_dtype, narrow types held widened (int4, float8), a graph output. The weight
// then takes 4 bytes a value instead of 1, as the float model's.
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

bool is_dequantize(const Node& node) {
  return node.op_type == "DequantizeLinear" &&
         (node.domain.empty() || node.domain == "ai.onnx" || node.domain == "com.microsoft");
}

bool foldable_integer(mx::Dtype t) {
  return t == mx::int8 || t == mx::uint8 || t == mx::int16 || t == mx::uint16 || t == mx::int32;
}

bool is_float(mx::Dtype t) { return t == mx::float32 || t == mx::float16 || t == mx::bfloat16; }

// A per-tensor or per-axis parameter shaped to broadcast against x, or nullopt.
std::optional<mx::array> broadcastable(const mx::array& p, const mx::array& x, int64_t axis) {
  if (p.size() == 1) return mx::reshape(p, {});
  if (p.ndim() != 1 || x.ndim() == 0) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(x.ndim());
  if (axis < -rank || axis >= rank) return std::nullopt;
  const int a = static_cast<int>((axis + rank) % rank);
  if (p.shape(0) != x.shape(a)) return std::nullopt;
  mx::Shape shape(x.ndim(), 1);
  shape[a] = p.shape(0);
  return mx::reshape(p, shape);
}

// The node's dequantized constant, or nullopt when it cannot be folded.
std::optional<mx::array> folded(const Graph& graph, const GraphIndex& index, const Node& node) {
  if (!is_dequantize(node) || node.outputs.size() != 1 || index.is_graph_output(node.outputs[0]))
    return std::nullopt;
  if (int_attribute_or(node, "block_size", 0) != 0 || int_attribute_or(node, "output_dtype", 0) != 0)
    return std::nullopt;
  const mx::array* x = stored_input(graph, node, 0);
  const mx::array* scale = stored_input(graph, node, 1);
  if (x == nullptr || scale == nullptr || !foldable_integer(x->dtype()) || !is_float(scale->dtype()))
    return std::nullopt;
  const bool has_zero_point = has_input(node, 2);
  const mx::array* zero_point = has_zero_point ? stored_input(graph, node, 2) : nullptr;
  if (has_zero_point &&
      (zero_point == nullptr || zero_point->dtype() != x->dtype() || zero_point->size() != scale->size()))
    return std::nullopt;
  const int64_t axis = int_attribute_or(node, "axis", 1);
  std::optional<mx::array> scale_b = broadcastable(*scale, *x, axis);
  if (!scale_b) return std::nullopt;
  mx::array values = mx::astype(*x, mx::float32);
  if (zero_point != nullptr) {
    std::optional<mx::array> zero_b = broadcastable(*zero_point, *x, axis);
    if (!zero_b) return std::nullopt;
    values = mx::subtract(values, mx::astype(*zero_b, mx::float32));
  }
  mx::array weight = mx::astype(mx::multiply(values, mx::astype(*scale_b, mx::float32)), scale->dtype());
  mx::eval(weight);
  return weight;
}

}  // namespace

size_t fold_constant_dequantize(Graph& graph) {
  std::vector<bool> removed(graph.nodes.size(), false);
  std::vector<std::string> inputs_of_folded;
  size_t count = 0;
  {
    const GraphIndex index(graph);
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& node = graph.nodes[i];
      std::optional<mx::array> weight = folded(graph, index, node);
      if (!weight) continue;
      graph.initializers[node.outputs[0]] = Value(*weight);
      for (const std::string& input : node.inputs) {
        if (!input.empty()) inputs_of_folded.push_back(input);
      }
      removed[i] = true;
      ++count;
    }
  }
  if (count == 0) return 0;
  erase_nodes(graph, removed);
  // The integer weights go once nothing reads them (giving their file pages back).
  const GraphIndex rewritten(graph);
  for (const std::string& name : inputs_of_folded) {
    if (graph.initializers.contains(name) && rewritten.consumers(name).empty() &&
        !rewritten.is_graph_output(name))
      drop_weight(graph, name);
  }
  return count;
}

}  // namespace transmuter
