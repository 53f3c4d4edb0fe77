#include "graph/function_inliner.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "transmuter/error.h"

namespace transmuter {

namespace {

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

  // Checked before each call is expanded, from sizes computed once per
  // function, so an exponential expansion fails before any work is done.
  void check_cap(const Node& call, const Function& function) {
    const Expansion size = expanded_size(function);
    if (size.nodes > kMaxInlinedNodes - std::min(emitted_, kMaxInlinedNodes)) {
      const std::string amount =
          size.nodes > kMaxInlinedNodes
              ? std::string("more than the cap of ")
              : str(size.nodes, " nodes, with ", emitted_, " already created, over the cap of ");
      throw ModelFormatError(str(call_label(call), ": inlining function '", function.name,
                                 "' would create ", amount, kMaxInlinedNodes, " inlined nodes"));
    }
    // Calls of functions with empty bodies create no nodes but still cost
    // time: they have a cap of their own.
    if (size.calls > kMaxInlinedCalls - std::min(calls_, kMaxInlinedCalls)) {
      throw ModelFormatError(str(call_label(call), ": inlining function '", function.name,
                                 "' would expand more than the cap of ", kMaxInlinedCalls,
                                 " function calls"));
    }
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
      // A backstop: check_cap has accounted for these nodes already, except
      // those in subgraphs a caller passes in through attribute references.
      if (++emitted_ > kMaxInlinedNodes) {
        throw ModelFormatError(str("inlining model functions gives more than ", kMaxInlinedNodes,
                                   " nodes"));
      }
      out.push_back(std::move(node));
      return;
    }
    for (const Function* active : stack_) {
      if (active == function) throw recursion_error(node, *function);
    }
    check_cap(node, *function);
    // Backstop, as for nodes: calls inside subgraphs that a caller passes in
    // through attribute references are not in the precomputed sizes.
    if (++calls_ > kMaxInlinedCalls) {
      throw ModelFormatError(str(call_label(node), ": inlining model functions expands more than ",
                                 kMaxInlinedCalls, " function calls"));
    }
    stack_.push_back(function);
    for (Node& body_node : instantiate(node, *function)) expand_node(std::move(body_node), out);
    stack_.pop_back();
  }

  static ModelFormatError recursion_error(const Node& call, const Function& function) {
    return ModelFormatError(str(call_label(call), ": function '", function.name,
                                "' calls itself (recursion is not allowed in ONNX functions)"));
  }

  // What expanding one call of `function` creates: nodes (nested calls
  // expanded, nodes of subgraphs included) and calls, each saturated at its
  // cap + 1. Memoized: each function body is walked once. A call cycle
  // counts as nothing here; expanding it then reports the recursion.
  struct Expansion {
    uint64_t nodes = 0;
    uint64_t calls = 0;
    void add(const Expansion& other) {
      nodes = std::min(nodes + other.nodes, kMaxInlinedNodes + 1);
      calls = std::min(calls + other.calls, kMaxInlinedCalls + 1);
    }
  };

  Expansion expanded_size(const Function& function) {
    auto [entry, inserted] = sizes_.try_emplace(&function);
    if (!inserted) return entry->second;
    const Expansion size = nodes_size(function.nodes);
    sizes_[&function] = size;  // `entry` may be invalidated by nested inserts
    return size;
  }

  Expansion nodes_size(const std::vector<Node>& nodes) {
    Expansion total;
    for (const Node& node : nodes) {
      if (const Function* callee = find(node)) {
        total.add({0, 1});
        total.add(expanded_size(*callee));
        continue;
      }
      total.add({1, 0});
      for (const Attribute& attribute : node.attributes) {
        if (attribute.g) total.add(nodes_size(attribute.g->nodes));
        for (const auto& g : attribute.graphs) {
          if (g) total.add(nodes_size(g->nodes));
        }
      }
    }
    return total;
  }

  // A name not used anywhere in the graph: `base`, else `base_K` with K
  // counted per base. Resuming from the last K keeps this O(1) amortized:
  // each taken `base_K` is skipped at most once (scanning from 1 on every
  // call made inlining quadratic in the number of calls).
  std::string fresh_name(const std::string& base) {
    if (used_names_.insert(base).second) return base;
    size_t& suffix = next_suffix_[base];
    std::string candidate;
    do {
      candidate = base + "_" + std::to_string(++suffix);
    } while (!used_names_.insert(candidate).second);
    return candidate;
  }

  // Generated names grow with the nesting depth (outer/inner/node); bounds
  // their total size so deep chains of long names cannot exhaust memory
  // while staying under the node cap.
  void count_name_bytes(const Node& node) {
    name_bytes_ += node.name.size();
    for (const std::string& output : node.outputs) name_bytes_ += output.size();
    if (name_bytes_ > kMaxInlinedNameBytes) {
      throw ModelFormatError(str("node '", node.name.substr(0, 200),
                                 "...': inlining model functions generates more than ",
                                 kMaxInlinedNameBytes, " bytes of node and value names"));
    }
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
      count_name_bytes(node);
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
                       RenameMap& rename) {
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

  // `rename` is restored before returning; it is lent, not copied, so that
  // binding stays linear in the body however many subgraphs it holds.
  void bind_subgraph(Graph& graph, const Node& call, const Function& function,
                     RenameMap& rename) {
    // Names the subgraph defines shadow the function's: hidden while its
    // nodes are bound.
    std::vector<std::pair<std::string, std::string>> hidden;
    auto hide = [&](const std::string& name) {
      auto found = rename.find(name);
      if (found == rename.end()) return;
      hidden.emplace_back(found->first, std::move(found->second));
      rename.erase(found);
    };
    for (const ValueInfo& v : graph.inputs) hide(v.name);
    for (const auto& [name, value] : graph.initializers) hide(name);
    for (const Node& node : graph.nodes) {
      for (const std::string& output : node.outputs) hide(output);
    }
    for (Node& node : graph.nodes) {
      for (std::string& input : node.inputs) rename_value(input, rename);
      bind_attributes(node, call, function, rename);
    }
    for (ValueInfo& output : graph.outputs) rename_value(output.name, rename);
    for (auto& [name, value] : hidden) rename.emplace(std::move(name), std::move(value));
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
  std::unordered_map<std::string, size_t> next_suffix_;  // per fresh_name base
  std::unordered_map<const Function*, Expansion> sizes_;  // expanded_size memo
  std::vector<const Function*> stack_;
  uint64_t emitted_ = 0;  // nodes created so far
  uint64_t calls_ = 0;    // calls expanded so far
  uint64_t name_bytes_ = 0;
};

}  // namespace

void inline_functions(Graph& graph, const std::vector<Function>& functions) {
  if (functions.empty()) return;
  FunctionInliner inliner(graph, functions);
  inliner.expand_graph(graph);
}

}  // namespace transmuter
