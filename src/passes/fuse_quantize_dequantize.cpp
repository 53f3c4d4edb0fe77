// Fuses the QDQ format's QuantizeLinear -> DequantizeLinear pair on an activation, one scale and zero
// point for the whole tensor, into ai.transmuter QuantizeDequantize: one pass over the activation
// (src/kernels/cpu/dynamic_quantize.h) instead of MLX's nine (divide, round, add, clip and a cast, then a
// cast, subtract, multiply and a cast), the same floats.
//
//   x   scale   zero_point                         x   scale   zero_point
//    \    |     /                                   \    |     /
//   QuantizeLinear -> q -> DequantizeLinear   =>   ai.transmuter QuantizeDequantize
//                   (q read by it alone)                    |
//                            |                              y
//                            y
//
// Also Mul(V, multiplier) -> QuantizeLinear(scale 1, zero point) -> ai.transmuter Requantize (what
// qlinear_conv_as_conv writes after each convolution), the multiplier one value or per channel along the
// last axis; and when the integers are read by one DequantizeLinear alone (the next convolution's input),
// that DequantizeLinear joins it as Requantize's inputs 3 and 4, which then returns its floats:
//
//   Requantize(V, m, zero) -> q -> DequantizeLinear(q, scale, zero2)   =>   Requantize(V, m, zero, scale,
//   zero2)
//
// Both nodes of the default domain with the same scale and zero point (the same initializers, or
// initializers of equal values), one element each, float32 scale, an 8- or 16-bit integer zero point, no
// block_size, output_dtype or saturate that would change them. Runs after channels_last_convs, which moves
// the layout through the two nodes as through any elementwise op.
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";

bool plain_quantization_node(const Node& node, const char* op_type) {
  return is_onnx_op(node, op_type) && node.outputs.size() == 1 && node.inputs.size() >= 2 &&
         int_attribute_or(node, "block_size", 0) == 0 && int_attribute_or(node, "output_dtype", 0) == 0 &&
         node.find_attribute("saturate") == nullptr;
}

// The input at `i` as a scalar initializer, or nullptr (also when absent: `present` false then).
const mx::array* parameter(const Graph& graph, const Node& node, size_t i, bool& present) {
  present = has_input(node, i);
  return present ? scalar_initializer(graph, node.inputs[i]) : nullptr;
}

// The same value: the same initializer, or two one-element initializers with equal values.
bool same_parameter(const Graph& graph, const Node& q, const Node& dq, size_t i) {
  bool in_q = false, in_dq = false;
  const mx::array* a = parameter(graph, q, i, in_q);
  const mx::array* b = parameter(graph, dq, i, in_dq);
  if (!in_q && !in_dq) return true;
  if (a == nullptr || b == nullptr) return false;
  if (q.inputs[i] == dq.inputs[i]) return true;
  return a->dtype() == b->dtype() && mx::array_equal(*a, *b).item<bool>();
}

// q -> dq, where dq is q's output's only reader.
bool fusable_pair(const Graph& graph, const Node& q, const Node& dq) {
  if (!plain_quantization_node(q, "QuantizeLinear") || !plain_quantization_node(dq, "DequantizeLinear"))
    return false;
  if (dq.inputs[0] != q.outputs[0]) return false;
  bool present = false;
  const mx::array* scale = parameter(graph, q, 1, present);
  if (scale == nullptr || scale->dtype() != mx::float32) return false;
  const mx::array* zero = parameter(graph, q, 2, present);
  if (present && (zero == nullptr || (zero->dtype() != mx::uint8 && zero->dtype() != mx::int8 &&
                                      zero->dtype() != mx::uint16 && zero->dtype() != mx::int16)))
    return false;
  return same_parameter(graph, q, dq, 1) && same_parameter(graph, q, dq, 2);
}

// Mul(v, multiplier) -> QuantizeLinear(scale 1, zero point), the Mul's output read by the QuantizeLinear
// alone, the multiplier a float32 initializer of one value or one per channel along the last axis (after
// channels_last_convs), the zero point 8-bit: the requantization qlinear_conv_as_conv writes.
std::optional<Node> requantization(const Graph& graph, const GraphIndex& index, const Node& mul,
                                   const Node& q) {
  if (!is_onnx_op(mul, "Mul") || mul.inputs.size() != 2 || mul.outputs.size() != 1) return std::nullopt;
  if (!plain_quantization_node(q, "QuantizeLinear") || q.inputs[0] != mul.outputs[0] || q.inputs.size() < 3 ||
      q.inputs[2].empty())
    return std::nullopt;
  if (sole_consumer(index, mul.outputs[0]) != index.producer(q.outputs[0])) return std::nullopt;
  bool present = false;
  const mx::array* one = parameter(graph, q, 1, present);
  const mx::array* zero = parameter(graph, q, 2, present);
  if (one == nullptr || one->dtype() != mx::float32 || one->item<float>() != 1.0f || zero == nullptr ||
      (zero->dtype() != mx::uint8 && zero->dtype() != mx::int8))
    return std::nullopt;
  const mx::array* multiplier = stored_initializer(graph, mul.inputs[1]);
  if (multiplier == nullptr || multiplier->dtype() != mx::float32) return std::nullopt;
  const mx::array& m = *multiplier;
  for (int axis = 0; axis + 1 < static_cast<int>(m.ndim()); ++axis) {
    if (m.shape(axis) != 1) return std::nullopt;  // per channel only along the last axis
  }
  Node fused;
  fused.op_type = "Requantize";
  fused.domain = kDomain;
  fused.opset = 1;
  fused.name = (q.name.empty() ? q.outputs[0] : q.name) + "/requantize";
  fused.inputs = {mul.inputs[0], mul.inputs[1], q.inputs[2]};
  fused.outputs = q.outputs;
  return fused;
}

// dq a plain per-tensor DequantizeLinear of requantize's integers: a float32 scale, and a zero point of the
// requantization's own type (or none).
bool dequantizes(const Graph& graph, const Node& dq, const Node& requantize) {
  if (!plain_quantization_node(dq, "DequantizeLinear") || dq.inputs[0] != requantize.outputs[0]) return false;
  bool present = false;
  const mx::array* scale = parameter(graph, dq, 1, present);
  if (scale == nullptr || scale->dtype() != mx::float32) return false;
  const mx::array* zero = parameter(graph, dq, 2, present);
  const mx::array* requantize_zero = stored_initializer(graph, requantize.inputs[2]);
  return !present ||
         (zero != nullptr && requantize_zero != nullptr && zero->dtype() == requantize_zero->dtype());
}

}  // namespace

size_t fuse_quantize_dequantize(Graph& graph) {
  std::vector<bool> removed(graph.nodes.size(), false);
  size_t count = 0;
  {
    const GraphIndex index(graph);
    // Requantizations first: their QuantizeLinear would otherwise pair with the next layer's
    // DequantizeLinear, leaving the Mul on its own.
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      if (!is_onnx_op(graph.nodes[i], "Mul") || graph.nodes[i].outputs.size() != 1) continue;
      std::optional<size_t> reader = sole_consumer(index, graph.nodes[i].outputs[0]);
      if (!reader || removed[*reader]) continue;
      if (std::optional<Node> fused = requantization(graph, index, graph.nodes[i], graph.nodes[*reader])) {
        graph.nodes[*reader] = std::move(*fused);
        removed[i] = true;
        ++count;
      }
    }
    // A requantization whose integers one DequantizeLinear alone reads returns that node's floats.
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      Node& requantize = graph.nodes[i];
      if (removed[i] || requantize.op_type != "Requantize" || requantize.domain != kDomain) continue;
      std::optional<size_t> reader = sole_consumer(index, requantize.outputs[0]);
      if (!reader || removed[*reader] || !dequantizes(graph, graph.nodes[*reader], requantize)) continue;
      Node& dq = graph.nodes[*reader];
      requantize.inputs.push_back(dq.inputs[1]);
      if (has_input(dq, 2)) requantize.inputs.push_back(dq.inputs[2]);
      requantize.outputs = dq.outputs;
      removed[*reader] = true;
      ++count;
    }
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& q = graph.nodes[i];
      if (removed[i] || !is_onnx_op(q, "QuantizeLinear") || q.outputs.size() != 1) continue;
      std::optional<size_t> reader = sole_consumer(index, q.outputs[0]);
      if (!reader || removed[*reader] || !fusable_pair(graph, q, graph.nodes[*reader])) continue;
      Node& dq = graph.nodes[*reader];
      Node fused;
      fused.op_type = "QuantizeDequantize";
      fused.domain = kDomain;
      fused.opset = 1;
      fused.name = (dq.name.empty() ? dq.outputs[0] : dq.name) + "/quantize_dequantize";
      fused.inputs = {q.inputs[0], q.inputs[1]};
      if (has_input(q, 2)) fused.inputs.push_back(q.inputs[2]);
      fused.outputs = dq.outputs;
      dq = std::move(fused);  // at the DequantizeLinear's place: after whatever made x
      removed[i] = true;
      ++count;
    }
  }
  if (count == 0) return 0;
  erase_nodes(graph, removed);
  import_domain(graph, kDomain, 1);
  return count;
}

}  // namespace transmuter
