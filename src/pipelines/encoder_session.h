// What every encoder pipeline shares: the model folder, the loaded model and tokenizer, the
// configs, and running texts through the model in padded batches.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipelines/model_config.h"
#include "pipelines/model_folder.h"
#include "pipelines/model_runner.h"
#include "transmuter/pipelines.h"
#include "transmuter/runtime.h"
#include "transmuter/text.h"

namespace transmuter::pipelines {

class EncoderSession {
 public:
  /** Loads the folder's model and tokenizer. extra_limit: a further bound on the tokens per text
   * (sentence_bert_config.json's max_seq_length), applied when options.max_length is 0. */
  EncoderSession(ModelFolder folder, const PipelineOptions& options,
                 std::optional<size_t> extra_limit = std::nullopt);
  EncoderSession(const std::string& source, const PipelineOptions& options)
      : EncoderSession(ModelFolder::open(source, options), options) {}

  /** One model call: the encodings of texts[first, first + encodings.size()) and the model's
   * output, float32 [batch, sequence, ...], evaluated. */
  struct Batch {
    size_t first = 0;
    std::vector<text::Encoding> encodings;
    mx::array output;
  };

  /** Encodes the texts (with pairs[i] when pairs is not empty) in batches of
   * options.batch_size, runs the model on each and hands each batch to `visit`, in order. */
  void for_each_batch(std::span<const std::string> texts, std::span<const std::string> pairs,
                      const std::string& output, const std::function<void(const Batch&)>& visit) const;

  /** The first of `preferred` among the model's outputs, else its first output. */
  std::string output_named(std::initializer_list<const char*> preferred) const;

  const ModelFolder& folder() const { return folder_; }
  const Model& model() const { return model_; }
  const text::Tokenizer& tokenizer() const { return tokenizer_; }
  const ModelConfig& config() const { return config_; }
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  /** Tokens per text; 0: no limit. */
  size_t max_length() const { return max_length_; }

 private:
  std::vector<text::Encoding> encode(std::span<const std::string> texts, std::span<const std::string> pairs,
                                     size_t first) const;
  Inputs model_inputs(const std::vector<text::Encoding>& encodings) const;

  ModelFolder folder_;
  PipelineOptions options_;
  Model model_;
  text::Tokenizer tokenizer_;
  ModelConfig config_;
  std::map<std::string, std::string> special_tokens_;
  size_t max_length_ = 0;
  ModelRunner runner_;  // after model_, which it refers to
};

/** Tokens per text: options.max_length, else the tightest of extra_limit, tokenizer_config.json's
 * model_max_length and config.json's max_position_embeddings (0: no limit). */
size_t resolve_max_length(const PipelineOptions& options, const text::Tokenizer& tokenizer, const ModelConfig& config,
                          std::optional<size_t> extra_limit = std::nullopt);

/** A softmax over the last axis of `logits` (rows of `width`), as transformers' pipelines compute
 * it in float32 (shifted by the row's maximum). */
void softmax_rows(std::span<float> values, size_t width);

}  // namespace transmuter::pipelines
