// Evaluation of a lazy CPU graph on the calling thread, without MLX's scheduler.
//
// mx::eval walks a graph, orders it, and hands each primitive's work to the CPU stream's thread. For an
// eager run of a small model that costs more than the kernels do: int8 MiniLM-L6 at 16 tokens evaluates
// 140 primitives in ~0.63 ms through MLX against ~0.41 ms as a compiled plan's direct run (session
// "thirteenth" in docs/roadmap.md). The calling thread sits idle meanwhile, and while it encodes, it
// competes for the cores with the stream's thread and the kernels' worker. When every primitive of the
// graph is a Transmuter CPU kernel or a view, evaluate_here runs them itself, in the graph's order --
// the same kernels as a direct run (runtime/direct_run.h), on the graph's own arrays, which end up
// evaluated as mx::eval leaves them (detached, their inputs released so that buffers are donated alike).
#pragma once

#include <string>
#include <vector>

#include <mlx/array.h>

namespace transmuter {

namespace mx = mlx::core;

/** Evaluates `arrays` (lazy or not) on the calling thread and returns true, when every unevaluated
 * primitive of their graph is a Transmuter CPU kernel or a view on a CPU stream and none is traced by a
 * function transformation (mx::vjp, mx::compile...). Otherwise evaluates nothing and returns false, with
 * the names of the primitives that need MLX's scheduler in `blockers` (when given): the caller then uses
 * mx::eval. */
bool evaluate_here(const std::vector<mx::array>& arrays, std::vector<std::string>* blockers = nullptr);

}  // namespace transmuter
