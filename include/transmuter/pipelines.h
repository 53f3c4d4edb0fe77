// Pipelines: a Hugging Face model folder (its .onnx with tokenizer.json and configs beside it) or an
// hf:// repo, text in, results out — embeddings, classification, token classification (NER) and
// fill-mask, with the outputs and option names of transformers' pipelines. Part of the text
// component (-DTRANSMUTER_TEXT=OFF builds without it); docs/text.md "Pipelines" has the details.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <mlx/array.h>
#include <mlx/device.h>

#include "transmuter/error.h"
#include "transmuter/generation.h"
#include "transmuter/model.h"
#include "transmuter/runtime.h"
#include "transmuter/text.h"

namespace transmuter::pipelines {

/** The model folder lacks what the pipeline needs (a tokenizer, id2label, a mask token), or an
 * input cannot be run (too long, no mask token in a fill-mask text); the message names which. */
class PipelineError : public Error {
 public:
  using Error::Error;
};

enum class ExecutionMode {
  kEager,
  /** mx::compile'd plans; batches are padded to a multiple of 16 tokens so that few shapes (and so
   * few plans) occur. */
  kCompiled,
};

/** What to do with a text longer than the model takes. */
enum class LongInputs {
  kTruncate,  // keep the first max_length tokens (special tokens included), as transformers does
  kReject,    // throw PipelineError naming the text and its length
};

struct PipelineOptions {
  /** dtype picks the ONNX file (onnx/model{_fp16,_quantized,...}.onnx, then the root) as
   * transformers.js does; hub settings for hf:// sources; the load-time passes. */
  LoadOptions load;
  /** The ONNX file inside the folder or repo; empty: picked by load.dtype. */
  std::string model_file;
  ExecutionMode mode = ExecutionMode::kEager;
  std::optional<mx::Device> device;
  /** Tokens per text, special tokens included. 0: the smallest of sentence_bert_config.json's
   * max_seq_length, tokenizer_config.json's model_max_length and config.json's
   * max_position_embeddings that the folder gives (no limit when it gives none). */
  size_t max_length = 0;
  LongInputs long_inputs = LongInputs::kTruncate;
  /** Texts per model call; each call pads its texts to the longest. */
  size_t batch_size = 16;
};

// --- text_embedding ------------------------------------------------------------------------

/** sentence-transformers' pooling modes. */
enum class Pooling { kMean, kCls, kMax, kLastToken, kMeanSqrtLen, kWeightedMean };

struct EmbeddingOptions {
  /** Unset: the folder's 1_Pooling/config.json (via modules.json), else mean. */
  std::optional<Pooling> pooling;
  /** Unset: true when modules.json has a Normalize module. */
  std::optional<bool> normalize;
};

/** Sentence embeddings, as sentence-transformers' encode() computes them from the model's token
 * embeddings (its last_hidden_state or token_embeddings output). */
class TextEmbedding {
 public:
  /** source: a folder, or hf://org/repo[@revision] (whose files are fetched into the hub cache). */
  static TextEmbedding open(const std::string& source, const PipelineOptions& options = {});

  /** A float32 array [texts.size(), hidden], evaluated. */
  mx::array operator()(std::span<const std::string> texts, const EmbeddingOptions& options = {}) const;

  /** What an unset EmbeddingOptions field means for this folder. */
  Pooling default_pooling() const;
  bool default_normalize() const;

  struct Impl;

 private:
  explicit TextEmbedding(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// --- text_classification -------------------------------------------------------------------

struct LabelScore {
  std::string label;
  float score = 0;
};

enum class ScoreFunction { kSoftmax, kSigmoid, kNone };

struct ClassificationOptions {
  /** The best top_k labels, best first (ties keep the labels' order); 0: every label. */
  size_t top_k = 1;
  /** Unset: as transformers picks it from config.json (problem_type "regression": none,
   * "multi_label_classification" or a single label: sigmoid, else softmax). */
  std::optional<ScoreFunction> function;
};

/** Sequence classification (sentiment, topics, NLI with pairs): scores per label of id2label. */
class TextClassification {
 public:
  static TextClassification open(const std::string& source, const PipelineOptions& options = {});

  /** One list of labels per text. */
  std::vector<std::vector<LabelScore>> operator()(std::span<const std::string> texts,
                                                  const ClassificationOptions& options = {}) const;
  /** Text pairs (texts[i], pairs[i]), encoded as the tokenizer's pair template. */
  std::vector<std::vector<LabelScore>> operator()(std::span<const std::string> texts,
                                                  std::span<const std::string> pairs,
                                                  const ClassificationOptions& options = {}) const;
  /** id2label in id order. */
  const std::vector<std::string>& labels() const;

  struct Impl;

 private:
  explicit TextClassification(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// --- token_classification ------------------------------------------------------------------

/** transformers' aggregation strategies. */
enum class Aggregation {
  kNone,     // one entity per token (its best label)
  kSimple,   // consecutive tokens of one entity type (B-/I- tags) grouped
  kFirst,    // words (a token and its subword continuations) take their first token's label
  kAverage,  // words take the label of their tokens' mean scores
  kMax,      // words take the label of their most confident token
};

struct Entity {
  /** The token's label ("B-PER") with Aggregation::kNone, else the entity type ("PER"). */
  std::string entity;
  float score = 0;
  /** The token's index in the encoding (with Aggregation::kNone; unset otherwise). */
  std::optional<size_t> index;
  /** The token (kNone) or the tokens joined by the tokenizer's decoder. */
  std::string word;
  /** [start, end) byte offsets into the text. */
  size_t start = 0;
  size_t end = 0;
};

struct TokenClassificationOptions {
  Aggregation aggregation = Aggregation::kNone;
  /** Entities of these labels (or entity types) are dropped. */
  std::vector<std::string> ignore_labels = {"O"};
};

/** Token classification (NER, POS): entities with offsets into the original text. */
class TokenClassification {
 public:
  static TokenClassification open(const std::string& source, const PipelineOptions& options = {});

  /** One list of entities per text, in text order. */
  std::vector<std::vector<Entity>> operator()(std::span<const std::string> texts,
                                              const TokenClassificationOptions& options = {}) const;
  const std::vector<std::string>& labels() const;

  struct Impl;

 private:
  explicit TokenClassification(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// --- fill_mask -----------------------------------------------------------------------------

struct MaskFill {
  float score = 0;
  int64_t token = 0;
  /** The token decoded alone. */
  std::string token_str;
  /** The text with the mask replaced by the token (decoded; special tokens skipped when the text
   * has one mask, as transformers does). */
  std::string sequence;
};

struct FillMaskOptions {
  size_t top_k = 5;
  /** Restrict the candidates to these tokens (a word the vocabulary lacks stands for its first
   * token, as transformers does). */
  std::vector<std::string> targets;
};

/** Masked-language-model predictions for each mask token of a text. */
class FillMask {
 public:
  static FillMask open(const std::string& source, const PipelineOptions& options = {});

  /** Per text, per mask token (in text order), the top_k fills, best first. A text without the
   * mask token is a PipelineError. */
  std::vector<std::vector<std::vector<MaskFill>>> operator()(std::span<const std::string> texts,
                                                             const FillMaskOptions& options = {}) const;
  /** The tokenizer's mask token ("[MASK]", "<mask>"). */
  const std::string& mask_token() const;

  struct Impl;

 private:
  explicit FillMask(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// --- text_generation -----------------------------------------------------------------------

/** How a decoder's past keys and values are kept between steps. */
enum class KvCache {
  /** kStatic when the model takes past inputs and either position_ids or GroupQueryAttention's mask
   * positions, else kDynamic (kNone without past). */
  kAuto,
  /** Every step runs the whole sequence again (the model's past inputs get length 0). */
  kNone,
  /** The presents of a step are the next step's past: its length grows by one each step. */
  kDynamic,
  /** The past is preallocated to a capacity (the max length rounded up to 64) and the attention mask
   * covers only the filled part: every decode step has the same shapes, so one compiled plan serves
   * them all. Needs a position_ids input (positions cannot come from the past's length), or
   * com.microsoft GroupQueryAttention decoders (onnxruntime-genai's builds), whose positions and valid
   * keys come from the attention mask's sum: there the mask spans the capacity, and the present (the
   * past with the new key written at the row's length) is the next step's past as it is. */
  kStatic,
};

/** Counters of one generate call. */
struct GenerationSummary {
  size_t input_tokens = 0;   // prompt tokens, padding excluded
  size_t output_tokens = 0;  // tokens generated (each row up to where it stopped)
  double time_to_first_token_s = 0;
  /** Generated tokens after the first, per second of the decode steps (all rows together). */
  double tokens_per_s = 0;
  double total_s = 0;
  size_t steps = 0;  // model calls
};

/** One generated sequence. */
struct GeneratedText {
  std::vector<int64_t> prompt;  // the prompt's tokens (no padding)
  std::vector<int64_t> tokens;  // the new tokens, up to and including the one that stopped it
  std::string text;             // tokens decoded, special tokens skipped
  generation::StopReason reason = generation::StopReason::kNone;
};

/** Called as text is generated: the row and the newly decoded text (complete UTF-8 characters). */
using TextStreamer = std::function<void(size_t row, std::string_view text)>;

/** A decoder-only language model (optimum exports with past_key_values.N.key/value inputs and
 * present.N.key/value outputs, merged decoders with use_cache_branch), generating as transformers'
 * generate() does: greedy or sampled (generation::GenerationConfig), left-padded batches with
 * position_ids from the attention mask, stop tokens and strings. */
class TextGeneration {
 public:
  static TextGeneration open(const std::string& source, const PipelineOptions& options = {},
                             KvCache cache = KvCache::kAuto);

  /** Prompts encoded by the tokenizer (its special tokens added), then generated from. */
  std::vector<GeneratedText> operator()(std::span<const std::string> prompts,
                                        const generation::GenerationConfig& config,
                                        const TextStreamer& streamer = {},
                                        GenerationSummary* summary = nullptr) const;
  /** The same from token ids (each prompt at least one token). */
  std::vector<GeneratedText> generate(const std::vector<std::vector<int64_t>>& prompts,
                                      const generation::GenerationConfig& config,
                                      const TextStreamer& streamer = {},
                                      GenerationSummary* summary = nullptr) const;

  /** The folder's generation_config.json (or config.json's fallbacks). */
  const generation::GenerationConfig& default_config() const;
  const text::Tokenizer& tokenizer() const;
  /** The cache mode kAuto resolved to. */
  KvCache cache() const;
  /** A file of the model's folder or repo commit by relative name (fetched for hf:// sources), or nullopt. */
  std::optional<std::filesystem::path> find_file(const std::string& name) const;
  /** The compiled decode plans' counters (ExecutionMode::kCompiled). */
  CompileStats compile_stats() const;

  struct Impl;

 private:
  explicit TextGeneration(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// --- text2text_generation ------------------------------------------------------------------

/** An encoder-decoder model (T5, BART, mBART, Marian, Pegasus, Whisper, ...) in optimum's seq2seq layout:
 * encoder_model.onnx with decoder_model_merged.onnx (one If on use_cache_branch), or with
 * decoder_model.onnx + decoder_with_past_model.onnx, or with decoder_model.onnx alone (no cache); each
 * picked by the options' dtype as transformers.js names them (onnx/encoder_model_quantized.onnx, ...).
 * It generates as transformers' generate() does for such models: the encoder runs once over the texts
 * (right padded, as seq2seq tokenizers pad), the decoder starts from decoder_start_token_id, keeps its
 * self-attention past between steps and the cross-attention past of its first step, and chooses tokens
 * as TextGeneration does (generation::GenerationConfig, forced_bos/forced_eos_token_id included). */
class Text2TextGeneration {
 public:
  /** cache: kAuto is kDynamic when the folder has a decoder with past, else kNone; kStatic is refused
   * (these decoders take their positions from the past's length). options.model_file is not used: the
   * files are found by their names. */
  static Text2TextGeneration open(const std::string& source, const PipelineOptions& options = {},
                                  KvCache cache = KvCache::kAuto);
  /** Whether `source` holds an encoder-decoder export: an encoder_model file for the options' dtype (hf://
   * sources: fetched when the repo has one). */
  static bool holds_encoder_decoder(const std::string& source, const PipelineOptions& options = {});

  /** Texts encoded by the tokenizer (its special tokens added; longer than the limit: truncated or
   * rejected per options.long_inputs), then generated from. */
  std::vector<GeneratedText> operator()(std::span<const std::string> texts,
                                        const generation::GenerationConfig& config,
                                        const TextStreamer& streamer = {},
                                        GenerationSummary* summary = nullptr) const;
  /** The same from the encoder's token ids (each at least one token); GeneratedText::prompt holds them. */
  std::vector<GeneratedText> generate(const std::vector<std::vector<int64_t>>& encoder_ids,
                                      const generation::GenerationConfig& config,
                                      const TextStreamer& streamer = {},
                                      GenerationSummary* summary = nullptr) const;
  /** From the encoder's own inputs by name (Whisper's input_features [batch, mel bins, frames]; an
   * attention_mask among them also masks the decoder's cross-attention), every row's decoder starting
   * with `decoder_prompt` (Whisper's <|startoftranscript|><|lang|><|task|>...; empty:
   * decoder_start_token_id). GeneratedText::prompt holds the decoder prompt. Whisper's own generate
   * (language detection, timestamps, long-form audio) is not reproduced, nor its feature extraction. */
  std::vector<GeneratedText> generate(const Inputs& encoder_inputs, const std::vector<int64_t>& decoder_prompt,
                                      const generation::GenerationConfig& config,
                                      const TextStreamer& streamer = {},
                                      GenerationSummary* summary = nullptr) const;

  const generation::GenerationConfig& default_config() const;
  const text::Tokenizer& tokenizer() const;
  /** The cache mode kAuto resolved to. */
  KvCache cache() const;
  /** The files in use: the encoder, then the decoder(s). */
  std::vector<std::filesystem::path> model_files() const;
  /** The compiled decoder plans' counters, summed over the decoder files (ExecutionMode::kCompiled: the
   * encoder and a cached run's first decoder step compile; the later steps, whose shapes grow, run eagerly). */
  CompileStats compile_stats() const;

  struct Impl;

 private:
  explicit Text2TextGeneration(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/** A conversation with a chat model: each user message is appended to the messages, the model's chat
 * template renders them with the generation prompt (as apply_chat_template(add_generation_prompt=True)),
 * the rendered prompt is encoded without adding special tokens (the template writes them) and
 * generated from, and the reply joins the messages as the assistant's. */
class Chat {
 public:
  /** The model's TextGeneration and its chat template (chat_template.jinja or tokenizer_config.json). */
  static Chat open(const std::string& source, const PipelineOptions& options = {},
                   KvCache cache = KvCache::kAuto);
  Chat(TextGeneration generation, text::ChatTemplate chat_template);

  /** Adds a system message (before the first user message). */
  void set_system(std::string_view text);
  /** Sends one user message and returns the reply (streamed to `streamer` as it is generated). An empty
   * message is a PipelineError. */
  std::string send(std::string_view user_text, const generation::GenerationConfig& config,
                   const TextStreamer& streamer = {}, GenerationSummary* summary = nullptr);
  /** The conversation so far, a JSON array of {"role", "content"} messages. */
  std::string messages_json() const;
  const TextGeneration& generation() const { return generation_; }

 private:
  TextGeneration generation_;
  text::ChatTemplate template_;
  std::vector<std::pair<std::string, std::string>> messages_;  // (role, content)
};

}  // namespace transmuter::pipelines
