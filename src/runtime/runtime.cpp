#include <mutex>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/kernel_lookahead.h"
#include "runtime/compiler.h"
#include "runtime/evaluate_here.h"
#include "runtime/inputs.h"
#include "runtime/interpreter.h"
#include "runtime/model_state.h"
#include "transmuter/error.h"
#include "transmuter/runtime.h"

namespace transmuter {

const Value& Outputs::at(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return values[i];
  }
  throw Error(str("the model has no output '", name, "'"));
}

const mx::array& Outputs::tensor(const std::string& name) const { return at(name).tensor(); }

mx::Device default_device() {
  return mx::is_available(mx::Device::gpu) ? mx::Device(mx::Device::gpu) : mx::Device(mx::Device::cpu);
}

void set_cpu_buffer_cache(const mx::Device& device, std::optional<size_t> requested) {
  if (device != mx::Device::cpu) return;
  // Where MLX has a GPU its cache also holds GPU buffers: left alone unless asked.
  const std::optional<size_t> limit =
      requested ? requested : (mx::is_available(mx::Device::gpu) ? std::nullopt : std::optional<size_t>{0});
  if (!limit) return;
  // mx::set_cache_limit waits for every CPU stream to drain (a round trip to
  // the stream's thread; runs made two such calls each): set it only when it
  // changes.
  static std::mutex mutex;
  static std::optional<size_t> last_set;
  std::lock_guard lock(mutex);
  if (last_set == limit) return;
  mx::set_cache_limit(*limit);
  last_set = limit;
}

void bound_cpu_eval_lookahead(const mx::Device& device, std::optional<size_t> requested,
                              std::optional<size_t> kernel_requested) {
  if (device != mx::Device::cpu) return;
  kernels::set_kernel_lookahead(kernel_requested.value_or(size_t{8} << 20));
  const size_t budget = requested.value_or(size_t{128} << 20);
  if (budget == 0) return;
  // From the active memory at the start of this run: the weights and whatever
  // the caller holds are not look-ahead. A limit left by an earlier run can
  // only slow later evaluations down, and the next run sets it afresh.
  mx::set_memory_limit(mx::get_active_memory() + budget);
}

namespace {

// Remembered host reads hold what the model's own initializers gave; params
// that replace one with another array may change them.
bool uses_model_params(const Params& params, const Model& model) {
  const Params& own = model.params();
  if (&params == &own) return true;
  for (const auto& [name, value] : params) {
    auto it = own.find(name);
    if (it == own.end() || it->second.id() != value.id()) return false;
  }
  return true;
}

// Runs the nodes: the outputs as the ops built them (lazy).
Outputs interpret(const Model& model, const Params& params, const Inputs& inputs, const RunOptions& options,
                  const mx::Device& device) {
  const BoundGraph& bound = *model.internal_state().bound;
  const Graph& graph = *bound.graph;
  const Inputs typed_inputs = validate_inputs(graph, inputs);
  Execution exec{device, options.memory_limit};
  set_cpu_buffer_cache(exec.device, options.cpu_buffer_cache);
  bound_cpu_eval_lookahead(exec.device, options.cpu_eval_lookahead, options.cpu_kernel_lookahead);
  // Host reads that depend only on the input signature: replayed when a run
  // with this signature has read them, else read and kept for the next runs.
  SignatureMemoCache& host_reads = *model.internal_state().host_reads;
  std::string signature;
  std::shared_ptr<const Replay> replay;
  std::shared_ptr<SignatureMemo> record;
  const bool own_params = uses_model_params(params, model);
  // A hook may replace values, and sees every node: nothing is replayed or recorded.
  if (own_params && !options.node_hook) {
    signature = signature_of(typed_inputs, {});
    replay = host_reads.find(signature);
    if (replay == nullptr) record = std::make_shared<SignatureMemo>();
    exec.replay_reads = replay != nullptr ? replay->memo.get() : nullptr;
    exec.record_reads = record.get();
    exec.rememberable = &host_reads.rememberable();
    exec.replayable = &host_reads.replayable();
  }
  // The model's own params: its initializers, bound once at load, are the enclosing scope.
  Environment env(own_params ? &model.internal_state().initializers : nullptr);
  env.use_slots(bound.slots);
  if (!own_params) bind_initializers(graph, &params, env);
  for (const auto& [name, value] : typed_inputs) env.set(name, value);
  bind_omitted_optionals(graph, typed_inputs, env);
  if (options.node_hook) exec.node_hook = &options.node_hook;
  if (replay != nullptr) {
    for (const auto& [name, value] : replay->plan.bindings) env.set(name, value);
    run_node_list(bound, replay->plan.nodes, env, exec);
  } else {
    run_nodes(bound, 0, bound.size(), env, exec);
  }
  if (record != nullptr) host_reads.insert(signature, std::move(record));
  return collect_outputs(graph, env);
}

}  // namespace

Outputs run(const Model& model, const Params& params, const Inputs& inputs, const RunOptions& options) {
  const mx::Device device = options.device.value_or(default_device());
  Outputs outputs = interpret(model, params, inputs, options, device);
  // Evaluated once the run's environment is gone: what the outputs no longer need is freed as the kernels
  // go, and an intermediate's last reader may take its buffer.
  if (options.evaluate_cpu_outputs && device == mx::Device::cpu) {
    std::vector<mx::array> tensors;
    for (const Value& v : outputs.values) {
      if (v.is_tensor()) tensors.push_back(v.tensor());
    }
    evaluate_here(tensors);
  }
  return outputs;
}

}  // namespace transmuter
