#include "kernels/cpu/kernel_lookahead.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>

namespace transmuter::kernels {

namespace {

// A wait longer than this gives up and lets the kernel be encoded: a kernel
// task takes milliseconds, so only a stream that cannot progress reaches it.
constexpr std::chrono::milliseconds kLongestWait{200};
// A waiting evaluating thread is woken once this few kernels are pending (or half the room is free).
constexpr int64_t kWakeAtPending = 2;

std::atomic<size_t> budget_bytes{0};

// Kernel tasks admitted and not yet finished, and the bytes they allocated.
class PendingTasks {
 public:
  void admit(size_t bytes) {
    std::unique_lock lock(mutex_);
    const size_t budget = budget_bytes.load(std::memory_order_relaxed);
    if (budget != 0 && bytes != 0 && !fits(bytes, budget)) {  // a kernel allocating nothing never waits
      const auto request = requests_.insert(bytes);
      changed_.wait_for(lock, kLongestWait, [&] { return fits(bytes, budget); });
      requests_.erase(request);
    }
    ++tasks_;
    bytes_ += bytes;
  }

  void finish(size_t bytes) {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      --tasks_;
      bytes_ -= bytes;
      // Wakes a waiting thread only when the smallest request now fits, and then only once the stream is
      // down to its last few kernels or half the room is free: a wake-up costs the cores the kernels run
      // on (a futex call on the stream's thread, a context switch on a busy core), and one that lets the
      // evaluating thread encode a single kernel before it waits again came once a kernel (int8
      // MobileNetV2: ~23 a run, 5 % of its time).
      const size_t budget = budget_bytes.load(std::memory_order_relaxed);
      wake = !requests_.empty() && fits(*requests_.begin(), budget) &&
             (tasks_ <= kWakeAtPending || 2 * (bytes_ + *requests_.begin()) <= limit(budget));
    }
    if (wake) changed_.notify_all();
  }

 private:
  // One pending kernel may be followed up to the budget; behind two or more, the stream has its next
  // kernel queued and the evaluating thread keeps within a quarter of it (small kernels' outputs
  // then stay few without the stream ever waiting for the next one to be encoded).
  bool fits(size_t bytes, size_t budget) const { return tasks_ == 0 || bytes_ + bytes <= limit(budget); }
  size_t limit(size_t budget) const { return tasks_ == 1 ? budget : budget / 4; }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::multiset<size_t> requests_;  // of the threads waiting
  int64_t tasks_ = 0;
  size_t bytes_ = 0;
};

PendingTasks& pending() {
  static auto* tasks = new PendingTasks;  // never destroyed: tasks may finish during exit
  return *tasks;
}

}  // namespace

void set_kernel_lookahead(size_t bytes) { budget_bytes.store(bytes, std::memory_order_relaxed); }

size_t kernel_lookahead() { return budget_bytes.load(std::memory_order_relaxed); }

void KernelTaskTicket::finish() {
  if (finished_) return;
  finished_ = true;
  pending().finish(bytes_);
}

std::shared_ptr<KernelTaskTicket> admit_kernel_task(size_t bytes) {
  pending().admit(bytes);
  return std::make_shared<KernelTaskTicket>(bytes);
}

}  // namespace transmuter::kernels
