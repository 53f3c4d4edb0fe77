// Fuses the scaled dot-product attention of PyTorch exports (BERT and its
// kin) into one ai.transmuter ScaledDotProductAttention node, which runs the
// attention kernel (src/kernels/cpu/attention.h) on CPU streams.
//
//   Q        Kt (= Transpose(K') or any [.., D, Sk])
//    \      /
//     MatMul                    c (constant scalar)
//        \                     /
//         Div or Mul  ---------            (optional)
//            |
//             Add (either side) --- mask   (optional; T5: two, the position
//              |                            bias, then the mask)
//              |
//           Softmax(axis = -1, opset >= 13)
//              |
//           [Cast(to float)]...                    (transformers' float32 softmax)
//              |                              =>   Q   K   V  [mask]
//            MatMul --- V                           \  |  /  /
//              |                         ScaledDotProductAttention(scale)
//              Y                                       |
//                                                      Y
//
//   scale = 1 / c (Div), c (Mul), or 1 without either. Two Adds (T5's
//   Add(Add(scores, position_bias), mask)) become one mask, a new
//   Add(position_bias, mask) ahead of the fused node: the sum rounds in
//   another order, within the pass's 1e-5.
//   K = Transpose(K', perm with its last two entries swapped) when Kt is a
//   Transpose whose output nothing else reads (the perm is rewritten in
//   place: for BERT, [0, 2, 3, 1] -> [0, 2, 1, 3]; its output renamed
//   Kt/fuse_attention_key), else a new Transpose(Kt, [0, 1, 3, 2]) for a 4-D Kt.
//
// Grouped-query attention: when K and V are transformers' repeat_kv of fewer
// key/value heads,
//
//   Kkv [B, Hkv, S, D] -> Unsqueeze(axes = [2]) -> Expand -> Reshape -> (K's Transpose)
//   Vkv                -> Unsqueeze(axes = [2]) -> Expand -> Reshape -> V
//
// and K's rewritten Transpose is the identity, the fused node also gets Kkv and
// Vkv as inputs 4 and 5 (input 3, the mask, empty when there is none). The op
// reads them instead of the repeated K and V when their shapes say they are
// the same heads repeated (runtime check), so the repeats, copies of the whole
// past in a decode step, are never computed; the repeat nodes stay for the
// other cases.
//
// A decoder's cache: when the key/value heads (Kkv and Vkv, or K and V
// themselves when nothing repeats them) are each a Concat of two values along
// axis 2 (-2), past and new rows,
//
//   past_key, new_key -> Concat(axis = 2) -> present_key -> [repeat_kv] -> (K's Transpose)
//   past_value, new_value -> Concat(axis = 2) -> present_value -> [repeat_kv] -> V
//
// the fused node gets the two runs instead: inputs 4 and 5 the pasts, 6 and 7
// the new rows. The kernel attends over both in place, so the Concat is
// computed only when something else reads it (the present as a graph output,
// unless LoadOptions::new_rows_outputs cut it to the new rows).
//
// Matches only when each intermediate (scores, scaled, masked, probabilities)
// is read by the next node alone and is not a graph output, the constant is
// a one-element float initializer or Constant, and Kt is rank 4 when the
// transpose has to be added (its rank known from value_info or from a
// 4-entry perm). Softmax before opset 13 normalizes over flattened trailing
// axes and is not matched. The fused node computes x * (1 / c) where Div
// computed x / c: a rounding of one ulp in the scores, far below the 1e-5 the
// pass keeps outputs to.
#include <mlx/mlx.h>

#include <algorithm>
#include <array>
#include <optional>
#include <unordered_map>

#include "graph/subgraphs.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

namespace mx = mlx::core;

constexpr const char* kDomain = "ai.transmuter";
constexpr const char* kFusedOp = "ScaledDotProductAttention";

bool is_onnx(const Node& node, std::string_view op_type) {
  return node.op_type == op_type && (node.domain.empty() || node.domain == "ai.onnx");
}

// The graph's value-level facts a match needs.
struct GraphIndex {
  std::unordered_map<std::string, size_t> producer;
  std::unordered_map<std::string, int> reads;

  explicit GraphIndex(const Graph& graph) {
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      for (const std::string& name : graph.nodes[i].outputs) producer[name] = i;
      for (const std::string& name : node_reads(graph.nodes[i])) reads[name]++;
    }
    for (const ValueInfo& output : graph.outputs) reads[output.name]++;
  }

  // The node producing `value` when it is of `op_type` and `value` is read
  // once (by the node being matched), else nullopt.
  std::optional<size_t> sole_producer(const Graph& graph, const std::string& value,
                                      std::string_view op_type) const {
    auto it = producer.find(value);
    if (it == producer.end() || !is_onnx(graph.nodes[it->second], op_type)) return std::nullopt;
    auto r = reads.find(value);
    if (r == reads.end() || r->second != 1) return std::nullopt;
    return it->second;
  }
};

// The tensor an initializer or a Constant node's `value` holds, or null.
const Value* constant_tensor(const Graph& graph, const GraphIndex& index, const std::string& name) {
  if (auto it = graph.initializers.find(name); it != graph.initializers.end())
    return it->second.is_tensor() ? &it->second : nullptr;
  auto p = index.producer.find(name);
  if (p == index.producer.end() || !is_onnx(graph.nodes[p->second], "Constant")) return nullptr;
  const Attribute* a = graph.nodes[p->second].find_attribute("value");
  return a != nullptr && a->type == AttrType::kTensor && a->t.is_tensor() ? &a->t : nullptr;
}

// The value of a one-element float constant (initializer or Constant node's value or value_float).
std::optional<float> scalar_constant(const Graph& graph, const GraphIndex& index, const std::string& name) {
  if (auto p = index.producer.find(name); p != index.producer.end() && is_onnx(graph.nodes[p->second], "Constant")) {
    const Attribute* f = graph.nodes[p->second].find_attribute("value_float");
    if (f != nullptr && f->type == AttrType::kFloat) return f->f;
  }
  const Value* value = constant_tensor(graph, index, name);
  if (value == nullptr) return std::nullopt;
  const mx::array& t = value->tensor();
  if (t.size() != 1 || !mx::issubdtype(t.dtype(), mx::floating)) return std::nullopt;
  return mx::astype(mx::reshape(t, {}, mx::Device::cpu), mx::float32, mx::Device::cpu).item<float>();
}

// The value of a one-element integer constant (initializer or Constant node).
std::optional<int64_t> int_constant(const Graph& graph, const GraphIndex& index, const std::string& name) {
  const Value* value = constant_tensor(graph, index, name);
  if (value == nullptr) return std::nullopt;
  const mx::array& t = value->tensor();
  if (t.size() != 1 || !mx::issubdtype(t.dtype(), mx::integer)) return std::nullopt;
  return mx::astype(mx::reshape(t, {}, mx::Device::cpu), mx::int64, mx::Device::cpu).item<int64_t>();
}

int64_t int_attribute(const Node& node, const std::string& name, int64_t fallback) {
  const Attribute* a = node.find_attribute(name);
  return a != nullptr && a->type == AttrType::kInt ? a->i : fallback;
}

// The rank of `value` when value_info or a graph input records its shape.
std::optional<size_t> known_rank(const Graph& graph, const std::string& value) {
  for (const auto* infos : {&graph.value_info, &graph.inputs}) {
    for (const ValueInfo& info : *infos) {
      if (info.name == value && info.has_shape) return info.shape.size();
    }
  }
  return std::nullopt;
}

// Kkv when `repeated` is Reshape(Expand(Unsqueeze(Kkv, axes = [2]))), transformers' repeat_kv.
std::optional<std::string> repeated_heads_source(const Graph& graph, const GraphIndex& index,
                                                 const std::string& repeated) {
  auto producer_of = [&](const std::string& value, std::string_view op) -> const Node* {
    auto it = index.producer.find(value);
    return it != index.producer.end() && is_onnx(graph.nodes[it->second], op) ? &graph.nodes[it->second] : nullptr;
  };
  const Node* reshape = producer_of(repeated, "Reshape");
  const Node* expand = reshape != nullptr ? producer_of(reshape->inputs[0], "Expand") : nullptr;
  const Node* unsqueeze = expand != nullptr ? producer_of(expand->inputs[0], "Unsqueeze") : nullptr;
  if (unsqueeze == nullptr) return std::nullopt;
  std::optional<int64_t> axis;
  if (unsqueeze->opset >= 13 && unsqueeze->inputs.size() == 2) {
    axis = int_constant(graph, index, unsqueeze->inputs[1]);
  } else if (const Attribute* axes = unsqueeze->find_attribute("axes");
             axes != nullptr && axes->type == AttrType::kInts && axes->ints.size() == 1) {
    axis = axes->ints[0];
  }
  // Axis 2 of the 5-D result (-3 counts from its end).
  if (axis != std::optional<int64_t>(2) && axis != std::optional<int64_t>(-3)) return std::nullopt;
  return unsqueeze->inputs[0];
}

// The two inputs of a two-input Concat along axis 2 (or -2) that makes `value`. The op checks at run
// time that they are 4-D key/value heads (where -2 is 2).
std::optional<std::pair<std::string, std::string>> concatenated_runs(const Graph& graph, const GraphIndex& index,
                                                                     const std::string& value) {
  auto it = index.producer.find(value);
  if (it == index.producer.end()) return std::nullopt;
  const Node& concat = graph.nodes[it->second];
  if (!is_onnx(concat, "Concat") || concat.inputs.size() != 2 || concat.inputs[0].empty() ||
      concat.inputs[1].empty())
    return std::nullopt;
  const int64_t axis = int_attribute(concat, "axis", 0);
  if (axis != 2 && axis != -2) return std::nullopt;
  return std::pair{concat.inputs[0], concat.inputs[1]};
}

// A matched subgraph, as node indices.
struct AttentionMatch {
  size_t scores = 0, softmax = 0, output = 0;
  std::optional<size_t> scale_node, mask_add, key_transpose;
  std::optional<size_t> bias_add;  // the first of two Adds (T5's position bias); mask_add the second
  std::vector<size_t> casts;  // identity Casts to float between the Softmax and the output MatMul
  std::string query, key_t, value, mask, bias;
  std::optional<std::string> grouped_key, grouped_value;  // Kkv, Vkv of a repeat_kv (see the header)
  // The Concat inputs that make Kkv and Vkv (or K and V): past key, past value, new key, new value.
  std::optional<std::array<std::string, 4>> cache_runs;
  float scale = 1.0f;
};

// Walks up from a MatMul(probabilities, V) to the scores MatMul.
std::optional<AttentionMatch> match_at(const Graph& graph, const GraphIndex& index, size_t output) {
  const Node& out = graph.nodes[output];
  if (!is_onnx(out, "MatMul") || out.inputs.size() != 2 || out.outputs.size() != 1) return std::nullopt;
  AttentionMatch m;
  m.output = output;
  m.value = out.inputs[1];
  // transformers' softmax(scores, dtype=float32).to(query.dtype) exports as Cast(to float) nodes between the
  // Softmax and the MatMul. They are identities: the MatMul reads them with V, so V is float32 too, and the
  // projections make Q and K V's type.
  std::string probabilities = out.inputs[0];
  while (auto cast = index.sole_producer(graph, probabilities, "Cast")) {
    if (int_attribute(graph.nodes[*cast], "to", 0) != 1) return std::nullopt;
    m.casts.push_back(*cast);
    probabilities = graph.nodes[*cast].inputs[0];
  }
  auto softmax = index.sole_producer(graph, probabilities, "Softmax");
  if (!softmax) return std::nullopt;
  const Node& sm = graph.nodes[*softmax];
  if (sm.opset < 13 || int_attribute(sm, "axis", -1) != -1) return std::nullopt;
  m.softmax = *softmax;

  std::string below = sm.inputs[0];  // the value the next node up produces
  // An Add of the (scaled) scores, on either side -- the one a Div/Mul/MatMul makes -- and another
  // operand: that operand and the scores' side, or nothing.
  auto scores_add = [&](size_t add) -> std::optional<std::pair<std::string, int>> {
    const Node& a = graph.nodes[add];
    for (int side = 0; side < 2; ++side) {
      auto p = index.producer.find(a.inputs[side]);
      if (p == index.producer.end()) continue;
      const Node& n = graph.nodes[p->second];
      if (is_onnx(n, "Div") || is_onnx(n, "Mul") || is_onnx(n, "MatMul"))
        return std::pair{a.inputs[1 - side], side};
    }
    return std::nullopt;
  };
  if (auto add = index.sole_producer(graph, below, "Add")) {
    const Node& a = graph.nodes[*add];
    if (auto found = scores_add(*add)) {
      m.mask_add = *add;
      m.mask = found->first;
      below = a.inputs[found->second];
    } else {
      // T5: Add(Add(scores, position_bias), mask), the inner Add on either side of the outer one.
      for (int side = 0; side < 2 && !m.mask_add; ++side) {
        auto inner = index.sole_producer(graph, a.inputs[side], "Add");
        if (!inner) continue;
        auto found_inner = scores_add(*inner);
        if (!found_inner) continue;
        m.bias_add = *inner;
        m.bias = found_inner->first;
        m.mask_add = *add;
        m.mask = a.inputs[1 - side];
        below = graph.nodes[*inner].inputs[found_inner->second];
      }
    }
    if (!m.mask_add) return std::nullopt;
  }
  for (std::string_view op : {"Div", "Mul"}) {
    auto scaled = index.sole_producer(graph, below, op);
    if (!scaled) continue;
    const Node& n = graph.nodes[*scaled];
    // Div(scores, c); Mul(scores, c) or Mul(c, scores).
    for (int side = 0; side < (op == "Mul" ? 2 : 1); ++side) {
      std::optional<float> c = scalar_constant(graph, index, n.inputs[1 - side]);
      if (!c || index.producer.count(n.inputs[side]) == 0) continue;
      if (!is_onnx(graph.nodes[index.producer.at(n.inputs[side])], "MatMul")) continue;
      if (op == "Div" && *c == 0.0f) return std::nullopt;
      m.scale = op == "Div" ? 1.0f / *c : *c;
      m.scale_node = *scaled;
      below = n.inputs[side];
      break;
    }
    if (!m.scale_node) return std::nullopt;  // a Div/Mul by something not constant
    break;
  }
  auto scores = index.sole_producer(graph, below, "MatMul");
  if (!scores) return std::nullopt;
  const Node& qk = graph.nodes[*scores];
  if (qk.inputs.size() != 2) return std::nullopt;
  m.scores = *scores;
  m.query = qk.inputs[0];
  m.key_t = qk.inputs[1];

  // K from Kt: rewrite a Transpose read only here, or add one (4-D only).
  if (auto t = index.sole_producer(graph, m.key_t, "Transpose")) {
    const Attribute* perm = graph.nodes[*t].find_attribute("perm");
    if (perm != nullptr && perm->type == AttrType::kInts && perm->ints.size() >= 2) m.key_transpose = *t;
  }
  if (!m.key_transpose && known_rank(graph, m.key_t) != std::optional<size_t>(4)) return std::nullopt;

  // K's Transpose becomes the identity when its perm is [0, 1, 3, 2]: K is then the repeated heads as they are.
  if (m.key_transpose) {
    const Attribute* perm = graph.nodes[*m.key_transpose].find_attribute("perm");
    if (perm->ints == std::vector<int64_t>{0, 1, 3, 2}) {
      auto key = repeated_heads_source(graph, index, graph.nodes[*m.key_transpose].inputs[0]);
      auto value = repeated_heads_source(graph, index, m.value);
      if (key && value) {
        m.grouped_key = key;
        m.grouped_value = value;
      }
      // The heads as the cache holds them: repeated by repeat_kv, or K and V as they are.
      const std::string heads_key = key && value ? *key : graph.nodes[*m.key_transpose].inputs[0];
      const std::string heads_value = key && value ? *value : m.value;
      auto key_runs = concatenated_runs(graph, index, heads_key);
      auto value_runs = concatenated_runs(graph, index, heads_value);
      if (key_runs && value_runs)
        m.cache_runs = {key_runs->first, value_runs->first, key_runs->second, value_runs->second};
    }
  }
  return m;
}

// Replaces the matched nodes by the fused node (at the output MatMul's place);
// marks the others removed. Returns the new nodes to insert before it.
std::vector<Node> rewrite(Graph& graph, const AttentionMatch& m, std::vector<bool>& removed) {
  std::vector<Node> before;
  std::string key;
  if (m.key_transpose) {
    Attribute* perm = nullptr;
    for (Attribute& a : graph.nodes[*m.key_transpose].attributes) {
      if (a.name == "perm") perm = &a;
    }
    std::swap(perm->ints[perm->ints.size() - 1], perm->ints[perm->ints.size() - 2]);
    // A new name for what is now K, not Kt: a value's name keeps one meaning (scripts/diff compares by name).
    key = m.key_t + "/fuse_attention_key";
    graph.nodes[*m.key_transpose].outputs[0] = key;
  } else {
    Node t;
    t.op_type = "Transpose";
    t.name = graph.nodes[m.scores].name + "/key";
    t.opset = graph.nodes[m.scores].opset;  // same domain as the MatMul
    key = m.key_t + "/fuse_attention_key";
    t.inputs = {m.key_t};
    t.outputs = {key};
    Attribute perm;
    perm.name = "perm";
    perm.type = AttrType::kInts;
    perm.ints = {0, 1, 3, 2};
    t.attributes.push_back(perm);
    before.push_back(std::move(t));
  }

  std::string mask = m.mask;
  if (m.bias_add) {  // one mask: the position bias plus the mask
    const Node& outer = graph.nodes[*m.mask_add];
    Node sum;
    sum.op_type = "Add";
    sum.name = outer.name + "/fuse_attention_mask";
    sum.opset = outer.opset;
    mask = outer.outputs[0] + "/fuse_attention_mask";
    sum.inputs = {m.bias, m.mask};
    sum.outputs = {mask};
    before.push_back(std::move(sum));
  }

  Node fused;
  fused.op_type = kFusedOp;
  fused.domain = kDomain;
  fused.opset = 1;
  fused.name = graph.nodes[m.softmax].name.empty() ? graph.nodes[m.output].outputs[0] + "/attention"
                                                   : graph.nodes[m.softmax].name + "/fused_attention";
  fused.inputs = {m.query, key, m.value};
  if (m.mask_add || m.grouped_key || m.cache_runs) fused.inputs.push_back(m.mask_add ? mask : "");
  if (m.cache_runs) {
    fused.inputs.insert(fused.inputs.end(), m.cache_runs->begin(), m.cache_runs->end());
  } else if (m.grouped_key) {
    fused.inputs.push_back(*m.grouped_key);
    fused.inputs.push_back(*m.grouped_value);
  }
  fused.outputs = graph.nodes[m.output].outputs;
  Attribute scale;
  scale.name = "scale";
  scale.type = AttrType::kFloat;
  scale.f = m.scale;
  fused.attributes.push_back(scale);
  graph.nodes[m.output] = std::move(fused);

  removed[m.scores] = removed[m.softmax] = true;
  if (m.scale_node) removed[*m.scale_node] = true;
  if (m.mask_add) removed[*m.mask_add] = true;
  if (m.bias_add) removed[*m.bias_add] = true;
  for (size_t cast : m.casts) removed[cast] = true;
  return before;
}

// Constant nodes nothing reads any more (the scales of fused Divs).
void drop_unread_constants(Graph& graph) {
  GraphIndex index(graph);
  std::erase_if(graph.nodes, [&](const Node& node) {
    return is_onnx(node, "Constant") && node.outputs.size() == 1 && index.reads[node.outputs[0]] == 0;
  });
}

}  // namespace

size_t fuse_attention(Graph& graph) {
  GraphIndex index(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  std::vector<bool> claimed(graph.nodes.size(), false);  // part of a match already
  std::unordered_map<size_t, std::vector<Node>> inserts;
  size_t fusions = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (claimed[i]) continue;
    std::optional<AttentionMatch> m = match_at(graph, index, i);
    if (!m) continue;
    std::vector<std::optional<size_t>> parts = {m->scores,   m->softmax,  m->scale_node,
                                                m->mask_add, m->bias_add, m->key_transpose};
    parts.insert(parts.end(), m->casts.begin(), m->casts.end());
    if (std::any_of(parts.begin(), parts.end(), [&](auto n) { return n && claimed[*n]; })) continue;
    for (std::optional<size_t> n : parts) {
      if (n) claimed[*n] = true;
    }
    claimed[i] = true;
    std::vector<Node> before = rewrite(graph, *m, removed);
    if (!before.empty()) inserts[i] = std::move(before);
    ++fusions;
  }
  if (fusions == 0) return 0;
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (auto it = inserts.find(i); it != inserts.end()) {
      for (Node& n : it->second) nodes.push_back(std::move(n));
    }
    if (!removed[i]) nodes.push_back(std::move(graph.nodes[i]));
  }
  graph.nodes = std::move(nodes);
  graph.opsets[kDomain] = 1;
  drop_unread_constants(graph);
  return fusions;
}

}  // namespace transmuter
