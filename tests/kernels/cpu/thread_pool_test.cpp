#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace transmuter::kernels {
namespace {

// Each index of [0, count) is visited exactly once, for chunkings that divide
// count evenly, leave a short last chunk, or hold everything in one chunk.
TEST(ThreadPool, VisitsEveryIndexOnce) {
  for (int64_t count : {1, 7, 64, 1000, 4097}) {
    for (int64_t grain : {1, 3, 64, 5000}) {
      std::vector<std::atomic<int>> visits(static_cast<size_t>(count));
      parallel_for(count, grain, [&](int64_t begin, int64_t end) {
        EXPECT_LE(end - begin, grain);
        for (int64_t i = begin; i < end; ++i) visits[static_cast<size_t>(i)]++;
      });
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(visits[static_cast<size_t>(i)], 1) << count << "/" << grain << " at " << i;
    }
  }
}

TEST(ThreadPool, EmptyRangeCallsNothing) {
  bool called = false;
  parallel_for(0, 4, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPool, RethrowsAnExceptionOfTheBodyAfterAllChunksRan) {
  std::atomic<int64_t> done{0};
  EXPECT_THROW(parallel_for(100, 1,
                            [&](int64_t begin, int64_t) {
                              done++;
                              if (begin == 50) throw std::runtime_error("chunk 50");
                            }),
               std::runtime_error);
  EXPECT_EQ(done, 100);
}

// A kernel inside a job (or a second stream's kernel) finds the pool busy and
// runs inline: no deadlock, every index still visited once.
TEST(ThreadPool, NestedAndConcurrentCallsComplete) {
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t, int64_t) {
    parallel_for(100, 10, [&](int64_t begin, int64_t end) { total += end - begin; });
  });
  EXPECT_EQ(total, 800);

  std::atomic<int64_t> concurrent{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int call = 0; call < 50; ++call) {
        parallel_for(256, 16, [&](int64_t begin, int64_t end) { concurrent += end - begin; });
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(concurrent, 4 * 50 * 256);
}

TEST(ThreadPool, UsesAtLeastOneThread) { EXPECT_GE(kernel_threads(), 1); }

}  // namespace
}  // namespace transmuter::kernels
