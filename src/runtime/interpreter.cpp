#include "runtime/interpreter.h"

#include <exception>

#include "core/memory.h"
#include "ops/node_context.h"
#include "ops/registry.h"
#include "transmuter/error.h"

namespace transmuter {

void Environment::use_slots(const NameSlots& slots) {
  if (!values_.empty() || slots_ != nullptr)
    throw Error("Environment::use_slots: the scope already holds values");
  slots_ = &slots;
  slot_values_.resize(slots.names.size());
  slot_bound_.assign(slots.names.size(), false);
}

const Value* Environment::find_here(const std::string& name) const {
  if (slots_ != nullptr) {
    auto slot = slots_->slot_of.find(name);
    if (slot != slots_->slot_of.end())
      return slot_bound_[slot->second] ? &slot_values_[slot->second] : nullptr;
  }
  auto it = values_.find(name);
  return it != values_.end() ? &it->second : nullptr;
}

const Value* Environment::find(const std::string& name) const {
  for (const Environment* scope = this; scope != nullptr; scope = scope->parent_) {
    if (const Value* v = scope->find_here(name)) return v;
  }
  return nullptr;
}

const Value* Environment::find(uint32_t slot) const {
  for (const Environment* scope = this; scope != nullptr; scope = scope->parent_) {
    if (scope->slots_ != slots_)
      return scope->find(slots_->names[slot]);  // an enclosing scope of other names
    if (scope->slot_bound_[slot]) return &scope->slot_values_[slot];
  }
  return nullptr;
}

void Environment::set(const std::string& name, Value value) {
  if (slots_ != nullptr) {
    auto slot = slots_->slot_of.find(name);
    if (slot != slots_->slot_of.end()) {
      set(slot->second, std::move(value));
      return;
    }
  }
  values_[name] = std::move(value);
}

void Environment::set(uint32_t slot, Value value) {
  slot_values_[slot] = std::move(value);
  slot_bound_[slot] = true;
}

void bind_initializers(const Graph& graph, const Params* overrides, Environment& env) {
  for (const auto& [name, value] : graph.initializers) {
    if (overrides != nullptr) {
      auto it = overrides->find(name);
      if (it != overrides->end()) {
        // Params are plain arrays: an int4/uint4/float8... initializer held widened keeps its ONNX
        // element type when the override has its MLX dtype (ops such as GatherBlockQuantized read
        // uint4 and uint8 data differently).
        const bool keeps_type = value.is_tensor() && value.is_widened() && it->second.dtype() == value.tensor().dtype();
        env.set(name, keeps_type ? Value(it->second, value.element_type()) : Value(it->second));
        continue;
      }
    }
    env.set(name, value);
  }
}

void bind_omitted_optionals(const Graph& graph, const Inputs& given, Environment& env) {
  for (const ValueInfo& info : graph.inputs) {
    if (info.kind == ValueInfo::Kind::kOptional && given.count(info.name) == 0) env.set(info.name, Value());
  }
}

namespace {

// The values of node n's inputs, found by slot when `env` keeps `graph`'s names in slots.
std::vector<const Value*> gather_inputs(const BoundGraph& graph, size_t n, const OpRow& row,
                                        const Environment& env) {
  const Node& node = graph.node(n);
  const bool by_slot = env.slots() == &graph.slots;
  std::vector<const Value*> inputs;
  inputs.reserve(node.inputs.size());
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const std::string& name = node.inputs[i];
    if (name.empty()) {
      inputs.push_back(nullptr);  // omitted optional input
      continue;
    }
    const Value* v =
        by_slot ? env.find(static_cast<uint32_t>(graph.slots.node_inputs[n][i])) : env.find(name);
    if (v == nullptr) {
      throw Error(str("[", node.op_type, " v", row.since, "] node '", node.name, "': input '", name, "' has no value"));
    }
    inputs.push_back(v);
  }
  return inputs;
}

OpOutputs call_op(const OpRow& row, NodeContext& ctx) {
  try {
    return row.fn(ctx);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // MLX reports shape/dtype problems as std::invalid_argument: say which node.
    throw OpError(str(ctx.prefix(), e.what()));
  }
}

// Refuses an output tensor larger than the memory limit while it is still a
// lazy array: its shape is known, its buffer not yet allocated.
void check_output_size(const NodeContext& ctx, const std::string& name, const mx::array& a, uint64_t limit) {
  std::optional<uint64_t> bytes = checked_nbytes(a.shape(), a.dtype());
  if (!bytes) throw ctx.error("output '", name, "' has more elements than 64 bits can count");
  if (*bytes > limit) {
    throw ctx.error("output '", name, "' would need ", *bytes, " bytes, over the memory limit of ", limit,
                    " bytes");
  }
}

// Float8, float4 and sub-byte integer tensors are held widened, and their
// Value carries the narrow type. ONNX admits those types only into ops that
// state their output types (Cast, QuantizeLinear...; OpRow::sets_element_types)
// and into ops that move data (Identity, Reshape, Transpose, Pad, Concat,
// If...), whose outputs hold the inputs' values. So an output of another op
// holds the narrow type of its inputs of the same MLX dtype, when they agree
// on one.
void carry_element_types(const std::vector<const Value*>& inputs, OpOutputs& outputs) {
  for (Value& out : outputs) {
    if (!out.is_tensor() || out.is_widened()) continue;
    OnnxType narrow = OnnxType::kUndefined;
    for (const Value* in : inputs) {
      if (in == nullptr || !in->is_tensor() || !in->is_widened()) continue;
      if (in->tensor().dtype() != out.tensor().dtype()) continue;
      if (narrow != OnnxType::kUndefined && narrow != in->element_type()) return;  // disagree: leave all as they are
      narrow = in->element_type();
    }
    if (narrow != OnnxType::kUndefined) out = Value(out.tensor(), narrow);
  }
}

// Keeps the (evaluated) outputs of node n for the next runs with this
// signature, when they are all tensors of at most kMaxRememberedOutputBytes.
void remember_outputs(const Node& node, size_t n, const Environment& env, SignatureMemo& memo) {
  std::vector<Value> kept;
  std::vector<mx::array> arrays;
  size_t bytes = 0;
  for (const std::string& name : node.outputs) {
    const Value* v = env.find(name);
    if (v == nullptr || !v->is_tensor()) return;
    bytes += v->tensor().nbytes();
    if (bytes > kMaxRememberedOutputBytes) return;
    kept.push_back(*v);
    arrays.push_back(v->tensor());
  }
  mx::eval(arrays);
  memo.remember_outputs(n, std::move(kept));
}

// Hands the node's outputs to RunOptions::node_hook and binds what it leaves
// in their place.
void call_node_hook(const NodeHook& hook, const Node& node, size_t n, Environment& env) {
  std::vector<Value> outputs;
  outputs.reserve(node.outputs.size());
  for (const std::string& name : node.outputs) {
    const Value* value = name.empty() ? nullptr : env.find(name);
    outputs.push_back(value != nullptr ? *value : Value());
  }
  NodeRun run{n, node.name, node.domain, node.op_type, node.inputs, node.outputs, outputs};
  hook(run);
  if (outputs.size() != node.outputs.size()) {
    throw Error(str(node.label(), ": the node hook left ", outputs.size(), " outputs, the node has ",
                    node.outputs.size()));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!node.outputs[i].empty()) env.set(node.outputs[i], std::move(outputs[i]));
  }
}

// Runs node n of `graph`, reading and writing `env`.
void run_node(const BoundGraph& graph, size_t n, Environment& env, const Execution& exec,
              const SubgraphRunner& subgraphs, uint64_t limit) {
  const Node& node = graph.node(n);
  const bool replayable = exec.replayable != nullptr && (*exec.replayable)[n];
  const bool by_slot = env.slots() == &graph.slots;
  auto bind_output = [&](size_t i, Value value) {
    if (by_slot) {
      env.set(static_cast<uint32_t>(graph.slots.node_outputs[n][i]), std::move(value));
    } else {
      env.set(node.outputs[i], std::move(value));
    }
  };
  if (replayable && exec.replay_reads != nullptr) {
    if (const std::vector<Value>* kept = exec.replay_reads->outputs(n)) {
      for (size_t i = 0; i < kept->size(); ++i) bind_output(i, (*kept)[i]);
      return;
    }
  }
  const OpRow* row = graph.rows[n];
  if (row == nullptr) throw UnsupportedError(str(node.label(), ": no implementation"));
  std::vector<const Value*> inputs = gather_inputs(graph, n, *row, env);
  NodeContext ctx(node, inputs, exec.device, &subgraphs, row);
  ctx.set_memory_limit(limit);
  if (exec.rememberable != nullptr) {
    ctx.set_host_reads({exec.replay_reads, exec.record_reads, &(*exec.rememberable)[n], n});
  }
  OpOutputs outputs = call_op(*row, ctx);
  if (!row->sets_element_types) carry_element_types(inputs, outputs);
  if (outputs.size() > node.outputs.size()) outputs.resize(node.outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].is_tensor()) check_output_size(ctx, node.outputs[i], outputs[i].tensor(), limit);
    if (!node.outputs[i].empty()) bind_output(i, std::move(outputs[i]));
  }
  for (size_t i = outputs.size(); i < node.outputs.size(); ++i) {
    // Optional outputs the op did not produce stay unbound unless named.
    if (!node.outputs[i].empty()) bind_output(i, Value());
  }
  if (replayable && exec.record_reads != nullptr) remember_outputs(node, n, env, *exec.record_reads);
  if (exec.node_hook != nullptr) call_node_hook(*exec.node_hook, node, n, env);
}

// Calls run_node(graph, n, ...) for each n that `for_each_node` yields.
template <typename ForEachNode>
void run_each(const BoundGraph& graph, Environment& env, const Execution& exec, ForEachNode&& for_each_node) {
  const SubgraphRunner subgraphs = [&graph, &env, &exec](const Graph& body, const std::vector<Value>& inputs) {
    return run_subgraph(graph.subgraph(body), inputs, env, exec);
  };
  const uint64_t limit = exec.memory_limit != 0 ? exec.memory_limit : physical_memory_bytes();
  for_each_node([&](size_t n) { run_node(graph, n, env, exec, subgraphs, limit); });
}

}  // namespace

void run_nodes(const BoundGraph& graph, size_t begin, size_t end, Environment& env, const Execution& exec) {
  run_each(graph, env, exec, [begin, end](auto&& run) {
    for (size_t n = begin; n < end; ++n) run(n);
  });
}

void run_node_list(const BoundGraph& graph, const std::vector<size_t>& nodes, Environment& env,
                   const Execution& exec) {
  run_each(graph, env, exec, [&nodes](auto&& run) {
    for (size_t n : nodes) run(n);
  });
}

std::vector<Value> run_subgraph(const BoundGraph& bound, const std::vector<Value>& inputs,
                                const Environment& outer, const Execution& exec) {
  const Graph& body = *bound.graph;
  Environment scope(&outer);
  bind_initializers(body, nullptr, scope);
  if (inputs.size() > body.inputs.size()) {
    throw Error(str("subgraph '", body.name, "' takes ", body.inputs.size(), " inputs, got ", inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) scope.set(body.inputs[i].name, inputs[i]);
  // A body's values change between iterations and its node indices are its
  // own: its host reads are never remembered.
  Execution body_exec{exec.device, exec.memory_limit};
  run_nodes(bound, 0, bound.size(), scope, body_exec);
  std::vector<Value> outputs;
  outputs.reserve(body.outputs.size());
  for (const ValueInfo& out : body.outputs) {
    const Value* v = scope.find(out.name);
    if (v == nullptr) throw Error(str("subgraph '", body.name, "' did not produce output '", out.name, "'"));
    outputs.push_back(*v);
  }
  return outputs;
}

Value with_declared_type(const ValueInfo& info, const Value& value) {
  if (!value.is_tensor() || value.is_widened() || info.kind != ValueInfo::Kind::kTensor) return value;
  std::optional<mx::Dtype> storage = to_mlx_dtype(info.elem_type);
  if (!storage || *storage != value.tensor().dtype() || to_onnx_type(*storage) == info.elem_type) return value;
  return Value(value.tensor(), info.elem_type);
}

Outputs collect_outputs(const Graph& graph, const Environment& env) {
  Outputs out;
  for (const ValueInfo& info : graph.outputs) {
    const Value* v = env.find(info.name);
    if (v == nullptr) throw Error(str("graph output '", info.name, "' was not computed"));
    out.names.push_back(info.name);
    out.values.push_back(with_declared_type(info, *v));
  }
  return out;
}

}  // namespace transmuter
