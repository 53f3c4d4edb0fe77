// transmuter::text::Tokenizer over the C ABI of rust/ (transmuter_text.h): handles are owned by
// unique_ptrs with the ABI's free functions, every call's error becomes an exception.
#include "text/tokenizer.h"

#include <limits>
#include <memory>
#include <system_error>

#include "transmuter/text.h"
#include "transmuter_text.h"

namespace transmuter::text {
namespace {

namespace fs = std::filesystem;

struct TokenizerFree {
  void operator()(TtTokenizer* t) const { tt_tokenizer_free(t); }
};
struct EncodingsFree {
  void operator()(TtEncodings* e) const { tt_encodings_free(e); }
};
struct DecodeStreamFree {
  void operator()(TtDecodeStream* s) const { tt_decode_stream_free(s); }
};

/** Takes ownership of a TtString: its bytes as a std::string, or nullopt for a NULL one. */
std::optional<std::string> take(TtString s) {
  if (s.data == nullptr) return std::nullopt;
  std::string out(s.data, s.len);
  tt_string_free(s);
  return out;
}

Side side_of(int32_t value, Side fallback) {
  return value < 0 ? fallback : (value == 1 ? Side::kLeft : Side::kRight);
}

TokenizerConfig read_config(const fs::path& path) {
  TtTokenizerConfig raw{};
  throw_if_error(tt_tokenizer_config_read(path.c_str(), &raw), true);
  TokenizerConfig config;
  if (raw.model_max_length > 0) config.model_max_length = static_cast<size_t>(raw.model_max_length);
  config.padding_side = side_of(raw.padding_side, Side::kRight);
  config.truncation_side = side_of(raw.truncation_side, Side::kRight);
  config.clean_up_tokenization_spaces = raw.clean_up_tokenization_spaces == 1;
  config.pad_token = take(raw.pad_token);
  return config;
}

uint32_t checked_id(int64_t id) {
  if (id < 0 || id > std::numeric_limits<uint32_t>::max())
    throw TokenizerError(str("token id ", id, " is out of range [0, 2^32)"));
  return static_cast<uint32_t>(id);
}

template <typename T>
std::vector<int64_t> widen(const T* data, size_t n) {
  return std::vector<int64_t>(data, data + n);
}

Encoding encoding_at(const TtEncodings* encodings, size_t index) {
  TtEncodingView view{};
  throw_if_error(tt_encodings_get(encodings, index, &view));
  Encoding e;
  e.ids = widen(view.ids, view.len);
  e.type_ids = widen(view.type_ids, view.len);
  e.attention_mask = widen(view.attention_mask, view.len);
  e.special_tokens_mask = widen(view.special_tokens_mask, view.len);
  e.sequence_ids.assign(view.sequence_ids, view.sequence_ids + view.len);
  e.offsets.reserve(view.len);
  e.tokens.reserve(view.len);
  for (size_t i = 0; i < view.len; ++i) {
    e.offsets.push_back({view.offsets[2 * i], view.offsets[2 * i + 1]});
    const char* data = nullptr;
    size_t len = 0;
    throw_if_error(tt_encodings_token(encodings, index, i, &data, &len));
    e.tokens.emplace_back(data, len);
  }
  return e;
}

}  // namespace

void throw_if_error(char* error, bool file_error) {
  if (error == nullptr) return;
  std::string message(error);
  tt_error_free(error);
  if (file_error) throw TokenizerFileError(message);
  throw TokenizerError(message);
}

std::string clean_up_tokenization(std::string text) {
  // transformers' PreTrainedTokenizerBase.clean_up_tokenization: these replacements, in this order.
  static constexpr std::pair<std::string_view, std::string_view> kReplacements[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kReplacements) {
    std::string out;
    out.reserve(text.size());
    size_t start = 0;
    for (size_t at; (at = text.find(from, start)) != std::string::npos; start = at + from.size())
      out.append(text, start, at - start).append(to);
    out.append(text, start);
    text = std::move(out);
  }
  return text;
}

struct Tokenizer::Impl {
  std::unique_ptr<TtTokenizer, TokenizerFree> handle;
  TokenizerConfig config;
  fs::path source;

  /** The ABI's options: per-call settings completed from tokenizer_config.json. pad_token must
   * outlive the result. */
  TtEncodeOptions abi_options(const EncodeOptions& options, const std::string*& pad_token) const;
  std::vector<Encoding> encode(const std::vector<TtInput>& inputs, const EncodeOptions& options) const;
};

TtEncodeOptions Tokenizer::Impl::abi_options(const EncodeOptions& options,
                                             const std::string*& pad_token) const {
  TtEncodeOptions o{};
  o.add_special_tokens = options.add_special_tokens;
  auto max_length = [&](size_t given, const char* what) {
    if (given > 0) return given;
    if (config.model_max_length) return *config.model_max_length;
    throw TokenizerError(str(what, ": no length given and ", source.string(),
                             " has no model_max_length (tokenizer_config.json)"));
  };
  if (const auto& t = options.truncation) {
    o.truncate = 1;
    o.max_length = max_length(t->max_length, "truncation");
    o.stride = t->stride;
    o.truncation_strategy = static_cast<int32_t>(t->strategy);
    o.truncation_side = t->side.value_or(config.truncation_side) == Side::kLeft;
  }
  if (const auto& p = options.padding) {
    o.padding = p->to_longest ? 1 : 2;
    if (!p->to_longest)
      o.pad_length = p->length > 0 ? p->length : (o.truncate ? o.max_length : max_length(0, "padding"));
    o.pad_to_multiple_of = p->multiple_of;
    o.padding_side = p->side.value_or(config.padding_side) == Side::kLeft;
    pad_token = p->pad_token ? &*p->pad_token : (config.pad_token ? &*config.pad_token : nullptr);
    if (pad_token != nullptr) {
      uint32_t id = 0;
      int32_t found = 0;
      throw_if_error(tt_token_to_id(handle.get(), pad_token->data(), pad_token->size(), &id, &found));
      if (!found)
        throw TokenizerError(str("padding: the pad token '", *pad_token, "' is not in the vocabulary"));
      o.pad_id = id;
      o.pad_token = pad_token->data();
      o.pad_token_len = pad_token->size();
    }
  }
  return o;
}

std::vector<Encoding> Tokenizer::Impl::encode(const std::vector<TtInput>& inputs,
                                              const EncodeOptions& options) const {
  const std::string* pad_token = nullptr;
  TtEncodeOptions o = abi_options(options, pad_token);
  TtEncodings* raw = nullptr;
  throw_if_error(tt_encode(handle.get(), &o, inputs.data(), inputs.size(), &raw));
  std::unique_ptr<TtEncodings, EncodingsFree> encodings(raw);
  std::vector<Encoding> out;
  out.reserve(inputs.size());
  for (size_t i = 0; i < tt_encodings_count(raw); ++i) out.push_back(encoding_at(raw, i));
  return out;
}

Tokenizer Tokenizer::from_file(const fs::path& tokenizer_json) {
  auto impl = std::make_shared<Impl>();
  TtTokenizer* raw = nullptr;
  throw_if_error(tt_tokenizer_from_file(tokenizer_json.c_str(), &raw), true);
  impl->handle.reset(raw);
  impl->source = tokenizer_json;
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "tokenizer.json", ec))
    throw TokenizerFileError(str((dir / "tokenizer.json").string(), ": no such file"));
  Tokenizer tokenizer = from_file(dir / "tokenizer.json");
  if (fs::exists(dir / "tokenizer_config.json", ec)) {
    auto impl = std::const_pointer_cast<Impl>(tokenizer.impl_);  // not shared yet
    impl->config = read_config(dir / "tokenizer_config.json");
  }
  return tokenizer;
}

Encoding Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  return impl_->encode({TtInput{text.data(), text.size(), nullptr, 0}}, options).at(0);
}

Encoding Tokenizer::encode_pair(std::string_view text, std::string_view pair,
                                const EncodeOptions& options) const {
  // A pair of length 0 still needs a non-NULL pointer: NULL means "no pair".
  const char* pair_data = pair.data() != nullptr ? pair.data() : "";
  return impl_->encode({TtInput{text.data(), text.size(), pair_data, pair.size()}}, options).at(0);
}

std::vector<Encoding> Tokenizer::encode_batch(std::span<const std::string> texts,
                                              const EncodeOptions& options,
                                              std::span<const std::string> pairs) const {
  if (!pairs.empty() && pairs.size() != texts.size())
    throw TokenizerError(str("encode_batch: ", texts.size(), " texts but ", pairs.size(), " pairs"));
  std::vector<TtInput> inputs;
  inputs.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    TtInput in{texts[i].data(), texts[i].size(), nullptr, 0};
    if (!pairs.empty()) in.pair = pairs[i].c_str(), in.pair_len = pairs[i].size();
    inputs.push_back(in);
  }
  return impl_->encode(inputs, options);
}

std::string Tokenizer::decode(std::span<const int64_t> ids, bool skip_special_tokens) const {
  std::vector<uint32_t> narrow;
  narrow.reserve(ids.size());
  for (int64_t id : ids) narrow.push_back(checked_id(id));
  TtString out{};
  throw_if_error(tt_decode(impl_->handle.get(), narrow.data(), narrow.size(), skip_special_tokens, &out));
  std::string text = take(out).value_or("");
  return impl_->config.clean_up_tokenization_spaces ? clean_up_tokenization(std::move(text)) : text;
}

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  uint32_t id = 0;
  int32_t found = 0;
  throw_if_error(tt_token_to_id(impl_->handle.get(), token.data(), token.size(), &id, &found));
  return found ? std::optional<int64_t>(id) : std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id > std::numeric_limits<uint32_t>::max()) return std::nullopt;
  TtString out{};
  throw_if_error(tt_id_to_token(impl_->handle.get(), static_cast<uint32_t>(id), &out));
  return take(out);
}

std::string Tokenizer::tokens_to_string(std::span<const std::string> tokens) const {
  std::string joined;
  std::vector<size_t> offsets{0};
  for (const auto& token : tokens) {
    joined += token;
    offsets.push_back(joined.size());
  }
  TtString out{};
  throw_if_error(
      tt_tokens_to_string(impl_->handle.get(), joined.data(), offsets.data(), tokens.size(), &out));
  return take(out).value_or("");
}

std::optional<std::string> Tokenizer::continuing_subword_prefix() const {
  TtString out{};
  throw_if_error(tt_continuing_subword_prefix(impl_->handle.get(), &out));
  return take(out);
}

size_t Tokenizer::vocab_size(bool with_added_tokens) const {
  size_t size = 0;
  throw_if_error(tt_vocab_size(impl_->handle.get(), with_added_tokens, &size));
  return size;
}

std::vector<AddedToken> Tokenizer::added_tokens() const {
  TtAddedToken* raw = nullptr;
  size_t count = 0;
  throw_if_error(tt_added_tokens(impl_->handle.get(), &raw, &count));
  std::vector<AddedToken> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i)
    out.push_back({raw[i].id, std::string(raw[i].content.data, raw[i].content.len), raw[i].special != 0});
  tt_added_tokens_free(raw, count);
  return out;
}

const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

struct DecodeStream::Impl {
  std::unique_ptr<TtDecodeStream, DecodeStreamFree> handle;
};

DecodeStream Tokenizer::decode_stream(bool skip_special_tokens) const {
  TtDecodeStream* raw = nullptr;
  throw_if_error(tt_decode_stream_new(impl_->handle.get(), skip_special_tokens, &raw));
  auto impl = std::make_unique<DecodeStream::Impl>();
  impl->handle.reset(raw);
  return DecodeStream(std::move(impl));
}

DecodeStream::DecodeStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DecodeStream::DecodeStream(DecodeStream&&) noexcept = default;
DecodeStream& DecodeStream::operator=(DecodeStream&&) noexcept = default;
DecodeStream::~DecodeStream() = default;

std::string DecodeStream::step(int64_t id) {
  TtString out{};
  throw_if_error(tt_decode_stream_step(impl_->handle.get(), checked_id(id), &out));
  return take(out).value_or("");
}

}  // namespace transmuter::text
