// StopRules: transformers' stopping criteria for one sequence (generation/stopping_criteria.py,
// 5.23.0), and TokenTexts, the token strings StopStringCriteria matches stop strings against.
//
// StopStringCriteria precomputes, per token, where it can sit inside each stop string, so that the match
// runs as tensor ops. What it decides is simpler to state (and is what is done here): join the texts of
// the last L tokens; stop when a stop string occurs there ending inside the last token's text.
#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "transmuter/generation.h"
#include "transmuter/text.h"

namespace transmuter::generation {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/** How StopStringCriteria turns tokens into text (_get_stop_string_matching_mode). */
enum class Matching { kDecoded, kByteLevel, kByteFallback };

bool has_decoder_type(const json& node, const std::string& type) {
  if (node.is_object()) {
    auto it = node.find("type");
    if (it != node.end() && *it == type) return true;
  }
  if (!node.is_structured()) return false;
  return std::any_of(node.begin(), node.end(),
                     [&](const json& child) { return has_decoder_type(child, type); });
}

Matching matching_of(const json& decoder) {
  if (!decoder.is_object()) return Matching::kDecoded;
  if (decoder.value("type", "") == "ByteLevel") return Matching::kByteLevel;
  // A Sequence holding both prefers explicit <0xNN> tokens, as transformers does.
  if (has_decoder_type(decoder, "ByteFallback")) return Matching::kByteFallback;
  if (has_decoder_type(decoder, "ByteLevel")) return Matching::kByteLevel;
  return Matching::kDecoded;
}

/** tokenizer.json's "decoder", parsed without building the (large) vocabulary. */
json decoder_of(const fs::path& tokenizer_json) {
  std::ifstream in(tokenizer_json, std::ios::binary);
  if (!in) throw GenerationConfigError(str(tokenizer_json.string(), ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  const json::parser_callback_t skip_model = [](int depth, json::parse_event_t event, json& parsed) {
    return !(depth == 1 && event == json::parse_event_t::key && parsed == "model");
  };
  try {
    json document = json::parse(text.str(), skip_model);
    return document.is_object() ? document.value("decoder", json()) : json();
  } catch (const json::parse_error& e) {
    throw GenerationConfigError(str(tokenizer_json.string(), ": malformed JSON: ", e.what()));
  }
}

/** The inverse of GPT-2's bytes_to_unicode: code point -> byte (-1: not a byte-level character). The
 * printable bytes !..~, ¡..¬, ®..ÿ stand for themselves; the other 68 bytes, in order, for U+0100.. */
const std::array<int16_t, 324>& byte_level_decoder() {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[printable ? b : next++] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

/** The code points of UTF-8 text; nullopt when it is not valid UTF-8. */
std::optional<std::vector<char32_t>> code_points(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t length = lead < 0x80         ? 1
                          : (lead >> 5) == 6  ? 2
                          : (lead >> 4) == 14 ? 3
                          : (lead >> 3) == 30 ? 4
                                              : 0;
    if (length == 0 || i + length > s.size()) return std::nullopt;
    char32_t cp = length == 1 ? lead : lead & (0x7F >> length);
    for (size_t k = 1; k < length; ++k) {
      const auto cont = static_cast<unsigned char>(s[i + k]);
      if ((cont >> 6) != 2) return std::nullopt;
      cp = (cp << 6) | (cont & 0x3F);
    }
    out.push_back(cp);
    i += length;
  }
  return out;
}

/** A byte-level token ("Ġworld") as its bytes (" world"); nullopt when a character is not in the map. */
std::optional<std::string> byte_level_bytes(const std::string& token) {
  const auto cps = code_points(token);
  if (!cps) return std::nullopt;
  std::string bytes;
  for (char32_t cp : *cps) {
    const int16_t b = cp < byte_level_decoder().size() ? byte_level_decoder()[cp] : -1;
    if (b < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

/** "<0xE2>" -> the byte 0xE2; nullopt for any other token. */
std::optional<std::string> byte_fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  if (!std::isxdigit(static_cast<unsigned char>(token[3])) ||
      !std::isxdigit(static_cast<unsigned char>(token[4])))
    return std::nullopt;
  return std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
}

/** clean_tokenizer_vocab's fallback: decode a static prefix + the token, keep what follows the prefix
 * (decoders add or drop spaces and markers at the start of a text; the prefix takes that). */
class PrefixedDecoder {
 public:
  explicit PrefixedDecoder(text::Tokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {
    text::EncodeOptions plain;
    plain.add_special_tokens = false;
    prefix_ids_ = tokenizer_.encode(kPrefix, plain).ids;
  }

  std::string text(int64_t id) const {
    std::vector<int64_t> ids = prefix_ids_;
    ids.push_back(id);
    const std::string decoded = tokenizer_.decode(ids);
    const size_t at = decoded.find(kPrefix);
    // transformers raises when the prefix does not come back; such a decoder keeps the whole text here.
    return at == std::string::npos ? decoded : decoded.substr(at + std::string_view(kPrefix).size());
  }

  const text::Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  static constexpr const char* kPrefix = "abcdef";
  text::Tokenizer tokenizer_;
  std::vector<int64_t> prefix_ids_;
};

size_t length_in(const std::string& s, TokenTexts::Unit unit) {
  if (unit == TokenTexts::Unit::kByte) return s.size();
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

size_t max_length_for(const GenerationConfig& config, size_t prompt_length,
                      std::optional<size_t> max_positions) {
  if (config.max_new_tokens) return prompt_length + *config.max_new_tokens;
  if (config.max_length) return *config.max_length;
  // transformers' default: 20 new tokens, but not past the model's positions.
  const size_t length = prompt_length + 20;
  return max_positions ? std::min(length, *max_positions) : length;
}

}  // namespace

struct TokenTexts::Impl {
  TextOf text_of;
  Unit unit;
  std::mutex mutex;
  std::unordered_map<int64_t, std::string> cache;
};

TokenTexts::TokenTexts(TextOf text_of, Unit unit) : impl_(std::make_shared<Impl>()) {
  impl_->text_of = std::move(text_of);
  impl_->unit = unit;
}

TokenTexts TokenTexts::from_file(const fs::path& tokenizer_json) {
  const Matching matching = matching_of(decoder_of(tokenizer_json));
  auto decoder = std::make_shared<const PrefixedDecoder>(text::Tokenizer::from_file(tokenizer_json));
  TextOf text_of = [decoder, matching](int64_t id) -> std::string {
    if (id < 0) return {};  // not a token: it adds no text
    const std::optional<std::string> token = decoder->tokenizer().id_to_token(id);
    if (token && matching == Matching::kByteLevel)
      if (auto bytes = byte_level_bytes(*token)) return *bytes;
    if (token && matching == Matching::kByteFallback)
      if (auto byte = byte_fallback_byte(*token)) return *byte;
    return decoder->text(id);
  };
  return TokenTexts(std::move(text_of), matching == Matching::kDecoded ? Unit::kCodePoint : Unit::kByte);
}

std::string TokenTexts::text(int64_t id) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->cache.find(id);
  if (it == impl_->cache.end()) it = impl_->cache.emplace(id, impl_->text_of(id)).first;
  return it->second;
}

TokenTexts::Unit TokenTexts::unit() const { return impl_->unit; }

StopRules::StopRules(const GenerationConfig& config, size_t prompt_length, std::optional<TokenTexts> texts,
                     std::optional<size_t> max_position_embeddings)
    : eos_token_ids_(config.eos_token_ids),
      max_length_(max_length_for(config, prompt_length, max_position_embeddings)),
      stop_strings_(config.stop_strings),
      texts_(std::move(texts)) {
  config.validate();
  if (prompt_length >= max_length_)
    throw GenerationConfigError(str("generation config: the input has ", prompt_length,
                                    " tokens but max_length is ", max_length_,
                                    ", so nothing can be generated (set max_new_tokens instead)"));
  if (stop_strings_.empty()) return;
  if (!texts_) throw GenerationConfigError("generation config: stop_strings need the tokenizer's TokenTexts");
  for (const std::string& stop : stop_strings_) window_ = std::max(window_, length_in(stop, texts_->unit()));
}

bool StopRules::ends_with_stop_string(std::span<const int64_t> history) const {
  if (stop_strings_.empty() || history.empty()) return false;
  const std::span<const int64_t> window = history.last(std::min(window_, history.size()));
  std::string joined;
  for (size_t i = 0; i + 1 < window.size(); ++i) joined += texts_->text(window[i]);
  const size_t last_begins = joined.size();
  joined += texts_->text(window.back());
  for (const std::string& stop : stop_strings_) {
    // An occurrence ends inside the last token when it starts after last_begins - stop.size().
    const size_t from = last_begins + 1 > stop.size() ? last_begins + 1 - stop.size() : 0;
    if (joined.find(stop, from) != std::string::npos) return true;
  }
  return false;
}

StopReason StopRules::check(std::span<const int64_t> history) const {
  if (!history.empty() &&
      std::find(eos_token_ids_.begin(), eos_token_ids_.end(), history.back()) != eos_token_ids_.end())
    return StopReason::kEosToken;
  if (ends_with_stop_string(history)) return StopReason::kStopString;
  if (history.size() >= max_length_) return StopReason::kMaxLength;
  return StopReason::kNone;
}

}  // namespace transmuter::generation
