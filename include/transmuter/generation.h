// Text generation's choice of the next token, made as transformers' generate() makes it (transformers
// 5.23.0): the generation config (generation_config.json), the logits processors in generate's order,
// greedy or seeded sampling, and the rules that end a sequence (eos, length, stop strings). Everything
// here works on the host, on one sequence's row of float32 logits at a time; the decode loop that runs
// the model lives in the pipelines. docs/text.md ("Generation: choosing tokens") has the details.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "transmuter/error.h"

namespace transmuter::generation {

/** A generation_config.json or config.json is malformed (the message names the file and the field), or
 * a GenerationConfig value is invalid for its use (the message names the field and the value). */
class GenerationConfigError : public Error {
 public:
  using Error::Error;
};

/** The fields of transformers' GenerationConfig that choosing and stopping use. Defaults are the ones
 * generate() applies to unset fields (GenerationConfig._get_default_generation_params). */
struct GenerationConfig {
  /** Tokens to generate at most; takes precedence over max_length. */
  std::optional<size_t> max_new_tokens;
  /** Prompt + generated tokens at most. Unset (and no max_new_tokens): 20 new tokens, capped at the
   * model's max_position_embeddings when given (transformers' default). */
  std::optional<size_t> max_length;
  /** Prompt + generated tokens before eos may be chosen (eos logits at -inf until then). */
  size_t min_length = 0;
  /** Generated tokens before eos may be chosen; when set, it replaces min_length (as in transformers). */
  std::optional<size_t> min_new_tokens;
  bool do_sample = false;
  /** Sampling only (do_sample), as every warper below: logits / temperature (1: off). */
  double temperature = 1.0;
  /** Keep the top_k largest logits, ties with the k-th included (0: off). */
  int64_t top_k = 50;
  /** Keep the most probable tokens up to a total probability of top_p (nucleus sampling; 1: off). */
  double top_p = 1.0;
  /** Drop tokens less probable than min_p times the most probable one (unset: off). */
  std::optional<double> min_p;
  /** Logits of tokens in the history: divided by it when positive, multiplied when negative (1: off). */
  double repetition_penalty = 1.0;
  /** No n-gram of this size occurs twice in the history + next token (0: off). */
  size_t no_repeat_ngram_size = 0;
  /** generation_config.json's eos_token_id: an int or a list. */
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> decoder_start_token_id;
  /** The first generated token is this one (ForcedBOSTokenLogitsProcessor; BART-style checkpoints). */
  std::optional<int64_t> forced_bos_token_id;
  /** The token at max_length - 1 is one of these (ForcedEOSTokenLogitsProcessor): an int or a list. */
  std::vector<int64_t> forced_eos_token_ids;
  /** Tokens never generated (SuppressTokensLogitsProcessor; Whisper). */
  std::vector<int64_t> suppress_tokens;
  /** Tokens not generated first (SuppressTokensAtBeginLogitsProcessor; Whisper): at the step where the
   * history is the prompt, or the prompt + the forced bos token when the prompt is one token long. */
  std::vector<int64_t> begin_suppress_tokens;
  /** Generation stops once the text ends in one of these (StopRules has the exact rule). */
  std::vector<std::string> stop_strings;
  /** Seed of sampling (not a transformers field; never read from a file). */
  uint64_t seed = 0;

  /** Defaults, then the fields of a generation_config.json (null is unset; other keys are ignored). */
  static GenerationConfig from_file(const std::filesystem::path& generation_config_json);
  /** dir/generation_config.json when present; else what transformers falls back to: the fields of
   * dir/config.json (its special token ids, and generation fields old configs carry), each unset one
   * taken from its first non-empty "decoder", "generator" or "text_config" object; else defaults. */
  static GenerationConfig from_folder(const std::filesystem::path& dir);

  /** Throws GenerationConfigError for values transformers rejects when it builds the processors
   * (temperature <= 0, top_k < 0, top_p or min_p outside [0, 1] while sampling; repetition_penalty
   * <= 0; max_new_tokens 0), top_p > 1 while sampling (transformers ignores it) and empty stop strings. */
  void validate() const;
  /** pad_token_id, else the first eos id (transformers pads finished rows with it). */
  std::optional<int64_t> pad_token_id_or_eos() const;
};

// The processors, one function per transformers class. logits: one row [vocab] of float32 scores,
// changed in place; masked entries become -infinity. history: the row's tokens so far (prompt +
// generated, no padding); ids outside [0, vocab) in it are ignored, as transformers clamps them away.

/** RepetitionPenaltyLogitsProcessor: each distinct token of the history: x < 0 ? x * penalty : x / penalty.
 */
void apply_repetition_penalty(std::span<float> logits, std::span<const int64_t> history, double penalty);
/** NoRepeatNGramLogitsProcessor: bans each token that would complete an n-gram already in the history. */
void ban_repeated_ngrams(std::span<float> logits, std::span<const int64_t> history, size_t ngram_size);
/** MinLength / MinNewTokensLength's masking: the given tokens (eos) to -inf, ids outside the row ignored. */
void suppress_tokens(std::span<float> logits, std::span<const int64_t> token_ids);
/** TemperatureLogitsWarper: x / temperature (float32 division). */
void apply_temperature(std::span<float> logits, double temperature);
/** TopKLogitsWarper: keeps the logits >= the top_k-th largest (ties kept; top_k past the row keeps all). */
void keep_top_k(std::span<float> logits, size_t top_k);
/** TopPLogitsWarper: sorts ascending as torch's CPU sort does (std::sort on (value, index) pairs, whose
 * order of ties is torch's), drops the tokens whose cumulative probability is <= 1 - top_p, keeps the
 * most probable one always. */
void keep_top_p(std::span<float> logits, double top_p);
/** MinPLogitsWarper: drops tokens with probability < min_p * the largest probability. */
void keep_min_p(std::span<float> logits, double min_p);
/** torch.argmax: the first index of the largest value. logits must not be empty. */
int64_t argmax_token(std::span<const float> logits);

/** ForcedBOSTokenLogitsProcessor / ForcedEOSTokenLogitsProcessor: every logit -inf but the token's, which
 * becomes 0 (of several eos ids, each). */
void force_tokens(std::span<float> logits, std::span<const int64_t> token_ids);

/** The processors generate() builds for a config, in its order (_get_logits_processor):
 * repetition_penalty, no_repeat_ngram_size, min_length / min_new_tokens (eos to -inf), forced_bos_token_id,
 * forced_eos_token_id, suppress_tokens, begin_suppress_tokens, then, only when do_sample, the warpers
 * temperature, top_k, top_p, min_p. Stateless; may be shared across rows. */
class LogitsProcessor {
 public:
  /** Validates the config (GenerationConfigError). */
  explicit LogitsProcessor(GenerationConfig config);
  /** generated: how many tokens of history were generated (the rest is the prompt). max_length: the
   * sequence's prompt + generated tokens at most (StopRules::max_length), where forced_eos_token_id
   * forces eos; 0 leaves forced_eos_token_id out. */
  void apply(std::span<float> logits, std::span<const int64_t> history, size_t generated,
             size_t max_length = 0) const;
  const GenerationConfig& config() const { return config_; }

 private:
  GenerationConfig config_;
};

/** Chooses one sequence's next tokens: processing, then greedy (argmax) or a seeded draw from the
 * softmax of the processed logits. Keep one per row of a batch: each holds its own random stream. */
class TokenSampler {
 public:
  /** The stream is seeded from (config.seed, row), so rows of a batch draw independently and a run
   * repeats exactly for the same seed (std::mt19937_64, seeded through std::seed_seq; both specified
   * by the C++ standard, the draw below is ours). */
  explicit TokenSampler(GenerationConfig config, uint64_t row = 0);
  /** logits: this step's row [vocab] (processed in place); history: prompt + generated tokens; max_length
   * as LogitsProcessor::apply takes it. */
  int64_t next(std::span<float> logits, std::span<const int64_t> history, size_t generated,
               size_t max_length = 0);
  /** The draw alone: index i with probability softmax(processed_logits)[i], never one at -inf. Throws
   * GenerationConfigError when every entry is -inf (torch.multinomial fails there too). */
  int64_t draw(std::span<const float> processed_logits);
  const LogitsProcessor& processor() const { return processor_; }

 private:
  LogitsProcessor processor_;
  std::mt19937_64 engine_;
};

/** The text each token contributes, as transformers' StopStringCriteria reads a vocabulary: byte-level
 * vocabularies (a ByteLevel decoder): a token's bytes through the GPT-2 byte map; byte-fallback ones
 * (a ByteFallback decoder): <0xNN> tokens as that byte; every other token: the decoder's output for
 * "abcdef" + the token, after "abcdef" (so "##ing" is "ing" and "▁the" is " the"). Copies share a cache. */
class TokenTexts {
 public:
  /** How stop strings are measured: bytes for byte-level and byte-fallback vocabularies, else characters. */
  enum class Unit { kByte, kCodePoint };
  using TextOf = std::function<std::string(int64_t id)>;

  /** Reads the decoder of a tokenizer.json and loads it (with no tokenizer_config.json: decoding
   * without transformers' clean-up, as convert_tokens_to_string does). */
  static TokenTexts from_file(const std::filesystem::path& tokenizer_json);
  /** Any other source of token texts (UTF-8). */
  TokenTexts(TextOf text_of, Unit unit);

  /** Thread-safe; cached. */
  std::string text(int64_t id) const;
  Unit unit() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/** Why a sequence is done. */
enum class StopReason { kNone, kEosToken, kStopString, kMaxLength };

/** transformers' stopping criteria for one sequence: the last token is an eos id (EosTokenCriteria),
 * the sequence reached its max length (MaxLengthCriteria), or a stop string was completed
 * (StopStringCriteria). The stop-string rule, exactly: the texts of the last L tokens (L: the longest
 * stop string in TokenTexts units) are joined, and a stop string matches when it occurs in that text
 * ending inside the last token's text. So it may span several tokens and the last token may run past
 * it ("st" + "opped" completes "stop"), but an occurrence that ends before the last token does not
 * count: it was checked when it was completed. The prompt's tokens count (a stop string may start in
 * the prompt); nothing is removed, the stop string stays in the output as transformers leaves it. */
class StopRules {
 public:
  /** prompt_length: the tokens the sequence starts with (decoder-only: the prompt; encoder-decoder: the
   * decoder's start tokens). texts: needed when config.stop_strings is not empty. Throws
   * GenerationConfigError when the prompt already has the max length, as generate() does. */
  StopRules(const GenerationConfig& config, size_t prompt_length,
            std::optional<TokenTexts> texts = std::nullopt,
            std::optional<size_t> max_position_embeddings = std::nullopt);

  /** Called after each new token; history: prompt + generated tokens. */
  StopReason check(std::span<const int64_t> history) const;
  /** The stop-string rule alone (false without stop strings). */
  bool ends_with_stop_string(std::span<const int64_t> history) const;
  /** Prompt + generated tokens at most, as generate() derives it. */
  size_t max_length() const { return max_length_; }

 private:
  std::vector<int64_t> eos_token_ids_;
  size_t max_length_ = 0;
  std::vector<std::string> stop_strings_;
  std::optional<TokenTexts> texts_;
  size_t window_ = 0;  // L: how many of the last tokens a stop string can span
};

}  // namespace transmuter::generation
