// The per-row side of a decode loop, shared by TextGeneration and Text2TextGeneration: each row's
// sampler, stop rules and text stream, the choice of every row's next token from one step's logits,
// and the results and summary at the end.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <mlx/array.h>

#include "transmuter/generation.h"
#include "transmuter/pipelines.h"
#include "transmuter/text.h"

namespace transmuter::pipelines {

/** Row-major int64 [rows, cols] from host values (token ids, masks, positions). */
mx::array int_matrix(const std::vector<int64_t>& flat, int rows, int cols);

/** The last position's logits of each row as float32 [rows, vocab] (not evaluated); `logits` must be
 * [batch, sequence, vocab], else a PipelineError naming `source`. */
mx::array last_position_logits(const mx::array& logits, const std::string& source);

/** True when greedy choice is the argmax of the raw logits at every step: no sampling and no processor that
 * changes the logits (penalties, minimum lengths, forced or suppressed tokens). */
bool plain_greedy(const generation::GenerationConfig& config);

class DecodeRows {
 public:
  using Clock = std::chrono::steady_clock;

  /** prompts: what each result reports as its prompt; history_length: the tokens each row's history
   * holds before the first new one (the padded prompt; an encoder-decoder's decoder start tokens), from
   * which StopRules derive max_length. finished_token: what a finished row gets while others go on.
   * Throws GenerationConfigError as StopRules does. */
  DecodeRows(const generation::GenerationConfig& config, const text::Tokenizer& tokenizer,
             const std::vector<std::vector<int64_t>>& prompts, size_t history_length,
             std::optional<generation::TokenTexts> texts, std::optional<size_t> max_position_embeddings,
             int64_t finished_token, const TextStreamer& streamer);

  /** Prompt + generated tokens at most (the same for every row). */
  size_t max_length() const { return max_length_; }
  size_t rows() const { return results_.size(); }

  /** Chooses each row's next token from logits [rows, vocab] (float32, evaluated), hands it to `append`
   * (which must add it to histories[row]), then streams it and checks the row's stop rules. A finished
   * row gets the finished token. Returns true when every row is done. */
  bool step(const mx::array& logits, const std::vector<std::vector<int64_t>>& histories,
            const std::function<void(size_t row, int64_t token)>& append);

  /** The same with the tokens already chosen (greedy choices computed with the model, when no processor
   * changes the logits: see plain_greedy): tokens[row] for the rows still going. */
  bool step_chosen(std::span<const int64_t> tokens, const std::vector<std::vector<int64_t>>& histories,
                   const std::function<void(size_t row, int64_t token)>& append);

  /** The results (text decoded with special tokens skipped) and, when `summary`, the call's counters.
   * A stream gets what its pieces held back at the end (a last token of an incomplete UTF-8 sequence,
   * decoded with replacement characters), so that the streamed text is the result's, as transformers'
   * TextStreamer flushes at its end. */
  std::vector<GeneratedText> finish(GenerationSummary* summary, size_t steps);

 private:
  /** Hands row r's next token over and streams and stop-checks it (a finished row's token is ignored). */
  void take(size_t r, int64_t next, const std::vector<std::vector<int64_t>>& histories,
            const std::function<void(size_t row, int64_t token)>& append);
  bool end_step();

  const text::Tokenizer& tokenizer_;
  const TextStreamer& streamer_;
  Clock::time_point start_ = Clock::now();
  std::vector<generation::StopRules> stops_;
  std::vector<generation::TokenSampler> samplers_;
  std::vector<text::DecodeStream> streams_;
  std::vector<std::string> streamed_;  // per row, the text handed to the streamer so far
  std::vector<GeneratedText> results_;
  std::vector<bool> done_;
  int64_t finished_token_ = 0;
  size_t max_length_ = 0;
  size_t generated_ = 0;
  double first_token_s_ = 0;
};

}  // namespace transmuter::pipelines
