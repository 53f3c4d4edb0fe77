// Fuses the rotary position embedding of Llama-style PyTorch exports
// (transformers' apply_rotary_pos_emb: q * cos + rotate_half(q) * sin) into one
// ai.transmuter RotateHalfRotary node, which runs one CPU kernel
// (src/kernels/cpu/rotary.h) where the export has seven ops, for q and k of
// every layer at every decode step.
//
//        X ----------------------------+
//        |                             |
//   Slice(h:)   Slice(:h)              |
//        |          |                  |
//       Neg         |                  |        Cos
//         \        /                   |        |
//        Concat(axis = -1)             +------ Mul          =>   X  Cos  Sin  Rotated  (slice bounds)
//             |                                 |                 \   |    |    /        /
//            Mul ---- Sin                       |                  RotateHalfRotary
//             \                                 |                        |
//              +------------- Add -------------+                        Y
//                              |
//                              Y
//
// Mul and Add match with their operands either way round; the Concat's axis
// must be -1 (or the last of a known rank-4 X). The Slices' bounds are usually
// computed from X's shape (h = D / 2), so the pass cannot check them: it passes
// them on (inputs 4-11) and the op checks them on the host, computing rotate_half
// itself when they are X[..., :h] and X[..., h:] and otherwise reading the
// Rotated input (the Concat's output, left in the graph: nothing evaluates it
// when the op does not read it). The Add is replaced and the two Muls go when
// nothing else reads them; the Concat and what makes it stay for that fallback
// (a compiled plan drops what no output needs).
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";
constexpr const char* kFusedOp = "RotateHalfRotary";

bool is_onnx(const Node& node, std::string_view op_type) {
  return node.op_type == op_type && (node.domain.empty() || node.domain == "ai.onnx");
}

const Node* producer_of(const Graph& graph, const GraphIndex& index, const std::string& value,
                        std::string_view op_type) {
  std::optional<size_t> p = index.producer(value);
  return p && is_onnx(graph.nodes[*p], op_type) ? &graph.nodes[*p] : nullptr;
}

/** The slice bounds a fused node passes on: starts, ends, axes, steps ("" when absent). A Slice before
 * opset 10 keeps them in attributes, which the op cannot read: not matched. */
std::optional<std::vector<std::string>> slice_bounds(const Node& slice) {
  if (slice.opset < 10 || slice.inputs.size() < 3) return std::nullopt;
  std::vector<std::string> bounds(slice.inputs.begin() + 1, slice.inputs.end());
  bounds.resize(4);
  return bounds;
}

struct RotaryMatch {
  std::string x, cos, sin, rotated;
  size_t plain_mul = 0, rotated_mul = 0;  // node indices
  std::vector<std::string> first_bounds, negated_bounds;
};

/** rotate_half(X): Concat(Neg(Slice(X, ...)), Slice(X, ...), axis = -1); X and the bounds, or nullopt. */
std::optional<RotaryMatch> match_rotate_half(const Graph& graph, const GraphIndex& index, const std::string& value) {
  const Node* concat = producer_of(graph, index, value, "Concat");
  if (concat == nullptr || concat->inputs.size() != 2 || int_attribute_or(*concat, "axis", 0) != -1)
    return std::nullopt;
  const Node* neg = producer_of(graph, index, concat->inputs[0], "Neg");
  const Node* negated = neg != nullptr ? producer_of(graph, index, neg->inputs[0], "Slice") : nullptr;
  const Node* first = producer_of(graph, index, concat->inputs[1], "Slice");
  if (negated == nullptr || first == nullptr || negated->inputs[0] != first->inputs[0]) return std::nullopt;
  auto first_bounds = slice_bounds(*first), negated_bounds = slice_bounds(*negated);
  if (!first_bounds || !negated_bounds) return std::nullopt;
  RotaryMatch m;
  m.x = first->inputs[0];
  m.rotated = value;
  m.first_bounds = *first_bounds;
  m.negated_bounds = *negated_bounds;
  return m;
}

/** Add(Mul(X, Cos), Mul(rotate_half(X), Sin)), operands either way round. */
std::optional<RotaryMatch> match_at(const Graph& graph, const GraphIndex& index, const Node& add) {
  if (!is_onnx(add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1) return std::nullopt;
  for (int rotated_side = 0; rotated_side < 2; ++rotated_side) {
    const std::string &rotated_product = add.inputs[rotated_side], &plain_product = add.inputs[1 - rotated_side];
    const Node* rotated_mul = producer_of(graph, index, rotated_product, "Mul");
    const Node* plain_mul = producer_of(graph, index, plain_product, "Mul");
    if (rotated_mul == nullptr || plain_mul == nullptr) continue;
    for (int r = 0; r < 2; ++r) {
      std::optional<RotaryMatch> m = match_rotate_half(graph, index, rotated_mul->inputs[r]);
      if (!m) continue;
      // The plain product multiplies the same X by the cosines.
      for (int p = 0; p < 2; ++p) {
        if (plain_mul->inputs[p] != m->x) continue;
        m->cos = plain_mul->inputs[1 - p];
        m->sin = rotated_mul->inputs[1 - r];
        m->plain_mul = *index.producer(plain_product);
        m->rotated_mul = *index.producer(rotated_product);
        return m;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

size_t fuse_rotary_embedding(Graph& graph) {
  GraphIndex index(graph);
  size_t fusions = 0;
  std::vector<bool> removed(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& node = graph.nodes[i];
    std::optional<RotaryMatch> m = match_at(graph, index, node);
    if (!m) continue;
    for (size_t mul : {m->plain_mul, m->rotated_mul})
      if (index.read_only_by(graph.nodes[mul].outputs[0], i)) removed[mul] = true;
    Node fused;
    fused.op_type = kFusedOp;
    fused.domain = kDomain;
    fused.opset = 1;
    fused.name = node.name.empty() ? node.outputs[0] + "/rotary" : node.name + "/fused_rotary";
    fused.inputs = {m->x, m->cos, m->sin, m->rotated};
    fused.inputs.insert(fused.inputs.end(), m->first_bounds.begin(), m->first_bounds.end());
    fused.inputs.insert(fused.inputs.end(), m->negated_bounds.begin(), m->negated_bounds.end());
    fused.outputs = node.outputs;
    node = std::move(fused);  // in the Add's place: its inputs all come before it
    ++fusions;
  }
  if (fusions == 0) return 0;
  std::vector<Node> kept;
  kept.reserve(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(graph.nodes[i]));
  graph.nodes = std::move(kept);
  graph.opsets[kDomain] = 1;
  return fusions;
}

}  // namespace transmuter
