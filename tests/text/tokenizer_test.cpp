// transmuter::text::Tokenizer against Python tokenizers 0.23.2 (tests/text/fixtures/<kind>/expected.txt,
// recorded by scripts/make_tokenizer_fixtures.py). Tolerance: none, every field is compared exactly.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "text/tokenizer.h"
#include "support/expect_error.h"
#include "transmuter/text.h"

namespace fs = std::filesystem;
using namespace transmuter::text;

namespace {

const fs::path kFixtures = fs::path(TRANSMUTER_SOURCE_DIR) / "tests" / "text" / "fixtures";
const char* kKinds[] = {"wordpiece", "bytelevel_bpe", "unigram", "sentencepiece_bpe"};
// The pad token each fixture's batch cases were recorded with.
const std::map<std::string, std::string> kPadTokens = {{"wordpiece", "[PAD]"},
                                                       {"bytelevel_bpe", "<|endoftext|>"},
                                                       {"unigram", "<pad>"},
                                                       {"sentencepiece_bpe", "</s>"}};

using Case = std::map<std::string, std::string>;

// expected.txt: "case NAME" starts a record of "key value" lines.
std::vector<std::pair<std::string, Case>> read_cases(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::vector<std::pair<std::string, Case>> cases;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.find(' ');
    std::string key = line.substr(0, space), value = space == std::string::npos ? "" : line.substr(space + 1);
    if (key == "case") {
      cases.push_back({value, {}});
    } else {
      cases.back().second[key] = value;
    }
  }
  return cases;
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// "x" + hex of the UTF-8 bytes.
std::string unhex(const std::string& s) {
  EXPECT_EQ(s.at(0), 'x') << s;
  std::string out;
  for (size_t i = 1; i + 1 < s.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<int64_t> numbers(const std::string& s) {
  std::vector<int64_t> out;
  for (const std::string& w : words(s)) out.push_back(std::stoll(w));
  return out;
}

std::vector<std::string> strings(const std::string& s) {
  std::vector<std::string> out;
  for (const std::string& w : words(s)) out.push_back(unhex(w));
  return out;
}

void expect_encoding(const Encoding& e, const Case& c, const std::string& suffix, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(e.ids, numbers(c.at("ids" + suffix)));
  EXPECT_EQ(e.type_ids, numbers(c.at("type_ids" + suffix)));
  EXPECT_EQ(e.attention_mask, numbers(c.at("attention_mask" + suffix)));
  EXPECT_EQ(e.special_tokens_mask, numbers(c.at("special_tokens_mask" + suffix)));
  std::vector<int64_t> sequence_ids(e.sequence_ids.begin(), e.sequence_ids.end());
  EXPECT_EQ(sequence_ids, numbers(c.at("sequence_ids" + suffix)));
  std::vector<int64_t> offsets;
  for (const TokenOffsets& o : e.offsets) offsets.insert(offsets.end(), {int64_t(o.begin), int64_t(o.end)});
  EXPECT_EQ(offsets, numbers(c.at("offsets" + suffix)));
  EXPECT_EQ(e.tokens, strings(c.at("tokens" + suffix)));
}

EncodeOptions batch_options(const Case& c, const std::string& pad_token) {
  EncodeOptions options;
  if (c.count("max_length")) {
    Truncation t;
    t.max_length = std::stoul(c.at("max_length"));
    t.strategy = static_cast<TruncationStrategy>(std::stoi(c.at("strategy")));
    t.side = c.at("truncation_side") == "1" ? Side::kLeft : Side::kRight;
    options.truncation = t;
  }
  if (c.count("pad_length")) {
    Padding p;
    p.length = std::stoul(c.at("pad_length"));
    p.to_longest = p.length == 0;
    p.multiple_of = std::stoul(c.at("pad_to_multiple_of"));
    p.side = c.at("padding_side") == "1" ? Side::kLeft : Side::kRight;
    p.pad_token = pad_token;
    options.padding = p;
  }
  return options;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

class TokenizerReference : public testing::TestWithParam<const char*> {};

TEST_P(TokenizerReference, EqualsPythonTokenizers) {
  const std::string kind = GetParam();
  Tokenizer tok = Tokenizer::from_folder(kFixtures / kind);
  auto cases = read_cases(kFixtures / kind / "expected.txt");
  ASSERT_GT(cases.size(), 40u);
  int checked = 0;
  for (const auto& [name, c] : cases) {
    if (name.rfind("encode.", 0) == 0) {
      EncodeOptions options;
      options.add_special_tokens = c.at("add_special") == "1";
      Encoding e = tok.encode(unhex(c.at("text")), options);
      expect_encoding(e, c, "", kind + " " + name);
      EXPECT_EQ(tok.decode(e.ids, false), unhex(c.at("decode"))) << kind << " " << name;
      EXPECT_EQ(tok.decode(e.ids, true), unhex(c.at("decode_skip"))) << kind << " " << name;
    } else if (name.rfind("pair.", 0) == 0) {
      expect_encoding(tok.encode_pair(unhex(c.at("text")), unhex(c.at("pair"))), c, "", kind + " " + name);
    } else if (name.rfind("batch.", 0) == 0) {
      size_t count = std::stoul(c.at("count"));
      std::vector<std::string> texts, pairs;
      for (size_t i = 0; i < count; ++i) {
        texts.push_back(unhex(c.at("text." + std::to_string(i))));
        if (c.count("pair." + std::to_string(i))) pairs.push_back(unhex(c.at("pair." + std::to_string(i))));
      }
      EncodeOptions options = batch_options(c, kPadTokens.at(kind));
      std::vector<Encoding> batch = tok.encode_batch(texts, options, pairs);
      ASSERT_EQ(batch.size(), count) << name;
      for (size_t i = 0; i < count; ++i)
        expect_encoding(batch[i], c, "." + std::to_string(i), kind + " " + name);
    } else if (name.rfind("stream.", 0) == 0) {
      // Python's DecodeStream returns None where the ids end inside a character; ours returns "".
      DecodeStream stream = tok.decode_stream();
      std::vector<int64_t> ids = numbers(c.at("ids"));
      std::vector<std::string> chunks = words(c.at("chunks"));
      ASSERT_EQ(chunks.size(), ids.size()) << name;
      std::string all;
      for (size_t i = 0; i < ids.size(); ++i) {
        std::string piece = stream.step(ids[i]);
        EXPECT_EQ(piece, chunks[i] == "-" ? "" : unhex(chunks[i])) << kind << " " << name << " step " << i;
        EXPECT_TRUE(valid_utf8(piece)) << kind << " " << name << " step " << i;
        all += piece;
      }
      EXPECT_EQ(all, tok.decode(ids)) << kind << " " << name;
    } else if (name == "vocab") {
      EXPECT_EQ(tok.vocab_size(false), std::stoul(c.at("vocab_size")));
      EXPECT_EQ(tok.vocab_size(true), std::stoul(c.at("vocab_size_added")));
      std::vector<AddedToken> added = tok.added_tokens();
      std::vector<int64_t> ids, special;
      std::vector<std::string> contents;
      for (const AddedToken& a : added)
        ids.push_back(a.id), contents.push_back(a.content), special.push_back(a.special);
      EXPECT_EQ(ids, numbers(c.at("added_ids")));
      EXPECT_EQ(contents, strings(c.at("added_contents")));
      EXPECT_EQ(special, numbers(c.at("added_special")));
    } else {
      ADD_FAILURE() << "unknown case " << name;
      continue;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerReference, testing::ValuesIn(kKinds),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// token_to_id / id_to_token lines sit in the "vocab" record as repeated keys, so read them apart.
TEST(TokenizerVocab, TokenToIdAndIdToTokenEqualPython) {
  for (const char* kind : kKinds) {
    Tokenizer tok = Tokenizer::from_folder(kFixtures / kind);
    std::ifstream in(kFixtures / kind / "expected.txt");
    int probes = 0;
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> w = words(line);
      if (w.size() == 3 && w[0] == "token_to_id") {
        std::optional<int64_t> id = tok.token_to_id(unhex(w[1]));
        EXPECT_EQ(id.value_or(-1), std::stoll(w[2])) << kind << " " << unhex(w[1]);
        ++probes;
      } else if (w.size() == 3 && w[0] == "id_to_token") {
        std::optional<std::string> token = tok.id_to_token(std::stoll(w[1]));
        EXPECT_EQ(token.value_or("-"), w[2] == "-" ? "-" : unhex(w[2])) << kind << " id " << w[1];
        ++probes;
      }
    }
    EXPECT_EQ(probes, 11) << kind;
  }
}

}  // namespace

namespace {

fs::path temp_folder(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("transmuter_tokenizer_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

using transmuter::testing::error_of;

TEST(TokenizerErrors, MissingTokenizerJsonNamesTheFile) {
  fs::path dir = temp_folder("missing");
  std::string message = error_of<TokenizerFileError>([&] { Tokenizer::from_folder(dir); });
  EXPECT_NE(message.find((dir / "tokenizer.json").string()), std::string::npos) << message;
  message = error_of<TokenizerFileError>([&] { Tokenizer::from_file(dir / "nope.json"); });
  EXPECT_NE(message.find((dir / "nope.json").string()), std::string::npos) << message;
  fs::remove_all(dir);
}

TEST(TokenizerErrors, MalformedFilesNameTheFile) {
  fs::path dir = temp_folder("malformed");
  write_file(dir / "tokenizer.json", "{\"version\": \"1.0\", \"model\": ");
  std::string message = error_of<TokenizerFileError>([&] { Tokenizer::from_folder(dir); });
  EXPECT_NE(message.find((dir / "tokenizer.json").string()), std::string::npos) << message;
  // A valid tokenizer.json with a broken tokenizer_config.json.
  fs::copy_file(kFixtures / "wordpiece" / "tokenizer.json", dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  write_file(dir / "tokenizer_config.json", "{\"padding_side\": \"middle\"}");
  message = error_of<TokenizerFileError>([&] { Tokenizer::from_folder(dir); });
  EXPECT_NE(message.find("tokenizer_config.json"), std::string::npos) << message;
  EXPECT_NE(message.find("padding_side"), std::string::npos) << message;
  write_file(dir / "tokenizer_config.json", "not json");
  message = error_of<TokenizerFileError>([&] { Tokenizer::from_folder(dir); });
  EXPECT_NE(message.find("tokenizer_config.json: malformed JSON"), std::string::npos) << message;
  fs::remove_all(dir);
}

TEST(TokenizerErrors, PanicAtTheBoundaryIsAnError) {
  // max_length below the post-processor's 2 special tokens underflows inside tokenizers
  // (max_length - added tokens); the crate is built with overflow checks, so that panics, and the
  // panic must come back as an error instead of aborting the process.
  Tokenizer tok = Tokenizer::from_folder(kFixtures / "wordpiece");
  EncodeOptions options;
  options.truncation = Truncation{};
  options.truncation->max_length = 1;
  std::string message = error_of<TokenizerError>([&] { tok.encode("hello world", options); });
  EXPECT_NE(message.find("panic in tokenizers"), std::string::npos) << message;
  // The tokenizer still works after the panic.
  EXPECT_EQ(tok.encode("hello").tokens, (std::vector<std::string>{"[CLS]", "hello", "[SEP]"}));
}

TEST(TokenizerErrors, BadIdsAndOptions) {
  Tokenizer tok = Tokenizer::from_folder(kFixtures / "wordpiece");
  // Ids without a token are skipped by tokenizers' decode; negative ones cannot be passed on.
  EXPECT_EQ(tok.decode(std::vector<int64_t>{276, 1000000, 242}), tok.decode(std::vector<int64_t>{276, 242}));
  EXPECT_NE(error_of<TokenizerError>([&] { tok.decode(std::vector<int64_t>{-1}); }).find("out of range"),
            std::string::npos);
  EncodeOptions options;
  options.padding = Padding{};
  options.padding->pad_token = "<not-a-token>";
  EXPECT_NE(error_of<TokenizerError>([&] { tok.encode("a", options); }).find("<not-a-token>"),
            std::string::npos);
  std::vector<std::string> texts{"a", "b"}, pairs{"c"};
  EXPECT_NE(error_of<TokenizerError>([&] { tok.encode_batch(texts, {}, pairs); }).find("2 texts but 1 pairs"),
            std::string::npos);
  // sentencepiece_bpe's tokenizer_config.json has pad_token null: padding must name one.
  Tokenizer spbpe = Tokenizer::from_folder(kFixtures / "sentencepiece_bpe");
  options.padding = Padding{};
  EXPECT_NE(error_of<TokenizerError>([&] { spbpe.encode_batch(texts, options); }).find("no pad token"),
            std::string::npos);
}

TEST(TokenizerBatch, EqualsPerItemEncodeThenPadding) {
  for (const char* kind : kKinds) {
    Tokenizer tok = Tokenizer::from_folder(kFixtures / kind);
    std::vector<std::string> texts{"Hello world!", "", "我能吞下玻璃 😀👍🏽", "  tabs\tand\nnewlines  "};
    EncodeOptions padded;
    padded.padding = Padding{};
    padded.padding->pad_token = kPadTokens.at(kind);
    std::vector<Encoding> batch = tok.encode_batch(texts, padded);
    size_t longest = 0;
    for (const std::string& t : texts) longest = std::max(longest, tok.encode(t).size());
    Side side = tok.config().padding_side;
    int64_t pad_id = *tok.token_to_id(kPadTokens.at(kind));
    for (size_t i = 0; i < texts.size(); ++i) {
      Encoding single = tok.encode(texts[i]);
      const Encoding& b = batch[i];
      ASSERT_EQ(b.size(), longest) << kind << " " << i;
      size_t pads = longest - single.size();
      size_t first = side == Side::kLeft ? pads : 0;  // where the unpadded tokens start
      for (size_t j = 0; j < longest; ++j) {
        bool pad = side == Side::kLeft ? j < pads : j >= single.size();
        if (pad) {
          EXPECT_EQ(b.ids[j], pad_id);
          EXPECT_EQ(b.attention_mask[j], 0);
          EXPECT_EQ(b.special_tokens_mask[j], 1);
          EXPECT_EQ(b.offsets[j], TokenOffsets{});
        } else {
          EXPECT_EQ(b.ids[j], single.ids[j - first]) << kind << " " << i << " " << j;
          EXPECT_EQ(b.offsets[j], single.offsets[j - first]);
          EXPECT_EQ(b.tokens[j], single.tokens[j - first]);
          EXPECT_EQ(b.attention_mask[j], 1);
        }
      }
    }
  }
}

TEST(TokenizerConfig, HonouredFields) {
  Tokenizer wp = Tokenizer::from_folder(kFixtures / "wordpiece");
  EXPECT_EQ(wp.config().model_max_length, 32u);
  EXPECT_EQ(wp.config().pad_token, "[PAD]");
  Tokenizer bbpe = Tokenizer::from_folder(kFixtures / "bytelevel_bpe");
  EXPECT_FALSE(bbpe.config().model_max_length.has_value());  // transformers' 1e30 "no limit"
  EXPECT_EQ(bbpe.config().padding_side, Side::kLeft);
  Tokenizer unigram = Tokenizer::from_folder(kFixtures / "unigram");
  EXPECT_EQ(unigram.config().pad_token, "<pad>");  // written as an AddedToken object
  EXPECT_EQ(unigram.config().truncation_side, Side::kLeft);
  EXPECT_FALSE(Tokenizer::from_folder(kFixtures / "sentencepiece_bpe").config().pad_token.has_value());
  EXPECT_FALSE(Tokenizer::from_file(kFixtures / "wordpiece" / "tokenizer.json").config().model_max_length);

  // Truncation without a length uses model_max_length (32 for wordpiece); a fixed padding
  // without a length pads to it.
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "hello world ";
  EncodeOptions options;
  options.truncation = Truncation{};
  EXPECT_EQ(wp.encode(long_text, options).size(), 32u);
  options.padding = Padding{};
  options.padding->to_longest = false;
  EXPECT_EQ(wp.encode("hello", options).size(), 32u);
  EncodeOptions truncate;
  truncate.truncation = Truncation{};
  EXPECT_NE(error_of<TokenizerError>([&] { bbpe.encode(long_text, truncate); }).find("model_max_length"),
            std::string::npos);
}

TEST(TokenizerDecode, CleanUpTokenizationAsTransformers) {
  EXPECT_EQ(clean_up_tokenization("Hello , world ! Is n't it ? I 'm sure . We 're , they 've"),
            "Hello, world! Isn't it? I'm sure. We're, they've");
  EXPECT_EQ(clean_up_tokenization(""), "");
}

TEST(TokenizerDecode, StreamNeverSplitsACharacter) {
  // Byte-level BPE puts one emoji's bytes into several tokens: no step may return part of it.
  Tokenizer tok = Tokenizer::from_folder(kFixtures / "bytelevel_bpe");
  std::string text = "👨‍👩‍👧‍👦 家族 🇫🇷 é ";
  Encoding e = tok.encode(text);
  ASSERT_GT(e.size(), 8u);
  DecodeStream stream = tok.decode_stream();
  std::string all;
  int empty_steps = 0;
  for (int64_t id : e.ids) {
    std::string piece = stream.step(id);
    EXPECT_TRUE(valid_utf8(piece));
    empty_steps += piece.empty();
    all += piece;
  }
  EXPECT_GT(empty_steps, 0);  // some ids did end inside a character
  EXPECT_EQ(all, text);
}

}  // namespace
