// Packs the constant 8-bit weight of each ONNX MatMulInteger once, at load, for the int8 GEMM kernel
// (src/kernels/cpu/integer_gemm.h: AVX512-VNNI dot products), as ONNX Runtime's quantize_dynamic
// exports use it (DynamicQuantizeLinear of the activation, then MatMulInteger by the int8 weight).
// ORT's own fusions of that pattern take the same kernel: com.microsoft MatMulIntegerToFloat(A, B,
// a_scale, b_scale, [a_zero], [b_zero], [bias]) becomes IntegerMatMul with its scales and bias as the
// epilogue, DynamicQuantizeMatMul(A, B, b_scale, [b_zero], [bias]) a DynamicQuantizeLinear of A and
// that IntegerMatMul.
//
//   A (uint8)   B (int8/uint8 constant [K, N])         A   packed  column_sums  column_zeros  [a_zero_point]
//      \       /     [a_zero_point] [b_zero_point]        \     |       |          /          /  [scale] [bias]
//     MatMulInteger --------/--------------/      =>       ai.transmuter IntegerMatMul (k = K, n = N)
//           |                                                       |
//     [Cast(to float) -> Mul(scale) [-> Add(bias)]]                 Y
//           |
//           Y
//
// The float epilogue quantize_dynamic writes after each product (Cast to float, Mul by A's scale
// times B's, Add of a constant bias [N]) joins the fused node when each value is read by the next node
// alone; the kernel rounds each step as the separate ops do. b_zero_point must be absent or a constant
// of B's type (one element or [N]); a_zero_point absent, a one-element constant, or DynamicQuantizeLinear's zero point (one element by its definition), since
// the kernel takes one zero point for all of A's rows. The file's weight is dropped when nothing else
// reads it. Runs only when the default device at load is the CPU and the CPU has the kernel
// (kernels::integer_gemm_available): elsewhere the node would unpack the weight on every call.
#include <algorithm>
#include <array>
#include <map>
#include <optional>

#include "kernels/cpu/integer_gemm.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";

bool is_8bit(mx::Dtype t) { return t == mx::int8 || t == mx::uint8; }

// The zero point of A is one element: a one-element constant or DynamicQuantizeLinear's output 2.
bool one_zero_point(const Graph& graph, const GraphIndex& index, const std::string& name) {
  if (std::optional<mx::array> c = index.constant(name)) return c->size() == 1;
  std::optional<size_t> producer = index.producer(name);
  if (!producer) return false;
  const Node& node = graph.nodes[*producer];
  return is_onnx_op(node, "DynamicQuantizeLinear") && node.outputs.size() == 3 && node.outputs[2] == name;
}

struct IntegerProduct {
  size_t node = 0;
  std::string a;                        // the uint8/int8 left operand the fused node reads
  std::optional<std::string> quantize = std::nullopt;  // DynamicQuantizeMatMul: its float A, quantized by a new node first
  std::string weight;
  std::optional<std::string> a_zero = std::nullopt, b_zero = std::nullopt;
  // quantize_dynamic's float epilogue, when it follows: Cast(to float) -> Mul(scale) [-> Add(bias)].
  std::vector<size_t> epilogue = {};  // its nodes, in order; the last one's output is the fused node's
  std::optional<std::string> scale = std::nullopt, bias = std::nullopt;
  // The scale's Mul of A's scale by B's constant one, read by the epilogue alone: taken in as well.
  std::optional<size_t> scale_product = std::nullopt;
  std::optional<std::string> scale_factor = std::nullopt;
};

// The epilogue's scale when it is Mul(value, constant float, one element or [N]) read there alone.
void take_scale_product(const Graph& graph, const GraphIndex& index, int64_t columns, size_t epilogue_mul,
                        IntegerProduct& m) {
  std::optional<size_t> producer = index.producer(*m.scale);
  if (!producer || !is_onnx_op(graph.nodes[*producer], "Mul") || !index.read_only_by(*m.scale, epilogue_mul)) return;
  const Node& mul = graph.nodes[*producer];
  if (mul.inputs.size() != 2) return;
  for (int side = 0; side < 2; ++side) {
    std::optional<mx::array> c = index.constant(mul.inputs[side]);
    if (!c || c->dtype() != mx::float32 || (c->size() != 1 && !(c->ndim() == 1 && c->shape(0) == columns))) continue;
    m.scale_product = producer;
    m.scale_factor = mul.inputs[side];
    m.scale = mul.inputs[1 - side];
    return;
  }
}

// Cast(to float) -> Mul by a value -> optional Add of a constant float [N], each read by the next
// alone: the fused node computes them in its epilogue.
void take_float_epilogue(const Graph& graph, const GraphIndex& index, int64_t columns, IntegerProduct& m) {
  std::optional<size_t> cast = sole_consumer(index, graph.nodes[m.node].outputs[0]);
  if (!cast || !is_onnx_op(graph.nodes[*cast], "Cast") || int_attribute_or(graph.nodes[*cast], "to", 0) != 1) return;
  const std::string& as_float = graph.nodes[*cast].outputs[0];
  std::optional<size_t> mul = sole_consumer(index, as_float);
  if (!mul || !is_onnx_op(graph.nodes[*mul], "Mul")) return;
  std::optional<std::string> scale = other_input(graph.nodes[*mul], as_float);
  if (!scale) return;
  m.epilogue = {*cast, *mul};
  m.scale = scale;
  take_scale_product(graph, index, columns, *mul, m);
  std::optional<size_t> add = sole_consumer(index, graph.nodes[*mul].outputs[0]);
  if (!add || !is_onnx_op(graph.nodes[*add], "Add")) return;
  std::optional<std::string> bias = other_input(graph.nodes[*add], graph.nodes[*mul].outputs[0]);
  if (!bias) return;
  std::optional<mx::array> b = index.constant(*bias);
  if (!b || b->dtype() != mx::float32 || b->ndim() != 1 || b->shape(0) != columns) return;
  m.epilogue.push_back(*add);
  m.bias = bias;
}

// Input `i` of `node` when present (not omitted).
std::optional<std::string> present_input(const Node& node, size_t i) {
  return i < node.inputs.size() && !node.inputs[i].empty() ? std::optional<std::string>(node.inputs[i]) : std::nullopt;
}

// The constant 8-bit weight [K, N] and its zero point (absent, or a constant of its type, one element or [N]).
bool constant_weight(const GraphIndex& index, const std::string& weight, const std::optional<std::string>& zero) {
  std::optional<mx::array> b = index.constant(weight);
  if (!b || b->ndim() != 2 || !is_8bit(b->dtype()) || b->shape(0) == 0 || b->shape(1) == 0) return false;
  if (!zero) return true;
  std::optional<mx::array> z = index.constant(*zero);
  return z && z->dtype() == b->dtype() && (z->size() == 1 || (z->ndim() == 1 && z->shape(0) == b->shape(1)));
}

std::optional<IntegerProduct> match(const Graph& graph, const GraphIndex& index, size_t i) {
  const Node& node = graph.nodes[i];
  if (node.outputs.size() != 1 || node.inputs.size() < 2) return std::nullopt;
  IntegerProduct m{.node = i, .a = node.inputs[0], .weight = node.inputs[1]};
  if (is_onnx_op(node, "MatMulInteger")) {
    m.b_zero = present_input(node, 3);
    if (!constant_weight(index, m.weight, m.b_zero)) return std::nullopt;
    if ((m.a_zero = present_input(node, 2)) && !one_zero_point(graph, index, *m.a_zero)) return std::nullopt;
    take_float_epilogue(graph, index, index.constant(m.weight)->shape(1), m);
    return m;
  }
  if (node.domain != "com.microsoft") return std::nullopt;
  if (node.op_type == "MatMulIntegerToFloat" && node.inputs.size() >= 4) {
    // (A, B, a_scale, b_scale, a_zero?, b_zero?, bias?): the op's own scales, zero points and bias.
    m.b_zero = present_input(node, 5);
    if (!constant_weight(index, m.weight, m.b_zero)) return std::nullopt;
    m.a_zero = present_input(node, 4);
    m.scale = node.inputs[2];
    m.scale_factor = node.inputs[3];
    m.bias = present_input(node, 6);
    return m;
  }
  // The quantizer inserted for it is a default-domain DynamicQuantizeLinear (opset 11 on).
  const auto onnx_opset = graph.opsets.find("");
  if (node.op_type == "DynamicQuantizeMatMul" && node.inputs.size() >= 3 && onnx_opset != graph.opsets.end() &&
      onnx_opset->second >= 11) {
    // (A float, B, b_scale, b_zero?, bias?): A quantized as DynamicQuantizeLinear does, then the same.
    m.b_zero = present_input(node, 3);
    if (!constant_weight(index, m.weight, m.b_zero)) return std::nullopt;
    m.quantize = node.inputs[0];
    m.scale_factor = node.inputs[2];
    m.bias = present_input(node, 4);
    return m;
  }
  return std::nullopt;
}

}  // namespace

size_t pack_integer_matmul_weights(Graph& graph) {
  if (mx::default_device() != mx::Device::cpu || !kernels::integer_gemm_available()) return 0;
  const GraphIndex index(graph);
  std::vector<IntegerProduct> matches;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (std::optional<IntegerProduct> m = match(graph, index, i)) matches.push_back(*m);
  }
  // (weight, zero point) -> the names of its packed initializers
  std::map<std::pair<std::string, std::string>, std::array<std::string, 3>> packed_names;
  std::map<std::string, size_t> products;  // per weight: the products that read it
  for (const IntegerProduct& m : matches) products[m.weight]++;
  std::map<std::string, size_t> pending = products;  // of those, the ones not rewritten yet
  std::vector<bool> removed(graph.nodes.size(), false);
  std::map<size_t, Node> quantizers;  // DynamicQuantizeLinear nodes to insert before the fused node at a place
  ValueNames values(graph);
  for (IntegerProduct& m : matches) {
    const mx::array b = *index.constant(m.weight);
    std::array<std::string, 3>& names = packed_names[{m.weight, m.b_zero.value_or("")}];
    if (names[0].empty()) {
      std::optional<mx::array> zero;
      if (m.b_zero) zero = index.constant(*m.b_zero);
      kernels::PackedIntegerRhs packed = kernels::pack_integer_gemm_rhs(b, zero);
      const char* suffixes[3] = {"/packed_int8", "/column_sums", "/column_zeros"};
      const mx::array* parts[3] = {&packed.packed, &packed.column_sums, &packed.column_zeros};
      for (int p = 0; p < 3; ++p) {
        names[p] = fresh_initializer_name(graph, m.weight + suffixes[p]);
        graph.initializers[names[p]] = Value(*parts[p]);
      }
    }
    const Node& node = graph.nodes[m.node];
    if (m.quantize) {
      Node quantizer;
      quantizer.name = node.name + "/quantize_a";
      quantizer.op_type = "DynamicQuantizeLinear";
      quantizer.opset = static_cast<int>(graph.opsets.at(""));
      quantizer.inputs = {*m.quantize};
      quantizer.outputs = {values.fresh(*m.quantize + "/quantized"), values.fresh(*m.quantize + "/scale"),
                           values.fresh(*m.quantize + "/zero_point")};
      m.a = quantizer.outputs[0];
      m.scale = quantizer.outputs[1];
      m.a_zero = quantizer.outputs[2];
      quantizers.emplace(m.node, std::move(quantizer));
    }
    Node fused;
    fused.name = node.name;
    fused.op_type = "IntegerMatMul";
    fused.domain = kDomain;
    fused.opset = 1;
    fused.inputs = {m.a, names[0], names[1], names[2]};
    if (m.a_zero || m.scale) fused.inputs.push_back(m.a_zero.value_or(""));
    if (m.scale) fused.inputs.push_back(*m.scale);
    if (m.bias || m.scale_factor) fused.inputs.push_back(m.bias.value_or(""));
    if (m.scale_factor) fused.inputs.push_back(*m.scale_factor);
    if (m.scale_product) removed[*m.scale_product] = true;
    // The fused node takes the place of the epilogue's last node, after whatever computes the scale.
    const size_t place = m.epilogue.empty() ? m.node : m.epilogue.back();
    fused.outputs = graph.nodes[place].outputs;
    for (size_t e : m.epilogue) removed[e] = true;
    removed[m.node] = true;
    removed[place] = false;
    fused.attributes = {int_attribute("k", b.shape(0)), int_attribute("n", b.shape(1))};
    graph.nodes[place] = std::move(fused);
    // The stored weight goes with its last product, unless something else reads it too.
    if (--pending[m.weight] == 0 && index.consumers(m.weight).size() == products[m.weight] &&
        graph.initializers.contains(m.weight) && !index.is_graph_output(m.weight))
      drop_weight(graph, m.weight);
  }
  if (!matches.empty()) {
    // DynamicQuantizeMatMul's quantizer goes just before its product (which stays at the node's place).
    std::vector<Node> nodes;
    std::vector<bool> gone;
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      if (auto q = quantizers.find(i); q != quantizers.end()) {
        nodes.push_back(std::move(q->second));
        gone.push_back(false);
      }
      nodes.push_back(std::move(graph.nodes[i]));
      gone.push_back(removed[i]);
    }
    graph.nodes = std::move(nodes);
    erase_nodes(graph, gone);
    import_domain(graph, kDomain, 1);
  }
  return matches.size();
}

}  // namespace transmuter
