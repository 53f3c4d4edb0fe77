// Runs a pipeline's model eagerly or through one lazily built CompiledModel, as PipelineOptions say.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "transmuter/pipelines.h"
#include "transmuter/runtime.h"

namespace transmuter::pipelines {

class ModelRunner {
 public:
  /** static_inputs: inputs whose values join a compiled plan's key (read on the host). */
  ModelRunner(const Model& model, const PipelineOptions& options, std::vector<std::string> static_inputs = {})
      : model_(model), options_(options), static_inputs_(std::move(static_inputs)) {}

  /** Compiled when the options ask for it and `may_compile`; the CompiledModel is built on the first
   * compiled call (with those inputs as the example) and shared by later calls and threads. */
  Outputs operator()(const Inputs& inputs, bool may_compile = true) const {
    if (options_.mode == ExecutionMode::kEager || !may_compile) {
      RunOptions run_options;
      run_options.device = options_.device;
      return run(model_, model_.params(), inputs, run_options);
    }
    std::optional<CompiledModel> plan;
    {
      std::lock_guard lock(mutex_);
      if (!compiled_) {
        CompileOptions compile_options;
        compile_options.device = options_.device;
        compile_options.static_inputs = static_inputs_;
        compiled_ = compile(model_, inputs, compile_options);
      }
      plan = compiled_;
    }
    return (*plan)(inputs);
  }

  CompileStats stats() const {
    std::lock_guard lock(mutex_);
    return compiled_ ? compiled_->stats() : CompileStats{};
  }

 private:
  const Model& model_;
  PipelineOptions options_;
  std::vector<std::string> static_inputs_;
  mutable std::mutex mutex_;
  mutable std::optional<CompiledModel> compiled_;
};

}  // namespace transmuter::pipelines
