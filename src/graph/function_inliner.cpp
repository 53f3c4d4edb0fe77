#include "graph/function_inliner.h"

#include <set>
#include <unordered_map>
#include <unordered_set>

#include "transmuter/error.h"

namespace transmuter {

namespace {

// Guards against models whose functions call each other so often that the
// expansion explodes (f calls g twice, g calls h twice, ...).
constexpr size_t kMaxInlinedNodes = size_t{1} << 22;

std::string call_label(const Node& node) {
  return str("node '", node.name, "' (", node.domain.empty() ? "" : node.domain + ".",
             node.op_type, ")");
}

// A copy of `graph` whose nested subgraphs are copies too, so renaming one
// inlined instance never touches another.
std::shared_ptr<Graph> deep_copy(const Graph& graph) {
  auto copy = std::make_shared<Graph>(graph);
  for (Node& node : copy->nodes) {
    for (Attribute& attribute : node.attributes) {
      if (attribute.g) attribute.g = deep_copy(*attribute.g);
      for (auto& g : attribute.graphs) {
        if (g) g = deep_copy(*g);
      }
    }
  }
  return copy;
}

void collect_names(const Graph& graph, std::unordered_set<std::string>& names) {
  for (const ValueInfo& v : graph.inputs) names.insert(v.name);
  for (const ValueInfo& v : graph.outputs) names.insert(v.name);
  for (const auto& [name, value] : graph.initializers) names.insert(name);
  for (const Node& node : graph.nodes) {
    names.insert(node.inputs.begin(), node.inputs.end());
    names.insert(node.outputs.begin(), node.outputs.end());
    for (const Attribute& attribute : node.attributes) {
      if (attribute.g) collect_names(*attribute.g, names);
      for (const auto& g : attribute.graphs) {
        if (g) collect_names(*g, names);
      }
    }
  }
}

class FunctionInliner {
 public:
  FunctionInliner(Graph& graph, const std::vector<Function>& functions) {
    for (const Function& f : functions) by_key_[{f.domain, f.name}] = &f;
    collect_names(graph, used_names_);
  }

  void expand_graph(Graph& graph) {
    std::vector<Node> expanded;
    expanded.reserve(graph.nodes.size());
    for (Node& node : graph.nodes) expand_node(std::move(node), expanded);
    graph.nodes = std::move(expanded);
  }

 private:
  using RenameMap = std::unordered_map<std::string, std::string>;

  const Function* find(const Node& node) const {
    auto found = by_key_.find({node.domain, node.op_type});
    return found == by_key_.end() ? nullptr : found->second;
  }

  void expand_node(Node node, std::vector<Node>& out) {
    const Function* function = find(node);
    if (function == nullptr) {
      for (Attribute& attribute : node.attributes) {
        if (attribute.g) expand_graph(*attribute.g);
        for (auto& g : attribute.graphs) {
          if (g) expand_graph(*g);
        }
      }
      if (++emitted_ > kMaxInlinedNodes) {
        throw ModelFormatError(str("inlining model functions gives more than ", kMaxInlinedNodes,
                                   " nodes"));
      }
      out.push_back(std::move(node));
      return;
    }
    for (const Function* active : stack_) {
      if (active == function) {
        throw ModelFormatError(str(call_label(node), ": function '", function->name,
                                   "' calls itself (recursion is not allowed in ONNX functions)"));
      }
    }
    stack_.push_back(function);
    for (Node& body_node : instantiate(node, *function)) expand_node(std::move(body_node), out);
    stack_.pop_back();
  }

  std::string fresh_name(const std::string& base) {
    std::string candidate = base;
    for (size_t suffix = 1; used_names_.contains(candidate); ++suffix) {
      candidate = str(base, "_", suffix);
    }
    used_names_.insert(candidate);
    return candidate;
  }

  // The body of `function` with names bound for the call `call`.
  std::vector<Node> instantiate(const Node& call, const Function& function) {
    if (call.inputs.size() > function.inputs.size() ||
        call.outputs.size() > function.outputs.size()) {
      throw ModelFormatError(str(call_label(call), ": calls function '", function.name, "' with ",
                                 call.inputs.size(), " inputs and ", call.outputs.size(),
                                 " outputs; it declares ", function.inputs.size(), " and ",
                                 function.outputs.size()));
    }
    const std::string prefix = (call.name.empty() ? function.name : call.name) + "/";
    RenameMap rename;
    for (size_t i = 0; i < function.inputs.size(); ++i) {
      rename[function.inputs[i]] = i < call.inputs.size() ? call.inputs[i] : std::string();
    }
    for (size_t i = 0; i < function.outputs.size(); ++i) {
      const bool bound = i < call.outputs.size() && !call.outputs[i].empty();
      rename[function.outputs[i]] =
          bound ? call.outputs[i] : fresh_name(prefix + function.outputs[i]);
    }
    for (const Node& node : function.nodes) {
      for (const std::string& output : node.outputs) {
        if (!output.empty() && !rename.contains(output)) {
          rename[output] = fresh_name(prefix + output);
        }
      }
    }
    std::vector<Node> body;
    body.reserve(function.nodes.size());
    for (const Node& original : function.nodes) {
      Node node = original;
      node.name = prefix + (original.name.empty() ? original.op_type : original.name);
      for (std::string& input : node.inputs) rename_value(input, rename);
      for (std::string& output : node.outputs) rename_value(output, rename);
      bind_attributes(node, call, function, rename);
      body.push_back(std::move(node));
    }
    return body;
  }

  static void rename_value(std::string& name, const RenameMap& rename) {
    auto found = rename.find(name);
    if (!name.empty() && found != rename.end()) name = found->second;
  }

  // Substitutes ref_attr_name attributes of `node` (and of nodes in its
  // subgraphs) and renames the function-scope values its subgraphs read.
  void bind_attributes(Node& node, const Node& call, const Function& function,
                       const RenameMap& rename) {
    std::vector<Attribute> bound;
    for (Attribute& attribute : node.attributes) {
      if (!attribute.ref_attr_name.empty()) {
        if (const Attribute* value = referenced(attribute.ref_attr_name, call, function)) {
          Attribute copy = *value;
          copy.name = attribute.name;
          copy.ref_attr_name.clear();
          if (copy.g) copy.g = deep_copy(*copy.g);
          for (auto& g : copy.graphs) {
            if (g) g = deep_copy(*g);
          }
          bound.push_back(std::move(copy));
        }
        continue;  // no value and no default: the attribute is absent
      }
      if (attribute.g) {
        attribute.g = deep_copy(*attribute.g);
        bind_subgraph(*attribute.g, call, function, rename);
      }
      for (auto& g : attribute.graphs) {
        if (!g) continue;
        g = deep_copy(*g);
        bind_subgraph(*g, call, function, rename);
      }
      bound.push_back(std::move(attribute));
    }
    node.attributes = std::move(bound);
  }

  void bind_subgraph(Graph& graph, const Node& call, const Function& function,
                     const RenameMap& rename) {
    // Names the subgraph defines shadow the function's.
    RenameMap visible = rename;
    for (const ValueInfo& v : graph.inputs) visible.erase(v.name);
    for (const auto& [name, value] : graph.initializers) visible.erase(name);
    for (const Node& node : graph.nodes) {
      for (const std::string& output : node.outputs) visible.erase(output);
    }
    for (Node& node : graph.nodes) {
      for (std::string& input : node.inputs) rename_value(input, visible);
      bind_attributes(node, call, function, visible);
    }
    for (ValueInfo& output : graph.outputs) rename_value(output.name, visible);
  }

  static const Attribute* referenced(const std::string& name, const Node& call,
                                     const Function& function) {
    if (const Attribute* given = call.find_attribute(name)) return given;
    for (const Attribute& fallback : function.attribute_defaults) {
      if (fallback.name == name) return &fallback;
    }
    return nullptr;
  }

  std::map<std::pair<std::string, std::string>, const Function*> by_key_;
  std::unordered_set<std::string> used_names_;
  std::vector<const Function*> stack_;
  size_t emitted_ = 0;
};

}  // namespace

void inline_functions(Graph& graph, const std::vector<Function>& functions) {
  if (functions.empty()) return;
  FunctionInliner inliner(graph, functions);
  inliner.expand_graph(graph);
}

}  // namespace transmuter
