// What src/mlx_bridge relies on in MLX's internals. These tests fail loudly
// when an MLX upgrade changes it: re-check docs/architecture.md ("MLX internals
// used") before updating them.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <mlx/mlx.h>
#include <mlx/primitives.h>
#include <mlx/version.h>

#include "mlx_bridge/compiled_function.h"
#include "mlx_bridge/kernel_cache.h"

namespace transmuter {
namespace {

TEST(MlxBridge, PinnedMlxVersion) {
  // scripts/requirements.txt pins the wheel; the internals below were checked against it.
  EXPECT_EQ(std::string(mx::version()), "0.32.4");
}

TEST(MlxBridge, CompileCacheIsPerThread) {
  // The per-thread executors of CompiledModel exist because of this.
  auto mine = mx::detail::compile_cache().lock();
  std::shared_ptr<void> other;
  std::thread([&] { other = mx::detail::compile_cache().lock(); }).join();
  ASSERT_NE(mine, nullptr);
  EXPECT_NE(std::static_pointer_cast<void>(mine), other);
  EXPECT_TRUE(is_current_compile_cache(mx::detail::compile_cache()));
}

TEST(MlxBridge, CompiledFunctionTracesOncePerThreadAndShape) {
  // MLX keys cache entries by the thread's default stream, which its first
  // evaluation settles: evaluate once so that the counts below are exact.
  mx::eval(mx::add(mx::array(1.f), mx::array(2.f)));
  std::atomic<int> traces{0};
  CompiledFunction f([&](const std::vector<mx::array>& in) {
    ++traces;
    return std::vector<mx::array>{mx::multiply(in[0], mx::array(2.f))};
  });
  mx::array y = f({mx::array({1.f, 2.f})})[0];
  EXPECT_EQ(mx::sum(y).item<float>(), 6.f);
  EXPECT_EQ(traces.load(), 1) << "first call";
  f({mx::array({3.f, 4.f})});
  EXPECT_EQ(traces.load(), 1);  // same shape: cached
  f({mx::array({1.f, 2.f, 3.f})});
  EXPECT_EQ(traces.load(), 2);  // new shape: retraced
}

// Without fusion the traced graph keeps MLX's own elementwise primitives; with
// it, a chain of elementwise ops becomes one run-time compiled kernel. Checked
// for every argument signature (a new shape retraces), and the process-wide
// mode is restored afterwards (a plain mx::compile fuses again).
TEST(MlxBridge, CompiledFunctionWithoutFusionKeepsElementwisePrimitives) {
  auto chain = [](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::add(mx::multiply(mx::exp(in[0]), mx::array(3.f)), mx::array(1.f))};
  };
  auto output_primitive = [](mx::array y) { return std::string(y.primitive().name()); };
  CompiledFunction unfused(chain, /*fuse=*/false);
  EXPECT_EQ(output_primitive(unfused({mx::array({1.f, 2.f})})[0]), "Add");
  EXPECT_EQ(output_primitive(unfused({mx::ones({2, 3})})[0]), "Add");
  secure_kernel_cache();  // the fused kernel is built into the private folder, as compile() does
  CompiledFunction fused(chain, /*fuse=*/true);
  EXPECT_TRUE(output_primitive(fused({mx::array({1.f, 2.f})})[0]).starts_with("Compiled"));
  mx::array y = unfused({mx::array({0.f})})[0];
  EXPECT_FLOAT_EQ(y.item<float>(), 4.f);
}

TEST(MlxBridge, DestroyingErasesTheEntryOfTheCreatingThread) {
  // After a CompiledFunction is gone, a new one (new id) traces afresh, and
  // destroying one from another thread is allowed.
  std::atomic<int> traces{0};
  auto fn = [&](const std::vector<mx::array>& in) {
    ++traces;
    return std::vector<mx::array>{mx::negative(in[0])};
  };
  auto f = std::make_unique<CompiledFunction>(fn);
  (*f)({mx::array({1.f})});
  std::thread([&] { f.reset(); }).join();
  CompiledFunction g(fn);
  g({mx::array({1.f})});
  EXPECT_EQ(traces.load(), 2);
  EXPECT_TRUE(g.cache_alive());
}

}  // namespace
}  // namespace transmuter
