// What the single-kernel benchmarks (attention_bench, gqa_bench) share: reading their options and
// timing one evaluation of a kernel's output per run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <vector>

#include <mlx/mlx.h>

namespace transmuter::bench {

/** An option that takes an integer (`value` set from the argument after it), or a flag (`flag` set true). */
struct Option {
  const char* name;
  int* value = nullptr;
  bool* flag = nullptr;
};

/** Reads argv into `options`; every other argument is an integer appended to `positional`. Exits with
 * status 2, naming `tool` and the option, when an integer option has no value. */
inline void parse_options(int argc, char** argv, const char* tool, std::initializer_list<Option> options,
                          std::vector<int>& positional) {
  for (int i = 1; i < argc; ++i) {
    const Option* match = nullptr;
    for (const Option& option : options) {
      if (std::strcmp(argv[i], option.name) == 0) match = &option;
    }
    if (match == nullptr) {
      positional.push_back(std::atoi(argv[i]));
    } else if (match->flag != nullptr) {
      *match->flag = true;
    } else if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", tool, argv[i]);
      std::exit(2);
    } else {
      *match->value = std::atoi(argv[++i]);
    }
  }
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
