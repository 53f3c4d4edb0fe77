#include <filesystem>
#include <set>
#include <tuple>

#include "onnx/model_file.h"
#include "ops/registry.h"
#include "runtime/model_state.h"
#include "transmuter/error.h"

namespace transmuter {

const std::vector<ValueInfo>& Model::inputs() const { return state_->graph->inputs; }
const std::vector<ValueInfo>& Model::outputs() const { return state_->graph->outputs; }
const Params& Model::params() const { return state_->params; }
const std::map<std::string, int64_t>& Model::opsets() const { return state_->graph->opsets; }
int64_t Model::ir_version() const { return state_->ir_version; }
const std::string& Model::producer() const { return state_->producer; }
size_t Model::node_count() const { return state_->graph->nodes.size(); }
const Graph& Model::graph() const { return *state_->graph; }

int64_t Model::opset(const std::string& domain) const {
  auto it = state_->graph->opsets.find(domain == "ai.onnx" ? "" : domain);
  return it == state_->graph->opsets.end() ? 0 : it->second;
}

namespace {

using MissingOp = std::tuple<std::string, std::string, int64_t>;

// Binds each node (also inside subgraphs) to its registry row and collects
// every (domain, op_type, opset) that has none, so one error lists them all.
void resolve_ops(Graph& graph, const OpRegistry& registry, std::set<MissingOp>& missing) {
  for (Node& node : graph.nodes) {
    node.op = registry.find(node.domain, node.op_type, node.opset);
    if (node.op == nullptr) missing.insert({node.domain.empty() ? "ai.onnx" : node.domain, node.op_type, node.opset});
    for (Attribute& attr : node.attributes) {
      if (attr.g) resolve_ops(*attr.g, registry, missing);
      for (auto& g : attr.graphs) {
        if (g) resolve_ops(*g, registry, missing);
      }
    }
  }
}

void check_supported(Graph& graph, const std::string& source) {
  std::set<MissingOp> missing;
  resolve_ops(graph, builtin_registry(), missing);
  if (missing.empty()) return;
  std::string list;
  for (const auto& [domain, op_type, opset] : missing) {
    list += str("\n  ", domain, " ", op_type, " (opset ", opset, ")");
  }
  throw UnsupportedError(str(source, ": ", missing.size(), " operator(s) have no implementation:", list));
}

Params collect_params(const Graph& graph) {
  Params params;
  for (const auto& [name, value] : graph.initializers) {
    if (value.is_tensor()) params.emplace(name, value.tensor());
  }
  return params;
}

}  // namespace

Model make_model(std::shared_ptr<Graph> graph, const std::string& source, int64_t ir_version,
                 std::string producer) {
  check_supported(*graph, source);
  auto state = std::make_shared<Model::State>();
  state->ir_version = ir_version;
  state->producer = std::move(producer);
  state->params = collect_params(*graph);
  state->graph = std::move(graph);
  state->path = source;
  return Model(state);
}

Model load(const std::string& source, const LoadOptions& options) {
  if (source.rfind("hf://", 0) == 0) {
    throw Error(str(source, ": hf:// sources need the Hugging Face Hub client, which is not built yet"));
  }
  ModelFile file = read_model_file(std::filesystem::path(source));
  (void)options;  // load-time passes arrive with src/passes/
  std::string producer = file.producer_name + (file.producer_version.empty() ? "" : " " + file.producer_version);
  return make_model(file.graph, source, file.ir_version, producer);
}

}  // namespace transmuter
