// Runs a test body once per SIMD target this CPU supports (Highway's run-time
// dispatch, restricted to one target at a time), so that the kernels' code for
// older targets (AVX2, SSE4 on an AVX-512 machine) is tested too, not only the
// target that dispatch would pick.
#pragma once

#include <hwy/targets.h>

#include <cstdint>
#include <string>

namespace transmuter::testing {

/** body(target name) under each supported target; dispatch is restored after. Returns how many ran. */
template <typename Body>
int for_each_simd_target(Body&& body) {
  const int64_t supported = hwy::SupportedTargets();
  int ran = 0;
  for (int64_t targets = supported; targets != 0; targets &= targets - 1) {
    const int64_t target = targets & ~(targets - 1);
    hwy::SetSupportedTargetsForTest(target);
    hwy::SupportedTargets();  // makes dispatch choose `target`
    body(std::string(hwy::TargetName(target)));
    ++ran;
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::SupportedTargets();
  return ran;
}

}  // namespace transmuter::testing
