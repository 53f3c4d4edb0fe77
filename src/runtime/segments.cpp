#include <algorithm>
#include <unordered_set>

#include <mlx/mlx.h>

#include "graph/subgraphs.h"
#include "ops/registry.h"
#include "runtime/compiler.h"

namespace transmuter {

namespace {

struct ValueFlags {
  bool traced = false;         // depends on input data
  bool dynamic_shape = false;  // its shape depends on input data
  bool non_tensor = false;     // may be a sequence, string tensor or optional
};

bool is_plain_tensor(const ValueInfo& info) {
  return info.kind == ValueInfo::Kind::kTensor && info.elem_type != OnnxType::kString;
}

// True when the node may output something other than a plain tensor: its row
// says so for this node (Cast to STRING), or value_info declares an output a
// string tensor, sequence or optional. Such a node runs eagerly, as its
// readers do.
bool produces_non_tensor(const Node& node, const OpRow* row,
                         const std::unordered_map<std::string, const ValueInfo*>& declared) {
  if (row != nullptr && row->makes_non_tensor != nullptr && row->makes_non_tensor(node)) return true;
  for (const std::string& name : node.outputs) {
    auto it = declared.find(name);
    if (it != declared.end() && it->second->kind != ValueInfo::Kind::kUnknown && !is_plain_tensor(*it->second)) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::set<std::string> trainable_params(const BoundGraph& bound) {
  const std::set<std::string> read_on_host = host_read_names(bound);
  std::set<std::string> names;
  for (const auto& [name, value] : bound.graph->initializers) {
    if (value.is_tensor() && mx::issubdtype(value.tensor().dtype(), mx::floating) && !read_on_host.count(name)) {
      names.insert(name);
    }
  }
  return names;
}

namespace {

ValueFlags& operator|=(ValueFlags& a, const ValueFlags& b) {
  a.traced |= b.traced;
  a.dynamic_shape |= b.dynamic_shape;
  a.non_tensor |= b.non_tensor;
  return a;
}

bool is_declared_non_tensor(const ValueInfo& info) {
  return info.kind != ValueInfo::Kind::kUnknown && !is_plain_tensor(info);
}

// Flags of the names of one graph; lookups fall back to the enclosing graph's
// scope, as subgraph bodies see their parent's names.
class FlagScope {
 public:
  explicit FlagScope(const FlagScope* parent = nullptr) : parent_(parent) {}
  ValueFlags get(const std::string& name) const {
    for (const FlagScope* s = this; s != nullptr; s = s->parent_) {
      auto it = s->flags_.find(name);
      if (it != s->flags_.end()) return it->second;
    }
    return {};  // initializers and constants
  }
  void set(const std::string& name, ValueFlags f) { flags_[name] = f; }

 private:
  std::unordered_map<std::string, ValueFlags> flags_;
  const FlagScope* parent_;
};

std::vector<bool> classify_nodes(const BoundGraph& bound, FlagScope& scope);

// How a node's subgraph bodies (If branches, Loop/Scan bodies) would trace in
// the scope of the node: whether some body node is a graph break (then the
// node must run eagerly as a whole), and the flags of the bodies' outputs.
// Body inputs get the flags of the node's own inputs, pessimistically.
struct BodyVerdict {
  bool has_break = false;
  ValueFlags outputs;
};

BodyVerdict classify_bodies(const BoundGraph& bound, const Node& node, const FlagScope& scope) {
  BodyVerdict verdict;
  ValueFlags direct;
  for (const std::string& name : node.inputs) {
    if (!name.empty()) direct |= scope.get(name);
  }
  for_each_subgraph(node, [&](const Graph& body) {
    FlagScope inner(&scope);
    for (const ValueInfo& in : body.inputs) {
      ValueFlags f = direct;
      f.non_tensor |= is_declared_non_tensor(in);
      inner.set(in.name, f);
    }
    std::vector<bool> breaks = classify_nodes(bound.subgraph(body), inner);
    verdict.has_break |= std::find(breaks.begin(), breaks.end(), true) != breaks.end();
    for (const ValueInfo& out : body.outputs) {
      verdict.outputs |= inner.get(out.name);
      verdict.outputs.non_tensor |= is_declared_non_tensor(out);
    }
  });
  return verdict;
}

// Decides, node by node, which nodes of `bound` are graph breaks, and records
// the flags of every output in `scope`.
std::vector<bool> classify_nodes(const BoundGraph& bound, FlagScope& scope) {
  const Graph& graph = *bound.graph;
  std::unordered_map<std::string, const ValueInfo*> declared;
  for (const auto* infos : {&graph.value_info, &graph.outputs}) {
    for (const ValueInfo& info : *infos) declared[info.name] = &info;
  }
  std::vector<bool> is_break(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    ValueFlags in_flags;
    for (const std::string& name : node_reads(node)) in_flags |= scope.get(name);
    const OpRow* row = bound.rows[i];
    bool host_input_traced = false;
    if (row != nullptr) {
      for (int h : row->host_inputs) {
        if (h < static_cast<int>(node.inputs.size()) && !node.inputs[h].empty()) {
          host_input_traced |= scope.get(node.inputs[h]).traced;
        }
      }
    }
    bool has_bodies = false;
    for_each_subgraph(node, [&has_bodies](const Graph&) { has_bodies = true; });
    BodyVerdict bodies = has_bodies ? classify_bodies(bound, node, scope) : BodyVerdict{};
    // Non-tensor values cannot cross a compiled boundary: their readers run eagerly.
    bool non_tensor_out = produces_non_tensor(node, row, declared) || bodies.outputs.non_tensor;
    is_break[i] = (row != nullptr && row->eager_only) || host_input_traced || in_flags.non_tensor ||
                  (non_tensor_out && in_flags.traced) || bodies.has_break;
    ValueFlags out;
    if (is_break[i]) {
      out = {in_flags.traced, in_flags.traced || in_flags.dynamic_shape,
             in_flags.non_tensor || non_tensor_out};
    } else if (row != nullptr && row->reads_only_shapes) {
      bool input_dynamic = !node.inputs.empty() && scope.get(node.inputs[0]).dynamic_shape;
      out = {input_dynamic, false, false};
    } else if (has_bodies) {
      // A body traced in place (an If on a host condition, a Scan): its
      // outputs are as traced as the body made them.
      out = bodies.outputs;
      for (const std::string& name : node.inputs) {
        if (!name.empty()) out |= scope.get(name);
      }
    } else {
      out = in_flags;
    }
    for (const std::string& name : node.outputs) {
      if (!name.empty()) scope.set(name, out);
    }
  }
  return is_break;
}

}  // namespace

SegmentLayout plan_segments(const BoundGraph& bound, const std::set<std::string>& static_inputs,
                            const std::set<std::string>& traced_params) {
  const Graph& graph = *bound.graph;
  FlagScope scope;
  for (const ValueInfo& in : graph.inputs) {
    bool data = static_inputs.count(in.name) == 0;
    scope.set(in.name, {data, false, !is_plain_tensor(in)});
  }
  for (const std::string& name : traced_params) scope.set(name, {true, false, false});
  const size_t n = graph.nodes.size();
  const std::vector<bool> is_break = classify_nodes(bound, scope);
  std::vector<std::vector<std::string>> reads(n);
  for (size_t i = 0; i < n; ++i) reads[i] = node_reads(graph.nodes[i]);
  auto flags = [&scope](const std::string& name) { return scope.get(name); };

  // Group consecutive non-break nodes into compiled steps.
  SegmentLayout layout;
  for (size_t i = 0; i < n;) {
    Step step;
    step.begin = i;
    step.eager = is_break[i];
    if (step.eager) {
      step.end = i + 1;
    } else {
      size_t j = i;
      while (j < n && !is_break[j]) ++j;
      step.end = j;
    }
    i = step.end;
    layout.steps.push_back(step);
  }

  // Last step that reads each name; graph outputs count as read at the end.
  std::unordered_map<std::string, size_t> last_read_step;
  for (size_t s = 0; s < layout.steps.size(); ++s) {
    for (size_t k = layout.steps[s].begin; k < layout.steps[s].end; ++k) {
      for (const std::string& name : reads[k]) last_read_step[name] = s;
    }
  }
  for (const ValueInfo& out : graph.outputs) last_read_step[out.name] = layout.steps.size();

  for (size_t s = 0; s < layout.steps.size(); ++s) {
    Step& step = layout.steps[s];
    if (step.eager) {
      ++layout.graph_breaks;
      continue;
    }
    ++layout.compiled_segments;
    std::unordered_set<std::string> defined_here;
    std::unordered_set<std::string> seen_inputs;
    for (size_t k = step.begin; k < step.end; ++k) {
      for (const std::string& name : reads[k]) {
        if (defined_here.count(name) || seen_inputs.count(name)) continue;
        // Initializers are captured as constants, unless traced as params.
        if (graph.initializers.count(name) && !traced_params.count(name)) continue;
        if (flags(name).traced) {
          step.traced_inputs.push_back(name);
          seen_inputs.insert(name);
        }
      }
      for (const std::string& name : graph.nodes[k].outputs) {
        if (name.empty()) continue;
        defined_here.insert(name);
        auto it = last_read_step.find(name);
        if (it == last_read_step.end() || it->second <= s) continue;
        (flags(name).traced ? step.traced_outputs : step.host_outputs).push_back(name);
      }
    }
  }
  return layout;
}

std::vector<std::vector<bool>> signature_determined_inputs(const BoundGraph& bound) {
  const Graph& graph = *bound.graph;
  FlagScope scope;
  for (const ValueInfo& in : graph.inputs) scope.set(in.name, {true, false, !is_plain_tensor(in)});
  classify_nodes(bound, scope);
  std::vector<std::vector<bool>> determined(graph.nodes.size());
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    for (const std::string& name : graph.nodes[n].inputs) {
      ValueFlags f = name.empty() ? ValueFlags{} : scope.get(name);
      determined[n].push_back(!name.empty() && !f.traced && !f.non_tensor);
    }
  }
  return determined;
}

std::vector<bool> signature_determined_nodes(const BoundGraph& bound) {
  const Graph& graph = *bound.graph;
  FlagScope scope;
  for (const ValueInfo& in : graph.inputs) scope.set(in.name, {true, false, !is_plain_tensor(in)});
  classify_nodes(bound, scope);
  std::unordered_set<std::string> always_computed;  // outputs of the nodes that must run every time
  std::vector<bool> determined(graph.nodes.size(), false);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    const OpRow* row = bound.rows[n];
    bool has_bodies = false;
    for_each_subgraph(node, [&has_bodies](const Graph&) { has_bodies = true; });
    bool ok = row != nullptr && !row->eager_only && !has_bodies && !node.outputs.empty();
    for (const std::string& out : node.outputs) {
      const ValueFlags f = out.empty() ? ValueFlags{true, false, false} : scope.get(out);
      ok = ok && !f.traced && !f.non_tensor;
    }
    // A shape-reading node (Shape, Size) needs only its input's shape, which
    // the classification found determined by the signature.
    const std::vector<std::string> reads = node_reads(node);
    const size_t first_read = row != nullptr && row->reads_only_shapes ? 1 : 0;
    for (size_t r = first_read; r < reads.size(); ++r) ok = ok && !always_computed.contains(reads[r]);
    determined[n] = ok;
    if (!ok) always_computed.insert(node.outputs.begin(), node.outputs.end());
  }
  return determined;
}

}  // namespace transmuter
