#include "passes/node_pattern.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "graph/subgraphs.h"
#include "mlx_bridge/buffers.h"
#include "onnx/mapped_file.h"
#include "transmuter/error.h"

namespace transmuter {

GraphIndex::GraphIndex(const Graph& graph) : graph_(graph) {
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (const std::string& name : graph.nodes[i].outputs) {
      if (!name.empty()) producer_[name] = i;
    }
    for (const std::string& name : node_reads(graph.nodes[i])) {
      std::vector<size_t>& readers = consumers_[name];
      if (readers.empty() || readers.back() != i) readers.push_back(i);
    }
  }
  for (const ValueInfo& output : graph.outputs) graph_outputs_.insert(output.name);
}

std::optional<size_t> GraphIndex::producer(const std::string& value) const {
  auto it = producer_.find(value);
  if (it == producer_.end()) return std::nullopt;
  return it->second;
}

const std::vector<size_t>& GraphIndex::consumers(const std::string& value) const {
  static const std::vector<size_t> none;
  auto it = consumers_.find(value);
  return it == consumers_.end() ? none : it->second;
}

bool GraphIndex::read_only_by(const std::string& value, size_t reader) const {
  const std::vector<size_t>& readers = consumers(value);
  return readers.size() == 1 && readers[0] == reader && !is_graph_output(value);
}

std::optional<mx::array> GraphIndex::constant(const std::string& value) const {
  auto init = graph_.initializers.find(value);
  if (init != graph_.initializers.end()) {
    if (!init->second.is_tensor()) return std::nullopt;
    return init->second.tensor();
  }
  std::optional<size_t> p = producer(value);
  if (!p) return std::nullopt;
  const Node& node = graph_.nodes[*p];
  if (!is_onnx_op(node, "Constant")) return std::nullopt;
  for (const Attribute& a : node.attributes) {
    if (a.name == "value" && a.type == AttrType::kTensor && a.t.is_tensor()) return a.t.tensor();
    if (a.name == "value_float" && a.type == AttrType::kFloat) return mx::array(a.f);
    if (a.name == "value_floats" && a.type == AttrType::kFloats) {
      return mx::array(a.floats.data(), {static_cast<int>(a.floats.size())});
    }
  }
  return std::nullopt;
}

std::optional<float> GraphIndex::scalar(const std::string& value) const {
  std::optional<mx::array> c = constant(value);
  if (!c || c->size() != 1 || !mx::issubdtype(c->dtype(), mx::floating)) return std::nullopt;
  return mx::astype(*c, mx::float32, mx::Device::cpu).item<float>();
}

bool is_onnx_op(const Node& node, std::string_view op_type) {
  return node.op_type == op_type && (node.domain.empty() || node.domain == "ai.onnx");
}

std::optional<std::string> other_input(const Node& node, const std::string& one) {
  if (node.inputs.size() != 2) return std::nullopt;
  if (node.inputs[0] == one) return node.inputs[1];
  if (node.inputs[1] == one) return node.inputs[0];
  return std::nullopt;
}

bool near(std::optional<float> value, float expected, float tolerance) {
  return value && std::fabs(*value - expected) <= tolerance * std::fabs(expected);
}

void erase_nodes(Graph& graph, const std::vector<bool>& removed) {
  size_t index = 0;
  std::erase_if(graph.nodes, [&](const Node&) { return removed[index++]; });
  std::unordered_set<std::string> read;
  for (const Node& node : graph.nodes) {
    for (const std::string& name : node_reads(node)) read.insert(name);
  }
  for (const ValueInfo& output : graph.outputs) read.insert(output.name);
  std::erase_if(graph.nodes, [&](const Node& node) {
    return is_onnx_op(node, "Constant") && node.outputs.size() == 1 && !read.contains(node.outputs[0]);
  });
}

void import_domain(Graph& graph, const std::string& domain, int64_t version) {
  graph.opsets.try_emplace(domain, version);
}

std::optional<size_t> sole_consumer(const GraphIndex& index, const std::string& value) {
  const std::vector<size_t>& readers = index.consumers(value);
  if (readers.size() != 1 || index.is_graph_output(value)) return std::nullopt;
  return readers[0];
}

int64_t int_attribute_or(const Node& node, const std::string& name, int64_t fallback) {
  const Attribute* a = node.find_attribute(name);
  return a != nullptr && a->type == AttrType::kInt ? a->i : fallback;
}

std::vector<int64_t> ints_attribute_or(const Node& node, const std::string& name,
                                       std::vector<int64_t> fallback) {
  const Attribute* a = node.find_attribute(name);
  return a != nullptr && a->type == AttrType::kInts ? a->ints : fallback;
}

float float_attribute_or(const Node& node, const std::string& name, float fallback) {
  const Attribute* a = node.find_attribute(name);
  return a != nullptr && a->type == AttrType::kFloat ? a->f : fallback;
}

namespace {

// The bytes of `w` as a preparation reads them: a deferred copy's where they lie.
std::span<const uint8_t> weight_bytes(const mx::array& w) {
  const std::optional<std::span<const uint8_t>> deferred = deferred_bytes(w);
  return deferred ? *deferred : std::span(w.data<uint8_t>(), w.nbytes());
}

}  // namespace

void release_weight_pages(const mx::array& w) {
  if (w.is_available() || deferred_bytes(w)) release_if_file_backed(weight_bytes(w));
}

void drop_weight(Graph& graph, const std::string& name) {
  auto it = graph.initializers.find(name);
  if (it == graph.initializers.end() || !it->second.is_tensor()) return;
  // A repacking not made yet (deferred_repack) holds its source weight, whose
  // pages the pass that replaced it read.
  const std::optional<mx::array> source = pending_repack_source(it->second.tensor());
  const mx::array w = source ? *source : it->second.tensor();
  // A weight still deferred (never copied out of its file) gives back the file
  // pages its packing read.
  const std::span<const uint8_t> bytes = weight_bytes(w);
  graph.initializers.erase(it);
  // MLX keeps a freed buffer in its cache; clearing the cache gives a large
  // weight's pages back at once. Clearing waits on the CPU stream, though:
  // PP-LCNet cls's 31 small weights spent 0.9 ms of its 3.4 ms load there, so
  // a small weight's buffer stays cached for a later allocation.
  constexpr size_t kClearCacheBytes = size_t{1} << 20;
  if (!release_if_file_backed(bytes) && bytes.size() >= kClearCacheBytes) mx::clear_cache();
}

void drop_unread_weights(Graph& graph, const std::vector<std::string>& names) {
  const GraphIndex index(graph);
  for (const std::string& name : names) {
    if (graph.initializers.contains(name) && index.consumers(name).empty() && !index.is_graph_output(name))
      drop_weight(graph, name);
  }
}

std::string add_initializer(Graph& graph, ValueNames& names, const std::string& base, mx::array value) {
  mx::eval(value);
  const std::string name = fresh_initializer_name(graph, base);
  names.reserve(name);
  graph.initializers[name] = Value(std::move(value));
  return name;
}

Attribute int_attribute(const std::string& name, int64_t value) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kInt;
  a.i = value;
  return a;
}

Attribute ints_attribute(const std::string& name, std::vector<int64_t> values) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kInts;
  a.ints = std::move(values);
  return a;
}

Attribute float_attribute(const std::string& name, float value) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kFloat;
  a.f = value;
  return a;
}

Attribute floats_attribute(const std::string& name, std::vector<float> values) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kFloats;
  a.floats = std::move(values);
  return a;
}

Attribute string_attribute(const std::string& name, std::string value) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kString;
  a.s = std::move(value);
  return a;
}

bool has_input(const Node& node, size_t i) { return node.inputs.size() > i && !node.inputs[i].empty(); }

const mx::array* stored_initializer(const Graph& graph, const std::string& name) {
  auto it = graph.initializers.find(name);
  if (it == graph.initializers.end() || !it->second.is_tensor() || it->second.is_widened()) return nullptr;
  return &it->second.tensor();
}

const mx::array* stored_input(const Graph& graph, const Node& node, size_t i) {
  return has_input(node, i) ? stored_initializer(graph, node.inputs[i]) : nullptr;
}

const mx::array* scalar_initializer(const Graph& graph, const std::string& name) {
  const mx::array* value = stored_initializer(graph, name);
  return value != nullptr && value->size() == 1 ? value : nullptr;
}

bool present_inputs_are_scalars(const Graph& graph, const Node& node, std::initializer_list<size_t> indices) {
  for (size_t i : indices) {
    if (has_input(node, i) && scalar_initializer(graph, node.inputs[i]) == nullptr) return false;
  }
  return true;
}

std::string fresh_initializer_name(const Graph& graph, const std::string& base) {
  std::string name = base;
  for (int i = 1; graph.initializers.contains(name); ++i) name = str(base, "_", i);
  return name;
}

namespace {

void collect_names(const Graph& graph, std::unordered_set<std::string>& names) {
  for (const ValueInfo& v : graph.inputs) names.insert(v.name);
  for (const ValueInfo& v : graph.outputs) names.insert(v.name);
  for (const auto& entry : graph.initializers) names.insert(entry.first);
  for (const Node& node : graph.nodes) {
    names.insert(node.inputs.begin(), node.inputs.end());
    names.insert(node.outputs.begin(), node.outputs.end());
    for_each_subgraph(node, [&](const Graph& g) { collect_names(g, names); });
  }
}

}  // namespace

ValueNames::ValueNames(const Graph& graph) { collect_names(graph, used_); }

std::string ValueNames::fresh(const std::string& base) {
  std::string name = base;
  for (int i = 1; used_.contains(name); ++i) name = str(base, "_", i);
  used_.insert(name);
  return name;
}

Node cast_node(const Graph& graph, const std::string& name, const std::string& input, const std::string& output,
               OnnxType to) {
  Node cast;
  cast.name = name;
  cast.op_type = "Cast";
  cast.inputs = {input};
  cast.outputs = {output};
  cast.attributes = {int_attribute("to", static_cast<int64_t>(to))};
  cast.opset = static_cast<int>(graph.opsets.at(""));
  return cast;
}

}  // namespace transmuter
