#include "passes/pass_manager.h"

#include <unordered_set>

#include "graph/subgraphs.h"

namespace transmuter {

namespace {

// A pass that replaces weights leaves the old initializers unread; they would
// still be reported as params and kept in memory.
void drop_unread_initializers(Graph& graph) {
  std::unordered_set<std::string> read;
  for (const Node& node : graph.nodes) {
    for (const std::string& name : node_reads(node)) read.insert(name);
  }
  for (const ValueInfo& output : graph.outputs) read.insert(output.name);
  std::erase_if(graph.initializers, [&](const auto& entry) { return !read.contains(entry.first); });
}

}  // namespace

const std::vector<Pass>& default_passes() {
  static const std::vector<Pass> passes = {
      {"fold_batch_norm_into_conv", fold_batch_norm_into_conv},
      {"fuse_conv_activation", fuse_conv_activation},  // after BatchNorm folding: Conv -> BN -> Relu
      {"fuse_attention", fuse_attention},
      {"fuse_gelu", fuse_gelu},
      {"fuse_skip_layer_norm", fuse_skip_layer_norm},
  };
  return passes;
}

std::vector<std::string> run_passes(Graph& graph, const std::vector<Pass>& passes) {
  std::vector<std::string> applied;
  for (const Pass& pass : passes) {
    if (pass.run(graph) > 0) applied.emplace_back(pass.name);
  }
  if (!applied.empty()) drop_unread_initializers(graph);
  return applied;
}

}  // namespace transmuter
