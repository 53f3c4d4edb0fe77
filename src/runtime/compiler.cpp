#include "runtime/compiler.h"

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <mlx/mlx.h>

#include "mlx_bridge/compiled_function.h"
#include "mlx_bridge/kernel_cache.h"
#include "runtime/direct_run.h"
#include "runtime/inputs.h"
#include "runtime/interpreter.h"
#include "runtime/model_state.h"
#include "transmuter/error.h"
#include "transmuter/runtime.h"

namespace transmuter {

namespace {

// Direct runs over all of a model's plans (each thread's own): how many segments were recorded, and the
// primitives that kept the others off (CompileStats::direct_blockers).
struct DirectTally {
  std::atomic<size_t> segments{0};
  std::mutex mutex;  // guards blockers
  std::set<std::string> blockers;

  void count(bool recorded, const std::vector<std::string>& names) {
    if (recorded) ++segments;
    if (names.empty()) return;
    std::lock_guard lock(mutex);
    blockers.insert(names.begin(), names.end());
  }
};

// The compiled functions and captured host values for one input signature,
// owned by one thread's Executor and only ever used on that thread.
class Plan {
 public:
  // `direct` (when direct runs are allowed) counts the segments recorded for one, and the others' blockers.
  Plan(const BoundGraph& graph, const SegmentLayout& layout, Execution exec, const Params& params, bool fuse,
       DirectTally* direct)
      : graph_(graph),
        layout_(layout),
        exec_(exec),
        direct_(exec.device == mx::Device::cpu ? direct : nullptr) {
    bind_initializers(*graph_.graph, &params, constants_);
    for (const Step& step : layout_.steps) {
      if (step.eager) {
        compiled_.emplace_back();
        continue;
      }
      compiled_.push_back(std::make_unique<CompiledFunction>(
          [this, &step](const std::vector<mx::array>& args) { return trace_segment(step, args); }, fuse));
    }
    direct_runs_.resize(compiled_.size());
    direct_tried_.assign(compiled_.size(), false);
  }

  // `params` shadow the initializers of the same name; the layout makes those
  // traced (arguments of the compiled segments) when they may be replaced.
  Outputs call(const Inputs& inputs, const Params* params) {
    Environment env(&constants_);
    if (params != nullptr) {
      for (const auto& [name, value] : *params) env.set(name, value);
    }
    for (const auto& [name, value] : inputs) env.set(name, value);
    bind_omitted_optionals(*graph_.graph, inputs, env);
    call_env_ = &env;
    for (size_t s = 0; s < layout_.steps.size(); ++s) {
      const Step& step = layout_.steps[s];
      if (step.eager) {
        run_nodes(graph_, step.begin, step.end, env, exec_);
        continue;
      }
      std::vector<mx::array> outs = run_segment(s, segment_args(step, env));
      for (size_t i = 0; i < outs.size(); ++i) {
        const std::string& name = step.traced_outputs[i];
        env.set(name, Value(outs[i], element_types_.at(name)));
      }
    }
    call_env_ = nullptr;
    return collect_outputs(*graph_.graph, env);
  }

 private:
  static std::vector<mx::array> segment_args(const Step& step, const Environment& env) {
    std::vector<mx::array> args;
    args.reserve(step.traced_inputs.size());
    for (const std::string& name : step.traced_inputs) {
      const Value* v = env.find(name);
      if (v == nullptr || !v->is_tensor()) {
        throw Error(str("compiled segment input '", name, "' is ", v ? v->describe() : "missing"));
      }
      args.push_back(v->tensor());
    }
    return args;
  }

  // Segment s's outputs: directly when its graph allows (recorded at its first untraced call, which then
  // runs directly too), else through its compiled function.
  std::vector<mx::array> run_segment(size_t s, const std::vector<mx::array>& args) {
    const bool traced =
        std::any_of(args.begin(), args.end(), [](const mx::array& a) { return a.is_tracer(); });
    if (direct_ == nullptr || traced) return (*compiled_[s])(args);
    if (direct_runs_[s]) {
      // Other shapes than the recorded ones (after a graph break) take the MLX path, which retraces.
      return direct_runs_[s]->accepts(args) ? (*direct_runs_[s])(args) : (*compiled_[s])(args);
    }
    if (direct_tried_[s]) return (*compiled_[s])(args);
    direct_tried_[s] = true;
    const std::vector<mx::array> own = DirectRun::own_handles(args);
    std::vector<mx::array> outs = (*compiled_[s])(own);
    std::vector<std::string> blockers;
    direct_runs_[s] = DirectRun::record(own, outs, &blockers);
    direct_->count(direct_runs_[s].has_value(), blockers);
    // The first call runs directly too once recorded: left to mx::eval, its graph ran on MLX's stream
    // thread with its encoding ahead, and the peak memory of a large batch moved by a buffer or two from
    // run to run (all-MiniLM-L6 b32: 135-166 MB).
    if (direct_runs_[s]) return (*direct_runs_[s])(args);
    return outs;
  }

  // The function mx::compile traces for one segment. Host values it produces
  // depend only on the plan's key, so they are captured once, here.
  std::vector<mx::array> trace_segment(const Step& step, const std::vector<mx::array>& args) {
    Environment scope(call_env_);
    for (size_t i = 0; i < args.size(); ++i) {
      // The traced arguments are bare arrays: give them back the element type
      // of the values they stand for (float8 held as float32...).
      const Value* outer = call_env_ != nullptr ? call_env_->find(step.traced_inputs[i]) : nullptr;
      const bool tensor = outer != nullptr && outer->is_tensor();
      scope.set(step.traced_inputs[i], tensor ? Value(args[i], outer->element_type()) : Value(args[i]));
    }
    run_nodes(graph_, step.begin, step.end, scope, exec_);
    for (const std::string& name : step.host_outputs) constants_.set(name, *scope.find(name));
    std::vector<mx::array> outs;
    outs.reserve(step.traced_outputs.size());
    for (const std::string& name : step.traced_outputs) {
      const Value* v = scope.find(name);
      if (!v->is_tensor()) {
        throw Error(str("compiled segment output '", name, "' is ", v->describe(), ", not a tensor"));
      }
      outs.push_back(v->tensor());
      element_types_[name] = v->element_type();
    }
    return outs;
  }

  const BoundGraph& graph_;
  const SegmentLayout& layout_;
  const Execution exec_;
  Environment constants_;                  // initializers + captured host values
  const Environment* call_env_ = nullptr;  // the running call's scope, for tracing
  std::vector<std::unique_ptr<CompiledFunction>> compiled_;  // null for eager steps
  DirectTally* const direct_;                                // null: no direct runs
  std::vector<std::optional<DirectRun>> direct_runs_;        // per step: its direct run, once recorded
  std::vector<bool> direct_tried_;
  // ONNX element types of the segments' outputs, seen while tracing: only
  // arrays cross the compiled boundary, and float8/int4... are held widened.
  std::unordered_map<std::string, OnnxType> element_types_;
};

// The plans of one calling thread. MLX keeps its compile cache per thread, so
// plans (and their compiled functions) are never shared between threads.
struct Executor {
  // MLX keys compiled functions by the thread's default stream, which the
  // thread's first evaluation settles: without this, a thread's first plan
  // would be traced twice (tests/mlx_bridge/compiled_function_test.cpp).
  Executor() { mx::eval(mx::add(mx::array(0.0f), mx::array(0.0f))); }

  mx::detail::CompileCacheWeakPtr cache = mx::detail::compile_cache();
  std::list<std::pair<std::string, std::unique_ptr<Plan>>> plans;  // most recently used first
};

}  // namespace

std::string signature_of(const Inputs& inputs, const std::set<std::string>& static_inputs) {
  std::map<std::string, const Value*> sorted;
  for (const auto& [name, value] : inputs) sorted[name] = &value;
  std::ostringstream key;
  for (const auto& [name, value] : sorted) {
    key << name << ':';
    if (!value->is_tensor()) {
      // Strings, sequences and optionals are read by eager steps only; their
      // kind and size select the plan, never baked-in contents.
      key << value->describe() << ';';
      continue;
    }
    const mx::array& a = value->tensor();
    key << a.dtype() << '[';
    for (int d : a.shape()) key << d << ',';
    key << ']';
    if (static_inputs.count(name)) {
      mx::array c = mx::contiguous(a);
      mx::eval(c);
      key << '=' << std::string(c.data<char>(), c.nbytes());
    }
    key << ';';
  }
  return key.str();
}

struct CompiledModel::State {
  State(Model m, CompileOptions o) : model(std::move(m)), options(std::move(o)) {}

  Model model;
  CompileOptions options;
  std::set<std::string> static_inputs;
  std::set<std::string> traced_params;  // empty unless options.params_as_arguments
  SegmentLayout layout;

  DirectTally direct;  // segments recorded for direct runs over all plans, and what kept the others off
  std::mutex mutex;  // guards executors and stats
  std::unordered_map<std::thread::id, std::unique_ptr<Executor>> executors;
  CompileStats stats;

  const BoundGraph& bound() const { return *model.internal_state().bound; }

  // The calling thread's executor. A thread id can be reused after its thread
  // exits; the compile cache tells the new thread from the old one.
  Executor& executor_for_this_thread() {
    std::lock_guard lock(mutex);
    auto it = executors.find(std::this_thread::get_id());
    if (it != executors.end() && is_current_compile_cache(it->second->cache)) return *it->second;
    // New thread, or a reused id: drop the executors of exited threads.
    std::erase_if(executors, [](const auto& entry) { return entry.second->cache.expired(); });
    std::unique_ptr<Executor>& slot = executors[std::this_thread::get_id()];
    slot = std::make_unique<Executor>();
    return *slot;
  }

  Plan& plan_for(Executor& executor, const std::string& key) {
    auto& plans = executor.plans;
    for (auto it = plans.begin(); it != plans.end(); ++it) {
      if (it->first == key) {
        plans.splice(plans.begin(), plans, it);
        count([](CompileStats& s) { ++s.cache_hits; });
        return *plans.front().second;
      }
    }
    Execution exec{options.device.value_or(default_device()), options.memory_limit};
    set_cpu_buffer_cache(exec.device, options.cpu_buffer_cache);
    const bool fuse = options.fuse_elementwise.value_or(exec.device != mx::Device::cpu);
    plans.emplace_front(key, std::make_unique<Plan>(bound(), layout, exec, model.params(), fuse,
                                                    options.direct_cpu_runs ? &direct : nullptr));
    size_t evicted = 0;
    while (plans.size() > std::max<size_t>(options.cache_size, 1)) {
      plans.pop_back();
      ++evicted;
    }
    count([evicted](CompileStats& s) {
      ++s.plans_built;
      s.evictions += evicted;
    });
    return *plans.front().second;
  }

  // Replacements for traced params must keep what the plans were traced for.
  void check_params(const Params& params) const {
    for (const auto& [name, value] : params) {
      if (!traced_params.count(name)) {
        throw InputError(str("param '", name, "' is not a float initializer of the model that ops read as data"));
      }
      const mx::array& stored = model.params().at(name);
      if (value.shape() != stored.shape() || value.dtype() != stored.dtype()) {
        throw InputError(str("param '", name, "' must keep its shape and dtype"));
      }
    }
  }

  template <typename Update>
  void count(Update update) {
    std::lock_guard lock(mutex);
    update(stats);
  }
};

Outputs CompiledModel::operator()(const Inputs& inputs) { return call(inputs, nullptr); }

Outputs CompiledModel::operator()(const Params& params, const Inputs& inputs) {
  if (!state_->options.params_as_arguments) {
    throw InputError("params can be passed to a CompiledModel only when it is compiled with params_as_arguments");
  }
  return call(inputs, &params);
}

Outputs CompiledModel::call(const Inputs& inputs, const Params* params) {
  State& s = *state_;
  const Inputs typed_inputs = validate_inputs(*s.bound().graph, inputs);
  if (params != nullptr) s.check_params(*params);
  std::string key = signature_of(typed_inputs, s.static_inputs);
  Executor& executor = s.executor_for_this_thread();
  bound_cpu_eval_lookahead(s.options.device.value_or(default_device()), s.options.cpu_eval_lookahead,
                           s.options.cpu_kernel_lookahead);
  return s.plan_for(executor, key).call(typed_inputs, params);
}

CompileStats CompiledModel::stats() const {
  std::lock_guard lock(state_->mutex);
  CompileStats stats = state_->stats;
  stats.segments = state_->layout.compiled_segments;
  stats.graph_breaks = state_->layout.graph_breaks;
  stats.direct_segments = state_->direct.segments.load();
  std::lock_guard blockers_lock(state_->direct.mutex);
  stats.direct_blockers.assign(state_->direct.blockers.begin(), state_->direct.blockers.end());
  return stats;
}

void prepare_to_compile() { start_compiler_probe(); }

CompiledModel compile(const Model& model, const Inputs& example_inputs, const CompileOptions& options) {
  start_compiler_probe();  // overlaps whatever the caller does before the first call
  secure_kernel_cache();   // before MLX compiles its first kernel
  auto state = std::make_shared<CompiledModel::State>(model, options);
  for (const std::string& name : options.static_inputs) {
    bool known = false;
    for (const ValueInfo& in : model.inputs()) known = known || in.name == name;
    if (!known) throw InputError(str("static input '", name, "' is not an input of the model"));
    state->static_inputs.insert(name);
  }
  if (options.params_as_arguments) state->traced_params = trainable_params(state->bound());
  state->layout = plan_segments(state->bound(), state->static_inputs, state->traced_params);
  CompiledModel compiled(state);
  if (!example_inputs.empty()) {
    Outputs warm = compiled(example_inputs);
    for (const Value& v : warm.values) {
      if (v.is_tensor()) mx::eval(v.tensor());
    }
  }
  return compiled;
}

}  // namespace transmuter
