// Hugging Face tokenizers (tokenizer.json) through the Rust `tokenizers` crate (rust/): encode and
// decode single texts, pairs and batches, with offsets, special tokens, truncation and padding, and
// incremental decoding for streaming; chat templates (minijinja, rendered as transformers'
// apply_chat_template). Built unless -DTRANSMUTER_TEXT=OFF (then this header has no
// implementation to link); docs/text.md has the details.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transmuter/error.h"

namespace transmuter::text {

/** Encoding or decoding failed: bad options, bad ids, or a panic inside tokenizers (its message
 * starts with "panic in tokenizers: "). */
class TokenizerError : public Error {
 public:
  using Error::Error;
};

/** tokenizer.json or tokenizer_config.json is missing or malformed; the message names the file. */
class TokenizerFileError : public TokenizerError {
 public:
  using TokenizerError::TokenizerError;
};

enum class Side { kRight, kLeft };
enum class TruncationStrategy { kLongestFirst, kOnlyFirst, kOnlySecond };

/** Truncate to max_length tokens, special tokens included (tokenizers' semantics). */
struct Truncation {
  /** 0: tokenizer_config.json's model_max_length (an error when it gives none). */
  size_t max_length = 0;
  /** Overlap of the overflowing pieces (which are not returned). */
  size_t stride = 0;
  TruncationStrategy strategy = TruncationStrategy::kLongestFirst;
  /** Unset: tokenizer_config.json's truncation_side, else right. */
  std::optional<Side> side;
};

/** Pad every encoding of a call to the longest of them, or to a fixed length. */
struct Padding {
  bool to_longest = true;
  /** With to_longest false; 0: the truncation's max_length, else model_max_length. */
  size_t length = 0;
  /** Round the padded length up to a multiple of this (0: no rounding). */
  size_t multiple_of = 0;
  /** Unset: tokenizer_config.json's padding_side, else right. */
  std::optional<Side> side;
  /** Unset: tokenizer_config.json's pad_token, else tokenizer.json's "padding" token. */
  std::optional<std::string> pad_token;
};

struct EncodeOptions {
  /** The post-processor's special tokens ([CLS] ... [SEP], <s>, </s>). */
  bool add_special_tokens = true;
  std::optional<Truncation> truncation;
  std::optional<Padding> padding;
};

/** [begin, end) byte offsets into the UTF-8 text a token came from; (0, 0) for special and pad
 * tokens. */
struct TokenOffsets {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const TokenOffsets&) const = default;
};

/** One encoded input; every vector has one element per token. */
struct Encoding {
  std::vector<int64_t> ids;
  /** 0 for the first text, 1 for the pair (as the post-processor assigns them). */
  std::vector<int64_t> type_ids;
  /** 1 for tokens, 0 for padding. */
  std::vector<int64_t> attention_mask;
  /** 1 for tokens the post-processor or padding added. */
  std::vector<int64_t> special_tokens_mask;
  /** 0: from the text, 1: from the pair, -1: special or pad token. */
  std::vector<int> sequence_ids;
  /** Byte offsets into the text for sequence_ids 0, into the pair for 1. */
  std::vector<TokenOffsets> offsets;
  std::vector<std::string> tokens;

  size_t size() const { return ids.size(); }
};

/** One entry of tokenizer.json's "added_tokens". */
struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
};

/** The fields of tokenizer_config.json that are honoured (docs/text.md). */
struct TokenizerConfig {
  /** Unset when absent or transformers' "no limit" sentinel. */
  std::optional<size_t> model_max_length;
  Side padding_side = Side::kRight;
  Side truncation_side = Side::kRight;
  std::optional<std::string> pad_token;
  /** transformers' decode-time clean-up (" ." -> ".", " n't" -> "n't", ...). */
  bool clean_up_tokenization_spaces = false;
};

class DecodeStream;

/** A loaded tokenizer. Copies share it; every method may be called from several threads at once. */
class Tokenizer {
 public:
  /** Loads a tokenizer.json, with the default TokenizerConfig. */
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);
  /** Loads dir/tokenizer.json and, when present, dir/tokenizer_config.json. */
  static Tokenizer from_folder(const std::filesystem::path& dir);

  /** text: UTF-8. */
  Encoding encode(std::string_view text, const EncodeOptions& options = {}) const;
  Encoding encode_pair(std::string_view text, std::string_view pair, const EncodeOptions& options = {}) const;
  /** One encoding per text (pairs: one per (texts[i], pairs[i]); pairs empty or texts.size()
   * long); padding to the longest applies across the batch. */
  std::vector<Encoding> encode_batch(std::span<const std::string> texts, const EncodeOptions& options = {},
                                     std::span<const std::string> pairs = {}) const;

  /** Ids with no token are skipped (as tokenizers does); ids outside [0, 2^32) are an error. */
  std::string decode(std::span<const int64_t> ids, bool skip_special_tokens = false) const;
  /** For streaming generation: see DecodeStream. */
  DecodeStream decode_stream(bool skip_special_tokens = false) const;

  /** The tokens joined into text by the tokenizer's decoder (by spaces when it has none), with
   * no clean-up: transformers' convert_tokens_to_string ({"john", "##son"} -> "johnson"). */
  std::string tokens_to_string(std::span<const std::string> tokens) const;
  /** The prefix that marks a token continuing a word ("##" for WordPiece), if the model has one. */
  std::optional<std::string> continuing_subword_prefix() const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  size_t vocab_size(bool with_added_tokens = true) const;
  std::vector<AddedToken> added_tokens() const;
  const TokenizerConfig& config() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/** Decodes one id at a time; step() returns only text that ends in a complete UTF-8 character
 * (byte-level tokens may carry part of one: the rest comes with later ids), and the pieces
 * concatenate to decode() of all ids (without clean_up_tokenization_spaces). Not thread-safe. */
class DecodeStream {
 public:
  /** The new text; empty while the ids so far end inside a character. */
  std::string step(int64_t id);

  struct Impl;
  explicit DecodeStream(std::unique_ptr<Impl> impl);
  DecodeStream(DecodeStream&&) noexcept;
  DecodeStream& operator=(DecodeStream&&) noexcept;
  ~DecodeStream();

 private:
  std::unique_ptr<Impl> impl_;
};

/** A chat template failed to compile (the message names the line) or to render (a
 * raise_exception(message) in the template gives exactly that message), or bad JSON was given. */
class ChatTemplateError : public Error {
 public:
  using Error::Error;
};

/** The variables of ChatTemplate::render besides the messages. JSON travels as text at this API
 * (the C++ side has no JSON library): each *_json string must hold valid JSON of the stated kind;
 * the renderer parses it (object keys keep their order, as Python dicts do). */
struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  /** A JSON array of tool definitions (JSON schemas); unset: `tools` is none in the template. */
  std::optional<std::string> tools_json;
  /** A JSON array of documents ({"title", "text"}, ...); unset: `documents` is none. */
  std::optional<std::string> documents_json;
  /** Further variables, as apply_chat_template's **kwargs: name -> JSON value text (e.g.
   * {"enable_thinking", "false"}); they override everything else, special tokens included. */
  std::map<std::string, std::string> extra_json;
};

/** A compiled chat template with the special tokens of its tokenizer_config.json. Rendered as
 * transformers' apply_chat_template(tokenize=False) renders it: trim_blocks, lstrip_blocks, loop
 * controls, raise_exception, strftime_now, a tojson that is json.dumps(ensure_ascii=False).
 * Copies share it; render may be called from several threads at once. */
class ChatTemplate {
 public:
  /** Compiles `source`; special_tokens_json: a JSON object (bos_token, eos_token, ...) set in
   * every rendering. */
  static ChatTemplate from_string(std::string_view source, std::string_view special_tokens_json = "{}");
  /** The template of a model folder, as transformers picks it: dir/chat_template.jinja when
   * present (and `name` is empty or "default"), else tokenizer_config.json's chat_template (a
   * string, or a list of {name, template}: the entry `name`, "default" when empty). Special
   * tokens come from tokenizer_config.json. Throws TokenizerFileError when there is none. */
  static ChatTemplate from_folder(const std::filesystem::path& dir, std::string_view name = {});

  /** messages_json: a JSON array of messages ({"role", "content", "tool_calls", ...}). */
  std::string render(std::string_view messages_json, const ChatTemplateOptions& options = {}) const;

  const std::string& source() const;
  /** The JSON object of special tokens set in every rendering. */
  const std::string& special_tokens_json() const;

  struct Impl;

 private:
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace transmuter::text
