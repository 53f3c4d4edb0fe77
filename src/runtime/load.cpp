// load(): read the file -> load-time passes -> bind to the registry. Reading
// (src/onnx) also inlines model-local functions and sorts the nodes.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <mlx/device.h>

#include "graph/subgraphs.h"
#include "mlx_bridge/buffers.h"
#include "onnx/model_file.h"
#include "ops/registry.h"
#include "passes/pass_manager.h"
#include "runtime/model_state.h"
#include "transmuter/error.h"
#if TRANSMUTER_WITH_HUB
#include "transmuter/hub.h"
#endif

namespace transmuter {

namespace {

Params collect_params(const Graph& graph) {
  Params params;
  for (const auto& [name, value] : graph.initializers) {
    if (value.is_tensor()) params.emplace(name, value.tensor());
  }
  return params;
}

// `describe()` names the value in an error (built only on failure).
template <typename Describe>
void materialize(const Value& value, Describe&& describe) {
  if (!value.is_tensor() || (!deferred_bytes(value.tensor()) && !pending_repack_source(value.tensor())))
    return;
  try {
    mx::array tensor = value.tensor();  // shares the value's array: evaluating it evaluates the value
    tensor.eval();
  } catch (const AllocationFailure& failure) {
    throw Error(str(describe(), ": cannot allocate ", failure.nbytes, " bytes for its copy"));
  }
}

// Copies out the tensors whose copy the reader deferred (mlx_bridge
// deferred_copy) and no pass consumed in place, and makes the repackings a
// pass deferred (deferred_repack) that no later pass replaced, so that runs
// see only evaluated weights.
void materialize_deferred(const Graph& graph) {
  for (const auto& [name, value] : graph.initializers) {
    materialize(value, [&] { return str("initializer '", name, "'"); });
  }
  for (const Node& node : graph.nodes) {
    for (const Attribute& attribute : node.attributes) {
      auto describe = [&] { return str("attribute '", attribute.name, "' of node '", node.name, "'"); };
      materialize(attribute.t, describe);
      for (const Value& tensor : attribute.tensors) materialize(tensor, describe);
    }
    for_each_subgraph(node, [](const Graph& subgraph) { materialize_deferred(subgraph); });
  }
}

// The precision passes for `compute_type`: compute_in_float32 when it resolves
// to float32, keep_float32_islands when the graph runs in its own types.
std::vector<Pass> passes_for(const LoadOptions& options) {
  bool float32 = options.compute_type == ComputeType::kFloat32 ||
                 (options.compute_type == ComputeType::kAuto && mx::default_device() == mx::Device::cpu);
  std::vector<Pass> passes = select_passes(options.only_passes);
  std::erase_if(passes, [&](const Pass& pass) {
    return pass.name == (float32 ? "keep_float32_islands" : "compute_in_float32");
  });
  return passes;
}

// Prints the time since the previous mark under `phase` when $TRANSMUTER_LOAD_PROFILE is set.
class LoadPhases {
 public:
  void mark(const char* phase) {
    if (!load_profile_enabled()) return;
    const auto now = std::chrono::steady_clock::now();
    std::fprintf(stderr, "load profile: %-33s %8.3f ms\n", phase,
                 std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

Model make_model(std::shared_ptr<Graph> graph, const std::string& source, const LoadOptions& options,
                 int64_t ir_version, std::string producer) {
  LoadPhases phases;
  auto state = std::make_shared<Model::State>();
  last_position_outputs(*graph, options.last_position_outputs);  // asked for: not one of run_passes'
  if (new_rows_outputs(*graph, options.new_rows_outputs) > 0) state->passes_applied.push_back("new_rows_outputs");
  if (options.run_passes) {
    std::vector<std::string> applied = run_passes(*graph, passes_for(options));
    state->passes_applied.insert(state->passes_applied.end(), applied.begin(), applied.end());
  }
  phases.mark("passes (in all)");
  materialize_deferred(*graph);
  release_packed_slab_tail();
  phases.mark("deferred copies, slab tail");
  state->bound = bind_graph(*graph, builtin_registry(), source);
  state->host_reads = std::make_unique<SignatureMemoCache>(*state->bound);
  state->ir_version = ir_version;
  state->producer = std::move(producer);
  state->params = collect_params(*graph);
  state->initializers.use_slots(state->bound->slots);
  bind_initializers(*graph, nullptr, state->initializers);
  state->graph = std::move(graph);
  state->source = source;
  phases.mark("binding");
  return Model(state);
}

namespace {

// The local file of a source: a path as it is, an hf:// source through the hub
// cache (downloaded when missing), with the folder its symlinks lead into.
struct LocalModel {
  std::filesystem::path file;
  std::filesystem::path link_target_dir;
};

LocalModel local_model(const std::string& source, const LoadOptions& options) {
  if (!source.starts_with("hf://")) return {source, {}};
#if TRANSMUTER_WITH_HUB
  hub::ModelFiles files = hub::download_model(source, options.dtype, options.hub ? *options.hub : hub::HubOptions{});
  return {files.model, files.blobs_dir};
#else
  (void)options;
  throw Error(str(source, ": this build has no Hugging Face Hub client (configured with -DTRANSMUTER_HUB=OFF)"));
#endif
}

}  // namespace

Model load(const std::string& source, const LoadOptions& options) {
  LoadPhases phases;
  const LocalModel local = local_model(source, options);
  ModelFile file = read_model_file(local.file, local.link_target_dir);
  phases.mark("reading the file");
  std::string producer = file.producer_name + (file.producer_version.empty() ? "" : " " + file.producer_version);
  return make_model(file.graph, source, options, file.ir_version, producer);
}

Value load_value_file(const std::string& path, const ValueInfo& declared) {
  return read_value_file(std::filesystem::path(path), declared);
}

}  // namespace transmuter
