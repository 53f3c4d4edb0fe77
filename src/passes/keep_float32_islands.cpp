// Computes in float32 the parts of a float16/bfloat16 graph that float16 would
// overflow, for graphs that run in their own types (LoadOptions::compute_type
// resolving to the model's types; compute_in_float32 is the other case).
//
// A normalization written out as ops squares its input before averaging:
// with |x| > 256 the square overflows float16 (65504) and the norm is inf.
//
//   x: float16                                    x: float16
//     |                                             |
//   Pow(x, 2) | Mul(x, x)                         Cast(to=FLOAT)
//     |                                             |
//   ReduceMean | ReduceSum                        Pow | Mul ... Sqrt      (float32, eps a float32 copy)
//     |                                   =>        |
//   [Add(., eps)]                                 Cast(to=x's type)
//     |                                             |
//   Sqrt | Pow(., e)  [-> Reciprocal]               r
//     |
//     r
//
// (both LayerNorm, where x is Sub(X, mean), and RMSNorm decompositions), and
//
//   x: float16 -> LpNormalization -> y   =>   x -> Cast(to=FLOAT) -> LpNormalization -> Cast(to=x's type) ->
//   y
//
// Each intermediate value must be read by the next node alone; eps must be a
// constant. The ops that fuse_skip_layer_norm and exporters produce already
// compute half precision in float32 internally and are left alone:
// LayerNormalization and GroupNormalization (stash_type 1), RMSNormalization,
// Softmax (MLX's precise softmax), com.microsoft (Skip)(Simplified)
// LayerNormalization, ReduceL2/ReduceLogSumExp. Element types come from
// known_element_types (compute_in_float32.cpp).
#include <mlx/mlx.h>

#include <algorithm>
#include <unordered_map>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

namespace mx = mlx::core;

bool is_half(OnnxType t) { return t == OnnxType::kFloat16 || t == OnnxType::kBfloat16; }

std::optional<OnnxType> type_of(const std::unordered_map<std::string, OnnxType>& types,
                                const std::string& name) {
  auto it = types.find(name);
  return it == types.end() ? std::nullopt : std::optional<OnnxType>(it->second);
}

// One island: nodes [first, last] of the graph (by index) computing in float32.
struct Island {
  size_t first = 0;  // the node reading `x`
  size_t last = 0;   // the node writing the island's result
  std::vector<size_t> nodes;
  std::string x;
  OnnxType type = OnnxType::kFloat16;
  std::optional<size_t> eps_add;  // the Add whose constant operand needs a float32 copy
};

// Square -> ReduceMean|ReduceSum -> [Add eps] -> Sqrt|Pow -> [Reciprocal], from the square node `i`.
std::optional<Island> match_norm(const Graph& graph, const GraphIndex& index,
                                 const std::unordered_map<std::string, OnnxType>& types, size_t i) {
  const Node& square = graph.nodes[i];
  const bool is_pow =
      is_onnx_op(square, "Pow") && square.inputs.size() == 2 && near(index.scalar(square.inputs[1]), 2);
  const bool is_mul =
      is_onnx_op(square, "Mul") && square.inputs.size() == 2 && square.inputs[0] == square.inputs[1];
  if ((!is_pow && !is_mul) || square.outputs.size() != 1) return std::nullopt;
  std::optional<OnnxType> type = type_of(types, square.inputs[0]);
  if (!type || !is_half(*type)) return std::nullopt;

  std::optional<size_t> reduce = sole_consumer(index, square.outputs[0]);
  if (!reduce) return std::nullopt;
  const Node& r = graph.nodes[*reduce];
  if ((!is_onnx_op(r, "ReduceMean") && !is_onnx_op(r, "ReduceSum")) || r.inputs.empty() ||
      r.inputs[0] != square.outputs[0]) {
    return std::nullopt;
  }
  Island island{.first = i,
                .last = *reduce,
                .nodes = {i, *reduce},
                .x = square.inputs[0],
                .type = *type,
                .eps_add = std::nullopt};
  std::optional<size_t> next = sole_consumer(index, r.outputs[0]);
  if (!next) return std::nullopt;
  if (is_onnx_op(graph.nodes[*next], "Add")) {
    const Node& add = graph.nodes[*next];
    std::optional<std::string> eps = other_input(add, r.outputs[0]);
    if (!eps || !index.constant(*eps)) return std::nullopt;
    island.eps_add = *next;
    island.nodes.push_back(*next);
    next = sole_consumer(index, add.outputs[0]);
    if (!next) return std::nullopt;
  }
  const Node& root = graph.nodes[*next];
  const std::string& root_input = graph.nodes[island.eps_add.value_or(*reduce)].outputs[0];
  const bool is_sqrt = is_onnx_op(root, "Sqrt");
  const bool is_root_pow = is_onnx_op(root, "Pow") && root.inputs.size() == 2 &&
                           root.inputs[0] == root_input && index.scalar(root.inputs[1]).has_value();
  if (!is_sqrt && !is_root_pow) return std::nullopt;
  island.last = *next;
  island.nodes.push_back(*next);
  if (std::optional<size_t> reciprocal = sole_consumer(index, root.outputs[0]);
      reciprocal && is_onnx_op(graph.nodes[*reciprocal], "Reciprocal")) {
    island.last = *reciprocal;
    island.nodes.push_back(*reciprocal);
  }
  return island;
}

Node make_cast(const Graph& graph, const std::string& input, const std::string& output, OnnxType to) {
  return cast_node(graph, "keep_float32_islands/" + output, input, output, to);
}

}  // namespace

size_t keep_float32_islands(Graph& graph) {
  auto opset = graph.opsets.find("");
  if (opset == graph.opsets.end() || opset->second < 6) return 0;
  const std::unordered_map<std::string, OnnxType> types = known_element_types(graph);
  const GraphIndex index(graph);
  std::vector<Island> islands;
  std::vector<bool> taken(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (taken[i]) continue;
    const Node& node = graph.nodes[i];
    if (is_onnx_op(node, "LpNormalization") && node.inputs.size() == 1 && node.outputs.size() == 1) {
      std::optional<OnnxType> type = type_of(types, node.inputs[0]);
      if (type && is_half(*type)) {
        islands.push_back({.first = i,
                           .last = i,
                           .nodes = {i},
                           .x = node.inputs[0],
                           .type = *type,
                           .eps_add = std::nullopt});
      }
      continue;
    }
    if (std::optional<Island> island = match_norm(graph, index, types, i)) {
      for (size_t k : island->nodes) taken[k] = true;
      islands.push_back(*island);
    }
  }
  if (islands.empty()) return 0;

  ValueNames names(graph);
  std::unordered_map<std::string, std::string> float32_of;  // x -> its float32 Cast
  std::vector<std::vector<Node>> before(graph.nodes.size()), after(graph.nodes.size());
  for (const Island& island : islands) {
    auto [it, inserted] = float32_of.try_emplace(island.x, "");
    if (inserted) {
      it->second = names.fresh(island.x + "/float32");
      before[island.first].push_back(make_cast(graph, island.x, it->second, OnnxType::kFloat));
    }
    Node& first = graph.nodes[island.first];
    std::replace(first.inputs.begin(), first.inputs.begin() + (first.op_type == "Mul" ? 2 : 1), island.x,
                 it->second);
    if (island.eps_add) {
      Node& add = graph.nodes[*island.eps_add];
      for (std::string& input : add.inputs) {
        std::optional<mx::array> c = index.constant(input);
        if (!c || !mx::issubdtype(c->dtype(), mx::floating) || c->dtype() == mx::float32) continue;
        const std::string copy = fresh_initializer_name(graph, input + "/float32");
        names.reserve(copy);
        mx::array f = mx::astype(*c, mx::float32, mx::Device::cpu);
        mx::eval(f);
        graph.initializers[copy] = f;
        input = copy;
      }
    }
    Node& last = graph.nodes[island.last];
    const std::string result = last.outputs[0];
    const std::string internal = names.fresh(result + "/float32");
    last.outputs[0] = internal;
    after[island.last].push_back(make_cast(graph, internal, result, island.type));
  }
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size() + 2 * islands.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (Node& n : before[i]) nodes.push_back(std::move(n));
    nodes.push_back(std::move(graph.nodes[i]));
    for (Node& n : after[i]) nodes.push_back(std::move(n));
  }
  graph.nodes = std::move(nodes);
  return islands.size();
}

}  // namespace transmuter
