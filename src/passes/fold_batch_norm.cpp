// Folds an inference-mode BatchNormalization into the Conv that feeds it.
//
//      X    W   [B]                                X    W'   B'
//       \   |   /                                   \   |   /
//         Conv                                        Conv
//          |    scale  beta  mean  var       =>         |
//          |      |     |     |     |                   Y
//       BatchNormalization(epsilon)
//          |
//          Y
//
//   s  = scale / sqrt(var + epsilon)        (per output channel m)
//   W' = W * s[m]                           (W: [M, C/group, k1, k2, ...])
//   B' = (B - mean) * s + beta              (B = 0 when the Conv has none)
//
// Matches only when W, B, scale, beta, mean and var are float initializers of
// the shapes above, the Conv's output is read by this BatchNormalization alone
// and is not a graph output, and the BatchNormalization computes one output in
// inference mode (training_mode 0; spatial 1 before opset 9). The folded
// weights are new initializers, so a W shared with another node stays intact.
#include <mlx/mlx.h>

#include <unordered_map>

#include "graph/subgraphs.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

namespace mx = mlx::core;

bool is_inference_batch_norm(const Node& node) {
  if (node.op_type != "BatchNormalization" || !node.domain.empty() || node.inputs.size() != 5) return false;
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    if (!node.outputs[i].empty()) return false;  // running statistics requested
  }
  return int_attribute_or(node, "training_mode", 0) == 0 && int_attribute_or(node, "spatial", 1) == 1;
}

const mx::array* float_initializer(const Graph& graph, const std::string& name) {
  auto it = graph.initializers.find(name);
  if (it == graph.initializers.end() || !it->second.is_tensor()) return nullptr;
  const mx::array& a = it->second.tensor();
  return mx::issubdtype(a.dtype(), mx::floating) ? &a : nullptr;
}

// How many times each value is read (by nodes, their subgraphs, graph outputs).
std::unordered_map<std::string, int> read_counts(const Graph& graph) {
  std::unordered_map<std::string, int> counts;
  for (const Node& node : graph.nodes) {
    for (const std::string& name : node_reads(node)) counts[name]++;
  }
  for (const ValueInfo& output : graph.outputs) counts[output.name]++;
  return counts;
}

// Folds `bn` into `conv` when the pattern holds; returns false otherwise.
bool try_fold(Graph& graph, Node& conv, const Node& bn) {
  if (conv.inputs.size() < 2) return false;
  const mx::array* w = float_initializer(graph, conv.inputs[1]);
  const mx::array* scale = float_initializer(graph, bn.inputs[1]);
  const mx::array* beta = float_initializer(graph, bn.inputs[2]);
  const mx::array* mean = float_initializer(graph, bn.inputs[3]);
  const mx::array* var = float_initializer(graph, bn.inputs[4]);
  if (!w || !scale || !beta || !mean || !var || w->ndim() < 3) return false;
  const int channels = w->shape(0);
  for (const mx::array* p : {scale, beta, mean, var}) {
    if (p->ndim() != 1 || p->shape(0) != channels) return false;
  }
  std::optional<mx::array> bias;
  if (conv.inputs.size() > 2 && !conv.inputs[2].empty()) {
    const mx::array* b = float_initializer(graph, conv.inputs[2]);
    if (b == nullptr || b->ndim() != 1 || b->shape(0) != channels) return false;
    bias = *b;
  }

  // Computed in float32 on the CPU (float64 stays float64), stored in W's dtype.
  const mx::Device cpu = mx::Device::cpu;
  const mx::Dtype compute = w->dtype() == mx::float64 ? mx::float64 : mx::float32;
  auto f = [&](const mx::array& a) { return mx::astype(a, compute, cpu); };
  const float epsilon = float_attribute_or(bn, "epsilon", 1e-5f);
  mx::array s = mx::divide(f(*scale), mx::sqrt(mx::add(f(*var), mx::array(epsilon, compute), cpu), cpu), cpu);
  mx::Shape per_channel(w->ndim(), 1);
  per_channel[0] = channels;
  mx::array folded_w = mx::astype(mx::multiply(f(*w), mx::reshape(s, per_channel, cpu), cpu), w->dtype(), cpu);
  mx::array b0 = bias ? f(*bias) : mx::zeros({channels}, compute, cpu);
  mx::array folded_b = mx::astype(mx::add(mx::multiply(mx::subtract(b0, f(*mean), cpu), s, cpu), f(*beta), cpu),
                                  w->dtype(), cpu);
  mx::eval(folded_w, folded_b);

  const std::string base = conv.name.empty() ? bn.outputs[0] : conv.name;
  std::string w_name = fresh_initializer_name(graph, base + "/bn_folded_weight");
  graph.initializers[w_name] = folded_w;
  std::string b_name = fresh_initializer_name(graph, base + "/bn_folded_bias");
  graph.initializers[b_name] = folded_b;
  conv.inputs.resize(3);
  conv.inputs[1] = w_name;
  conv.inputs[2] = b_name;
  conv.outputs = {bn.outputs[0]};
  return true;
}

}  // namespace

size_t fold_batch_norm_into_conv(Graph& graph) {
  std::unordered_map<std::string, int> reads = read_counts(graph);
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (const std::string& name : graph.nodes[i].outputs) producer[name] = i;
  }
  std::vector<bool> removed(graph.nodes.size(), false);
  size_t folds = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& bn = graph.nodes[i];
    if (!is_inference_batch_norm(bn)) continue;
    auto p = producer.find(bn.inputs[0]);
    if (p == producer.end()) continue;
    Node& conv = graph.nodes[p->second];
    if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1) continue;
    if (reads[conv.outputs[0]] != 1) continue;  // also read elsewhere, or a graph output
    if (try_fold(graph, conv, bn)) {
      removed[i] = true;
      ++folds;
    }
  }
  size_t index = 0;
  std::erase_if(graph.nodes, [&](const Node&) { return removed[index++]; });
  return folds;
}

}  // namespace transmuter
