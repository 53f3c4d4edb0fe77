// What the single-kernel benchmarks (attention_bench, gqa_bench) share: reading an integer option and
// timing one evaluation of a kernel's output per run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <mlx/mlx.h>

namespace transmuter::bench {

/** The integer after argv[i], moving i past it; exits with status 2, naming `tool` and the option, when
 * there is none. */
inline int int_option(int argc, char** argv, int& i, const char* tool) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s: %s needs a value\n", tool, argv[i]);
    std::exit(2);
  }
  return std::atoi(argv[++i]);
}

/** Microseconds of mx::eval of `output_of(run)` for `runs` runs, sorted, after 10 runs that warm the
 * kernel thread pool and the allocator. Only the evaluation is timed, not the building of the output. */
inline std::vector<double> sorted_eval_us(int runs, const std::function<mlx::core::array(int)>& output_of) {
  std::vector<double> us;
  for (int run = 0; run < runs + 10; ++run) {
    mlx::core::array y = output_of(run);
    const auto t0 = std::chrono::steady_clock::now();
    mlx::core::eval(y);
    const double elapsed =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (run >= 10) us.push_back(elapsed);
  }
  std::sort(us.begin(), us.end());
  return us;
}

}  // namespace transmuter::bench
