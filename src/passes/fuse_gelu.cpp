// Fuses the GELU subgraphs that PyTorch exports (and the bias Add of the
// MatMul before them) into ONNX Runtime's GELU contrib operators, which run as
// one SIMD kernel on CPU (src/ops/microsoft/activation.cpp).
//
//   exact (erf) form                         tanh form
//
//      X   bias(const [D])                      X  [bias]
//       \   /                                   |
//        Add  (optional)                 Pow(3) or Mul(x, Mul(x, x))
//         |                                     |
//         x ------------.                   Mul(0.044715)
//         |              \                      |
//   Div(sqrt 2) or        \               Add(x, .)
//   Mul(1/sqrt 2)          \                    |
//         |                 |             Mul(sqrt(2/pi))
//        Erf                |                   |
//         |                 |                 Tanh
//      Add(1)               |                   |
//         |                 |                Add(1)
//         +---- tail -------+                   +---- tail (as left)
//
//   tail: Mul(x, .) -> Mul(0.5)  |  Mul(Mul(x, 0.5), .)  |  Mul(., 0.5) -> Mul(x, .)
//   (every Add/Mul in either operand order)
//
//   =>  BiasGelu(X, bias)  or  Gelu(x)          FastGelu(X[, bias])
//       (domain com.microsoft, version 1)
//
// Matches only when every intermediate value is read by the next node of the
// pattern alone (and is no graph output), the constants are scalars within
// 1e-5 relative of the values above (4e-4 for sqrt(2/pi), which exports spell
// 0.7978845608 or 0.79788456), and the bias is a float 1-D constant of more
// than one element (of the weight's N when X comes from a MatMul with a
// constant weight). x itself may be read elsewhere: then the bias Add stays
// and Gelu reads x.
#include <algorithm>
#include <optional>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

constexpr float kSqrt2 = 1.41421356f;
constexpr float kSqrtTwoOverPi = 0.7978845608f;

struct GeluMatch {
  std::vector<size_t> nodes;  // every node of the pattern except the bias Add
  size_t last;                // the node whose output the fused node takes over
  std::string x;              // GELU's input
};

// For Op(value, constant c) with `value` read only by it: the node, when c ~= expected.
std::optional<size_t> consumer_with_scalar(const Graph& graph, const GraphIndex& index, const std::string& value,
                                           std::string_view op_type, float expected) {
  std::optional<size_t> n = sole_consumer(index, value);
  if (!n || !is_onnx_op(graph.nodes[*n], op_type)) return std::nullopt;
  std::optional<std::string> other = other_input(graph.nodes[*n], value);
  if (!other || !near(index.scalar(*other), expected)) return std::nullopt;
  return n;
}

// The tail after Add(1): `one_plus` (= 1 + erf or 1 + tanh) -> ... -> 0.5 x (one_plus).
bool match_tail(const Graph& graph, const GraphIndex& index, const std::string& one_plus, GeluMatch& m) {
  std::optional<size_t> m1 = sole_consumer(index, one_plus);
  if (!m1 || !is_onnx_op(graph.nodes[*m1], "Mul")) return false;
  std::optional<std::string> other = other_input(graph.nodes[*m1], one_plus);
  if (!other) return false;
  const std::string& m1_out = graph.nodes[*m1].outputs[0];
  if (*other == m.x) {
    // Mul(x, 1 + erf) -> Mul(0.5)
    std::optional<size_t> m2 = consumer_with_scalar(graph, index, m1_out, "Mul", 0.5f);
    if (!m2) return false;
    m.nodes.insert(m.nodes.end(), {*m1, *m2});
    m.last = *m2;
    return true;
  }
  if (near(index.scalar(*other), 0.5f)) {
    // Mul(1 + erf, 0.5) -> Mul(x, .)
    std::optional<size_t> m2 = sole_consumer(index, m1_out);
    if (!m2 || !is_onnx_op(graph.nodes[*m2], "Mul") || other_input(graph.nodes[*m2], m1_out) != m.x) return false;
    m.nodes.insert(m.nodes.end(), {*m1, *m2});
    m.last = *m2;
    return true;
  }
  // Mul(Mul(x, 0.5), 1 + erf)
  std::optional<size_t> half = index.producer(*other);
  if (!half || !is_onnx_op(graph.nodes[*half], "Mul") || !index.read_only_by(*other, *m1)) return false;
  std::optional<std::string> half_of = other_input(graph.nodes[*half], m.x);
  if (!half_of || !near(index.scalar(*half_of), 0.5f)) return false;
  m.nodes.insert(m.nodes.end(), {*half, *m1});
  m.last = *m1;
  return true;
}

// Erf(Div(x, sqrt 2) | Mul(x, 1/sqrt 2)) -> Add(1) -> tail.
std::optional<GeluMatch> match_erf_gelu(const Graph& graph, const GraphIndex& index, size_t erf) {
  const Node& erf_node = graph.nodes[erf];
  if (!is_onnx_op(erf_node, "Erf") || erf_node.inputs.size() != 1) return std::nullopt;
  std::optional<size_t> scale = index.producer(erf_node.inputs[0]);
  if (!scale || !index.read_only_by(erf_node.inputs[0], erf)) return std::nullopt;
  const Node& scale_node = graph.nodes[*scale];
  if (scale_node.inputs.size() != 2) return std::nullopt;
  GeluMatch m{.nodes = {*scale, erf}, .last = erf, .x = scale_node.inputs[0]};
  const bool divides = is_onnx_op(scale_node, "Div") && near(index.scalar(scale_node.inputs[1]), kSqrt2);
  bool multiplies = false;
  if (is_onnx_op(scale_node, "Mul")) {
    for (int i : {0, 1}) {
      if (near(index.scalar(scale_node.inputs[1 - i]), 1.0f / kSqrt2)) {
        multiplies = true;
        m.x = scale_node.inputs[i];
      }
    }
  }
  if (!divides && !multiplies) return std::nullopt;
  std::optional<size_t> add = consumer_with_scalar(graph, index, erf_node.outputs[0], "Add", 1.0f);
  if (!add) return std::nullopt;
  m.nodes.push_back(*add);
  if (!match_tail(graph, index, graph.nodes[*add].outputs[0], m)) return std::nullopt;
  return m;
}

// x^3 as Pow(x, 3) or Mul(x, Mul(x, x)) (either order); adds its nodes to m.
bool match_cube(const Graph& graph, const GraphIndex& index, const std::string& cube, GeluMatch& m) {
  std::optional<size_t> p = index.producer(cube);
  if (!p || index.consumers(cube).size() != 1 || index.is_graph_output(cube)) return false;
  const Node& node = graph.nodes[*p];
  if (node.inputs.size() != 2) return false;
  if (is_onnx_op(node, "Pow") && near(index.scalar(node.inputs[1]), 3.0f)) {
    m.x = node.inputs[0];
    m.nodes.push_back(*p);
    return true;
  }
  if (!is_onnx_op(node, "Mul")) return false;
  for (int i : {0, 1}) {
    std::optional<size_t> square = index.producer(node.inputs[1 - i]);
    if (!square || !index.read_only_by(node.inputs[1 - i], *p)) continue;
    const Node& sq = graph.nodes[*square];
    if (is_onnx_op(sq, "Mul") && sq.inputs.size() == 2 && sq.inputs[0] == node.inputs[i] &&
        sq.inputs[1] == node.inputs[i]) {
      m.x = node.inputs[i];
      m.nodes.insert(m.nodes.end(), {*square, *p});
      return true;
    }
  }
  return false;
}

// Tanh(Mul(sqrt(2/pi), Add(x, Mul(0.044715, x^3)))) -> Add(1) -> tail.
std::optional<GeluMatch> match_tanh_gelu(const Graph& graph, const GraphIndex& index, size_t tanh) {
  const Node& tanh_node = graph.nodes[tanh];
  if (!is_onnx_op(tanh_node, "Tanh") || tanh_node.inputs.size() != 1) return std::nullopt;
  GeluMatch m{.nodes = {tanh}, .last = tanh, .x = {}};
  std::optional<size_t> scale = index.producer(tanh_node.inputs[0]);
  if (!scale || !index.read_only_by(tanh_node.inputs[0], tanh) || !is_onnx_op(graph.nodes[*scale], "Mul")) {
    return std::nullopt;
  }
  std::string inner;
  for (int i : {0, 1}) {
    const Node& s = graph.nodes[*scale];
    if (s.inputs.size() == 2 && near(index.scalar(s.inputs[1 - i]), kSqrtTwoOverPi, 4e-4f)) inner = s.inputs[i];
  }
  std::optional<size_t> sum = index.producer(inner);
  if (inner.empty() || !sum || !index.read_only_by(inner, *scale) || !is_onnx_op(graph.nodes[*sum], "Add")) {
    return std::nullopt;
  }
  m.nodes.insert(m.nodes.end(), {*scale, *sum});
  // Add(x, Mul(0.044715, x^3)): find which operand is the scaled cube.
  const Node& sum_node = graph.nodes[*sum];
  if (sum_node.inputs.size() != 2) return std::nullopt;
  for (int i : {0, 1}) {
    const std::string& scaled = sum_node.inputs[1 - i];
    std::optional<size_t> k = index.producer(scaled);
    if (!k || !index.read_only_by(scaled, *sum) || !is_onnx_op(graph.nodes[*k], "Mul")) continue;
    const Node& kn = graph.nodes[*k];
    for (int j : {0, 1}) {
      if (kn.inputs.size() != 2 || !near(index.scalar(kn.inputs[1 - j]), 0.044715f)) continue;
      GeluMatch attempt = m;
      attempt.nodes.push_back(*k);
      if (match_cube(graph, index, kn.inputs[j], attempt) && attempt.x == sum_node.inputs[i]) {
        std::optional<size_t> add = consumer_with_scalar(graph, index, tanh_node.outputs[0], "Add", 1.0f);
        if (!add) return std::nullopt;
        attempt.nodes.push_back(*add);
        if (!match_tail(graph, index, graph.nodes[*add].outputs[0], attempt)) return std::nullopt;
        return attempt;
      }
    }
  }
  return std::nullopt;
}

// x = Add(X, bias) with bias a float 1-D constant, read only by the GELU's
// nodes: {add node, X, bias}.
struct BiasAdd {
  size_t node;
  std::string input, bias;
};

// BiasGelu/FastGelu need a bias of X's last dimension, which Add would also
// broadcast from [1]-sized X axes. Shapes are unknown at load time, but when X
// comes from a MatMul with a constant [K, N] weight, N must equal `size`.
bool last_dimension_may_be(const Graph& graph, const GraphIndex& index, const std::string& x, int size) {
  std::optional<size_t> p = index.producer(x);
  if (!p || !is_onnx_op(graph.nodes[*p], "MatMul") || graph.nodes[*p].inputs.size() != 2) return true;
  std::optional<mx::array> w = index.constant(graph.nodes[*p].inputs[1]);
  return !w || (w->ndim() >= 2 && w->shape().back() == size);
}

std::optional<BiasAdd> bias_add_before(const Graph& graph, const GraphIndex& index, const GeluMatch& m) {
  if (index.is_graph_output(m.x)) return std::nullopt;
  for (size_t reader : index.consumers(m.x)) {
    if (std::find(m.nodes.begin(), m.nodes.end(), reader) == m.nodes.end()) return std::nullopt;
  }
  std::optional<size_t> add = index.producer(m.x);
  if (!add || !is_onnx_op(graph.nodes[*add], "Add") || graph.nodes[*add].inputs.size() != 2) return std::nullopt;
  for (int i : {0, 1}) {
    const std::string& bias = graph.nodes[*add].inputs[1 - i];
    std::optional<mx::array> value = index.constant(bias);
    const std::string& input = graph.nodes[*add].inputs[i];
    if (value && value->ndim() == 1 && value->shape(0) > 1 && mx::issubdtype(value->dtype(), mx::floating) &&
        !index.constant(input) && last_dimension_may_be(graph, index, input, value->shape(0))) {
      return BiasAdd{*add, input, bias};
    }
  }
  return std::nullopt;
}

Node fused_node(const Node& last, std::string op_type, std::vector<std::string> inputs) {
  Node fused;
  fused.name = str(last.name.empty() ? last.outputs[0] : last.name, "/", op_type);
  fused.op_type = std::move(op_type);
  fused.domain = "com.microsoft";
  fused.opset = 1;
  fused.inputs = std::move(inputs);
  fused.outputs = {last.outputs[0]};
  return fused;
}

}  // namespace

size_t fuse_gelu(Graph& graph) {
  GraphIndex index(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  std::vector<std::pair<size_t, Node>> replacements;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const bool erf = is_onnx_op(graph.nodes[i], "Erf");
    if (!erf && !is_onnx_op(graph.nodes[i], "Tanh")) continue;
    std::optional<GeluMatch> m = erf ? match_erf_gelu(graph, index, i) : match_tanh_gelu(graph, index, i);
    if (!m) continue;
    std::optional<BiasAdd> bias = bias_add_before(graph, index, *m);
    if (bias) m->nodes.push_back(bias->node);
    if (std::any_of(m->nodes.begin(), m->nodes.end(), [&](size_t n) { return removed[n]; })) continue;
    for (size_t n : m->nodes) removed[n] = true;
    const Node& last = graph.nodes[m->last];
    Node fused = erf ? (bias ? fused_node(last, "BiasGelu", {bias->input, bias->bias}) : fused_node(last, "Gelu", {m->x}))
                     : (bias ? fused_node(last, "FastGelu", {bias->input, bias->bias})
                             : fused_node(last, "FastGelu", {m->x}));
    removed[m->last] = false;
    replacements.emplace_back(m->last, std::move(fused));
  }
  if (replacements.empty()) return 0;
  for (auto& [position, node] : replacements) graph.nodes[position] = std::move(node);
  erase_nodes(graph, removed);
  import_domain(graph, "com.microsoft", 1);
  return replacements.size();
}

}  // namespace transmuter
