// How far the evaluating thread may run ahead of the CPU stream's kernel tasks.
//
// MLX evaluates a graph by encoding each op (allocating its output, queueing
// its task on the stream's thread) up to ~50 ops before the first has run, so
// every queued op holds its output buffer early. At batch 32 an encoder's
// [4096, 384] and [4096, 1536] outputs are 6-24 MiB each, and MiniLM-L6 held
// twice its live tensors. MLX's own bound (mx::set_memory_limit, which
// RunOptions::cpu_eval_lookahead sets) waits until the stream has drained
// *every* queued task group once the live tensors alone pass the limit, and
// costs 1.5x the time; this bound waits for the oldest kernel only.
//
// Before a kernel allocates its outputs, admit_kernel_task() waits while
// kernel tasks are queued or running and their new outputs plus this one's
// would pass the budget -- or a quarter of it once two or more are pending:
// the stream then has its next kernel queued, and small kernels' outputs stay
// few (MiniLM-L6 b1 s128 peaked at 119 MiB instead of 125). It never waits
// when none is pending, so the stream always has the next kernel once the
// current one ends. A waiting thread is woken once the kernel fits and the
// stream is down to two pending kernels or half the room is free, so that it
// encodes several before it waits again (a wake-up a kernel cost int8
// MobileNetV2 ~23 futex round trips a run). A wait is also cut off after a
// while (see the .cpp), so a
// stream that cannot progress (work of another device it waits on, not yet
// committed) delays, never deadlocks.
#pragma once

#include <cstddef>
#include <memory>

namespace transmuter::kernels {

/** The budget in bytes (process-wide, as MLX's memory limit); 0 turns the
 * pacing off. Set by each run on a CPU device (RunOptions::cpu_kernel_lookahead). */
void set_kernel_lookahead(size_t bytes);
size_t kernel_lookahead();

/** One admitted kernel task's bytes, counted until finish() or destruction,
 * whichever comes first: the task calls finish() when it has run; a task
 * dropped without running gives them back when destroyed. */
class KernelTaskTicket {
 public:
  explicit KernelTaskTicket(size_t bytes) : bytes_(bytes) {}
  ~KernelTaskTicket() { finish(); }
  KernelTaskTicket(const KernelTaskTicket&) = delete;
  KernelTaskTicket& operator=(const KernelTaskTicket&) = delete;
  void finish();

 private:
  size_t bytes_;
  bool finished_ = false;  // only the task's thread, or the last owner, finishes it
};

/** Waits (on the evaluating thread) until a kernel task allocating `bytes`
 * fits the budget, then counts it as pending. */
std::shared_ptr<KernelTaskTicket> admit_kernel_task(size_t bytes);

}  // namespace transmuter::kernels
