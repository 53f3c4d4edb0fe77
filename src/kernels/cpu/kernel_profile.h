// Where a run's kernel time goes, per kernel and shape: with
// $TRANSMUTER_KERNEL_PROFILE set (to anything but "0"), every CpuKernel task is
// timed on the thread that runs it, and at exit the totals are printed to
// stderr, largest first: kernel name, first input's and first output's shape,
// calls, total and mean time. A development aid for choosing what to speed up
// (perf attributes samples to functions, not to the layers that called them);
// unset, it costs one branch per kernel.
#pragma once

#include <string>

#include "kernels/cpu/cpu_kernel.h"

namespace transmuter::kernels {

/** True when $TRANSMUTER_KERNEL_PROFILE asks for the profile (read once). */
bool kernel_profile_enabled();

/** `task`, timed into the profile under `key` when it runs. */
KernelTask profiled_task(std::string key, KernelTask task);

/** The profile key of a kernel call: "name in-shape -> out-shape". */
std::string kernel_profile_key(const char* name, const std::vector<mx::array>& inputs,
                               const std::vector<mx::array>& outputs);

}  // namespace transmuter::kernels
