#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace transmuter::kernels {

namespace {

int online_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int threads_from_environment() {
  if (const char* text = std::getenv("TRANSMUTER_NUM_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(text, &end, 10);
    if (end != text && *end == '\0' && n > 0) return static_cast<int>(std::min(n, 256L));
  }
  return online_cores();
}

// One parallel_for call: its chunks are claimed by index from an atomic counter.
struct Job {
  const std::function<void(int64_t, int64_t)>* body;
  int64_t count;
  int64_t grain;
  int64_t chunks;
  std::atomic<int64_t> next_chunk{0};
  // Changed under ThreadPool::state_mutex_; read without it by the caller's spin (finish()).
  std::atomic<int> workers_inside{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  void run_chunks() {
    for (int64_t c = next_chunk.fetch_add(1); c < chunks; c = next_chunk.fetch_add(1)) {
      const int64_t begin = c * grain;
      try {
        (*body)(begin, std::min(count, begin + grain));
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
};

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { work(); });
  }

  // False when another job holds the pool (the caller then runs alone).
  bool try_run(Job& job) {
    std::unique_lock job_lock(job_mutex_, std::try_to_lock);
    if (!job_lock.owns_lock()) return false;
    {
      std::lock_guard lock(state_mutex_);
      job_ = &job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    job.run_chunks();
    finish(job);
    return true;
  }

 private:
  // How long an idle worker polls for the next job before it sleeps: kernels
  // of one model follow each other within microseconds, while a futex wake-up
  // costs about as much as a small kernel. It polls with sched_yield, not a
  // busy pause loop: a matmul often follows a kernel at once, and OpenBLAS's
  // worker then needs this core.
  static constexpr std::chrono::microseconds kSpin{50};
  // How long a caller polls for the workers to finish their last chunks before it sleeps.
  static constexpr std::chrono::microseconds kFinishSpin{500};

  // Waits until the workers inside `job` have left it. They are at most one chunk from done, so the
  // caller polls first: sleeping on the condition variable put its core to sleep, and in a virtual
  // machine waking a sleeping core costs tens of microseconds (futex wake-ups were ~3 % of MiniLM-L3's
  // samples at 16 tokens; polling made it 0.83x the time, median of 12 alternating rounds).
  void finish(Job& job) {
    {
      std::lock_guard lock(state_mutex_);
      job_ = nullptr;  // late workers skip it; those inside finish their chunks
    }
    const auto until = std::chrono::steady_clock::now() + kFinishSpin;
    while (job.workers_inside.load(std::memory_order_acquire) != 0) {
      std::this_thread::yield();  // the core to a runnable thread (the eager graph builder), if any
      if (std::chrono::steady_clock::now() > until) {
        std::unique_lock lock(state_mutex_);
        left_.wait(lock, [&] { return job.workers_inside.load(std::memory_order_relaxed) == 0; });
        return;
      }
    }
    // The last worker may still hold state_mutex_ (it notifies under it): take it once so that the
    // Job, on the caller's stack, outlives every use the workers make of it.
    std::lock_guard lock(state_mutex_);
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      spin_for_new_generation(seen);
      std::unique_lock lock(state_mutex_);
      wake_.wait(lock, [&] { return job_ != nullptr && generation_.load(std::memory_order_acquire) != seen; });
      seen = generation_.load(std::memory_order_acquire);
      Job* job = job_;
      job->workers_inside.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      job->run_chunks();
      lock.lock();
      if (job->workers_inside.fetch_sub(1, std::memory_order_acq_rel) == 1) left_.notify_all();
    }
  }

  void spin_for_new_generation(uint64_t seen) const {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    while (generation_.load(std::memory_order_acquire) == seen) {
      std::this_thread::yield();
      if (std::chrono::steady_clock::now() > until) return;
    }
  }

  std::vector<std::thread> workers_;
  std::mutex job_mutex_;    // held by the caller of the running job
  std::mutex state_mutex_;  // guards job_ and Job::workers_inside
  std::condition_variable wake_;
  std::condition_variable left_;
  std::atomic<uint64_t> generation_{0};
  Job* job_ = nullptr;
};

ThreadPool& pool() {
  // Never destroyed: workers may still be asleep in it while the process exits.
  static ThreadPool* instance = new ThreadPool(kernel_threads() - 1);
  return *instance;
}

void run_inline(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  for (int64_t begin = 0; begin < count; begin += grain) body(begin, std::min(count, begin + grain));
}

}  // namespace

int kernel_threads() {
  static const int threads = threads_from_environment();
  return threads;
}

void parallel_for(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (count <= grain || kernel_threads() == 1) {
    run_inline(count, grain, body);
    return;
  }
  Job job;
  job.body = &body;
  job.count = count;
  job.grain = grain;
  job.chunks = (count + grain - 1) / grain;
  if (!pool().try_run(job)) {
    run_inline(count, grain, body);
    return;
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace transmuter::kernels
