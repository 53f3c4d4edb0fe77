// Packs the constant weight of each float32 MatMul/Gemm once, at load, into
// the panel layout of the CPU GEMM kernel (src/kernels/cpu/gemm.h), and takes
// the bias and the GELU that follow into the kernel's epilogue.
//
//      X    W (float32 [K, N])                        X    W' (packed)   [bias]
//       \   /                                          \      |       /
//       MatMul                                      ai.transmuter PackedMatMul
//         |     bias (float32 [N])                     (n = N, activation)
//         |    /                                          |
//        Add          (optional)           =>             Y
//         |
//     Gelu | FastGelu | BiasGelu(., bias)   (optional: the com.microsoft nodes
//         |                                  of fuse_gelu, or ONNX Gelu)
//         Y
//
//   Without a GELU, a Mul by a constant [N] (layer scale) after the bias is
//   folded into W' and the bias, and an Add of a computed value Z (the
//   block's shortcut) becomes the residual input: PackedMatMul(X, W', b', Z).
//
//      Gemm(A, B, [C]) with alpha 1, beta 1, transA 0, B float32 2-D
//      (transB picks its layout), C absent or float32 [N] / [1, N]
//                                          =>  PackedMatMul(A, B', [C as [N]])
//
// Every intermediate value must be read by the next node of the pattern alone
// and be no graph output. A weight read by several products is packed once;
// the file's weight is dropped when nothing else reads it, so params() then
// holds the packed tensor under a new name (LoadOptions::run_passes says so).
//
// The pass runs only when the default device at load is the CPU: the packed
// layout is this CPU's (its SIMD width), and on a GPU stream the node would
// unpack the weight on every call.
#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "kernels/cpu/gemm.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";
constexpr const char* kMicrosoft = "com.microsoft";

struct ProductMatch {
  size_t product = 0;                // the MatMul or Gemm node
  std::vector<size_t> swallowed;     // the bias Add and the activation, when fused
  size_t last = 0;                     // the node whose outputs the fused node takes over
  std::string a, weight;             // inputs of the product
  bool transposed = false;           // weight stored [N, K] (Gemm transB)
  int64_t n = 0;
  std::optional<std::string> bias;   // a float32 [N] initializer
  std::optional<mx::array> bias_reshaped;  // Gemm's [1, N] C, flattened
  std::string activation;            // "", "gelu", "gelu_tanh"
  std::optional<mx::array> column_scale;  // a Mul by a constant [N] after the bias (layer scale), folded in
  std::optional<std::string> residual;    // an Add of a computed value last (no activation)
};

const mx::array* float32_initializer(const Graph& graph, const std::string& name) {
  auto it = graph.initializers.find(name);
  if (it == graph.initializers.end() || !it->second.is_tensor()) return nullptr;
  const mx::array& a = it->second.tensor();
  return a.dtype() == mx::float32 ? &a : nullptr;
}

bool is_bias_of(const Graph& graph, const std::string& name, int64_t n) {
  const mx::array* b = float32_initializer(graph, name);
  return b != nullptr && b->ndim() == 1 && b->shape(0) == n;
}

bool is_microsoft_op(const Node& node, std::string_view op_type) {
  return node.domain == kMicrosoft && node.op_type == op_type;
}

ProductMatch new_match(size_t i, const Node& product, bool transposed, int64_t n) {
  ProductMatch m;
  m.product = m.last = i;
  m.a = product.inputs[0];
  m.weight = product.inputs[1];
  m.transposed = transposed;
  m.n = n;
  return m;
}

// MatMul(X, W) with W a float32 [K, N] initializer.
std::optional<ProductMatch> match_matmul(const Graph& graph, size_t i) {
  const Node& node = graph.nodes[i];
  if (!is_onnx_op(node, "MatMul") || node.inputs.size() != 2 || node.outputs.size() != 1) return std::nullopt;
  const mx::array* w = float32_initializer(graph, node.inputs[1]);
  if (w == nullptr || w->ndim() != 2 || w->size() == 0) return std::nullopt;
  return new_match(i, node, false, w->shape(1));
}

// Gemm(A, B, [C]) computing A @ op(B) + C exactly (alpha = beta = 1, no transA).
std::optional<ProductMatch> match_gemm(const Graph& graph, size_t i) {
  const Node& node = graph.nodes[i];
  if (!is_onnx_op(node, "Gemm") || node.inputs.size() < 2 || node.outputs.size() != 1) return std::nullopt;
  if (int_attribute_or(node, "transA", 0) != 0 || float_attribute_or(node, "alpha", 1.0f) != 1.0f ||
      float_attribute_or(node, "beta", 1.0f) != 1.0f) {
    return std::nullopt;
  }
  const mx::array* w = float32_initializer(graph, node.inputs[1]);
  if (w == nullptr || w->ndim() != 2 || w->size() == 0) return std::nullopt;
  const bool transposed = int_attribute_or(node, "transB", 0) != 0;
  ProductMatch m = new_match(i, node, transposed, transposed ? w->shape(0) : w->shape(1));
  if (node.inputs.size() > 2 && !node.inputs[2].empty()) {
    const mx::array* c = float32_initializer(graph, node.inputs[2]);
    if (c == nullptr) return std::nullopt;
    if (c->ndim() == 1 && c->shape(0) == m.n) {
      m.bias = node.inputs[2];
    } else if (c->ndim() == 2 && c->shape(0) == 1 && c->shape(1) == m.n) {
      m.bias = node.inputs[2];
      m.bias_reshaped = mx::reshape(*c, {static_cast<int>(m.n)});
      m.bias_reshaped->eval();
    } else {
      return std::nullopt;  // a per-row C is no epilogue
    }
  }
  return m;
}

// The GELU node reading `value` alone, with the bias it adds (BiasGelu, FastGelu).
bool take_activation(const Graph& graph, const GraphIndex& index, const std::string& value, ProductMatch& m) {
  std::optional<size_t> reader = sole_consumer(index, value);
  if (!reader) return false;
  const Node& node = graph.nodes[*reader];
  if (node.outputs.size() != 1 || node.inputs.empty() || node.inputs[0] != value) return false;
  std::optional<std::string> bias;
  if (node.inputs.size() == 2 && !node.inputs[1].empty()) bias = node.inputs[1];
  if (node.inputs.size() > 2 || (bias && (m.bias || !is_bias_of(graph, *bias, m.n)))) return false;
  std::string activation;
  if (is_microsoft_op(node, "BiasGelu") && bias) {
    activation = "gelu";
  } else if (is_microsoft_op(node, "Gelu") && !bias) {
    activation = "gelu";
  } else if (is_microsoft_op(node, "FastGelu")) {
    activation = "gelu_tanh";
  } else if (is_onnx_op(node, "Gelu") && !bias) {
    const Attribute* approximate = node.find_attribute("approximate");
    activation = approximate == nullptr || approximate->s == "none" ? "gelu" : "gelu_tanh";
    if (approximate != nullptr && approximate->s != "none" && approximate->s != "tanh") return false;
  } else {
    return false;
  }
  if (bias) m.bias = bias;
  m.activation = activation;
  m.swallowed.push_back(*reader);
  m.last = *reader;
  return true;
}

// A float32 constant [n]. (Not [1, n]: broadcasting it could raise the
// rank of a 1-D product's output, which the folded product would not.)
std::optional<mx::array> column_vector(const GraphIndex& index, const std::string& name, int64_t n) {
  std::optional<mx::array> c = index.constant(name);
  if (!c || c->dtype() != mx::float32 || c->ndim() != 1 || c->shape(0) != n) return std::nullopt;
  return c;
}

// Extends a match without activation by a Mul with a constant [N] (ConvNeXt's
// and CaiT's layer scale: folded into the packed weight and the bias) and an
// Add of a computed value after it (the block's shortcut: the epilogue's
// residual). Not an Add an earlier match already took as its residual: in a
// parallel block (GPT-J, Phi, Falcon: x + attn(x) + mlp(x)) the attention's and
// the MLP's products both feed one Add, which only one of them can end in.
void take_scale_and_residual(const Graph& graph, const GraphIndex& index, std::string value, ProductMatch& m,
                             const std::vector<bool>& claimed) {
  std::optional<size_t> reader = sole_consumer(index, value);
  if (reader && is_onnx_op(graph.nodes[*reader], "Mul") && graph.nodes[*reader].outputs.size() == 1) {
    std::optional<std::string> other = other_input(graph.nodes[*reader], value);
    if (other && *other != value) {
      if (std::optional<mx::array> scale = column_vector(index, *other, m.n)) {
        m.column_scale = scale;
        m.swallowed.push_back(*reader);
        m.last = *reader;
        value = graph.nodes[*reader].outputs[0];
        reader = sole_consumer(index, value);
      }
    }
  }
  if (reader && !claimed[*reader] && is_onnx_op(graph.nodes[*reader], "Add") &&
      graph.nodes[*reader].outputs.size() == 1) {
    std::optional<std::string> other = other_input(graph.nodes[*reader], value);
    if (other && *other != value && !index.constant(*other) && *other != m.a) {
      m.residual = *other;
      m.swallowed.push_back(*reader);
      m.last = *reader;
    }
  }
}

// Extends a MatMul match by the bias Add and the GELU after it, when present.
// `claimed`: the nodes earlier matches swallowed.
void take_epilogue(const Graph& graph, const GraphIndex& index, ProductMatch& m,
                   const std::vector<bool>& claimed) {
  std::string value = graph.nodes[m.product].outputs[0];
  if (!m.bias) {
    std::optional<size_t> reader = sole_consumer(index, value);
    if (reader && is_onnx_op(graph.nodes[*reader], "Add") && graph.nodes[*reader].outputs.size() == 1) {
      std::optional<std::string> other = other_input(graph.nodes[*reader], value);
      if (other && is_bias_of(graph, *other, m.n)) {
        m.bias = *other;
        m.swallowed.push_back(*reader);
        m.last = *reader;
        value = graph.nodes[*reader].outputs[0];
      }
    }
  }
  if (take_activation(graph, index, value, m)) return;
  take_scale_and_residual(graph, index, value, m, claimed);
}

Node packed_node(const ProductMatch& m, const Node& product, const Node& last, const std::string& packed,
                 const std::optional<std::string>& bias) {
  Node fused;
  fused.op_type = "PackedMatMul";
  fused.domain = kDomain;
  fused.opset = 1;
  fused.name = (product.name.empty() ? last.outputs[0] : product.name) + "/packed";
  fused.inputs = {m.a, packed};
  if (bias || m.residual) fused.inputs.push_back(bias.value_or(""));
  if (m.residual) fused.inputs.push_back(*m.residual);
  fused.outputs = last.outputs;
  fused.attributes.push_back(int_attribute("n", m.n));
  if (!m.activation.empty()) fused.attributes.push_back(string_attribute("activation", m.activation));
  return fused;
}

// True when the products of `matches` are the only readers of `weight`, and
// read it only as their packed operand (not also as A or as the bias, e.g.
// MatMul(W, W)): then nothing reads it once they are rewritten.
bool only_packed_reads(const GraphIndex& index, const std::vector<ProductMatch>& matches, const std::string& weight) {
  size_t products = 0;
  for (const ProductMatch& m : matches) {
    if (m.weight != weight) continue;
    if (m.a == weight || m.bias == weight) return false;
    ++products;
  }
  return index.consumers(weight).size() == products && !index.is_graph_output(weight);
}

}  // namespace

size_t pack_matmul_weights(Graph& graph) {
  if (mx::default_device() != mx::Device::cpu) return 0;
  const GraphIndex index(graph);
  std::vector<ProductMatch> matches;
  std::vector<bool> claimed(graph.nodes.size(), false);  // swallowed by a match so far
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    std::optional<ProductMatch> m = match_matmul(graph, i);
    if (m) {
      take_epilogue(graph, index, *m, claimed);
    } else if ((m = match_gemm(graph, i))) {
      take_activation(graph, index, graph.nodes[i].outputs[0], *m);
    }
    if (!m) continue;
    for (size_t s : m->swallowed) claimed[s] = true;
    matches.push_back(std::move(*m));
  }
  // (weight, transposed) -> its packed initializer
  std::map<std::pair<std::string, bool>, std::string> packed_names;
  // Products left to rewrite per weight that nothing else reads: when the
  // last one is done the stored weight goes at once, so that the peak memory
  // holds one layer's weight twice, not the whole model's.
  std::map<std::string, size_t> pending;
  for (const ProductMatch& m : matches) pending[m.weight]++;
  std::vector<bool> removed(graph.nodes.size(), false);
  for (const ProductMatch& m : matches) {
    std::string scaled_packed;  // a product with a layer scale has a packed weight of its own
    std::string& packed = m.column_scale ? scaled_packed : packed_names[{m.weight, m.transposed}];
    if (packed.empty()) {
      packed = fresh_initializer_name(graph, m.weight + "/packed");
      mx::array w = graph.initializers.at(m.weight).tensor();
      if (m.column_scale) {
        w = mx::multiply(w, m.transposed ? mx::reshape(*m.column_scale, {-1, 1}) : *m.column_scale);
      }
      graph.initializers[packed] = Value(kernels::pack_gemm_rhs(w, m.transposed));
    }
    if (--pending[m.weight] == 0 && only_packed_reads(index, matches, m.weight)) drop_weight(graph, m.weight);
    std::optional<std::string> bias = m.bias;
    if (m.bias_reshaped) {
      bias = fresh_initializer_name(graph, *m.bias + "/row");
      graph.initializers[*bias] = Value(*m.bias_reshaped);
    }
    if (bias && m.column_scale) {
      mx::array scaled = mx::multiply(graph.initializers.at(*bias).tensor(), *m.column_scale);
      scaled.eval();
      bias = fresh_initializer_name(graph, *bias + "/scaled");
      graph.initializers[*bias] = Value(scaled);
    }
    Node fused = packed_node(m, graph.nodes[m.product], graph.nodes[m.last], packed, bias);
    for (size_t s : m.swallowed) removed[s] = true;
    removed[m.product] = true;
    removed[m.last] = false;
    graph.nodes[m.last] = std::move(fused);
  }
  if (!matches.empty()) {
    erase_nodes(graph, removed);
    import_domain(graph, kDomain, 1);
  }
  return matches.size();
}

}  // namespace transmuter
