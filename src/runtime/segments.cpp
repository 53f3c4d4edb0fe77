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

SegmentLayout plan_segments(const BoundGraph& bound, const std::set<std::string>& static_inputs,
                            const std::set<std::string>& traced_params) {
  const Graph& graph = *bound.graph;
  std::unordered_map<std::string, ValueFlags> flags;
  for (const ValueInfo& in : graph.inputs) {
    bool data = static_inputs.count(in.name) == 0;
    flags[in.name] = {data, false, !is_plain_tensor(in)};
  }
  for (const std::string& name : traced_params) flags[name] = {true, false, false};
  std::unordered_map<std::string, const ValueInfo*> declared;
  for (const auto* infos : {&graph.value_info, &graph.outputs}) {
    for (const ValueInfo& info : *infos) declared[info.name] = &info;
  }
  const size_t n = graph.nodes.size();
  std::vector<bool> is_break(n, false);
  std::vector<std::vector<std::string>> reads(n);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    reads[i] = node_reads(node);
    ValueFlags in_flags;
    for (const std::string& name : reads[i]) {
      ValueFlags f = flags.count(name) ? flags[name] : ValueFlags{};
      in_flags.traced |= f.traced;
      in_flags.dynamic_shape |= f.dynamic_shape;
      in_flags.non_tensor |= f.non_tensor;
    }
    const OpRow* row = bound.rows[i];
    bool host_input_traced = false;
    if (row != nullptr) {
      for (int h : row->host_inputs) {
        if (h < static_cast<int>(node.inputs.size()) && !node.inputs[h].empty()) {
          host_input_traced |= flags[node.inputs[h]].traced;
        }
      }
    }
    // Non-tensor values cannot cross a compiled boundary: their readers run eagerly.
    bool non_tensor_out = produces_non_tensor(node, row, declared);
    is_break[i] = (row != nullptr && row->eager_only) || host_input_traced || in_flags.non_tensor ||
                  (non_tensor_out && in_flags.traced);
    ValueFlags out;
    if (is_break[i]) {
      out = {in_flags.traced, in_flags.traced || in_flags.dynamic_shape, in_flags.non_tensor || non_tensor_out};
    } else if (row != nullptr && row->reads_only_shapes) {
      bool input_dynamic = !node.inputs.empty() && flags[node.inputs[0]].dynamic_shape;
      out = {input_dynamic, false, false};
    } else {
      out = in_flags;
    }
    for (const std::string& name : node.outputs) {
      if (!name.empty()) flags[name] = out;
    }
  }

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
        if (flags[name].traced) {
          step.traced_inputs.push_back(name);
          seen_inputs.insert(name);
        }
      }
      for (const std::string& name : graph.nodes[k].outputs) {
        if (name.empty()) continue;
        defined_here.insert(name);
        auto it = last_read_step.find(name);
        if (it == last_read_step.end() || it->second <= s) continue;
        (flags[name].traced ? step.traced_outputs : step.host_outputs).push_back(name);
      }
    }
  }
  return layout;
}

}  // namespace transmuter
