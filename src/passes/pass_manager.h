// Load-time rewrites of a graph, between reading the file and binding its
// nodes to the registry (src/runtime/load.cpp). One pass per file, each with
// the subgraph it matches drawn in its header comment. Passes match op types by
// name (they sit below the registry) and must leave results equal to those of
// the unrewritten graph within float rounding; each has a test that runs a
// model with and without it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "graph/graph.h"

namespace transmuter {

struct Pass {
  std::string_view name;
  /** Rewrites the main graph in place; returns the number of rewrites. */
  size_t (*run)(Graph& graph);
};

/** The passes load() runs, in order. */
const std::vector<Pass>& default_passes();

/** The default passes named in `names`, in the default order (all of them
 * when `names` is empty). Throws std::invalid_argument naming an unknown pass. */
std::vector<Pass> select_passes(const std::vector<std::string>& names);

/** Runs `passes` in order over `graph`, then drops initializers nothing reads
 * any more. Returns the names of the passes that rewrote something. With
 * $TRANSMUTER_LOAD_PROFILE set (to anything but "0"), prints each pass's time
 * and rewrites to stderr (load_profile_enabled). */
std::vector<std::string> run_passes(Graph& graph, const std::vector<Pass>& passes);

/** True when $TRANSMUTER_LOAD_PROFILE asks load() to print where its time goes (read once): a
 * development aid beside $TRANSMUTER_KERNEL_PROFILE; unset, it costs a branch per phase. */
bool load_profile_enabled();

// The passes (one file each). load() runs one of the two precision passes,
// as LoadOptions::compute_type resolves: compute_in_float32 (float32) or
// keep_float32_islands (the model's types).
size_t compute_in_float32(Graph& graph);
size_t keep_float32_islands(Graph& graph);
size_t qdq_as_qlinear(Graph& graph);
size_t fold_constant_dequantize(Graph& graph);
size_t qlinear_convs_nhwc(Graph& graph);
size_t qlinear_conv_as_conv(Graph& graph);
size_t fold_batch_norm_into_conv(Graph& graph);
size_t fuse_conv_activation(Graph& graph);
size_t fuse_attention(Graph& graph);
size_t fuse_rotary_embedding(Graph& graph);
size_t fuse_gelu(Graph& graph);
size_t fuse_skip_layer_norm(Graph& graph);
size_t channels_last_convs(Graph& graph);
size_t fuse_depthwise_blocks(Graph& graph);
size_t winograd_convs(Graph& graph);
size_t fuse_quantize_dequantize(Graph& graph);
size_t fuse_qlinear_conv_add(Graph& graph);
size_t pack_matmul_nbits(Graph& graph);
size_t pack_qmoe_weights(Graph& graph);
size_t pack_integer_matmul_weights(Graph& graph);
size_t fuse_gated_mlp(Graph& graph);
size_t pack_matmul_weights(Graph& graph);
size_t gather_rows_in_place(Graph& graph);

/** Not a default pass: LoadOptions::last_position_outputs asks for it. Cuts each named output to
 * the last position of its last-but-one axis, before the product that makes it when the nodes
 * after that product are position-wise. Throws Error for a name that is no output, or an output
 * that nodes of the graph also read. Returns the number of outputs cut. */
size_t last_position_outputs(Graph& graph, const std::vector<std::string>& outputs);

/** Not a default pass: LoadOptions::new_rows_outputs asks for it. Makes each named output, a Concat
 * of a graph input (a past) and new rows, the new rows alone; all or nothing (returns 0 and changes
 * nothing when any name is no such output). Returns the number of outputs changed. */
size_t new_rows_outputs(Graph& graph, const std::vector<std::string>& outputs);

/** Element types of the values of `graph` known without running it: declared
 * (inputs, outputs, value_info), of initializers and Constants, set by Cast
 * and other type attributes, kept by type-preserving ops (elementwise,
 * MatMul, data movement, reductions...). Shared by the precision passes. */
std::unordered_map<std::string, OnnxType> known_element_types(const Graph& graph);

}  // namespace transmuter
