#include "mlx_bridge/compiled_function.h"

#include <mlx/compile.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <future>
#include <mutex>
#include <system_error>

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

// MLX's answer to "can this process compile?", settled by wrapping a function that is never called
// (mx::detail::compile asks before it wraps; nothing enters a compile cache).
void ask_mlx_whether_it_compiles() {
  (void)mx::detail::compile([](const std::vector<mx::array>& args) { return args; }, next_compile_id());
}

// The one probe of the process. A std::async future's last copy waits for the thread at exit.
const std::shared_future<void>& compiler_probe() {
  static const std::shared_future<void> probe = [] {
    try {
      return std::async(std::launch::async, ask_mlx_whether_it_compiles).share();
    } catch (const std::system_error&) {  // no thread to spare: ask here
      ask_mlx_whether_it_compiles();
      std::promise<void> done;
      done.set_value();
      return done.get_future().share();
    }
  }();
  return probe;
}

// MLX builds every compiled function after the probe: its answer lives in an unguarded static.
CompiledFunction::Fn compile_after_probe(CompiledFunction::Fn fn, std::uintptr_t id) {
  compiler_probe().wait();
  return mx::detail::compile(std::move(fn), id);
}

}  // namespace

void start_compiler_probe() { (void)compiler_probe(); }

CompiledFunction::CompiledFunction(Fn fn, bool fuse)
    : id_(next_compile_id()),
      cache_(mx::detail::compile_cache()),
      compiled_(compile_after_probe(std::move(fn), id_)),
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
