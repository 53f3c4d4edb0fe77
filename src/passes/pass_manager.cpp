#include "passes/pass_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
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
      {"compute_in_float32", compute_in_float32},  // first: the fusions and packing see float32 weights
      {"qdq_as_qlinear", qdq_as_qlinear},  // QDQ convolutions and adds as integer operators (VNNI), then
      {"fold_constant_dequantize", fold_constant_dequantize},  // QDQ weights as initializers the others take
      {"qlinear_convs_nhwc", qlinear_convs_nhwc},      // QOperator convolutions on the integer kernels (VNNI)
      {"qlinear_conv_as_conv", qlinear_conv_as_conv},  // the other QOperator convolutions as float ones
      {"fold_batch_norm_into_conv", fold_batch_norm_into_conv},
      {"fuse_conv_activation", fuse_conv_activation},  // after BatchNorm folding: Conv -> BN -> Relu
      {"fuse_attention", fuse_attention},
      {"fuse_rotary_embedding", fuse_rotary_embedding},
      {"fuse_gelu", fuse_gelu},
      {"fuse_skip_layer_norm", fuse_skip_layer_norm},
      {"keep_float32_islands", keep_float32_islands},  // after the norm fusions: wraps what stays decomposed
      {"channels_last_convs", channels_last_convs},    // after the BatchNorm and activation fusions
      {"fuse_depthwise_blocks", fuse_depthwise_blocks},        // on channels_last_convs' ConvNhwc nodes
      {"winograd_convs", winograd_convs},                      // on channels_last_convs' 3x3 ConvNhwc nodes
      {"fuse_quantize_dequantize", fuse_quantize_dequantize},  // after the layout moved through the pairs
      {"fuse_qlinear_conv_add", fuse_qlinear_conv_add},  // after channels_last_convs moved the adds' layout
      {"pack_matmul_nbits", pack_matmul_nbits},
      {"pack_qmoe_weights", pack_qmoe_weights},
      {"pack_integer_matmul_weights", pack_integer_matmul_weights},
      {"pack_matmul_weights", pack_matmul_weights},  // takes the bias Adds and GELUs the others left
      {"fuse_gated_mlp", fuse_gated_mlp},  // stacks the packed (quantized or float) gate and up weights
      {"gather_rows_in_place", gather_rows_in_place},  // last: on the tables no other pass took
  };
  return passes;
}

std::vector<Pass> select_passes(const std::vector<std::string>& names) {
  if (names.empty()) return default_passes();
  std::vector<Pass> selected;
  for (const Pass& pass : default_passes()) {
    if (std::find(names.begin(), names.end(), pass.name) != names.end()) selected.push_back(pass);
  }
  for (const std::string& name : names) {
    auto known = [&](const Pass& pass) { return pass.name == name; };
    if (std::none_of(default_passes().begin(), default_passes().end(), known)) {
      std::string list;
      for (const Pass& pass : default_passes()) list += (list.empty() ? "" : ", ") + std::string(pass.name);
      throw std::invalid_argument("unknown load-time pass '" + name + "' (passes: " + list + ")");
    }
  }
  return selected;
}

bool load_profile_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TRANSMUTER_LOAD_PROFILE");
    return value != nullptr && std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

std::vector<std::string> run_passes(Graph& graph, const std::vector<Pass>& passes) {
  std::vector<std::string> applied;
  for (const Pass& pass : passes) {
    const auto start = std::chrono::steady_clock::now();
    const size_t rewrites = pass.run(graph);
    if (load_profile_enabled()) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "load profile: pass %-28.*s %8.3f ms, %zu rewrite(s)\n",
                   static_cast<int>(pass.name.size()), pass.name.data(), ms, rewrites);
    }
    if (rewrites > 0) applied.emplace_back(pass.name);
  }
  if (!applied.empty()) drop_unread_initializers(graph);
  return applied;
}

}  // namespace transmuter
