// Generation's token choice (include/transmuter/generation.h) against transformers 5.23.0. Every expected
// value comes from transformers itself, recorded by scripts/make_generation_references.py into
// tests/pipelines/fixtures/generation/ (the tests only read them).
//
// Tolerance for processed logits: |got - want| <= 1e-5 * max(1, |want|), and -inf exactly where
// transformers has -inf. The values come from float32 scalar arithmetic done as torch does it on CPU and
// agree bit for bit today; the tolerance leaves room for references recorded where torch rounds otherwise
// (its CUDA kernels divide by a scalar as a multiplication by its reciprocal).
// What could really differ is a cut (top-p, min-p) decided on probabilities within rounding of the
// threshold, since std::exp is not torch's vectorized exp: that shows as a -inf mismatch, not a tolerance.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/expect_error.h"
#include "transmuter/generation.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace transmuter::generation;
using transmuter::testing::error_of;

namespace {

const fs::path kFixtures =
    fs::path(TRANSMUTER_SOURCE_DIR) / "tests" / "pipelines" / "fixtures" / "generation";
const fs::path kTokenizers = fs::path(TRANSMUTER_SOURCE_DIR) / "tests" / "text" / "fixtures";
constexpr float kInf = std::numeric_limits<float>::infinity();

json load(const std::string& name) {
  std::ifstream in(kFixtures / name);
  EXPECT_TRUE(in) << kFixtures / name;
  return json::parse(in);
}

std::vector<float> floats(const json& values) {
  std::vector<float> out;
  for (const json& v : values) out.push_back(v.is_string() ? -kInf : static_cast<float>(v.get<double>()));
  return out;
}

std::vector<int64_t> ids(const json& values) { return values.get<std::vector<int64_t>>(); }

void expect_row_matches(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << name << " at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::abs(want[i]))) << name << " at " << i;
    }
  }
}

/** A fresh folder under the system's temp dir, removed afterwards. */
class TempFolder {
 public:
  TempFolder() {
    std::string pattern = (fs::temp_directory_path() / "generation_test_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempFolder() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return path_ / name;
  }

 private:
  fs::path path_;
};

/** A GenerationConfig from the fields transformers was given, read through from_file. */
GenerationConfig config_of(const json& fields) {
  TempFolder folder;
  return GenerationConfig::from_file(folder.write("generation_config.json", fields.dump()));
}

template <typename T>
json as_json(const std::optional<T>& v) {
  return v ? json(*v) : json();
}

/** The fields of configs.json's "expected", as this config has them. */
json fields_of(const GenerationConfig& c) {
  return {{"max_new_tokens", as_json(c.max_new_tokens)},
          {"max_length", as_json(c.max_length)},
          {"min_length", c.min_length},
          {"min_new_tokens", as_json(c.min_new_tokens)},
          {"do_sample", c.do_sample},
          {"temperature", c.temperature},
          {"top_k", c.top_k},
          {"top_p", c.top_p},
          {"min_p", as_json(c.min_p)},
          {"repetition_penalty", c.repetition_penalty},
          {"no_repeat_ngram_size", c.no_repeat_ngram_size},
          {"pad_token_id", as_json(c.pad_token_id)},
          {"bos_token_id", as_json(c.bos_token_id)},
          {"decoder_start_token_id", as_json(c.decoder_start_token_id)},
          {"stop_strings", c.stop_strings},
          {"eos_token_ids", c.eos_token_ids},
          {"generation_pad_token_id", as_json(c.pad_token_id_or_eos())}};
}

void expect_fields(const GenerationConfig& config, const json& expected, const std::string& name) {
  const json got = fields_of(config);
  for (auto [key, want] : expected.items()) {
    ASSERT_TRUE(got.contains(key)) << name << ": no field " << key;
    // Numbers compare as numbers (transformers keeps an int temperature an int; ours is a double).
    if (want.is_number()) {
      EXPECT_EQ(got[key].get<double>(), want.get<double>()) << name << ": " << key;
    } else {
      EXPECT_EQ(got[key], want) << name << ": " << key;
    }
  }
}

std::vector<float> processed_by_class(const json& c) {
  std::vector<float> logits = floats(c["logits"]);
  const std::vector<int64_t> history = ids(c["history"]);
  if (c.contains("penalty")) {
    apply_repetition_penalty(logits, history, c["penalty"]);
  } else if (c.contains("ngram_size")) {
    ban_repeated_ngrams(logits, history, c["ngram_size"]);
  } else if (c.contains("min_new_tokens")) {
    GenerationConfig config;
    config.min_new_tokens = c["min_new_tokens"].get<size_t>();
    config.eos_token_ids = ids(c["eos"]);
    LogitsProcessor(config).apply(logits, history, history.size() - c["prompt_length"].get<size_t>());
  } else if (c.contains("min_length")) {
    GenerationConfig config;
    config.min_length = c["min_length"];
    config.eos_token_ids = ids(c["eos"]);
    LogitsProcessor(config).apply(logits, history, 0);
  } else if (c.contains("temperature")) {
    apply_temperature(logits, c["temperature"]);
  } else if (c.contains("top_k")) {
    keep_top_k(logits, c["top_k"]);
  } else if (c.contains("top_p")) {
    keep_top_p(logits, c["top_p"]);
  } else if (c.contains("min_p")) {
    keep_min_p(logits, c["min_p"]);
  } else {
    ADD_FAILURE() << "unknown processor in " << c["name"];
  }
  return logits;
}

const json& chain_case(const std::string& name) {
  static const json chains = load("chains.json");
  for (const json& c : chains["cases"])
    if (c["name"] == name) return c;
  static const json none;
  ADD_FAILURE() << "no chain case " << name;
  return none;
}

size_t generated_of(const json& c) { return c["history"].size() - c["prompt_length"].get<size_t>(); }

/** The stand-in model of generate.json (make_generation_references.py's hash_logits): logits k / 64 for k
 * in [-1000, 1000] from a hash of the last two tokens and the length; exact in float32. */
uint64_t mix64(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7FB5D329728EA185ull;
  x ^= x >> 27;
  x *= 0x81DADEF4BC2DD44Dull;
  return x ^ (x >> 33);
}

std::vector<float> hash_logits(const std::vector<int64_t>& history, size_t vocab) {
  const uint64_t last = history.empty() ? 0 : history.back();
  const uint64_t before = history.size() > 1 ? history[history.size() - 2] : 0;
  const uint64_t base = mix64(last * 0x9E3779B97F4A7C15ull + before * 0xC2B2AE3D27D4EB4Full + history.size());
  std::vector<float> logits(vocab);
  for (size_t v = 0; v < vocab; ++v)
    logits[v] = (static_cast<float>(mix64(base + v) % 2001) - 1000.0f) / 64.0f;
  return logits;
}

fs::path tokenizer_json(const std::string& kind) {
  return kind == "byte_fallback" ? kFixtures / kind / "tokenizer.json"
                                 : kTokenizers / kind / "tokenizer.json";
}

}  // namespace

TEST(GenerationProcessors, MatchTransformersLogitsProcessorClasses) {
  const json cases = load("processors.json")["cases"];
  ASSERT_GE(cases.size(), 40u);
  for (const json& c : cases) expect_row_matches(processed_by_class(c), floats(c["expected"]), c["name"]);
}

TEST(GenerationProcessors, ChainsMatchGetLogitsProcessor) {
  const json cases = load("chains.json")["cases"];
  ASSERT_GE(cases.size(), 55u);  // 25 of them encoder-decoder checkpoints' forcing and suppressing processors
  for (const json& c : cases) {
    const LogitsProcessor processor(config_of(c["config"]));
    std::vector<float> logits = floats(c["logits"]);
    processor.apply(logits, ids(c["history"]), generated_of(c), c["max_length"].get<size_t>());
    expect_row_matches(logits, floats(c["expected"]), c["name"]);
    EXPECT_EQ(argmax_token(logits), c["argmax"].get<int64_t>()) << c["name"];
  }
}

TEST(GenerationGreedy, TakesTheFirstMaximumLikeTorchArgmax) {
  // The script puts a tie at the maximum into every row; unprocessed rows keep it.
  for (const char* name : {"greedy_defaults_0", "greedy_defaults_1", "greedy_defaults_2"}) {
    const json& c = chain_case(name);
    std::vector<float> logits = floats(c["logits"]);
    const float max = *std::max_element(logits.begin(), logits.end());
    ASSERT_GE(std::count(logits.begin(), logits.end(), max), 2) << name << " has no tie at the maximum";
    TokenSampler greedy(config_of(c["config"]));
    EXPECT_EQ(greedy.next(logits, ids(c["history"]), generated_of(c)), c["argmax"].get<int64_t>()) << name;
  }
}

TEST(GenerationGreedy, ProcessesBeforeChoosing) {
  for (const char* name : {"greedy_penalties_0", "greedy_penalties_1", "greedy_penalty_below_one_2",
                           "greedy_ignores_warpers_1"}) {
    const json& c = chain_case(name);
    std::vector<float> logits = floats(c["logits"]);
    TokenSampler greedy(config_of(c["config"]));
    EXPECT_EQ(greedy.next(logits, ids(c["history"]), generated_of(c)), c["argmax"].get<int64_t>()) << name;
  }
}

// generate()'s greedy loop for one sequence: choose, append, then ask the stopping criteria.
TEST(GenerationGreedy, WholeRunsMatchGenerate) {
  const json cases = load("generate.json")["cases"];
  ASSERT_GE(cases.size(), 10u);
  for (const json& c : cases) {
    const GenerationConfig config = config_of(c["config"]);
    std::optional<TokenTexts> texts;
    if (!c["tokenizer"].is_null()) texts = TokenTexts::from_file(tokenizer_json(c["tokenizer"]));
    const std::vector<int64_t> prompt = ids(c["prompt"]);
    TokenSampler sampler(config);
    const StopRules rules(config, prompt.size(), texts);
    std::vector<int64_t> sequence = prompt;
    do {
      std::vector<float> logits = hash_logits(sequence, c["vocab"]);
      sequence.push_back(sampler.next(logits, sequence, sequence.size() - prompt.size()));
    } while (rules.check(sequence) == StopReason::kNone);
    EXPECT_EQ(sequence, ids(c["sequence"])) << c["name"];
  }
}

TEST(GenerationSampling, IsReproducibleForASeedAndDiffersAcrossSeedsAndRows) {
  const json& c = chain_case("sample_temperature_top_k_top_p_1");
  const GenerationConfig config = config_of(c["config"]);
  GenerationConfig other_seed = config;
  other_seed.seed = 1;
  auto draws = [&](const GenerationConfig& cfg, uint64_t row) {
    TokenSampler sampler(cfg, row);
    std::vector<int64_t> out;
    for (int i = 0; i < 200; ++i) {
      std::vector<float> logits = floats(c["logits"]);
      out.push_back(sampler.next(logits, ids(c["history"]), generated_of(c)));
    }
    return out;
  };
  const std::vector<int64_t> first = draws(config, 0);
  EXPECT_EQ(draws(config, 0), first);
  EXPECT_NE(draws(other_seed, 0), first);
  EXPECT_NE(draws(config, 1), first);
  // Not a constant: the kept set has several tokens, and the draws use them.
  EXPECT_GT(std::set<int64_t>(first.begin(), first.end()).size(), 3u);
}

// Each token's count over N draws is Binomial(N, p) with p = softmax(transformers' processed row). A
// bound of 5 standard deviations (+1 count for rounding) fails a correct sampler for a given token with
// probability < 6e-7, so < 1e-4 over the at most ~130 tokens of a row; the draws are deterministic
// for the seed, so the test cannot flake. A sampler off by one token, drawing from unprocessed logits or
// ignoring the temperature misses it by hundreds of deviations.
TEST(GenerationSampling, FrequenciesMatchTheProcessedSoftmax) {
  constexpr int kDraws = 20000;
  for (const char* name :
       {"sample_temperature_top_k_top_p_1", "sample_all_2", "sample_defaults_0", "sample_min_length_1"}) {
    const json& c = chain_case(name);
    const std::vector<float> expected = floats(c["expected"]);
    const float max = *std::max_element(expected.begin(), expected.end());
    std::vector<double> p(expected.size());
    double total = 0;
    for (size_t i = 0; i < p.size(); ++i) total += p[i] = std::exp(double(expected[i]) - max);
    for (double& v : p) v /= total;

    TokenSampler sampler(config_of(c["config"]));
    std::vector<int> counts(p.size());
    for (int i = 0; i < kDraws; ++i) {
      std::vector<float> logits = floats(c["logits"]);
      ++counts.at(sampler.next(logits, ids(c["history"]), generated_of(c)));
    }
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] == 0) {
        EXPECT_EQ(counts[i], 0) << name << ": masked token " << i << " was drawn";
        continue;
      }
      const double bound = 5 * std::sqrt(kDraws * p[i] * (1 - p[i])) + 1;
      EXPECT_NEAR(counts[i], kDraws * p[i], bound) << name << ": token " << i;
    }
  }
}

TEST(GenerationSampling, TopKOneAndATinyTemperatureChooseLikeGreedy) {
  // With a unique maximum (a tied one survives top_k=1 in transformers too, and is then sampled).
  for (const char* name : {"sample_defaults_0", "sample_all_1", "sample_sharp_2"}) {
    const json& c = chain_case(name);
    std::vector<float> raw = floats(c["logits"]);
    *std::max_element(raw.begin(), raw.end()) += 1.0f;
    const std::vector<int64_t> history = ids(c["history"]);
    GenerationConfig greedy = config_of(c["config"]);
    greedy.do_sample = false;
    std::vector<float> logits = raw;
    const int64_t want = TokenSampler(greedy).next(logits, history, generated_of(c));

    GenerationConfig top_k_one = config_of(c["config"]);
    top_k_one.top_k = 1;
    GenerationConfig cold = config_of(c["config"]);
    cold.temperature = 1e-4;
    cold.top_k = 0;
    for (const GenerationConfig& config : {top_k_one, cold}) {
      TokenSampler sampler(config);
      for (int i = 0; i < 100; ++i) {
        logits = raw;
        ASSERT_EQ(sampler.next(logits, history, generated_of(c)), want) << name;
      }
    }
  }
}

TEST(GenerationSampling, RefusesARowWithEveryTokenMasked) {
  GenerationConfig config;
  config.do_sample = true;
  TokenSampler sampler(config);
  std::vector<float> masked(8, -kInf);
  EXPECT_NE(error_of<GenerationConfigError>([&] { sampler.draw(masked); }).find("every logit is -inf"),
            std::string::npos);
}

TEST(GenerationStopStrings, MatchStopStringCriteria) {
  const json cases = load("stop_strings.json")["cases"];
  ASSERT_GE(cases.size(), 200u);
  std::map<std::string, TokenTexts> texts;
  size_t stops = 0;
  for (const json& c : cases) {
    const std::string kind = c["tokenizer"];
    if (!texts.count(kind)) texts.emplace(kind, TokenTexts::from_file(tokenizer_json(kind)));
    GenerationConfig config;
    config.stop_strings = c["stop_strings"].get<std::vector<std::string>>();
    config.max_new_tokens = 1000;
    const StopRules rules(config, 0, texts.at(kind));
    const std::vector<int64_t> sequence = ids(c["ids"]);
    for (size_t k = 1; k <= sequence.size(); ++k) {
      const std::span<const int64_t> prefix(sequence.data(), k);
      const bool want = c["expected"][k - 1];
      EXPECT_EQ(rules.ends_with_stop_string(prefix), want)
          << kind << " " << c["origin"] << " " << c["stop_strings"] << " after " << k << " tokens";
      if (want) {
        EXPECT_EQ(rules.check(prefix), StopReason::kStopString);
      }
      stops += want;
    }
  }
  EXPECT_GE(stops, 50u);  // the cases do stop, and often
}

TEST(GenerationStopStrings, UnitsFollowTheMatchingMode) {
  EXPECT_EQ(TokenTexts::from_file(tokenizer_json("bytelevel_bpe")).unit(), TokenTexts::Unit::kByte);
  EXPECT_EQ(TokenTexts::from_file(tokenizer_json("byte_fallback")).unit(), TokenTexts::Unit::kByte);
  EXPECT_EQ(TokenTexts::from_file(tokenizer_json("wordpiece")).unit(), TokenTexts::Unit::kCodePoint);
}

TEST(GenerationStopRules, EosAndLength) {
  GenerationConfig config;
  config.eos_token_ids = {5, 7};
  config.max_new_tokens = 3;
  const StopRules rules(config, 2);
  EXPECT_EQ(rules.max_length(), 5u);
  EXPECT_EQ(rules.check(std::vector<int64_t>{1, 2, 3}), StopReason::kNone);
  EXPECT_EQ(rules.check(std::vector<int64_t>{1, 2, 7}), StopReason::kEosToken);
  EXPECT_EQ(rules.check(std::vector<int64_t>{7, 2, 3}), StopReason::kNone);  // only the last token counts
  EXPECT_EQ(rules.check(std::vector<int64_t>{1, 2, 3, 4, 9}), StopReason::kMaxLength);
}

TEST(GenerationStopRules, MaxLengthAsGenerateDerivesIt) {
  const json cases = load("configs.json")["lengths"];
  ASSERT_GE(cases.size(), 8u);
  for (const json& c : cases) {
    const GenerationConfig config = config_of(c["config"]);
    const size_t prompt = c["prompt_length"];
    std::optional<size_t> positions;
    if (!c["max_position_embeddings"].is_null()) positions = c["max_position_embeddings"].get<size_t>();
    if (c.contains("error")) {
      EXPECT_NE(error_of<GenerationConfigError>([&] {
                  StopRules(config, prompt, std::nullopt, positions);
                }).find("nothing can be generated"),
                std::string::npos)
          << c["error"];
    } else {
      EXPECT_EQ(StopRules(config, prompt, std::nullopt, positions).max_length(),
                c["max_length"].get<size_t>())
          << c["config"] << " prompt " << prompt;
    }
  }
}

TEST(GenerationConfigFile, ReadsLikeGenerationConfigFromPretrained) {
  const json cases = load("configs.json")["from_file"];
  ASSERT_GE(cases.size(), 6u);
  for (const json& c : cases) {
    TempFolder folder;
    const fs::path file = folder.write("generation_config.json", c["json"].dump());
    folder.write("config.json", R"({"eos_token_id": 12345, "max_length": 7})");  // not read: the file wins
    expect_fields(GenerationConfig::from_file(file), c["expected"], c["name"]);
    expect_fields(GenerationConfig::from_folder(folder.path()), c["expected"], c["name"]);
  }
}

TEST(GenerationConfigFile, FallsBackToConfigJsonAsTransformers) {
  const json cases = load("configs.json")["from_model_config"];
  ASSERT_GE(cases.size(), 4u);
  for (const json& c : cases) {
    TempFolder folder;
    folder.write("config.json", c["json"].dump());
    expect_fields(GenerationConfig::from_folder(folder.path()), c["expected"], c["name"]);
  }
}

TEST(GenerationConfigFile, ErrorsNameTheFileAndTheField) {
  TempFolder folder;
  auto message_for = [&](const std::string& text) {
    const fs::path file = folder.write("generation_config.json", text);
    return error_of<GenerationConfigError>([&] { GenerationConfig::from_file(file); });
  };
  const std::string path = (folder.path() / "generation_config.json").string();
  EXPECT_NE(message_for(R"({"temperature": 0.5,)").find(path + ": malformed JSON"), std::string::npos);
  EXPECT_NE(message_for("[1, 2]").find(path + ": must hold a JSON object, got [1,2]"), std::string::npos);
  EXPECT_EQ(message_for(R"({"temperature": "hot"})"),
            path + R"(: field "temperature" must be a number, got "hot")");
  EXPECT_EQ(message_for(R"({"do_sample": "yes"})"),
            path + R"(: field "do_sample" must be true or false, got "yes")");
  EXPECT_EQ(message_for(R"({"top_k": 2.5})"), path + R"(: field "top_k" must be an integer, got 2.5)");
  EXPECT_EQ(message_for(R"({"max_new_tokens": -1})"),
            path + R"(: field "max_new_tokens" must be a non-negative integer, got -1)");
  EXPECT_EQ(message_for(R"({"max_new_tokens": 0})"),
            path + R"(: field "max_new_tokens" must be greater than 0, got 0)");
  EXPECT_EQ(message_for(R"({"eos_token_id": [1, "2"]})"),
            path + R"(: field "eos_token_id" must be an integer or a list of integers, got "2")");
  EXPECT_EQ(message_for(R"({"stop_strings": 5})"),
            path + R"(: field "stop_strings" must be a string or a list of strings, got 5)");
  EXPECT_EQ(
      error_of<GenerationConfigError>([&] { GenerationConfig::from_file(folder.path() / "missing.json"); }),
      (folder.path() / "missing.json").string() + ": cannot be read");

  TempFolder model;
  model.write("config.json", R"({"text_config": {"eos_token_id": "x"}})");
  EXPECT_EQ(error_of<GenerationConfigError>([&] { GenerationConfig::from_folder(model.path()); }),
            (model.path() / "config.json").string() +
                R"(: field "text_config.eos_token_id" must be an integer or a list of integers, got "x")");
}

TEST(GenerationConfigFile, ValidationRejectsWhatTransformersRejectsWhenSampling) {
  auto message_for = [](auto change) {
    GenerationConfig config;
    config.do_sample = true;
    change(config);
    return error_of<GenerationConfigError>([&] { LogitsProcessor processor(config); });
  };
  EXPECT_EQ(
      message_for([](GenerationConfig& c) { c.temperature = 0; }),
      "generation config: temperature must be strictly positive when do_sample is true, got 0 (for greedy "
      "decoding set do_sample to false)");
  EXPECT_NE(message_for([](GenerationConfig& c) { c.temperature = -0.5; }).find("got -0.5"),
            std::string::npos);
  EXPECT_EQ(message_for([](GenerationConfig& c) { c.top_p = 1.5; }),
            "generation config: top_p must be in [0, 1] (1: off), got 1.5");
  EXPECT_EQ(message_for([](GenerationConfig& c) { c.top_p = -0.1; }),
            "generation config: top_p must be in [0, 1] (1: off), got -0.1");
  EXPECT_EQ(message_for([](GenerationConfig& c) { c.top_k = -1; }),
            "generation config: top_k must be a non-negative integer (0: off), got -1");
  EXPECT_EQ(message_for([](GenerationConfig& c) { c.min_p = 2.0; }),
            "generation config: min_p must be in [0, 1], got 2");
  EXPECT_EQ(message_for([](GenerationConfig& c) { c.repetition_penalty = 0; }),
            "generation config: repetition_penalty must be a strictly positive float, got 0");
  EXPECT_EQ(message_for([](GenerationConfig& c) {
              c.stop_strings = {"ok", ""};
            }),
            "generation config: stop_strings must not hold an empty string");

  // Greedy decoding ignores the warpers' values, as transformers does.
  GenerationConfig greedy;
  greedy.temperature = 0;
  greedy.top_p = 7;
  EXPECT_NO_THROW(LogitsProcessor{greedy});
}

TEST(GenerationStopRules, ErrorsSayWhatIsMissing) {
  GenerationConfig config;
  config.max_length = 9;
  EXPECT_EQ(error_of<GenerationConfigError>([&] { StopRules(config, 9); }),
            "generation config: the input has 9 tokens but max_length is 9, so nothing can be generated (set "
            "max_new_tokens instead)");
  config.stop_strings = {"stop"};
  EXPECT_EQ(error_of<GenerationConfigError>([&] { StopRules(config, 2); }),
            "generation config: stop_strings need the tokenizer's TokenTexts");
}
