// Fuses the gated feed-forward block of Llama-style decoders: over packed quantized weights (what
// pack_matmul_nbits makes of onnxruntime-genai's MatMulNBits) or over packed float weights (what
// pack_matmul_weights makes of a PyTorch export's MatMuls):
//
//          x ---------------------+
//          |                      |
//      P(x, Wg)               P(x, Wu)          P: QuantizedMatMul, or PackedMatMul without epilogue
//          |       |              |
//          |    Sigmoid           |
//          |       |              |
//          +----- Mul             |
//                  |              |
//                  +---- Mul -----+
//                         |
//                         Y
//                                   =>
//   P(x, [Wg | Wu]) -> ai.transmuter SwiGlu -> Y
//
// One product of 2N columns instead of two of N (a decode step's products are GEMVs over small
// weights, where each call's set-up and thread hand-off weigh: bench/quantized_matmul_bench
// 1x576x3072 against 2 x 1x576x1536) and one kernel instead of three elementwise ops. The
// weights are stacked once at load (QuantizedMatMul's [N, ...] rows; PackedMatMul's [panels, K, P]
// panels, one after the other, which is the packing of [Wg | Wu] when Wg's N is a multiple of the panel
// width P); each output column is computed as before (the products' columns are independent), SwiGlu's
// sigmoid is the activation kernel's (1 ulp of exp).
//
// Matches when both products read the same x with the same K (and bits and group size), have constant
// weights, both or neither with stored biases and no bias input, and every intermediate value is
// read by the pattern alone (and is no graph output). Either operand order of each Mul.
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";

struct GatedMlp {
  size_t gate, up, sigmoid, silu, product;  // the nodes (product: the last Mul)
};

bool is_quantized_matmul(const Node& node) {
  return node.domain == kDomain && node.op_type == "QuantizedMatMul";
}

bool is_constant(const Graph& graph, const std::string& name) {
  auto it = graph.initializers.find(name);
  return it != graph.initializers.end() && it->second.is_tensor() && !it->second.is_widened();
}

/** A PackedMatMul by a constant packed weight [panels, K, P], without bias, residual or activation. */
bool is_plain_packed_matmul(const Graph& graph, const Node& node) {
  if (node.domain != kDomain || node.op_type != "PackedMatMul" || node.inputs.size() != 2) return false;
  const Attribute* activation = node.find_attribute("activation");
  if (!is_constant(graph, node.inputs[1]) || (activation != nullptr && !activation->s.empty())) return false;
  return graph.initializers.at(node.inputs[1]).tensor().ndim() == 3;
}

bool is_stackable_product(const Graph& graph, const Node& node) {
  return is_quantized_matmul(node) || is_plain_packed_matmul(graph, node);
}

// The two products agree on everything but their weights.
bool same_product_shape(const Graph& graph, const Node& g, const Node& u) {
  if (g.op_type != u.op_type || g.inputs[0] != u.inputs[0]) return false;
  if (g.op_type == "PackedMatMul") {
    // Panels of one width over one K, and the gate's columns filling its last panel.
    const mx::array &wg = graph.initializers.at(g.inputs[1]).tensor(), &wu = graph.initializers.at(u.inputs[1]).tensor();
    return wg.shape(1) == wu.shape(1) && wg.shape(2) == wu.shape(2) &&
           int_attribute_or(g, "n", -1) == int64_t{wg.shape(0)} * wg.shape(2);
  }
  if (has_input(g, 4) || has_input(u, 4)) return false;
  if (has_input(g, 3) != has_input(u, 3)) return false;
  for (const char* name : {"K", "bits", "group_size", "accuracy_level"}) {
    if (int_attribute_or(g, name, -1) != int_attribute_or(u, name, -2)) return false;
  }
  for (const Node* node : {&g, &u}) {
    for (size_t i = 1; i < 4; ++i) {
      if (has_input(*node, i) && !is_constant(graph, node->inputs[i])) return false;
    }
  }
  return true;
}

// Y = Mul(silu, up) with silu = Mul(gate, Sigmoid(gate)), from the last Mul.
std::optional<GatedMlp> match(const Graph& graph, const GraphIndex& index, size_t product) {
  const Node& mul = graph.nodes[product];
  if (!is_onnx_op(mul, "Mul") || mul.inputs.size() != 2) return std::nullopt;
  for (int order = 0; order < 2; ++order) {
    const std::string& silu_value = mul.inputs[order];
    const std::string& up_value = mul.inputs[1 - order];
    std::optional<size_t> silu = index.producer(silu_value), up = index.producer(up_value);
    if (!silu || !up || !is_onnx_op(graph.nodes[*silu], "Mul") || !is_stackable_product(graph, graph.nodes[*up]))
      continue;
    if (!index.read_only_by(silu_value, product) || !index.read_only_by(up_value, product)) continue;
    const Node& silu_mul = graph.nodes[*silu];
    if (silu_mul.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string& gate_value = silu_mul.inputs[side];
      const std::string& sigmoid_value = silu_mul.inputs[1 - side];
      std::optional<size_t> gate = index.producer(gate_value), sigmoid = index.producer(sigmoid_value);
      if (!gate || !sigmoid || !is_stackable_product(graph, graph.nodes[*gate])) continue;
      const Node& sig = graph.nodes[*sigmoid];
      if (!is_onnx_op(sig, "Sigmoid") || sig.inputs.size() != 1 || sig.inputs[0] != gate_value) continue;
      if (!index.read_only_by(sigmoid_value, *silu)) continue;
      // The gate is read by the Sigmoid and the Mul only.
      const std::vector<size_t>& readers = index.consumers(gate_value);
      if (readers.size() != 2 || index.is_graph_output(gate_value)) continue;
      if (*gate == *up || !same_product_shape(graph, graph.nodes[*gate], graph.nodes[*up])) continue;
      return GatedMlp{*gate, *up, *sigmoid, *silu, product};
    }
  }
  return std::nullopt;
}

// Two constants stacked along their first axis into a new initializer: QuantizedMatMul's rows [N, *] (weights,
// scales, biases) or PackedMatMul's panels [panels, K, P].
std::string stacked(Graph& graph, const std::string& first, const std::string& second) {
  mx::array rows =
      mx::concatenate({graph.initializers.at(first).tensor(), graph.initializers.at(second).tensor()}, 0);
  mx::eval(rows);
  const std::string name = fresh_initializer_name(graph, first + "/gate_up");
  graph.initializers[name] = Value(rows);
  return name;
}

}  // namespace

size_t fuse_gated_mlp(Graph& graph) {
  GraphIndex index(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  std::vector<std::string> replaced_weights;
  size_t fused = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    std::optional<GatedMlp> m = match(graph, index, i);
    if (!m) continue;
    const size_t parts[] = {m->gate, m->up, m->sigmoid, m->silu, m->product};
    bool taken = false;
    for (size_t n : parts) taken = taken || removed[n];
    if (taken) continue;
    const Node gate = graph.nodes[m->gate], up = graph.nodes[m->up];
    Node product = gate;
    product.name = gate.name + "/gate_up";
    product.outputs = {fresh_initializer_name(graph, graph.nodes[m->product].outputs[0] + "/gate_up")};
    for (size_t k = 1; k < 4; ++k) {
      if (!has_input(gate, k)) continue;
      product.inputs[k] = stacked(graph, gate.inputs[k], up.inputs[k]);
      replaced_weights.push_back(gate.inputs[k]);
      replaced_weights.push_back(up.inputs[k]);
    }
    for (Attribute& a : product.attributes) {
      if (a.name == "N" || a.name == "n")  // QuantizedMatMul's N, PackedMatMul's n
        a = int_attribute(a.name, int_attribute_or(gate, a.name, 0) + int_attribute_or(up, a.name, 0));
    }
    Node swiglu;
    swiglu.op_type = "SwiGlu";
    swiglu.domain = kDomain;
    swiglu.opset = 1;
    swiglu.name = graph.nodes[m->product].name + "/swiglu";
    swiglu.inputs = {product.outputs[0]};
    swiglu.outputs = graph.nodes[m->product].outputs;
    // The product takes the gate's place (its inputs come before it), SwiGlu the last Mul's.
    graph.nodes[m->gate] = std::move(product);
    graph.nodes[m->product] = std::move(swiglu);
    removed[m->up] = removed[m->sigmoid] = removed[m->silu] = true;
    ++fused;
  }
  if (fused == 0) return 0;
  erase_nodes(graph, removed);
  const GraphIndex rewritten(graph);
  for (const std::string& name : replaced_weights) {
    if (graph.initializers.contains(name) && rewritten.consumers(name).empty() &&
        !rewritten.is_graph_output(name))
      drop_weight(graph, name);
  }
  return fused;
}

}  // namespace transmuter
