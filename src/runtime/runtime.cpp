#include <mlx/mlx.h>

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

Outputs run(const Model& model, const Params& params, const Inputs& inputs, const RunOptions& options) {
  const BoundGraph& bound = *model.internal_state().bound;
  const Graph& graph = *bound.graph;
  const Inputs typed_inputs = validate_inputs(graph, inputs);
  Execution exec{options.device.value_or(default_device()), options.memory_limit};
  Environment env;
  bind_initializers(graph, &params, env);
  for (const auto& [name, value] : typed_inputs) env.set(name, value);
  bind_omitted_optionals(graph, typed_inputs, env);
  run_nodes(bound, 0, bound.size(), env, exec);
  return collect_outputs(graph, env);
}

}  // namespace transmuter
