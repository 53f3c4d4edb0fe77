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

// One parallel_for call. Its chunks are dealt out as one contiguous range per thread (the caller's
// first): a thread claims chunks from the front of its own range, each range's counter on its own cache
// line, and only once that is empty takes chunks from the others' ranges. So each core mostly runs one
// block of neighbouring chunks -- the same block of rows, layer after layer, whose inputs its own cache
// then holds -- and the cores do not pass a counter's cache line back and forth on every chunk. One
// shared counter dealt the chunks alternately: when this host's cross-core latency rose tenfold (30 ->
// 330 ns one way), the int8 MobileNetV2 took 2.4 ms on two threads against 1.7 ms on one.
struct Job {
  static constexpr int kMaxRanges = 32;  // more threads share ranges (still balanced by taking)
  struct alignas(64) Range {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };

  const std::function<void(int64_t, int64_t)>* body;
  int64_t count;
  int64_t grain;
  int64_t chunks;
  int ranges = 1;
  Range range[kMaxRanges];
  // Changed under ThreadPool::state_mutex_; read without it by the caller's spin (finish()).
  std::atomic<int> workers_inside{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  // One range per thread, as long as there are chunks for them.
  void deal(int threads) {
    ranges = static_cast<int>(std::clamp<int64_t>(threads, 1, std::min<int64_t>(chunks, kMaxRanges)));
    for (int r = 0; r < ranges; ++r) {
      range[r].next.store(chunks * r / ranges, std::memory_order_relaxed);
      range[r].end = chunks * (r + 1) / ranges;
    }
  }

  // Runs chunks until none is left unclaimed, starting with range `home`.
  void run_chunks(int home) {
    for (int i = 0; i < ranges; ++i) {
      Range& r = range[(home + i) % ranges];
      for (int64_t c = r.next.fetch_add(1, std::memory_order_relaxed); c < r.end;
           c = r.next.fetch_add(1, std::memory_order_relaxed))
        run_chunk(c);
    }
  }

  void run_chunk(int64_t c) {
    const int64_t begin = c * grain;
    try {
      (*body)(begin, std::min(count, begin + grain));
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
};

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { work(i + 1); });
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
    job.run_chunks(0);
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

  void work(int home) {
    uint64_t seen = 0;
    for (;;) {
      spin_for_new_generation(seen);
      std::unique_lock lock(state_mutex_);
      wake_.wait(lock, [&] { return job_ != nullptr && generation_.load(std::memory_order_acquire) != seen; });
      seen = generation_.load(std::memory_order_acquire);
      Job* job = job_;
      job->workers_inside.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      job->run_chunks(home % job->ranges);
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

}  // namespace

int64_t packing_grain(int64_t item_bytes) {
  constexpr int64_t kChunkBytes = int64_t{64} << 10;
  return std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, item_bytes));
}

int kernel_threads() {
  static const int threads = threads_from_environment();
  return threads;
}

void parallel_for(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  Job job;
  job.body = &body;
  job.count = count;
  job.grain = std::max<int64_t>(grain, 1);
  job.chunks = (count + job.grain - 1) / job.grain;
  const bool alone = job.chunks == 1 || kernel_threads() == 1;
  job.deal(alone ? 1 : kernel_threads());
  if (alone || !pool().try_run(job)) job.run_chunks(0);  // a busy pool: the caller takes every range
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace transmuter::kernels
