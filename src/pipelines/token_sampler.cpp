// TokenSampler: the token choice of transformers' _sample loop for one sequence: the processors, then
// torch.argmax (greedy) or torch.multinomial(softmax(scores)) (sampling). The random draw cannot
// repeat torch's generator; it is our own categorical draw over a standard engine, so that a seed gives
// the same tokens on every run and platform (std::discrete_distribution's algorithm is unspecified).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "transmuter/generation.h"

namespace transmuter::generation {
namespace {

std::mt19937_64 seeded_engine(uint64_t seed, uint64_t row) {
  // seed_seq's mixing is specified by the standard; it spreads nearby (seed, row) pairs apart.
  std::seed_seq sequence{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                         static_cast<uint32_t>(row), static_cast<uint32_t>(row >> 32)};
  return std::mt19937_64(sequence);
}

/** Uniform in [0, 1) from the top 53 bits of one engine output. */
double uniform01(std::mt19937_64& engine) { return static_cast<double>(engine() >> 11) * 0x1.0p-53; }

}  // namespace

TokenSampler::TokenSampler(GenerationConfig config, uint64_t row)
    : processor_(std::move(config)), engine_(seeded_engine(processor_.config().seed, row)) {}

int64_t TokenSampler::next(std::span<float> logits, std::span<const int64_t> history, size_t generated,
                           size_t max_length) {
  processor_.apply(logits, history, generated, max_length);
  return processor_.config().do_sample ? draw(logits) : argmax_token(logits);
}

int64_t TokenSampler::draw(std::span<const float> processed_logits) {
  float max = -std::numeric_limits<float>::infinity();
  for (float x : processed_logits) max = std::max(max, x);
  if (max == -std::numeric_limits<float>::infinity())
    throw GenerationConfigError("sampling: every logit is -inf (the processors masked every token)");
  // Unnormalized softmax weights in double; a target in [0, total) picks the first index whose running
  // sum passes it. Masked tokens weigh exactly 0 and so are never picked.
  std::vector<double> weights(processed_logits.size());
  double total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    weights[i] = std::exp(static_cast<double>(processed_logits[i]) - max);
    total += weights[i];
  }
  const double target = uniform01(engine_) * total;
  double cumulative = 0;
  int64_t last_weighted = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] == 0) continue;
    cumulative += weights[i];
    last_weighted = static_cast<int64_t>(i);
    if (cumulative > target) return last_weighted;
  }
  return last_weighted;  // rounding left the target at the very top
}

}  // namespace transmuter::generation
