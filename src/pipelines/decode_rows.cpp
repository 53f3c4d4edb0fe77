#include "pipelines/decode_rows.h"

#include <algorithm>

#include <mlx/ops.h>

namespace transmuter::pipelines {
namespace {

double seconds_since(DecodeRows::Clock::time_point start) {
  return std::chrono::duration<double>(DecodeRows::Clock::now() - start).count();
}

}  // namespace

DecodeRows::DecodeRows(const generation::GenerationConfig& config, const text::Tokenizer& tokenizer,
                       const std::vector<std::vector<int64_t>>& prompts, size_t history_length,
                       std::optional<generation::TokenTexts> texts,
                       std::optional<size_t> max_position_embeddings, int64_t finished_token,
                       const TextStreamer& streamer)
    : tokenizer_(tokenizer), streamer_(streamer), finished_token_(finished_token) {
  for (size_t r = 0; r < prompts.size(); ++r) {
    stops_.emplace_back(config, history_length, texts, max_position_embeddings);
    samplers_.emplace_back(config, r);
    if (streamer_) streams_.push_back(tokenizer_.decode_stream(true));
    streamed_.emplace_back();
    results_.emplace_back().prompt = prompts[r];
  }
  done_.assign(prompts.size(), false);
  if (!stops_.empty()) max_length_ = stops_.front().max_length();
}

mx::array int_matrix(const std::vector<int64_t>& flat, int rows, int cols) {
  return mx::array(flat.begin(), {rows, cols}, mx::int64);
}

mx::array last_position_logits(const mx::array& logits, const std::string& source) {
  if (logits.ndim() != 3) throw PipelineError(str(source, ": logits should be [batch, sequence, vocabulary]"));
  const int rows = logits.shape(0), seq = logits.shape(1), vocab = logits.shape(2);
  return mx::contiguous(
      mx::astype(mx::reshape(mx::slice(logits, {0, seq - 1, 0}, {rows, seq, vocab}), {rows, vocab}), mx::float32));
}

bool plain_greedy(const generation::GenerationConfig& c) {
  return !c.do_sample && c.repetition_penalty == 1.0 && c.no_repeat_ngram_size == 0 && c.min_length == 0 &&
         (!c.min_new_tokens || *c.min_new_tokens == 0) && !c.forced_bos_token_id && c.forced_eos_token_ids.empty() &&
         c.suppress_tokens.empty() && c.begin_suppress_tokens.empty();
}

void DecodeRows::take(size_t r, int64_t next, const std::vector<std::vector<int64_t>>& histories,
                      const std::function<void(size_t row, int64_t token)>& append) {
  append(r, done_[r] ? finished_token_ : next);
  if (done_[r]) return;
  results_[r].tokens.push_back(next);
  if (streamer_) {
    std::string piece = streams_[r].step(next);
    if (!piece.empty()) {
      streamer_(r, piece);
      streamed_[r] += piece;
    }
  }
  results_[r].reason = stops_[r].check(histories[r]);
  done_[r] = results_[r].reason != generation::StopReason::kNone;
}

bool DecodeRows::end_step() {
  if (generated_ == 0) first_token_s_ = seconds_since(start_);
  ++generated_;
  return std::all_of(done_.begin(), done_.end(), [](bool d) { return d; });
}

bool DecodeRows::step(const mx::array& logits, const std::vector<std::vector<int64_t>>& histories,
                      const std::function<void(size_t row, int64_t token)>& append) {
  const size_t vocab = static_cast<size_t>(logits.shape(1));
  std::vector<float> row_logits(vocab);
  for (size_t r = 0; r < rows(); ++r) {
    int64_t next = finished_token_;
    if (!done_[r]) {
      std::copy_n(logits.data<float>() + r * vocab, vocab, row_logits.begin());
      next = samplers_[r].next(row_logits, histories[r], generated_, max_length_);
    }
    take(r, next, histories, append);
  }
  return end_step();
}

bool DecodeRows::step_chosen(std::span<const int64_t> tokens, const std::vector<std::vector<int64_t>>& histories,
                             const std::function<void(size_t row, int64_t token)>& append) {
  for (size_t r = 0; r < rows(); ++r) take(r, tokens[r], histories, append);
  return end_step();
}

std::vector<GeneratedText> DecodeRows::finish(GenerationSummary* summary, size_t steps) {
  size_t output_tokens = 0, input_tokens = 0;
  for (size_t r = 0; r < rows(); ++r) {
    GeneratedText& result = results_[r];
    result.text = tokenizer_.decode(result.tokens, true);
    if (streamer_ && result.text.size() > streamed_[r].size() && result.text.starts_with(streamed_[r]))
      streamer_(r, std::string_view(result.text).substr(streamed_[r].size()));
    output_tokens += result.tokens.size();
    input_tokens += result.prompt.size();
  }
  if (summary) {
    summary->input_tokens = input_tokens;
    summary->output_tokens = output_tokens;
    summary->time_to_first_token_s = first_token_s_;
    summary->total_s = seconds_since(start_);
    summary->steps = steps;
    const double decode_s = summary->total_s - first_token_s_;
    summary->tokens_per_s = decode_s > 0 && output_tokens > rows()
                                ? static_cast<double>(output_tokens - rows()) / decode_s
                                : 0;
  }
  return std::move(results_);
}

}  // namespace transmuter::pipelines
