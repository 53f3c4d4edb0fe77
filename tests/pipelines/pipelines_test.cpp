// The encoder pipelines against transformers' pipelines (and sentence-transformers) on tiny random
// models: tests/pipelines/fixtures/*/expected.json, recorded by scripts/make_pipeline_models.py.
// Scores within 1e-4: float32 PyTorch vs MLX on the same weights differ by summation order only
// (the issue's tolerance); labels, words, tokens, decoded text and offsets exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/expect_error.h"
#include "transmuter/pipelines.h"

namespace transmuter::pipelines {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;

constexpr float kScoreTolerance = 1e-4f;

fs::path fixture(const std::string& name) {
  return fs::path(TRANSMUTER_SOURCE_DIR) / "tests/pipelines/fixtures" / name;
}

json expected_of(const std::string& name) {
  std::ifstream in(fixture(name) / "expected.json");
  return json::parse(in);
}

std::vector<std::string> strings(const json& list) { return list.get<std::vector<std::string>>(); }

/** transformers' offsets count characters; ours count bytes. */
size_t chars_before(const std::string& text, size_t byte) {
  size_t chars = 0;
  for (size_t i = 0; i < byte && i < text.size(); ++i)
    chars += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
  return chars;
}

PipelineOptions with(ExecutionMode mode, size_t batch_size) {
  PipelineOptions options;
  options.mode = mode;
  options.batch_size = batch_size;
  return options;
}

// --- text_embedding ------------------------------------------------------------------------

struct EmbeddingCase {
  const char* key;
  Pooling pooling;
  bool normalize;
};

class TextEmbeddingTest : public ::testing::TestWithParam<std::tuple<ExecutionMode, size_t>> {};

TEST_P(TextEmbeddingTest, EqualsSentenceTransformersForEveryPooling) {
  const auto [mode, batch_size] = GetParam();
  const json expected = expected_of("bert_embedding");
  const auto sentences = strings(expected["sentences"]);
  auto embed = TextEmbedding::open(fixture("bert_embedding").string(), with(mode, batch_size));
  const EmbeddingCase cases[] = {{"mean", Pooling::kMean, false},
                                 {"mean_normalize", Pooling::kMean, true},
                                 {"cls", Pooling::kCls, false},
                                 {"cls_normalize", Pooling::kCls, true},
                                 {"max", Pooling::kMax, false},
                                 {"max_normalize", Pooling::kMax, true},
                                 {"lasttoken", Pooling::kLastToken, false},
                                 {"lasttoken_normalize", Pooling::kLastToken, true}};
  for (const auto& c : cases) {
    mx::array vectors = embed(sentences, {.pooling = c.pooling, .normalize = c.normalize});
    const auto& want = expected["poolings"][c.key];
    ASSERT_EQ(vectors.shape(0), static_cast<int>(want.size())) << c.key;
    ASSERT_EQ(vectors.shape(1), static_cast<int>(want[0].size())) << c.key;
    const float* got = vectors.data<float>();
    for (size_t i = 0; i < want.size(); ++i)
      for (size_t k = 0; k < want[i].size(); ++k)
        ASSERT_NEAR(got[i * want[i].size() + k], want[i][k].get<float>(), kScoreTolerance)
            << c.key << " sentence " << i << " dim " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(ModesAndBatches, TextEmbeddingTest,
                         ::testing::Combine(::testing::Values(ExecutionMode::kEager,
                                                              ExecutionMode::kCompiled),
                                            ::testing::Values(size_t{1}, size_t{16})));

TEST(TextEmbedding, DefaultsComeFromTheSentenceTransformersFolder) {
  const json expected = expected_of("bert_embedding");
  auto embed = TextEmbedding::open(fixture("bert_embedding").string());
  EXPECT_EQ(embed.default_pooling(), Pooling::kMean);  // 1_Pooling/config.json
  EXPECT_TRUE(embed.default_normalize());              // modules.json has a Normalize module
  const auto sentences = strings(expected["sentences"]);
  mx::array vectors = embed(sentences);
  const auto& want = expected["poolings"]["mean_normalize"];
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t k = 0; k < want[i].size(); ++k)
      ASSERT_NEAR(vectors.data<float>()[i * want[i].size() + k], want[i][k].get<float>(), kScoreTolerance);
}

// --- text_classification -------------------------------------------------------------------

ClassificationOptions top(size_t k, std::optional<ScoreFunction> function = std::nullopt) {
  ClassificationOptions options;
  options.top_k = k;
  options.function = function;
  return options;
}

FillMaskOptions fills(size_t k, std::vector<std::string> targets = {}) {
  FillMaskOptions options;
  options.top_k = k;
  options.targets = std::move(targets);
  return options;
}

void expect_labels(const std::vector<LabelScore>& got, const json& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].label, want[i]["label"].get<std::string>()) << where << " rank " << i;
    EXPECT_NEAR(got[i].score, want[i]["score"].get<float>(), kScoreTolerance) << where << " rank " << i;
  }
}

class TextClassificationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TextClassificationTest, EqualsTheTransformersPipeline) {
  const json expected = expected_of(GetParam());
  const auto sentences = strings(expected["sentences"]);
  for (size_t batch_size : {size_t{1}, size_t{4}}) {
    auto classify =
        TextClassification::open(fixture(GetParam()).string(), with(ExecutionMode::kEager, batch_size));
    auto top1 = classify(sentences);
    auto all = classify(sentences, top(0));
    auto top2 = classify(sentences, top(2));
    auto raw = classify(sentences, top(0, ScoreFunction::kNone));
    for (size_t i = 0; i < sentences.size(); ++i) {
      const std::string where = GetParam() + " sentence " + std::to_string(i);
      expect_labels(top1[i], expected["top1"][i], where + " top1");
      expect_labels(all[i], expected["all"][i], where + " all");
      expect_labels(top2[i], expected["top2"][i], where + " top2");
      expect_labels(raw[i], expected["none_all"][i], where + " function none");
    }
  }
}

TEST_P(TextClassificationTest, PairsUseThePairTemplate) {
  const json expected = expected_of(GetParam());
  std::vector<std::string> texts, pairs;
  for (const auto& pair : expected["pairs"]) {
    texts.push_back(pair[0]);
    pairs.push_back(pair[1]);
  }
  auto classify = TextClassification::open(fixture(GetParam()).string());
  auto got = classify(texts, pairs, top(0));
  for (size_t i = 0; i < texts.size(); ++i)
    expect_labels(got[i], expected["pairs_all"][i], "pair " + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(SingleAndMultiLabel, TextClassificationTest,
                         ::testing::Values("bert_sentiment", "bert_multilabel"));

// --- token_classification ------------------------------------------------------------------

const std::pair<const char*, Aggregation> kStrategies[] = {{"none", Aggregation::kNone},
                                                           {"simple", Aggregation::kSimple},
                                                           {"first", Aggregation::kFirst},
                                                           {"average", Aggregation::kAverage},
                                                           {"max", Aggregation::kMax}};

void expect_entities(const std::vector<Entity>& got, const json& want, const std::string& text,
                     const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    const json& w = want[i];
    const std::string at = where + " entity " + std::to_string(i);
    const std::string label = w.contains("entity_group") ? w["entity_group"] : w["entity"];
    EXPECT_EQ(got[i].entity, label) << at;
    EXPECT_NEAR(got[i].score, w["score"].get<float>(), kScoreTolerance) << at;
    EXPECT_EQ(got[i].word, w["word"].get<std::string>()) << at;
    EXPECT_EQ(chars_before(text, got[i].start), w["start"].get<size_t>()) << at;
    EXPECT_EQ(chars_before(text, got[i].end), w["end"].get<size_t>()) << at;
    if (w.contains("index")) {
      ASSERT_TRUE(got[i].index.has_value()) << at;
      EXPECT_EQ(*got[i].index, w["index"].get<size_t>()) << at;
    } else {
      EXPECT_FALSE(got[i].index.has_value()) << at;
    }
  }
}

class TokenClassificationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenClassificationTest, EveryAggregationEqualsTheTransformersPipeline) {
  const json expected = expected_of(GetParam());
  const auto sentences = strings(expected["sentences"]);
  for (size_t batch_size : {size_t{1}, size_t{8}}) {
    auto ner =
        TokenClassification::open(fixture(GetParam()).string(), with(ExecutionMode::kEager, batch_size));
    for (const auto& [name, aggregation] : kStrategies) {
      auto got = ner(sentences, {.aggregation = aggregation});
      for (size_t i = 0; i < sentences.size(); ++i)
        expect_entities(got[i], expected["strategies"][name][i], sentences[i],
                        GetParam() + " " + name + " sentence " + std::to_string(i));
    }
    auto unfiltered = ner(sentences, {.aggregation = Aggregation::kNone, .ignore_labels = {}});
    for (size_t i = 0; i < sentences.size(); ++i)
      expect_entities(unfiltered[i], expected["none_no_ignore"][i], sentences[i],
                      "no ignore " + std::to_string(i));
  }
}

// WordPiece (a ## prefix tells subwords) and byte-level BPE (the pipeline's space heuristic).
INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenClassificationTest, ::testing::Values("bert_ner", "bpe_ner"));

// --- fill_mask -----------------------------------------------------------------------------

void expect_fills(const std::vector<MaskFill>& got, const json& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string at = where + " rank " + std::to_string(i);
    EXPECT_EQ(got[i].token, want[i]["token"].get<int64_t>()) << at;
    EXPECT_NEAR(got[i].score, want[i]["score"].get<float>(), kScoreTolerance) << at;
    EXPECT_EQ(got[i].token_str, want[i]["token_str"].get<std::string>()) << at;
    EXPECT_EQ(got[i].sequence, want[i]["sequence"].get<std::string>()) << at;
  }
}

TEST(FillMask, EqualsTheTransformersPipeline) {
  const json expected = expected_of("bert_fill_mask");
  const auto single = strings(expected["single"]);
  auto fill = FillMask::open(fixture("bert_fill_mask").string());
  EXPECT_EQ(fill.mask_token(), "[MASK]");
  auto top5 = fill(single);
  auto top3 = fill(single, fills(3));
  auto targeted = fill(single, fills(3, strings(expected["targets"])));
  for (size_t i = 0; i < single.size(); ++i) {
    ASSERT_EQ(top5[i].size(), 1u);
    expect_fills(top5[i][0], expected["top5"][i], "top5 " + std::to_string(i));
    expect_fills(top3[i][0], expected["top3"][i], "top3 " + std::to_string(i));
    expect_fills(targeted[i][0], expected["targets_top3"][i], "targets " + std::to_string(i));
  }
}

TEST(FillMask, SeveralMasksKeepSpecialTokensInTheSequence) {
  const json expected = expected_of("bert_fill_mask");
  auto fill = FillMask::open(fixture("bert_fill_mask").string());
  auto got = fill(strings(expected["double"]), fills(2));
  const json& want = expected["double_top2"][0];
  ASSERT_EQ(got[0].size(), want.size());
  for (size_t m = 0; m < want.size(); ++m) expect_fills(got[0][m], want[m], "mask " + std::to_string(m));
}

// --- errors --------------------------------------------------------------------------------

/** A copy of a fixture folder to break. */
fs::path copy_of(const std::string& name, const std::string& tag) {
  fs::path dir =
      fs::temp_directory_path() / ("transmuter_pipelines_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(fixture(name), dir, fs::copy_options::recursive);
  return dir;
}

void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

TEST(PipelineErrors, AFolderWithoutTokenizerIsNamed) {
  fs::path dir = copy_of("bert_sentiment", "no_tokenizer");
  fs::remove(dir / "tokenizer.json");
  EXPECT_NE(
      error_of<PipelineError>([&] { TextClassification::open(dir.string()); }).find("has no tokenizer.json"),
      std::string::npos);
  fs::remove_all(dir);
}

TEST(PipelineErrors, MissingFolderAndModelFile) {
  EXPECT_NE(error_of<PipelineError>([] { TextEmbedding::open("/nonexistent/model"); }).find("no such folder"),
            std::string::npos);
  fs::path dir = copy_of("bert_sentiment", "no_model");
  fs::remove(dir / "model.onnx");
  EXPECT_NE(error_of<PipelineError>([&] {
              TextClassification::open(dir.string());
            }).find("no ONNX model for dtype fp32"),
            std::string::npos);
  PipelineOptions escaping;
  escaping.model_file = "../model.onnx";
  EXPECT_NE(error_of<PipelineError>([&] {
              TextClassification::open(dir.string(), escaping);
            }).find("must be relative"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(PipelineErrors, LongInputsAreRejectedWhenAsked) {
  const json expected = expected_of("bert_embedding");
  const std::vector<std::string> texts = {"short", expected["sentences"].back().get<std::string>()};
  PipelineOptions reject;
  reject.long_inputs = LongInputs::kReject;
  auto embed = TextEmbedding::open(fixture("bert_embedding").string(), reject);
  std::string message = error_of<PipelineError>([&] { embed(texts); });
  EXPECT_NE(message.find("text 1 has"), std::string::npos) << message;
  EXPECT_NE(message.find("more than the model's limit of 32"), std::string::npos) << message;
  EXPECT_EQ(embed(std::vector<std::string>{"short"}).shape(0), 1);
}

TEST(PipelineErrors, FillMaskNeedsAMaskInEveryText) {
  auto fill = FillMask::open(fixture("bert_fill_mask").string());
  EXPECT_EQ(error_of<PipelineError>([&] {
              fill(std::vector<std::string>{"a [MASK]", "no mask here"});
            }),
            "text 1 has no mask token [MASK]");
  EXPECT_NE(
      error_of<PipelineError>([&] { FillMask::open(fixture("bpe_ner").string()); }).find("no mask_token"),
      std::string::npos);
}

TEST(PipelineErrors, BadConfigFilesAreNamed) {
  fs::path dir = copy_of("bert_sentiment", "bad_config");
  write(dir / "config.json", "{\"id2label\": {\"0\": \"a\", \"2\": \"b\"}}");
  std::string message = error_of<PipelineError>([&] { TextClassification::open(dir.string()); });
  EXPECT_NE(message.find("config.json: id2label key '2' is not one of the ids 0..1"), std::string::npos)
      << message;
  write(dir / "config.json", "{\"id2label\": ");
  message = error_of<PipelineError>([&] { TextClassification::open(dir.string()); });
  EXPECT_NE(message.find("config.json: malformed JSON"), std::string::npos) << message;
  write(dir / "config.json", "{}");
  message = error_of<PipelineError>([&] { TextClassification::open(dir.string()); });
  EXPECT_NE(message.find("config.json has no id2label"), std::string::npos) << message;
  fs::remove_all(dir);
}

TEST(PipelineErrors, AModulesJsonPathMayNotEscapeTheFolder) {
  fs::path dir = copy_of("bert_embedding", "escape");
  write(dir / "modules.json", R"([{"type": "sentence_transformers.models.Pooling", "path": "../../etc"}])");
  std::string message = error_of<PipelineError>([&] { TextEmbedding::open(dir.string()); });
  EXPECT_NE(message.find("'../../etc/config.json' must be relative"), std::string::npos) << message;
  write(dir / "modules.json", R"([{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}])");
  write(dir / "1_Pooling/config.json",
        R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true})");
  message = error_of<PipelineError>([&] { TextEmbedding::open(dir.string()); });
  EXPECT_NE(message.find("several pooling modes"), std::string::npos) << message;
  write(dir / "1_Pooling/config.json", R"({"pooling_mode": "lasttoken"})");
  EXPECT_EQ(TextEmbedding::open(dir.string()).default_pooling(), Pooling::kLastToken);
  fs::remove_all(dir);
}

TEST(PipelineErrors, PairsMustMatchTexts) {
  auto classify = TextClassification::open(fixture("bert_sentiment").string());
  const std::vector<std::string> texts = {"a", "b"}, pairs = {"c"};
  EXPECT_EQ(error_of<PipelineError>([&] { classify(texts, pairs); }),
            "got 2 texts and 1 pairs: give one pair per text");
}

}  // namespace
}  // namespace transmuter::pipelines
