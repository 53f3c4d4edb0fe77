// A compiled segment run without MLX's evaluation machinery, when its graph allows it.
//
// Each call of an mx::compile'd function rebuilds its graph (new arrays for every primitive), and mx::eval
// then walks it, orders it, and hands each primitive's task to the CPU stream's thread, which sleeps
// between calls. For a 1-ms CNN that is ~10 % of the time: ~20 us of graph, ~20-30 us before the stream's
// thread starts the first kernel (a futex wake-up in this VM), ~1 us a primitive between kernels
// (measured on the int8 MobileNetV2 and PP-LCNet rec, session "eleventh" in docs/roadmap.md).
//
// A DirectRun is recorded from the graph of one call: the primitives in order, each input a slot (an
// argument, a constant, an earlier output). When every primitive that depends on the arguments is a
// Transmuter CPU kernel or a view (Reshape, Transpose, Broadcast, ExpandDims, Squeeze), later calls run
// that list on the calling thread: kernels through CpuKernel::run_here, views through their eval_cpu
// (which only points the output at the input's buffer). Primitives that depend on constants alone (a
// zero point widened, a scale reshaped) are evaluated once, at recording. The results are evaluated
// arrays, as an mx::eval of the compiled function's outputs would leave them, and the kernels are the
// same, so the values are too.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <mlx/array.h>

namespace transmuter {

namespace mx = mlx::core;

class DirectRun {
 public:
  /** The run of `outputs` -- the unevaluated results of one call of a compiled function -- over that
   * call's `args`, or nullopt (and in `blockers`, the names of the primitives that need MLX's scheduler,
   * sorted, each once) when the graph has a primitive that is neither a CPU kernel nor a view. Constant parts
   * are evaluated here. */
  static std::optional<DirectRun> record(const std::vector<mx::array>& args,
                                         const std::vector<mx::array>& outputs,
                                         std::vector<std::string>* blockers = nullptr);

  /** Handles of their own for `args` (computed first when lazy), sharing their buffers: the arguments to
   * pass to the call that is recorded. The graph names arrays by identity, and the caller's arrays may
   * repeat (one array passed for two inputs) or be constants of the graph too (an initializer passed as
   * an input), which would tie those uses to one slot. */
  static std::vector<mx::array> own_handles(const std::vector<mx::array>& args);

  /** True when `args` have the shapes and types of the recorded call's: the tape's shapes hold for them
   * only. A segment after a graph break can see other shapes under the same plan (NonZero's count). */
  bool accepts(const std::vector<mx::array>& args) const;

  /** The outputs for new `args` (accepted ones), evaluated on the calling thread. */
  std::vector<mx::array> operator()(const std::vector<mx::array>& args) const;

  size_t steps() const;

  struct Tape;

 private:
  explicit DirectRun(std::shared_ptr<const Tape> tape) : tape_(std::move(tape)) {}
  std::shared_ptr<const Tape> tape_;
};

}  // namespace transmuter
