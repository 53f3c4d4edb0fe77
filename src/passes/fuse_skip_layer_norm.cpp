// Fuses layer and RMS normalization, with the residual Add (and the bias Add
// of the projection) before them, into one node that runs as the one-pass
// kernel of src/kernels/cpu/layer_norm.h. Three steps, in this order:
//
// 1. Decomposed LayerNorm (older exports) -> LayerNormalization(axis -1):
//
//      x --> ReduceMean(-1) --> Sub(x, .) = d --> Pow(2) | Mul(d, d) --> ReduceMean(-1)
//                                           \                                 |
//                                            \                            Add(eps)
//                                             \                               |
//                                              \                            Sqrt
//                                               \                             |
//                                                `-> Div(d, .) | Mul(d, Reciprocal(.)) | Mul(d, Div(1, .))
//                                                               |
//                                                         Mul(gamma) [-> Add(beta)]
//
// 2. Decomposed RMSNorm (Llama-style exports) -> SimplifiedLayerNormalization:
//
//      x --> Pow(2) | Mul(x, x) --> ReduceMean(-1) --> Add(eps) --> Sqrt
//      x --> Div(x, .) | Mul(x, Reciprocal(.)) | Mul(x, Div(1, .)) [--> Cast(float)] --> Mul(gamma)
//
//    (the Cast only when x is itself a Cast to float: transformers' float32 round trip)
//
// 3. The residual before a last-axis normalization:
//
//      P  bias(const [D])
//       \  /
//       Add (optional)   S                        P     S    gamma beta bias
//          \            /                          \    |     |    |    /
//                Add = sum          gamma beta  =>   SkipLayerNormalization
//                 |                   |    |          |                 |
//           LayerNormalization(axis -1)              Y          sum (only when read
//                 |                                                elsewhere: pre-LN)
//                 Y
//
//    and SimplifiedLayerNormalization -> SkipSimplifiedLayerNormalization
//    (input, skip, gamma, bias). Fused nodes are com.microsoft, version 1
//    (src/ops/microsoft/normalization.cpp).
//
// Matches only when the intermediate values are read by the next node of the
// pattern alone (the sum Add's result may be read elsewhere: it becomes output
// 3), the reductions are over axes [-1] with keepdims, epsilon is a scalar
// constant, gamma/beta/bias are float 1-D constants of one size (so they are
// the hidden size D), and the normalization requests no statistics outputs.
#include <algorithm>
#include <optional>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

constexpr const char* kMicrosoftDomain = "com.microsoft";

// A float 1-D constant of `size` elements (any size when size < 0).
std::optional<int> vector_constant(const GraphIndex& index, const std::string& name, int size = -1) {
  std::optional<mx::array> c = index.constant(name);
  if (!c || c->ndim() != 1 || !mx::issubdtype(c->dtype(), mx::floating)) return std::nullopt;
  if (size >= 0 && c->shape(0) != size) return std::nullopt;
  return c->shape(0);
}

// The value an Identity chain passes on: PyTorch's exporter shares equal weights (freshly initialized
// norms are all ones) through Identity nodes of one initializer.
std::string through_identity(const Graph& graph, const GraphIndex& index, std::string name) {
  for (std::optional<size_t> p = index.producer(name); p && is_onnx_op(graph.nodes[*p], "Identity");
       p = index.producer(name)) {
    name = graph.nodes[*p].inputs.at(0);
  }
  return name;
}

// ReduceMean over axes [-1] with keepdims, reading `input` (axes as attribute
// before opset 18, as a constant input from 18).
bool is_last_axis_mean(const Node& node, const GraphIndex& index, const std::string& input) {
  if (!is_onnx_op(node, "ReduceMean") || node.inputs.empty() || node.inputs[0] != input) return false;
  if (int_attribute_or(node, "keepdims", 1) != 1) return false;
  std::vector<int64_t> axes;
  if (node.opset < 18) {
    const Attribute* a = node.find_attribute("axes");
    if (a != nullptr && a->type == AttrType::kInts) axes = a->ints;
  } else if (node.inputs.size() > 1 && !node.inputs[1].empty()) {
    std::optional<mx::array> c = index.constant(node.inputs[1]);
    if (!c || c->size() != 1 || !mx::issubdtype(c->dtype(), mx::integer)) return false;
    axes = {mx::astype(*c, mx::int64, mx::Device::cpu).item<int64_t>()};
  }
  return axes == std::vector<int64_t>{-1};
}

// Square of `value`: Pow(value, 2) or Mul(value, value).
bool is_square_of(const Node& node, const GraphIndex& index, const std::string& value) {
  if (node.inputs.size() != 2 || node.inputs[0] != value) return false;
  if (is_onnx_op(node, "Pow")) return near(index.scalar(node.inputs[1]), 2.0f);
  return is_onnx_op(node, "Mul") && node.inputs[1] == value;
}

struct Chain {
  std::vector<size_t> nodes;
  size_t last = 0;
  float epsilon = 0;
};

// From the mean of squares `mean_square` (read once): Add(eps) -> Sqrt ->
// divide `numerator` by it (three spellings). Appends the nodes to `chain`;
// the node producing the quotient is chain.last.
bool match_divide_by_root(const Graph& graph, const GraphIndex& index, const std::string& mean_square,
                          const std::string& numerator, Chain& chain) {
  std::optional<size_t> add = sole_consumer(index, mean_square);
  if (!add || !is_onnx_op(graph.nodes[*add], "Add")) return false;
  std::optional<std::string> eps = other_input(graph.nodes[*add], mean_square);
  std::optional<float> epsilon = eps ? index.scalar(*eps) : std::nullopt;
  if (!epsilon || *epsilon < 0) return false;
  std::optional<size_t> root = sole_consumer(index, graph.nodes[*add].outputs[0]);
  if (!root || !is_onnx_op(graph.nodes[*root], "Sqrt")) return false;
  const std::string& sd = graph.nodes[*root].outputs[0];
  std::optional<size_t> next = sole_consumer(index, sd);
  if (!next) return false;
  const Node& n = graph.nodes[*next];
  chain.epsilon = *epsilon;
  chain.nodes.insert(chain.nodes.end(), {*add, *root});
  if (is_onnx_op(n, "Div") && n.inputs.size() == 2 && n.inputs[0] == numerator && n.inputs[1] == sd) {
    chain.nodes.push_back(*next);
    chain.last = *next;
    return true;
  }
  // Reciprocal(sd) or Div(1, sd), then Mul(numerator, .)
  const bool reciprocal =
      is_onnx_op(n, "Reciprocal") || (is_onnx_op(n, "Div") && n.inputs.size() == 2 && n.inputs[1] == sd &&
                                      near(index.scalar(n.inputs[0]), 1.0f));
  if (!reciprocal) return false;
  std::optional<size_t> mul = sole_consumer(index, n.outputs[0]);
  if (!mul || !is_onnx_op(graph.nodes[*mul], "Mul") ||
      other_input(graph.nodes[*mul], n.outputs[0]) != numerator) {
    return false;
  }
  chain.nodes.insert(chain.nodes.end(), {*next, *mul});
  chain.last = *mul;
  return true;
}

// After the normalized value: Mul(gamma) [-> Add(beta) when `with_beta`].
// Returns {gamma, beta} names; appends nodes and moves chain.last.
std::optional<std::pair<std::string, std::string>> match_affine(const Graph& graph, const GraphIndex& index,
                                                                Chain& chain, bool with_beta) {
  const std::string& normalized = graph.nodes[chain.last].outputs[0];
  std::optional<size_t> mul = sole_consumer(index, normalized);
  if (!mul || !is_onnx_op(graph.nodes[*mul], "Mul")) return std::nullopt;
  std::optional<std::string> gamma = other_input(graph.nodes[*mul], normalized);
  if (!gamma) return std::nullopt;
  std::optional<int> d = vector_constant(index, through_identity(graph, index, *gamma));
  if (!d) return std::nullopt;
  chain.nodes.push_back(*mul);
  chain.last = *mul;
  std::string beta;
  if (!with_beta) return std::make_pair(*gamma, beta);
  std::optional<size_t> add = sole_consumer(index, graph.nodes[*mul].outputs[0]);
  if (add && is_onnx_op(graph.nodes[*add], "Add")) {
    std::optional<std::string> b = other_input(graph.nodes[*add], graph.nodes[*mul].outputs[0]);
    if (b && vector_constant(index, *b, *d)) {
      beta = *b;
      chain.nodes.push_back(*add);
      chain.last = *add;
    }
  }
  return std::make_pair(*gamma, beta);
}

Node new_node(const Node& last, const std::string& op_type, const std::string& domain, int opset,
              std::vector<std::string> inputs, std::vector<std::string> outputs) {
  Node n;
  n.name = str(last.name.empty() ? last.outputs[0] : last.name, "/", op_type);
  n.op_type = op_type;
  n.domain = domain;
  n.opset = opset;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

// Applies the matches: each node of a match is removed except `last`, which
// becomes the fused node. Overlapping matches after the first are dropped.
class Rewrites {
 public:
  explicit Rewrites(const Graph& graph) : removed_(graph.nodes.size(), false) {}
  bool add(const std::vector<size_t>& nodes, size_t last, Node fused) {
    if (std::any_of(nodes.begin(), nodes.end(), [&](size_t n) { return removed_[n]; })) return false;
    for (size_t n : nodes) removed_[n] = true;
    removed_[last] = false;
    replacements_.emplace_back(last, std::move(fused));
    return true;
  }
  size_t apply(Graph& graph) {
    if (replacements_.empty()) return 0;
    for (auto& [position, node] : replacements_) graph.nodes[position] = std::move(node);
    erase_nodes(graph, removed_);
    return replacements_.size();
  }

 private:
  std::vector<bool> removed_;
  std::vector<std::pair<size_t, Node>> replacements_;
};

size_t fuse_decomposed_layer_norm(Graph& graph) {
  GraphIndex index(graph);
  Rewrites rewrites(graph);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& mean = graph.nodes[i];
    if (mean.inputs.empty() || !is_last_axis_mean(mean, index, mean.inputs[0])) continue;
    const std::string& x = mean.inputs[0];
    std::optional<size_t> sub = sole_consumer(index, mean.outputs[0]);
    if (!sub || !is_onnx_op(graph.nodes[*sub], "Sub") || graph.nodes[*sub].inputs.size() != 2 ||
        graph.nodes[*sub].inputs[0] != x || graph.nodes[*sub].inputs[1] != mean.outputs[0]) {
      continue;
    }
    const std::string& d = graph.nodes[*sub].outputs[0];
    const std::vector<size_t>& d_readers = index.consumers(d);
    if (d_readers.size() != 2 || index.is_graph_output(d)) continue;
    Chain chain{.nodes = {i, *sub}};
    bool matched = false;
    for (size_t square : d_readers) {
      if (!is_square_of(graph.nodes[square], index, d)) continue;
      std::optional<size_t> variance = sole_consumer(index, graph.nodes[square].outputs[0]);
      if (!variance || !is_last_axis_mean(graph.nodes[*variance], index, graph.nodes[square].outputs[0]))
        continue;
      chain.nodes.insert(chain.nodes.end(), {square, *variance});
      matched = match_divide_by_root(graph, index, graph.nodes[*variance].outputs[0], d, chain);
      break;
    }
    if (!matched) continue;
    auto affine = match_affine(graph, index, chain, true);
    if (!affine) continue;
    const Node& last = graph.nodes[chain.last];
    std::vector<std::string> inputs = {x, affine->first};
    if (!affine->second.empty()) inputs.push_back(affine->second);
    // LayerNormalization exists from opset 17; the node asks for it whatever
    // the model imports (the op's semantics are those of the subgraph).
    Node fused =
        new_node(last, "LayerNormalization", "", std::max(mean.opset, 17), inputs, {last.outputs[0]});
    fused.attributes = {int_attribute("axis", -1), float_attribute("epsilon", chain.epsilon)};
    rewrites.add(chain.nodes, chain.last, std::move(fused));
  }
  return rewrites.apply(graph);
}

bool is_float_cast(const Node& node) {
  return is_onnx_op(node, "Cast") && int_attribute_or(node, "to", 0) == 1;
}

// transformers' LlamaRMSNorm casts around the normalization (hidden.to(float32) ... .to(input_dtype)), so
// its float32 exports carry Cast(to float) before the weight's Mul. When x itself is the output of a Cast
// to float, that second Cast changes nothing and the chain takes it in.
void take_identity_cast(const Graph& graph, const GraphIndex& index, const std::string& x, Chain& chain) {
  std::optional<size_t> producer = index.producer(x);
  if (!producer || !is_float_cast(graph.nodes[*producer])) return;
  std::optional<size_t> cast = sole_consumer(index, graph.nodes[chain.last].outputs[0]);
  if (!cast || !is_float_cast(graph.nodes[*cast])) return;
  chain.nodes.push_back(*cast);
  chain.last = *cast;
}

size_t fuse_decomposed_rms_norm(Graph& graph) {
  GraphIndex index(graph);
  Rewrites rewrites(graph);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& square = graph.nodes[i];
    if (square.inputs.empty() || !is_square_of(square, index, square.inputs[0])) continue;
    const std::string& x = square.inputs[0];
    std::optional<size_t> mean = sole_consumer(index, square.outputs[0]);
    if (!mean || !is_last_axis_mean(graph.nodes[*mean], index, square.outputs[0])) continue;
    Chain chain{.nodes = {i, *mean}};
    if (!match_divide_by_root(graph, index, graph.nodes[*mean].outputs[0], x, chain)) continue;
    take_identity_cast(graph, index, x, chain);
    auto affine = match_affine(graph, index, chain, false);
    if (!affine) continue;
    const Node& last = graph.nodes[chain.last];
    Node fused = new_node(last, "SimplifiedLayerNormalization", kMicrosoftDomain, 1, {x, affine->first},
                          {last.outputs[0]});
    fused.attributes = {int_attribute("axis", -1), float_attribute("epsilon", chain.epsilon)};
    rewrites.add(chain.nodes, chain.last, std::move(fused));
  }
  return rewrites.apply(graph);
}

// The last-axis normalizations step 3 takes: {is RMS, gamma, beta ("" none)}.
struct Normalization {
  bool rms;
  std::string gamma, beta;
};

std::optional<Normalization> last_axis_normalization(const Node& node, const GraphIndex& index) {
  const bool layer = is_onnx_op(node, "LayerNormalization");
  const bool rms = node.op_type == "SimplifiedLayerNormalization" && node.domain == kMicrosoftDomain;
  if ((!layer && !rms) || node.inputs.size() < 2 || int_attribute_or(node, "axis", -1) != -1)
    return std::nullopt;
  for (size_t o = 1; o < node.outputs.size(); ++o) {
    if (!node.outputs[o].empty()) return std::nullopt;  // statistics requested
  }
  std::optional<int> d = vector_constant(index, node.inputs[1]);
  if (!d || *d < 1) return std::nullopt;
  Normalization n{rms, node.inputs[1], ""};
  if (layer && node.inputs.size() > 2 && !node.inputs[2].empty()) {
    if (!vector_constant(index, node.inputs[2], *d)) return std::nullopt;
    n.beta = node.inputs[2];
  }
  return n;
}

size_t fuse_residual_into_norm(Graph& graph) {
  GraphIndex index(graph);
  Rewrites rewrites(graph);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& norm = graph.nodes[i];
    std::optional<Normalization> n = last_axis_normalization(norm, index);
    if (!n) continue;
    const std::string& sum = norm.inputs[0];
    std::optional<size_t> add = index.producer(sum);
    if (!add || !is_onnx_op(graph.nodes[*add], "Add") || graph.nodes[*add].inputs.size() != 2) continue;
    const Node& add_node = graph.nodes[*add];
    if (index.constant(add_node.inputs[0]) || index.constant(add_node.inputs[1]))
      continue;  // a bias, not a residual
    const int d = *vector_constant(index, n->gamma);
    std::string input = add_node.inputs[0], skip = add_node.inputs[1], bias;
    std::vector<size_t> nodes = {*add, i};
    // A projection's bias Add on either operand folds in.
    for (int k : {0, 1}) {
      const std::string& operand = add_node.inputs[k];
      std::optional<size_t> p = index.producer(operand);
      if (!p || !index.read_only_by(operand, *add) || !is_onnx_op(graph.nodes[*p], "Add")) continue;
      const Node& bias_add = graph.nodes[*p];
      if (bias_add.inputs.size() != 2) continue;
      for (int j : {0, 1}) {
        if (vector_constant(index, bias_add.inputs[1 - j], d) && !index.constant(bias_add.inputs[j])) {
          input = bias_add.inputs[j];
          bias = bias_add.inputs[1 - j];
          skip = add_node.inputs[1 - k];
          nodes.push_back(*p);
          break;
        }
      }
      if (!bias.empty()) break;
    }
    // The sum stays visible when read elsewhere (pre-LN blocks) or a graph output.
    const bool sum_read_elsewhere = !index.read_only_by(sum, i);
    // The fused node sits where the normalization was: the sum's other readers
    // must come after it (nodes stay in topological order).
    const std::vector<size_t>& sum_readers = index.consumers(sum);
    if (std::any_of(sum_readers.begin(), sum_readers.end(), [&](size_t r) { return r < i; })) continue;
    std::vector<std::string> outputs = {norm.outputs[0], "", "", sum_read_elsewhere ? sum : ""};
    if (!sum_read_elsewhere) outputs.resize(1);
    Node fused;
    if (n->rms) {
      fused = new_node(norm, "SkipSimplifiedLayerNormalization", kMicrosoftDomain, 1,
                       {input, skip, n->gamma, bias}, outputs);
    } else {
      fused = new_node(norm, "SkipLayerNormalization", kMicrosoftDomain, 1,
                       {input, skip, n->gamma, n->beta, bias}, outputs);
    }
    while (!fused.inputs.empty() && fused.inputs.back().empty()) fused.inputs.pop_back();
    const Attribute* eps = norm.find_attribute("epsilon");
    fused.attributes = {
        float_attribute("epsilon", eps != nullptr && eps->type == AttrType::kFloat ? eps->f : 1e-5f)};
    rewrites.add(nodes, i, std::move(fused));
  }
  return rewrites.apply(graph);
}

}  // namespace

size_t fuse_skip_layer_norm(Graph& graph) {
  size_t rewrites = fuse_decomposed_layer_norm(graph) + fuse_decomposed_rms_norm(graph);
  rewrites += fuse_residual_into_norm(graph);
  if (rewrites > 0) import_domain(graph, kMicrosoftDomain, 1);
  return rewrites;
}

}  // namespace transmuter
