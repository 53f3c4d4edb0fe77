// The threads Transmuter's CPU kernels split their work across.
//
// MLX runs every CPU op of a stream on that stream's single thread, so a kernel
// that wants more cores brings its own threads. One process-wide pool serves
// all kernels: the calling thread (an MLX stream thread) works too, and the
// pool's workers sleep on a condition variable between jobs after polling
// briefly (yielding the core to any other runnable thread),
// so they do not take a core away from the stream thread or from the BLAS
// between kernels. Each thread starts on its own contiguous share of a job's
// chunks and then helps with the others' (see Job in the .cpp). A job is taken by one caller at a time; a
// second caller (another stream, or a kernel nested in a job) finds the pool busy and runs its loop on its
// own thread, so no call ever waits for another job.
#pragma once

#include <cstdint>
#include <functional>

namespace transmuter::kernels {

/** Threads a kernel may use, the caller included: $TRANSMUTER_NUM_THREADS when
 * set to a positive number, else the number of online cores. Read once. */
int kernel_threads();

/** Calls body(begin, end) over disjoint chunks covering [0, count), each about
 * `grain` items long (the last may be shorter), on up to kernel_threads()
 * threads, and returns when all chunks are done. Runs inline when count <=
 * grain or the pool is busy. An exception thrown by body is rethrown here
 * (the first one; the other chunks still run). */
void parallel_for(int64_t count, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& body);

/** The grain of a loop over items of `item_bytes` each that fill fresh memory (a load-time packing):
 * chunks of at least 64 KiB, so that a small weight is packed on the calling thread, where waking a
 * pool thread would cost more than the packing. */
int64_t packing_grain(int64_t item_bytes);

}  // namespace transmuter::kernels
