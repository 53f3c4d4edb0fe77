#include <map>
#include <set>

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
const std::vector<std::string>& Model::passes_applied() const { return state_->passes_applied; }

int64_t Model::opset(const std::string& domain) const {
  auto it = state_->graph->opsets.find(domain == "ai.onnx" ? "" : domain);
  return it == state_->graph->opsets.end() ? 0 : it->second;
}

std::map<std::string, size_t> Model::op_histogram() const {
  std::map<std::string, size_t> histogram;
  for (const Node& node : state_->graph->nodes) {
    histogram[(node.domain.empty() ? "" : node.domain + ".") + node.op_type]++;
  }
  return histogram;
}

std::vector<std::string> Model::inputs_read_on_host() const {
  const std::set<std::string> read_on_host = host_read_names(*state_->bound);
  std::vector<std::string> names;
  for (const ValueInfo& input : inputs()) {
    if (read_on_host.count(input.name)) names.push_back(input.name);
  }
  return names;
}

}  // namespace transmuter
