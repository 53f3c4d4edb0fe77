#include "mlx_bridge/compiled_function.h"

#include <mlx/compile.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

namespace transmuter {

namespace {

// MLX uses the address of a plain function as its id; small integers never
// collide with code addresses.
std::uintptr_t next_compile_id() {
  static std::atomic<std::uintptr_t> counter{1};
  return counter++;
}

// Holds MLX's process-wide compile mode at no_fuse while any thread traces
// without fusion; the last one out restores the mode MLX starts with
// (`disabled` under $MLX_DISABLE_COMPILE, else `enabled`; MLX has no getter for
// a mode set by the application, which a concurrent trace here would override).
class ScopedNoFuse {
 public:
  ScopedNoFuse() {
    std::lock_guard lock(mutex());
    if (users()++ == 0) mx::set_compile_mode(mx::CompileMode::no_fuse);
  }
  ~ScopedNoFuse() {
    std::lock_guard lock(mutex());
    if (--users() == 0) {
      mx::set_compile_mode(std::getenv("MLX_DISABLE_COMPILE") != nullptr ? mx::CompileMode::disabled
                                                                        : mx::CompileMode::enabled);
    }
  }
  ScopedNoFuse(const ScopedNoFuse&) = delete;
  ScopedNoFuse& operator=(const ScopedNoFuse&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static int& users() {
    static int n = 0;
    return n;
  }
};

}  // namespace

CompiledFunction::CompiledFunction(Fn fn, bool fuse)
    : id_(next_compile_id()),
      cache_(mx::detail::compile_cache()),
      compiled_(mx::detail::compile(std::move(fn), id_)),
      fuse_(fuse) {}

std::vector<mx::array> CompiledFunction::operator()(const std::vector<mx::array>& args) {
  if (fuse_) return compiled_(args);
  // MLX traces again for argument shapes or dtypes it has not seen.
  std::vector<std::pair<mx::Shape, mx::Dtype>> signature;
  signature.reserve(args.size());
  for (const mx::array& a : args) signature.emplace_back(a.shape(), a.dtype());
  if (std::find(traced_signatures_.begin(), traced_signatures_.end(), signature) != traced_signatures_.end()) {
    return compiled_(args);
  }
  ScopedNoFuse no_fuse;
  std::vector<mx::array> outputs = compiled_(args);
  traced_signatures_.push_back(std::move(signature));
  return outputs;
}

CompiledFunction::~CompiledFunction() { mx::detail::compile_erase(cache_, id_); }

bool is_current_compile_cache(const mx::detail::CompileCacheWeakPtr& cache) {
  auto mine = mx::detail::compile_cache().lock();
  return mine != nullptr && mine == cache.lock();
}

}  // namespace transmuter
