#include "runtime/compiler.h"

#include <atomic>
#include <list>
#include <sstream>

#include <mlx/compile_impl.h>
#include <mlx/mlx.h>

#include "runtime/inputs.h"
#include "runtime/interpreter.h"
#include "transmuter/error.h"
#include "transmuter/runtime.h"

namespace transmuter {

namespace {

// Ids for mx::detail::compile. Small integers never collide with the code
// addresses MLX uses as ids for compiled function pointers.
std::uintptr_t next_compile_id() {
  static std::atomic<std::uintptr_t> counter{1};
  return counter++;
}

// The compiled functions and captured host values for one input signature.
struct Plan {
  const Graph* graph = nullptr;
  const SegmentLayout* layout = nullptr;
  mx::Device device = mx::Device::cpu;
  Environment constants;                      // initializers + captured host values
  const Environment* call_env = nullptr;      // the running call's scope, for tracing
  std::vector<std::uintptr_t> compile_ids;
  std::vector<std::function<std::vector<mx::array>(const std::vector<mx::array>&)>> compiled;

  ~Plan() {
    auto cache = mx::detail::compile_cache();
    for (std::uintptr_t id : compile_ids) mx::detail::compile_erase(cache, id);
  }

  // The function mx::compile traces for one segment.
  std::vector<mx::array> trace_segment(const Step& step, const std::vector<mx::array>& args) {
    Environment scope(call_env);
    for (size_t i = 0; i < args.size(); ++i) scope.set(step.traced_inputs[i], args[i]);
    run_nodes(*graph, step.begin, step.end, scope, device);
    for (const std::string& name : step.host_outputs) constants.set(name, *scope.find(name));
    std::vector<mx::array> outs;
    outs.reserve(step.traced_outputs.size());
    for (const std::string& name : step.traced_outputs) {
      const Value* v = scope.find(name);
      if (!v->is_tensor()) {
        throw Error(str("compiled segment output '", name, "' is ", v->describe(), ", not a tensor"));
      }
      outs.push_back(v->tensor());
    }
    return outs;
  }

  void build(const Params& params) {
    bind_initializers(*graph, &params, constants);
    for (size_t s = 0; s < layout->steps.size(); ++s) {
      const Step& step = layout->steps[s];
      if (step.eager) {
        compiled.emplace_back();
        compile_ids.push_back(0);
        continue;
      }
      std::uintptr_t id = next_compile_id();
      auto fn = [this, &step](const std::vector<mx::array>& args) { return trace_segment(step, args); };
      compiled.push_back(mx::detail::compile(fn, id));
      compile_ids.push_back(id);
    }
  }

  Outputs call(const Inputs& inputs) {
    Environment env(&constants);
    for (const auto& [name, value] : inputs) env.set(name, value);
    call_env = &env;
    for (size_t s = 0; s < layout->steps.size(); ++s) {
      const Step& step = layout->steps[s];
      if (step.eager) {
        run_nodes(*graph, step.begin, step.end, env, device);
        continue;
      }
      std::vector<mx::array> args;
      args.reserve(step.traced_inputs.size());
      for (const std::string& name : step.traced_inputs) {
        const Value* v = env.find(name);
        if (v == nullptr || !v->is_tensor()) {
          throw Error(str("compiled segment input '", name, "' is ", v ? v->describe() : "missing"));
        }
        args.push_back(v->tensor());
      }
      std::vector<mx::array> outs = compiled[s](args);
      for (size_t i = 0; i < outs.size(); ++i) env.set(step.traced_outputs[i], outs[i]);
    }
    call_env = nullptr;
    return collect_outputs(*graph, env);
  }
};

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

}  // namespace

struct CompiledModel::State {
  Model model;
  CompileOptions options;
  std::set<std::string> static_inputs;
  SegmentLayout layout;
  CompileStats stats;
  // Most recently used first.
  std::list<std::pair<std::string, std::unique_ptr<Plan>>> plans;

  Plan& plan_for(const std::string& key) {
    for (auto it = plans.begin(); it != plans.end(); ++it) {
      if (it->first == key) {
        plans.splice(plans.begin(), plans, it);
        ++stats.cache_hits;
        return *plans.front().second;
      }
    }
    auto plan = std::make_unique<Plan>();
    plan->graph = &model.graph();
    plan->layout = &layout;
    plan->device = options.device.value_or(default_device());
    plan->build(model.params());
    plans.emplace_front(key, std::move(plan));
    ++stats.plans_built;
    while (plans.size() > std::max<size_t>(options.cache_size, 1)) {
      plans.pop_back();
      ++stats.evictions;
    }
    return *plans.front().second;
  }
};

Outputs CompiledModel::operator()(const Inputs& inputs) {
  State& s = *state_;
  validate_inputs(s.model.graph(), inputs);
  Plan& plan = s.plan_for(signature_of(inputs, s.static_inputs));
  s.stats.segments = s.layout.compiled_segments;
  s.stats.graph_breaks = s.layout.graph_breaks;
  return plan.call(inputs);
}

const CompileStats& CompiledModel::stats() const { return state_->stats; }

CompiledModel compile(const Model& model, const Inputs& example_inputs, const CompileOptions& options) {
  auto state = std::make_shared<CompiledModel::State>(CompiledModel::State{model, options, {}, {}, {}, {}});
  for (const std::string& name : options.static_inputs) {
    bool known = false;
    for (const ValueInfo& in : model.inputs()) known = known || in.name == name;
    if (!known) throw InputError(str("static input '", name, "' is not an input of the model"));
    state->static_inputs.insert(name);
  }
  state->layout = plan_segments(model.graph(), state->static_inputs);
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
