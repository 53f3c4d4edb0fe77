// Running a model: eagerly (run) or through mx::compile (compile).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <mlx/device.h>

#include "transmuter/model.h"
#include "transmuter/value.h"

namespace transmuter {

/** Named inputs. Tensors convert implicitly: `{{"input_ids", ids}}`. */
using Inputs = std::unordered_map<std::string, Value>;

/** Outputs in the model's declared order. Arrays are lazy MLX arrays:
 * evaluate them (mx::eval) or feed them to further MLX code. */
struct Outputs {
  std::vector<std::string> names;
  std::vector<Value> values;

  /** The output called `name`; throws transmuter::Error if there is none. */
  const Value& at(const std::string& name) const;
  /** Shortcut for at(name).tensor(). */
  const mx::array& tensor(const std::string& name) const;
  size_t size() const { return values.size(); }
};

/** One node of the top-level graph as RunOptions::node_hook sees it, just
 * after it ran. The graph is the model's after its load-time passes (load
 * with LoadOptions::run_passes = false to see the ONNX file's own nodes). */
struct NodeRun {
  size_t index;               // position in the graph
  const std::string& name;    // may be empty
  const std::string& domain;  // "" for the default ONNX domain
  const std::string& op_type;
  const std::vector<std::string>& input_names;   // "" for an omitted optional input
  const std::vector<std::string>& output_names;  // "" for an omitted optional output
  /** The node's outputs, one per output name (lazy MLX arrays). The hook may
   * replace them: later nodes, and the run's outputs, read what it leaves. */
  std::vector<Value>& outputs;
};

/** Called by run() after each node of the top-level graph (subgraph bodies
 * excluded), in graph order. */
using NodeHook = std::function<void(NodeRun&)>;

struct RunOptions {
  /** Where ops run; default: the GPU when MLX has one, else the CPU. */
  std::optional<mx::Device> device;
  /** Largest tensor, in bytes, that one op may produce; larger ones are
   * refused with an OpError before MLX allocates them. 0: the machine's
   * physical memory. */
  uint64_t memory_limit = 0;
  /** On a CPU device, the limit of MLX's buffer cache (mx::set_cache_limit,
   * process-wide) that runs set. Unset: 0 where MLX has no GPU, so that freed
   * intermediates go back to malloc, which reuses their memory for requests of
   * any size; MLX's cache hands a buffer out again only for a request of
   * nearly its size, so with a large limit a run kept one buffer of each
   * size it had freed (the transmuter CLI, on tcmalloc: peak RSS of
   * ResNet-50 b8 291 -> 237 MB, all-MiniLM-L6 b32 160 -> 135 MB, speed
   * unchanged). malloc may give large freed buffers back to the system, to be
   * faulted in again on the next run (glibc unmaps those over its mmap
   * threshold, at most 32 MiB): a larger limit keeps them. Where MLX has a
   * GPU, unset leaves its limit alone (that cache also holds GPU buffers).
   * Transmuter calls MLX only when the value changes, so a limit set by the
   * caller in between stays until then. */
  std::optional<size_t> cpu_buffer_cache = std::nullopt;
  /** On a CPU device, how many bytes MLX's evaluation may allocate ahead of
   * the computation. MLX encodes up to ~100 ops before the first one has run,
   * and each encoded op holds its output buffer, so a large batch's peak
   * memory was several times its live tensors (all-MiniLM-L6 at batch 32:
   * 582 MiB, ORT 255). Each run sets MLX's memory limit
   * (mx::set_memory_limit, process-wide; evaluation waits while the active
   * memory is over it, it never fails) to the active memory when the run
   * starts plus this budget, which brought that case to 263 MiB at ~1 % of
   * its speed. 0 leaves MLX's limit alone. Default: 128 MiB. */
  std::optional<size_t> cpu_eval_lookahead = std::nullopt;
  /** On a CPU device, how many bytes of Transmuter's CPU kernels' outputs may
   * be allocated ahead of the computation: before encoding a kernel, the
   * evaluating thread waits while earlier kernels that have not finished hold
   * more than this, or more than a quarter of it behind two or more of them
   * (never while none is pending, so the stream is not left idle). Unlike
   * cpu_eval_lookahead it waits for the oldest kernel only: all-MiniLM-L6 at
   * batch 32 peaked at 200 MiB instead of 284 and ResNet-50 at batch 8 at
   * 291-314 instead of 429, at the same speed (docs/roadmap.md). Process-wide,
   * as MLX's memory limit; 0 turns it off. Default: 8 MiB. */
  std::optional<size_t> cpu_kernel_lookahead = std::nullopt;
  /** Sees (and may replace) every node's outputs: for inspecting a run
   * (`transmuter run --dump-all`, scripts/diff) and for interventions such as
   * activation patching. A run with a hook runs every node: it neither
   * replays nor records the values that runs of the same input signature
   * otherwise share. Eager runs only: compiled plans (compile()) never call it. */
  NodeHook node_hook = nullptr;
  /** On a CPU device, the outputs are evaluated before run() returns, on the
   * calling thread, when every primitive of their graph is a Transmuter CPU
   * kernel or a view and no function transformation (mx::value_and_grad,
   * mx::compile...) traces them; otherwise they come back lazy, as the graph
   * the ops built. mx::eval's scheduling cost small models more than their
   * kernels took (int8 MiniLM-L6 at 16 tokens: docs/roadmap.md, session
   * "thirteenth"). false: always lazy, e.g. to evaluate the outputs with
   * arrays of your own in one mx::eval. */
  bool evaluate_cpu_outputs = true;
};

/** Runs the graph once, eagerly (safe to call from many threads at once on
 * one Model): ops build a lazy MLX graph, and values that
 * an op needs on the host (shapes, NonZero...) are evaluated as it goes.
 * `params` replaces the model's initializers of the same name (this is how
 * mx::value_and_grad differentiates with respect to weights). */
Outputs run(const Model& model, const Params& params, const Inputs& inputs,
            const RunOptions& options = {});

struct CompileOptions {
  /** Inputs whose values are fixed per call site and read on the host (they
   * join the cache key). */
  std::vector<std::string> static_inputs;
  /** Compiled plans kept, keyed by input shapes, dtypes and static values. */
  size_t cache_size = 8;
  std::optional<mx::Device> device;
  /** As RunOptions::memory_limit; a plan whose tensors exceed it is refused
   * while it is traced. */
  uint64_t memory_limit = 0;
  /** Float initializers (those no op reads on the host) become arguments of
   * the compiled functions instead of constants: calls may pass new values
   * (operator()(params, inputs)) without a new plan, and mx::value_and_grad
   * differentiates with respect to them (fine-tuning). */
  bool params_as_arguments = false;
  /** Let MLX fuse elementwise ops into kernels it generates and builds with the
   * system compiler when a plan is first traced. On a GPU that is fast and
   * pays; on the CPU the generated code is scalar, and building it costs
   * seconds per kernel when MLX's kernel cache is empty (34 s for a 3-layer
   * BERT), so unset means: fuse on GPU devices, not on the CPU (where
   * Transmuter's own kernels cover the hot elementwise work). */
  std::optional<bool> fuse_elementwise = std::nullopt;
  /** As RunOptions::cpu_buffer_cache, applied when a plan is built. */
  std::optional<size_t> cpu_buffer_cache = std::nullopt;
  /** As RunOptions::cpu_eval_lookahead, applied at every call. */
  std::optional<size_t> cpu_eval_lookahead = std::nullopt;
  /** As RunOptions::cpu_kernel_lookahead, applied at every call. */
  std::optional<size_t> cpu_kernel_lookahead = std::nullopt;
  /** On a CPU device, run a compiled segment whose graph is made of Transmuter's CPU kernels and views
   * directly: the kernels one after the other on the calling thread, without MLX rebuilding the graph,
   * ordering it and handing each kernel to its stream's thread (src/runtime/direct_run.h). The outputs
   * are then already evaluated when the call returns, and equal those of the MLX path. Calls whose
   * arguments are being traced (mx::value_and_grad, mx::compile around the model) take the MLX path. */
  bool direct_cpu_runs = true;
};

/** Counters of a CompiledModel's plan cache. */
struct CompileStats {
  size_t plans_built = 0;   // cache misses (per thread: each thread builds its own)
  size_t cache_hits = 0;
  size_t evictions = 0;
  size_t segments = 0;      // compiled segments in the last plan used
  size_t graph_breaks = 0;  // eager nodes between them in the last plan used
  size_t direct_segments =
      0;  // compiled segments that run directly (CompileOptions::direct_cpu_runs), summed over plans
  /** The MLX primitives that kept the other CPU segments off direct runs (sorted, each once): the ops
   * that a Transmuter kernel would have to cover for them to run directly. */
  std::vector<std::string> direct_blockers;
};

/** A model compiled for repeated calls. The graph is split at graph breaks
 * (ops that need values computed from data); each run of nodes between breaks
 * is one mx::compile'd function.
 *
 * Threads: a CompiledModel may be called from any number of threads at once.
 * MLX traces and caches compiled functions per thread, so each calling thread
 * gets its own plans (its own plan LRU of `cache_size`), built on its first
 * call with a new input signature; stats() sums over threads. A copy is a
 * handle to the same state. */
class CompiledModel {
 public:
  Outputs operator()(const Inputs& inputs);
  /** With CompileOptions::params_as_arguments: runs with `params` in place of
   * the model's float initializers of the same name (same shapes and dtypes;
   * others keep the model's values). Throws InputError otherwise. */
  Outputs operator()(const Params& params, const Inputs& inputs);
  /** A snapshot of the counters, summed over all calling threads. */
  CompileStats stats() const;

  struct State;
  explicit CompiledModel(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  Outputs call(const Inputs& inputs, const Params* params);

  std::shared_ptr<State> state_;
};

/** Starts, on a thread of its own, the check MLX makes once per process before it first compiles:
 * whether the system compiler runs, asked of the shell (2.8 ms of a fork and two execs on the
 * benchmark machine), whether or not any kernel will be generated. compile() starts it and the
 * first plan waits for it; a caller that knows it will compile can start it before load(), which
 * then hides it. Idempotent and cheap after the first call. */
void prepare_to_compile();

/** Compiles `model`; builds (and caches) the plan for `example_inputs`. */
CompiledModel compile(const Model& model, const Inputs& example_inputs,
                      const CompileOptions& options = {});

/** The device used when none is given: GPU when available, else CPU. */
mx::Device default_device();

}  // namespace transmuter
