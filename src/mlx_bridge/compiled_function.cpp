#include "mlx_bridge/compiled_function.h"

#include <atomic>

namespace transmuter {

namespace {

// MLX uses the address of a plain function as its id; small integers never
// collide with code addresses.
std::uintptr_t next_compile_id() {
  static std::atomic<std::uintptr_t> counter{1};
  return counter++;
}

}  // namespace

CompiledFunction::CompiledFunction(Fn fn)
    : id_(next_compile_id()), cache_(mx::detail::compile_cache()), compiled_(mx::detail::compile(std::move(fn), id_)) {}

CompiledFunction::~CompiledFunction() { mx::detail::compile_erase(cache_, id_); }

bool is_current_compile_cache(const mx::detail::CompileCacheWeakPtr& cache) {
  auto mine = mx::detail::compile_cache().lock();
  return mine != nullptr && mine == cache.lock();
}

}  // namespace transmuter
