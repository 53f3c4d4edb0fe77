// A function compiled by MLX under an id of ours, so that its entry in MLX's
// compile cache can be erased when the function is dropped.
//
// MLX internals used (pinned to the MLX version; tests/mlx_bridge checks them):
// mx::detail::compile(fn, id) and mx::detail::compile_erase(cache, id). Since
// MLX 0.32 each thread has its own compile cache (mx::detail::compile_cache()
// is thread_local), so a CompiledFunction remembers the cache of the thread
// that created it and erases from that one, whichever thread destroys it.
//
// Fusion: MLX's CPU backend turns each fused elementwise subgraph into C++
// source and builds it with the system compiler the first time it is traced,
// which costs seconds per kernel with an empty kernel cache (34 s for a
// 3-layer BERT). A CompiledFunction made without fusion traces under MLX's
// `no_fuse` compile mode (graph simplification still runs), set around the
// calls that trace: the first one for each argument signature. MLX's compile mode is
// process-wide and has no getter; see ScopedNoFuse in the .cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <mlx/array.h>
#include <mlx/compile_impl.h>

namespace transmuter {

namespace mx = mlx::core;

class CompiledFunction {
 public:
  using Fn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

  /** Wraps `fn` in MLX's compile. Call the result only on the creating thread:
   * MLX traces and caches per thread. `fuse`: let MLX fuse elementwise ops
   * into run-time compiled kernels. */
  explicit CompiledFunction(Fn fn, bool fuse = true);
  ~CompiledFunction();
  CompiledFunction(const CompiledFunction&) = delete;
  CompiledFunction& operator=(const CompiledFunction&) = delete;

  std::vector<mx::array> operator()(const std::vector<mx::array>& args);

  /** True while the creating thread's compile cache still exists (the thread
   * has not exited). */
  bool cache_alive() const { return !cache_.expired(); }

 private:
  std::uintptr_t id_;
  mx::detail::CompileCacheWeakPtr cache_;
  Fn compiled_;
  bool fuse_;
  // Argument shapes and dtypes already traced (without fusion).
  std::vector<std::vector<std::pair<mx::Shape, mx::Dtype>>> traced_signatures_;
};

/** Starts MLX's one check per process of whether it can compile, on a thread of its own (idempotent).
 * Before it first compiles anything, MLX asks the shell whether the system compiler runs
 * (JitCompiler::available: std::system("g++ --version"), a fork and two execs: 2.8 ms here), even
 * for a function whose kernels it will not generate (fusion off), and keeps the answer in a static
 * it does not guard. Every CompiledFunction is built after this probe has finished, so started
 * early it costs the first compiled call nothing; started by that call, the call waits for it. */
void start_compiler_probe();

/** True when the calling thread's MLX compile cache is `cache`. */
bool is_current_compile_cache(const mx::detail::CompileCacheWeakPtr& cache);

}  // namespace transmuter
