// Encoder-decoder generation against transformers' generate() on tiny random T5 and BART models in
// optimum's seq2seq layout (tests/pipelines/fixtures/*_seq2seq/expected.json, recorded by
// scripts/make_seq2seq_models.py): T5 as encoder_model + decoder_model + decoder_with_past_model, BART as
// encoder_model + decoder_model_merged, whose generation_config.json forces the first token
// (forced_bos_token_id) and eos at the last position (forced_eos_token_id). Token for token, without a
// cache and with one, eagerly and compiled, single texts and a right-padded batch. Token ids are compared
// exactly: a greedy choice changes only when two logits are within float32 noise, and the recording script
// checks ORT against PyTorch to 5e-5 of the logits' scale.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <mlx/ops.h>
#include <nlohmann/json.hpp>

#include "pipelines/generation_cases.h"
#include "support/expect_error.h"
#include "transmuter/pipelines.h"

namespace transmuter::pipelines {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::GenerationMode;
using testing::until_eos;

fs::path fixture(const std::string& family) {
  return fs::path(TRANSMUTER_SOURCE_DIR) / "tests/pipelines/fixtures" / (family + "_seq2seq");
}

json expected_of(const std::string& family) {
  std::ifstream in(fixture(family) / "expected.json");
  return json::parse(in);
}

/** The case's generate() arguments over the folder's generation_config.json. */
generation::GenerationConfig config_of(const Text2TextGeneration& pipe, const json& arguments) {
  generation::GenerationConfig config = pipe.default_config();
  config.max_new_tokens = arguments.value("max_new_tokens", 20);
  if (arguments.contains("min_new_tokens")) config.min_new_tokens = arguments["min_new_tokens"].get<size_t>();
  config.repetition_penalty = arguments.value("repetition_penalty", 1.0);
  config.no_repeat_ngram_size = arguments.value("no_repeat_ngram_size", 0);
  return config;
}

const GenerationMode kModes[] = {{KvCache::kNone, ExecutionMode::kEager, "NoCache"},
                       {KvCache::kDynamic, ExecutionMode::kEager, "Cache"},
                       {KvCache::kDynamic, ExecutionMode::kCompiled, "CacheCompiled"}};

class Text2TextGenerationTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Text2TextGenerationTest, GreedyEqualsTransformersGenerate) {
  const auto& [family, mode_index] = GetParam();
  const GenerationMode& mode = kModes[mode_index];
  const json expected = expected_of(family);
  PipelineOptions options;
  options.mode = mode.execution;
  auto pipe = Text2TextGeneration::open(fixture(family).string(), options, mode.cache);
  ASSERT_EQ(pipe.cache(), mode.cache);
  ASSERT_FALSE(pipe.default_config().eos_token_ids.empty());
  const int64_t eos = pipe.default_config().eos_token_ids.front();
  for (const json& c : expected["cases"]) {
    const auto inputs = c["encoder_token_ids"].get<std::vector<std::vector<int64_t>>>();
    GenerationSummary summary;
    const size_t plans_before = pipe.compile_stats().plans_built;
    auto outputs = pipe.generate(inputs, config_of(pipe, c["generate"]), {}, &summary);
    ASSERT_EQ(outputs.size(), inputs.size());
    for (size_t r = 0; r < outputs.size(); ++r) {
      const auto want = until_eos(c["new_token_ids"][r].get<std::vector<int64_t>>(), eos);
      EXPECT_EQ(outputs[r].tokens, want) << family << " " << mode.name << " case " << c["name"] << " row " << r;
      EXPECT_EQ(outputs[r].prompt, inputs[r]);
      // A last token that is eos, forced at max_length - 1 or not, is the reason (StopRules checks it first).
      const bool stopped_on_eos = !want.empty() && want.back() == eos;
      EXPECT_EQ(outputs[r].reason,
                stopped_on_eos ? generation::StopReason::kEosToken : generation::StopReason::kMaxLength)
          << family << " case " << c["name"] << " row " << r;
    }
    if (mode.execution == ExecutionMode::kCompiled) {
      // The first decoder step compiles (once per encoder length); the growing steps run eagerly.
      EXPECT_LE(pipe.compile_stats().plans_built - plans_before, 1u) << c["name"];
    }
    EXPECT_EQ(summary.input_tokens, [&] {
      size_t n = 0;
      for (const auto& i : inputs) n += i.size();
      return n;
    }());
  }
}

std::string name_of(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_" + kModes[std::get<1>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(Families, Text2TextGenerationTest,
                         ::testing::Combine(::testing::Values("t5", "bart"), ::testing::Range(0, 3)), name_of);

// From text: the tokenizer's encoding (T5's appends </s>) and the decoded output, as transformers
// decodes it with skip_special_tokens; streaming gives the same text (BART's random tokens end in
// incomplete UTF-8 sequences, which the stream hands over at the end). The recorded encodings are not
// truncated (transformers' text2text pipeline does not truncate by default), while the T5 fixture's
// tokenizer_config.json says model_max_length 24: the limit is raised here.
TEST(Text2TextGeneration, GeneratesFromTextAndStreams) {
  for (const std::string family : {"t5", "bart"}) {
    const json expected = expected_of(family);
    PipelineOptions options;
    options.max_length = 64;
    auto pipe = Text2TextGeneration::open(fixture(family).string(), options);
    for (const json& c : expected["cases"]) {
      if (c["name"] != "single" && c["name"] != "batch") continue;
      const auto texts = c["texts"].get<std::vector<std::string>>();
      std::vector<std::string> streamed(texts.size());
      auto outputs = pipe(texts, config_of(pipe, c["generate"]),
                          [&](size_t row, std::string_view piece) { streamed.at(row) += piece; });
      ASSERT_EQ(outputs.size(), texts.size());
      for (size_t r = 0; r < texts.size(); ++r) {
        EXPECT_EQ(outputs[r].prompt, c["encoder_token_ids"][r].get<std::vector<int64_t>>()) << family;
        EXPECT_EQ(outputs[r].text, c["decoded"][r].get<std::string>()) << family << " row " << r;
        EXPECT_EQ(streamed[r], outputs[r].text) << family << " row " << r;
      }
    }
  }
}

// A row of a batch generates what it generates alone: the encoder's padding is masked.
TEST(Text2TextGeneration, BatchRowsEqualSingleRuns) {
  auto pipe = Text2TextGeneration::open(fixture("t5").string());
  generation::GenerationConfig config = pipe.default_config();
  config.max_new_tokens = 10;
  const std::vector<std::vector<int64_t>> inputs = {{25, 215, 1}, {182, 97, 39, 46, 267, 149, 1}};
  auto batch = pipe.generate(inputs, config);
  for (size_t r = 0; r < inputs.size(); ++r)
    EXPECT_EQ(batch[r].tokens, pipe.generate({inputs[r]}, config)[0].tokens) << "row " << r;
}

// A Whisper-style encoder (input_features, no input_ids) and decoder (no encoder attention mask), with the
// generation config's suppress_tokens and begin_suppress_tokens (tests/pipelines/fixtures/whisper_seq2seq,
// scripts/make_whisper_model.py): greedy tokens equal transformers' generic generate() from the same features
// and decoder prompt, without cache, with it, and compiled.
TEST(Text2TextGeneration, WhisperStyleEncoderInputs) {
  std::ifstream in(fixture("whisper") / "expected.json");
  const json expected = json::parse(in);
  const auto prompt = expected["decoder_prompt"].get<std::vector<int64_t>>();
  const int mel = expected["mel_bins"], frames = expected["frames"];
  for (const GenerationMode& mode : kModes) {
    PipelineOptions options;
    options.mode = mode.execution;
    auto pipe = Text2TextGeneration::open(fixture("whisper").string(), options, mode.cache);
    EXPECT_FALSE(pipe.default_config().suppress_tokens.empty());
    for (const json& c : expected["cases"]) {
      std::vector<float> flat;
      for (const json& row : c["input_features"])
        for (const json& bin : row)
          for (const json& v : bin) flat.push_back(v.get<float>());
      const int rows = static_cast<int>(c["input_features"].size());
      Inputs features{{"input_features", Value(mx::array(flat.begin(), {rows, mel, frames}, mx::float32))}};
      auto outputs = pipe.generate(features, prompt, config_of(pipe, c["generate"]));
      ASSERT_EQ(outputs.size(), static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) {
        EXPECT_EQ(outputs[r].tokens, c["new_token_ids"][r].get<std::vector<int64_t>>())
            << mode.name << " case " << c["name"] << " row " << r;
        EXPECT_EQ(outputs[r].prompt, prompt);
      }
    }
    EXPECT_NE(error_of<PipelineError>([&] { pipe.generate({{5, 6}}, pipe.default_config()); })
                  .find("the encoder takes no input_ids"),
              std::string::npos);
  }
  // Bad encoder inputs: none, a missing name, the wrong shape; each a clear error, never a crash.
  auto pipe = Text2TextGeneration::open(fixture("whisper").string());
  const generation::GenerationConfig config = pipe.default_config();
  EXPECT_NE(error_of<PipelineError>([&] { pipe.generate(Inputs{}, prompt, config); }).find("is not given"),
            std::string::npos);
  const mx::array features = mx::zeros({1, mel, frames});
  EXPECT_NE(error_of<PipelineError>([&] {
              pipe.generate(Inputs{{"input_features", Value(features)}, {"features", Value(features)}}, prompt, config);
            }).find("the encoder has no input 'features' (its inputs: input_features)"),
            std::string::npos);
  EXPECT_NE(error_of<PipelineError>([&] {
              pipe.generate(Inputs{{"features", Value(features)}}, prompt, config);
            }).find("the encoder's input 'input_features' is not given"),
            std::string::npos);
  const std::string wrong_shape = error_of<Error>([&] {
    pipe.generate(Inputs{{"input_features", Value(mx::zeros({1, mel + 1, frames}))}}, prompt, config);
  });
  EXPECT_FALSE(wrong_shape.empty());
}

fs::path copy_of(const std::string& family, const std::string& tag) {
  fs::path dir = fs::temp_directory_path() / ("transmuter_t2t_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(fixture(family), dir);
  return dir;
}

// decoder_model.onnx alone: every step reruns the decoder over the whole sequence; a cache is refused.
TEST(Text2TextGeneration, DecoderWithoutPastRunsWithoutACache) {
  const fs::path dir = copy_of("t5", "nopast");
  fs::remove(dir / "decoder_with_past_model.onnx");
  auto pipe = Text2TextGeneration::open(dir.string());
  EXPECT_EQ(pipe.cache(), KvCache::kNone);
  EXPECT_EQ(pipe.model_files().size(), 2u);
  EXPECT_NE(error_of<PipelineError>([&] {
              Text2TextGeneration::open(dir.string(), {}, KvCache::kDynamic);
            }).find("there is no decoder with past"),
            std::string::npos);
  const json expected = expected_of("t5");
  const json& single = expected["cases"][0];
  auto out = pipe.generate(single["encoder_token_ids"].get<std::vector<std::vector<int64_t>>>(),
                           config_of(pipe, single["generate"]));
  EXPECT_EQ(out[0].tokens, single["new_token_ids"][0].get<std::vector<int64_t>>());
  fs::remove_all(dir);
}

// The dtype picks the files as transformers.js names them, in onnx/ first.
TEST(Text2TextGeneration, FindsTheDtypesFilesInOnnxFolder) {
  const fs::path dir = copy_of("bart", "dtype");
  fs::create_directories(dir / "onnx");
  fs::rename(dir / "encoder_model.onnx", dir / "onnx/encoder_model_quantized.onnx");
  fs::rename(dir / "decoder_model_merged.onnx", dir / "onnx/decoder_model_merged_quantized.onnx");
  PipelineOptions options;
  EXPECT_NE(error_of<PipelineError>([&] { Text2TextGeneration::open(dir.string(), options); })
                .find("no ONNX model for dtype fp32"),
            std::string::npos);
  options.load.dtype = "q8";
  auto pipe = Text2TextGeneration::open(dir.string(), options);
  ASSERT_EQ(pipe.model_files().size(), 2u);
  EXPECT_EQ(pipe.model_files()[1].filename(), "decoder_model_merged_quantized.onnx");
  EXPECT_EQ(pipe.cache(), KvCache::kDynamic);
  fs::remove_all(dir);
}

TEST(Text2TextGeneration, ClearErrors) {
  auto pipe = Text2TextGeneration::open(fixture("bart").string());
  generation::GenerationConfig config = pipe.default_config();
  EXPECT_EQ(error_of<PipelineError>([&] { pipe(std::vector<std::string>{""}, config); }),
            "text 0 is empty: it encodes to no tokens");
  EXPECT_NE(error_of<PipelineError>([&] {
              Text2TextGeneration::open(fixture("bart").string(), {}, KvCache::kStatic);
            }).find("cannot run with a static cache"),
            std::string::npos);
  config.max_new_tokens = 64;  // + the start token: 65 positions of BART's 64
  EXPECT_NE(error_of<PipelineError>([&] { pipe.generate({{5, 6}}, config); })
                .find("up to 65 decoder tokens do not fit the model's 64 positions"),
            std::string::npos);
  PipelineOptions reject;
  reject.long_inputs = LongInputs::kReject;
  reject.max_length = 4;
  auto strict = Text2TextGeneration::open(fixture("bart").string(), reject);
  config.max_new_tokens = 4;
  EXPECT_NE(error_of<PipelineError>([&] {
              strict(std::vector<std::string>{"Paris is the capital of France and"}, config);
            }).find("more than the model's limit of 4"),
            std::string::npos);
  PipelineOptions truncate;
  truncate.max_length = 4;
  auto truncating = Text2TextGeneration::open(fixture("bart").string(), truncate);
  EXPECT_EQ(truncating(std::vector<std::string>{"Paris is the capital of France and"}, config)[0].prompt.size(), 4u);
  config.decoder_start_token_id.reset();
  config.bos_token_id.reset();
  EXPECT_NE(error_of<PipelineError>([&] { pipe.generate({{5, 6}}, config); })
                .find("neither decoder_start_token_id nor bos_token_id"),
            std::string::npos);

  PipelineOptions named;
  named.model_file = "encoder_model.onnx";
  EXPECT_NE(error_of<PipelineError>([&] { Text2TextGeneration::open(fixture("bart").string(), named); })
                .find("model_file is not used"),
            std::string::npos);
  const fs::path dir = copy_of("bart", "nodecoder");
  fs::remove(dir / "decoder_model_merged.onnx");
  EXPECT_NE(error_of<PipelineError>([&] { Text2TextGeneration::open(dir.string()); })
                .find("needs decoder_model_merged.onnx or decoder_model.onnx"),
            std::string::npos);
  // A decoder-only model's file where the decoder should be: its inputs say so.
  fs::copy(fs::path(TRANSMUTER_SOURCE_DIR) / "tests/pipelines/fixtures/gpt2_decoder/model.onnx",
           dir / "decoder_model.onnx");
  EXPECT_NE(error_of<PipelineError>([&] { Text2TextGeneration::open(dir.string()); })
                .find("the decoder's input 'attention_mask' is not one generation fills"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace transmuter::pipelines
