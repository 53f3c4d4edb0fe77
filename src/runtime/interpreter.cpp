#include "runtime/interpreter.h"

#include <exception>

#include "ops/node_context.h"
#include "ops/registry.h"
#include "transmuter/error.h"

namespace transmuter {

const Value* Environment::find(const std::string& name) const {
  for (const Environment* scope = this; scope != nullptr; scope = scope->parent_) {
    auto it = scope->values_.find(name);
    if (it != scope->values_.end()) return &it->second;
  }
  return nullptr;
}

void Environment::set(const std::string& name, Value value) { values_[name] = std::move(value); }

void bind_initializers(const Graph& graph, const Params* overrides, Environment& env) {
  for (const auto& [name, value] : graph.initializers) {
    if (overrides != nullptr) {
      auto it = overrides->find(name);
      if (it != overrides->end()) {
        env.set(name, it->second);
        continue;
      }
    }
    env.set(name, value);
  }
}

namespace {

std::vector<const Value*> gather_inputs(const Node& node, const Environment& env) {
  std::vector<const Value*> inputs;
  inputs.reserve(node.inputs.size());
  for (const std::string& name : node.inputs) {
    if (name.empty()) {
      inputs.push_back(nullptr);  // omitted optional input
      continue;
    }
    const Value* v = env.find(name);
    if (v == nullptr) throw Error(str(node.label(), ": input '", name, "' has no value"));
    inputs.push_back(v);
  }
  return inputs;
}

OpOutputs call_op(const Node& node, NodeContext& ctx) {
  try {
    return node.op->fn(ctx);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // MLX reports shape/dtype problems as std::invalid_argument: say which node.
    throw OpError(str(ctx.prefix(), e.what()));
  }
}

}  // namespace

void run_nodes(const Graph& graph, size_t begin, size_t end, Environment& env, mx::Device device) {
  const SubgraphRunner subgraphs = [&env, device](const Graph& body, const std::vector<Value>& inputs) {
    return run_subgraph(body, inputs, env, device);
  };
  for (size_t n = begin; n < end; ++n) {
    const Node& node = graph.nodes[n];
    if (node.op == nullptr) throw UnsupportedError(str(node.label(), ": no implementation"));
    NodeContext ctx(node, gather_inputs(node, env), device, &subgraphs);
    OpOutputs outputs = call_op(node, ctx);
    if (outputs.size() > node.outputs.size()) outputs.resize(node.outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!node.outputs[i].empty()) env.set(node.outputs[i], std::move(outputs[i]));
    }
    for (size_t i = outputs.size(); i < node.outputs.size(); ++i) {
      // Optional outputs the op did not produce stay unbound unless named.
      if (!node.outputs[i].empty()) env.set(node.outputs[i], Value());
    }
  }
}

std::vector<Value> run_subgraph(const Graph& body, const std::vector<Value>& inputs,
                                const Environment& outer, mx::Device device) {
  Environment scope(&outer);
  bind_initializers(body, nullptr, scope);
  if (inputs.size() > body.inputs.size()) {
    throw Error(str("subgraph '", body.name, "' takes ", body.inputs.size(), " inputs, got ", inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) scope.set(body.inputs[i].name, inputs[i]);
  run_nodes(body, 0, body.nodes.size(), scope, device);
  std::vector<Value> outputs;
  outputs.reserve(body.outputs.size());
  for (const ValueInfo& out : body.outputs) {
    const Value* v = scope.find(out.name);
    if (v == nullptr) throw Error(str("subgraph '", body.name, "' did not produce output '", out.name, "'"));
    outputs.push_back(*v);
  }
  return outputs;
}

Outputs collect_outputs(const Graph& graph, const Environment& env) {
  Outputs out;
  for (const ValueInfo& info : graph.outputs) {
    const Value* v = env.find(info.name);
    if (v == nullptr) throw Error(str("graph output '", info.name, "' was not computed"));
    out.names.push_back(info.name);
    out.values.push_back(*v);
  }
  return out;
}

}  // namespace transmuter
