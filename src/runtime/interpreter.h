// Executes graph nodes one by one. MLX is lazy, so running the nodes builds
// an array graph; values an op reads on the host are evaluated on demand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <mlx/device.h>

#include "graph/graph.h"
#include "ops/node_context.h"
#include "runtime/bound_graph.h"
#include "transmuter/model.h"
#include "transmuter/runtime.h"
#include "transmuter/value.h"

namespace transmuter {

/** Name -> value bindings of one scope. Lookups fall back to the enclosing
 * scope, which is how subgraphs see the names of their parent graph. A scope
 * may keep the values of one graph's names in slots (use_slots): the run of
 * that graph finds and binds them by index. */
class Environment {
 public:
  explicit Environment(const Environment* parent = nullptr) : parent_(parent) {}

  /** Keeps the values of the names of `slots` in slots from now on; call it
   * while nothing is bound. `slots` must outlive this scope. */
  void use_slots(const NameSlots& slots);
  /** The NameSlots this scope keeps in slots, or nullptr. */
  const NameSlots* slots() const { return slots_; }

  /** The value bound to `name` here or in an enclosing scope, or nullptr. */
  const Value* find(const std::string& name) const;
  /** find(slots()->names[slot]), without hashing while the enclosing scopes keep the same slots. */
  const Value* find(uint32_t slot) const;
  void set(const std::string& name, Value value);
  /** set(slots()->names[slot], value). */
  void set(uint32_t slot, Value value);

 private:
  const Value* find_here(const std::string& name) const;

  std::unordered_map<std::string, Value> values_;  // names without a slot
  const NameSlots* slots_ = nullptr;
  std::vector<Value> slot_values_;
  std::vector<bool> slot_bound_;
  const Environment* parent_;
};

/** RunOptions::cpu_buffer_cache: on a CPU device, sets MLX's buffer-cache
 * limit to `requested`, or when unset to 0 where MLX has no GPU (and leaves it
 * alone where it has one). Calls MLX only when the limit changes. */
void set_cpu_buffer_cache(const mx::Device& device, std::optional<size_t> requested);

/** RunOptions::cpu_eval_lookahead: on a CPU device, sets MLX's memory limit
 * to the active memory now plus `requested` bytes (default 128 MiB); 0 does
 * nothing. RunOptions::cpu_kernel_lookahead: on a CPU device, sets the
 * kernels' budget (kernels::set_kernel_lookahead; default 8 MiB, 0 off). */
void bound_cpu_eval_lookahead(const mx::Device& device, std::optional<size_t> requested,
                              std::optional<size_t> kernel_requested);

/** Binds the graph's initializers, replacing those named in `overrides`. */
void bind_initializers(const Graph& graph, const Params* overrides, Environment& env);

/** Binds each optional graph input the caller left out (not in `given`) to an
 * empty optional (`none`): nodes that read it see "no element" rather than a
 * missing name. */
void bind_omitted_optionals(const Graph& graph, const Inputs& given, Environment& env);

/** Where and within what limits nodes run. */
struct Execution {
  mx::Device device = mx::Device::cpu;
  // No op output tensor may need more bytes than this (checked before MLX
  // allocates it; MLX's CPU allocator does not report failures).
  uint64_t memory_limit = 0;
  // Host reads of the top-level graph's nodes: replayed from `replay_reads`
  // when it holds them, else evaluated and, for the inputs `rememberable`
  // marks (by node, then input), stored in `record_reads`
  // (runtime/host_reads.h). Subgraph bodies run without them.
  const SignatureMemo* replay_reads = nullptr;
  SignatureMemo* record_reads = nullptr;
  const std::vector<std::vector<bool>>* rememberable = nullptr;
  // Nodes whose outputs depend only on the signature (by node): taken from
  // `replay_reads` without running the node when it holds them, else stored
  // in `record_reads` (up to kMaxRememberedOutputBytes per node).
  const std::vector<bool>* replayable = nullptr;
  // RunOptions::node_hook, for the top-level graph's nodes (null: none).
  const NodeHook* node_hook = nullptr;
};

/** Outputs larger than this are computed on every run (memory over speed). */
inline constexpr size_t kMaxRememberedOutputBytes = size_t{256} << 10;

/** Runs nodes [begin, end) of `graph`, reading and writing `env`. */
void run_nodes(const BoundGraph& graph, size_t begin, size_t end, Environment& env, const Execution& exec);

/** Runs the nodes of `graph` listed in `nodes` (ascending), reading and writing `env`. */
void run_node_list(const BoundGraph& graph, const std::vector<size_t>& nodes, Environment& env,
                   const Execution& exec);

/** Runs a subgraph (If/Loop/Scan body) whose declared inputs take `inputs`;
 * names of `outer` stay visible. Returns the body's declared outputs. */
std::vector<Value> run_subgraph(const BoundGraph& body, const std::vector<Value>& inputs,
                                const Environment& outer, const Execution& exec);


/** `value` with the narrow element type `info` declares (float8, int4...),
 * when it is a tensor of that type's MLX storage dtype not yet marked as
 * such; otherwise `value` unchanged. */
Value with_declared_type(const ValueInfo& info, const Value& value);

/** The graph's declared outputs, read from `env`, in declared order, marked
 * with their declared narrow element types (with_declared_type). */
Outputs collect_outputs(const Graph& graph, const Environment& env);

}  // namespace transmuter
