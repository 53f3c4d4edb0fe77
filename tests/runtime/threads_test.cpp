// The thread contract (docs/architecture.md, "Threads"): one loaded Model run
// eagerly and one CompiledModel called from many threads at once, each thread
// with its own sequence length, give the single-threaded results.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include <mlx/mlx.h>

#include "support/graph_builder.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

constexpr int kThreads = 8;
constexpr int kCallsPerThread = 200;

std::string bert_path() { return std::string(TRANSMUTER_SOURCE_DIR) + "/tests/models/bert/model.onnx"; }

Inputs bert_inputs(int sequence_length) {
  mx::array ids = mx::random::randint(0, 1000, {1, sequence_length}, mx::int64, mx::random::key(sequence_length));
  return {{"input_ids", ids},
          {"attention_mask", mx::ones({1, sequence_length}, mx::int64)},
          {"token_type_ids", mx::zeros({1, sequence_length}, mx::int64)}};
}

// Same ops, same shapes, same thread count inside OpenBLAS per call: results
// are expected bit-identical; 1e-6 only absorbs a possible change of BLAS
// partitioning when calls run concurrently (outputs are O(1)).
void expect_close(const mx::array& got, const mx::array& expected, std::atomic<int>& mismatches) {
  if (!mx::allclose(got, expected, 0.0, 1e-6).item<bool>()) ++mismatches;
}

// Each thread uses its own sequence length and one shared with all others, so
// plans are built, hit and (for `cache_size` 1) evicted concurrently.
template <typename Call>
int run_threads(Call call, const std::map<int, mx::array>& reference) {
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int lengths[2] = {3 + t, 16};
      const Inputs inputs[2] = {bert_inputs(lengths[0]), bert_inputs(lengths[1])};
      for (int i = 0; i < kCallsPerThread; ++i) {
        int k = i % 2;
        mx::array y = call(inputs[k]);
        expect_close(y, reference.at(lengths[k]), mismatches);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return mismatches.load();
}

std::map<int, mx::array> reference_outputs(const Model& model) {
  std::map<int, mx::array> reference;
  for (int length : {3, 4, 5, 6, 7, 8, 9, 10, 16}) {
    mx::array y = run(model, model.params(), bert_inputs(length), {mx::Device::cpu}).tensor("last_hidden_state");
    mx::eval(y);
    reference.emplace(length, y);
  }
  return reference;
}

// prepare_to_compile() asks MLX on a thread of its own whether it can compile, and MLX keeps the answer
// in a static it does not guard: plans built meanwhile on other threads wait for that probe (TSan
// checks the ordering in scripts/sanitize; this test comes first in its file, so that in the sanitizer
// binary the probe is likelier still running).
TEST(Threads, PlansBuiltOnEightThreadsWhileMlxProbesTheCompiler) {
  Model model = testing::GraphBuilder()
                    .input("x", OnnxType::kFloat, {-1})
                    .node("Neg", {"x"}, {"y"})
                    .output("y")
                    .build();
  prepare_to_compile();
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      prepare_to_compile();
      CompiledModel compiled = compile(model, {}, {.static_inputs = {}, .device = mx::Device::cpu});
      mx::array y = compiled({{"x", mx::array({1.f, float(t)})}}).tensor("y");
      if (mx::sum(y).item<float>() != -1.f - float(t)) ++mismatches;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Threads, EagerRunsOfOneModelFromEightThreads) {
  const Model model = load(bert_path());
  const std::map<int, mx::array> reference = reference_outputs(model);
  int mismatches = run_threads(
      [&](const Inputs& in) {
        mx::array y = run(model, model.params(), in, {mx::Device::cpu}).tensor("last_hidden_state");
        mx::eval(y);
        return y;
      },
      reference);
  EXPECT_EQ(mismatches, 0);
}

TEST(Threads, OneCompiledModelCalledFromEightThreads) {
  const Model model = load(bert_path());
  const std::map<int, mx::array> reference = reference_outputs(model);
  CompiledModel compiled = compile(model, {}, {.static_inputs = {}, .device = mx::Device::cpu});
  int mismatches = run_threads(
      [&](const Inputs& in) {
        mx::array y = compiled(in).tensor("last_hidden_state");
        mx::eval(y);
        return y;
      },
      reference);
  EXPECT_EQ(mismatches, 0);
  CompileStats stats = compiled.stats();
  EXPECT_EQ(stats.plans_built + stats.cache_hits, size_t{kThreads * kCallsPerThread});
  EXPECT_EQ(stats.plans_built, size_t{kThreads * 2});  // each thread builds its own two plans
}

TEST(Threads, PlansEvictedWhileOtherThreadsTrace) {
  const Model model = load(bert_path());
  const std::map<int, mx::array> reference = reference_outputs(model);
  // cache_size 1 with two alternating shapes: every call evicts and retraces.
  CompiledModel compiled = compile(model, {}, {.static_inputs = {}, .cache_size = 1, .device = mx::Device::cpu});
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int lengths[2] = {3 + t, 16};
      for (int i = 0; i < 10; ++i) {
        int length = lengths[i % 2];
        mx::array y = compiled(bert_inputs(length)).tensor("last_hidden_state");
        expect_close(y, reference.at(length), mismatches);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(compiled.stats().evictions, size_t{kThreads * 9});
}

TEST(Threads, APlanOutlivesTheThreadThatBuiltIt) {
  Model model = testing::GraphBuilder().input("x", OnnxType::kFloat, {-1}).node("Neg", {"x"}, {"y"}).output("y").build();
  CompiledModel compiled = compile(model, {}, {.static_inputs = {}, .device = mx::Device::cpu});
  // Threads that exit leave executors whose compile caches are gone; a new
  // thread (possibly with a reused id) must build its own plan.
  for (int round = 0; round < 4; ++round) {
    std::thread([&] {
      mx::array y = compiled({{"x", mx::array({1.f, 2.f})}}).tensor("y");
      EXPECT_EQ(mx::sum(y).item<float>(), -3.f);
    }).join();
  }
  EXPECT_EQ(compiled.stats().plans_built, 4u);
  CompiledModel copy = compiled;  // a handle to the same state
  EXPECT_EQ(mx::sum(copy({{"x", mx::array({5.f})}}).tensor("y")).item<float>(), -5.f);
  EXPECT_EQ(compiled.stats().plans_built, 5u);
}

}  // namespace
}  // namespace transmuter
