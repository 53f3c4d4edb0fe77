// The logits processors of transformers' generate() (transformers/generation/logits_process.py, 5.23.0),
// one function per class, and LogitsProcessor, which chains them in _get_logits_processor's order.
// Arithmetic follows torch on CPU where a result depends on it: scalars are rounded to float32 before
// the float32 operation (tensor * python float), cumulative sums accumulate in double (torch's CPU
// cumsum), and top-p sorts as torch's CPU sort does.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "transmuter/generation.h"

namespace transmuter::generation {
namespace {

constexpr float kMasked = -std::numeric_limits<float>::infinity();

bool in_row(int64_t id, size_t vocab) { return id >= 0 && static_cast<uint64_t>(id) < vocab; }

/** softmax in float32 as torch.softmax: exp(x - max) / sum. Empty when every entry is -inf (torch
 * gives NaN there; no token survives to keep or drop). */
std::vector<float> probabilities(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  if (max == kMasked) return {};
  std::vector<float> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp(logits[i] - max);
    sum += p[i];
  }
  const float total = static_cast<float>(sum);
  for (float& v : p) v /= total;
  return p;
}

void require_positive(const char* name, size_t value) {
  if (value == 0)
    throw GenerationConfigError(str("generation config: ", name, " must be greater than 0, got 0"));
}

void require_unit_interval(const char* name, double value) {
  if (!(value >= 0 && value <= 1))
    throw GenerationConfigError(str("generation config: ", name, " must be in [0, 1], got ", value));
}

}  // namespace

void apply_repetition_penalty(std::span<float> logits, std::span<const int64_t> history, double penalty) {
  const float p = static_cast<float>(penalty);
  std::vector<bool> seen(logits.size());  // a token repeated in the history is penalized once
  for (int64_t id : history) {
    if (!in_row(id, logits.size()) || seen[id]) continue;
    seen[id] = true;
    float& x = logits[id];
    x = x < 0 ? x * p : x / p;
  }
}

void ban_repeated_ngrams(std::span<float> logits, std::span<const int64_t> history, size_t ngram_size) {
  require_positive("no_repeat_ngram_size", ngram_size);
  if (history.size() < ngram_size) return;
  // The next token completes an n-gram whose first n-1 tokens are the history's last n-1; every
  // earlier n-gram starting with those bans its last token.
  const std::span<const int64_t> prefix = history.last(ngram_size - 1);
  for (size_t start = 0; start + ngram_size <= history.size(); ++start) {
    if (!std::equal(prefix.begin(), prefix.end(), history.begin() + start)) continue;
    const int64_t banned = history[start + ngram_size - 1];
    if (in_row(banned, logits.size())) logits[banned] = kMasked;
  }
}

void suppress_tokens(std::span<float> logits, std::span<const int64_t> token_ids) {
  for (int64_t id : token_ids)
    if (in_row(id, logits.size())) logits[id] = kMasked;
}

void apply_temperature(std::span<float> logits, double temperature) {
  const float t = static_cast<float>(temperature);
  for (float& x : logits) x /= t;
}

void keep_top_k(std::span<float> logits, size_t top_k) {
  require_positive("top_k", top_k);
  const size_t k = std::min(top_k, logits.size());
  if (k == 0) return;
  std::vector<float> sorted(logits.begin(), logits.end());
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
  const float kth = sorted[k - 1];
  for (float& x : logits)
    if (x < kth) x = kMasked;
}

void keep_top_p(std::span<float> logits, double top_p) {
  require_unit_interval("top_p", top_p);
  if (logits.empty()) return;
  // torch.sort(stable=False) on CPU is std::sort of (value, index) pairs comparing values; the same
  // call here puts ties in the same order, which decides which of tied tokens at the cut survive.
  std::vector<std::pair<float, int64_t>> ascending(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) ascending[i] = {logits[i], static_cast<int64_t>(i)};
  std::sort(ascending.begin(), ascending.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<float> values(ascending.size());
  for (size_t i = 0; i < ascending.size(); ++i) values[i] = ascending[i].first;
  const std::vector<float> p = probabilities(values);
  if (p.empty()) return;
  const float drop_up_to = static_cast<float>(1.0 - top_p);
  double cumulative = 0;
  for (size_t i = 0; i + 1 < p.size(); ++i) {  // the most probable token always stays
    cumulative += p[i];
    if (static_cast<float>(cumulative) <= drop_up_to) logits[ascending[i].second] = kMasked;
  }
}

void keep_min_p(std::span<float> logits, double min_p) {
  require_unit_interval("min_p", min_p);
  if (logits.empty()) return;
  const std::vector<float> p = probabilities(logits);
  if (p.empty()) return;
  // The most probable token is never below min_p (<= 1) times itself: min_tokens_to_keep=1 holds.
  const float threshold = static_cast<float>(min_p) * *std::max_element(p.begin(), p.end());
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] < threshold) logits[i] = kMasked;
}

int64_t argmax_token(std::span<const float> logits) {
  if (logits.empty()) throw Error("argmax_token: empty logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int64_t>(best);
}

void force_tokens(std::span<float> logits, std::span<const int64_t> token_ids) {
  std::fill(logits.begin(), logits.end(), kMasked);
  for (int64_t id : token_ids)
    if (in_row(id, logits.size())) logits[static_cast<size_t>(id)] = 0.0f;
}

LogitsProcessor::LogitsProcessor(GenerationConfig config) : config_(std::move(config)) { config_.validate(); }

void LogitsProcessor::apply(std::span<float> logits, std::span<const int64_t> history, size_t generated,
                            size_t max_length) const {
  if (generated > history.size())
    throw Error(str("LogitsProcessor: ", generated, " generated tokens but a history of ", history.size()));
  const GenerationConfig& c = config_;
  if (c.repetition_penalty != 1.0) apply_repetition_penalty(logits, history, c.repetition_penalty);
  if (c.no_repeat_ngram_size > 0) ban_repeated_ngrams(logits, history, c.no_repeat_ngram_size);
  // generate() turns min_new_tokens into min_length = prompt + min_new_tokens (both processors then
  // test the same thing); without it, min_length counts the prompt too.
  const bool eos_too_early = c.min_new_tokens ? generated < *c.min_new_tokens : history.size() < c.min_length;
  if (eos_too_early) suppress_tokens(logits, c.eos_token_ids);
  if (c.forced_bos_token_id && history.size() == 1) force_tokens(logits, std::span(&*c.forced_bos_token_id, 1));
  if (!c.forced_eos_token_ids.empty() && max_length > 0 && history.size() + 1 == max_length)
    force_tokens(logits, c.forced_eos_token_ids);
  if (!c.suppress_tokens.empty()) suppress_tokens(logits, c.suppress_tokens);
  if (!c.begin_suppress_tokens.empty()) {
    // generate()'s begin_index: the prompt's length, one more when a one-token prompt is followed by the
    // forced bos token.
    const size_t prompt = history.size() - generated;
    const size_t begin = prompt + (prompt == 1 && c.forced_bos_token_id ? 1 : 0);
    if (history.size() == begin) suppress_tokens(logits, c.begin_suppress_tokens);
  }
  if (!c.do_sample) return;
  if (c.temperature != 1.0) apply_temperature(logits, c.temperature);
  if (c.top_k != 0) keep_top_k(logits, static_cast<size_t>(c.top_k));
  if (c.top_p < 1.0) keep_top_p(logits, c.top_p);
  if (c.min_p) keep_min_p(logits, *c.min_p);
}

}  // namespace transmuter::generation
