// What the generation tests share when they compare with transformers' recorded generate() outputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "transmuter/pipelines.h"

namespace transmuter::testing {

/** transformers keeps generating pad tokens in rows that already stopped; ours end at their eos. */
inline std::vector<int64_t> until_eos(std::vector<int64_t> tokens, int64_t eos) {
  auto it = std::find(tokens.begin(), tokens.end(), eos);
  if (it != tokens.end()) tokens.erase(it + 1, tokens.end());
  return tokens;
}

/** One way of running a generation pipeline, for parameterized tests. */
struct GenerationMode {
  pipelines::KvCache cache;
  pipelines::ExecutionMode execution;
  const char* name;
};

}  // namespace transmuter::testing
