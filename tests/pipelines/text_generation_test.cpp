// Greedy generation against transformers' generate() on tiny random decoders of four families
// (tests/pipelines/fixtures/*_decoder/expected.json, recorded by scripts/make_generation_models.py):
// token for token, without a cache, with the dynamic and the static cache, eagerly and compiled, single
// prompts and a left-padded batch. Token ids are compared exactly: a greedy choice only changes if two
// logits are within float32 noise, which these fixtures' margins exclude (the recording script checks
// ORT against PyTorch to 1e-4).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

fs::path fixture(const std::string& name) {
  return fs::path(TRANSMUTER_SOURCE_DIR) / "tests/pipelines/fixtures" / name;
}

json expected_of(const std::string& family) {
  std::ifstream in(fixture(family + "_decoder") / "expected.json");
  return json::parse(in);
}

/** The case's generate() arguments as a GenerationConfig over the folder's defaults. */
generation::GenerationConfig config_of(const TextGeneration& pipe, const json& arguments) {
  generation::GenerationConfig config = pipe.default_config();
  config.max_new_tokens = arguments.value("max_new_tokens", 20);
  config.repetition_penalty = arguments.value("repetition_penalty", 1.0);
  config.no_repeat_ngram_size = arguments.value("no_repeat_ngram_size", 0);
  return config;
}

class TextGenerationTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

const GenerationMode kModes[] = {{KvCache::kNone, ExecutionMode::kEager, "no cache"},
                       {KvCache::kDynamic, ExecutionMode::kEager, "dynamic cache"},
                       {KvCache::kStatic, ExecutionMode::kEager, "static cache"},
                       {KvCache::kStatic, ExecutionMode::kCompiled, "static cache, compiled"}};

TEST_P(TextGenerationTest, GreedyEqualsTransformersGenerate) {
  const auto& [family, mode_index] = GetParam();
  const GenerationMode& mode = kModes[mode_index];
  const json expected = expected_of(family);
  PipelineOptions options;
  options.mode = mode.execution;
  auto pipe = TextGeneration::open(fixture(family + "_decoder").string(), options, mode.cache);
  ASSERT_EQ(pipe.cache(), mode.cache);
  const int64_t eos = expected["eos_token_id"];
  for (const json& c : expected["cases"]) {
    const auto prompts = c["prompt_token_ids"].get<std::vector<std::vector<int64_t>>>();
    GenerationSummary summary;
    auto outputs = pipe.generate(prompts, config_of(pipe, c["generate"]), {}, &summary);
    ASSERT_EQ(outputs.size(), prompts.size());
    for (size_t r = 0; r < outputs.size(); ++r) {
      const auto want = until_eos(c["new_token_ids"][r].get<std::vector<int64_t>>(), eos);
      EXPECT_EQ(outputs[r].tokens, want)
          << family << " " << mode.name << " case " << c["name"] << " row " << r;
      const bool stopped_on_eos = !want.empty() && want.back() == eos;
      EXPECT_EQ(outputs[r].reason,
                stopped_on_eos ? generation::StopReason::kEosToken : generation::StopReason::kMaxLength);
    }
    EXPECT_GT(summary.output_tokens, 0u);
  }
  if (mode.execution == ExecutionMode::kCompiled) {
    // Every decode step of every case shares one plan per batch size and capacity.
    EXPECT_LE(pipe.compile_stats().plans_built, 2u) << family;
  }
}

std::string name_of(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  const char* modes[] = {"NoCache", "Dynamic", "Static", "StaticCompiled"};
  return std::get<0>(info.param) + "_" + modes[std::get<1>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Families, TextGenerationTest,
                         ::testing::Combine(::testing::Values("gpt2", "llama", "qwen2", "phi3"),
                                            ::testing::Range(0, 4)),
                         name_of);

// onnxruntime-genai's builder output (GroupQueryAttention with the rotary embedding inside, no
// position_ids input, SkipSimplifiedLayerNormalization; MatMulNBits weights for int4 at accuracy
// level 4): greedy tokens equal onnxruntime-genai's own Generator on the same folder
// (tests/pipelines/fixtures/genai_*/expected.json, scripts/make_genai_models.py): Llama (the llama
// fixture's model) and Qwen2 (q/k/v biases), Phi-3, Gemma, Gemma 2, gpt-oss (MoE), LFM2-MoE (short
// convolutions with recurrent states, CausalConvWithState; MoE, and QMoE in the int4 build). The
// recording script checked that each fp32 build picks transformers' tokens.
// The static cache (the default: positions and valid keys come from the mask's sum) in eager and
// compiled runs, where one plan serves every decode step of every prompt, and the dynamic cache.
struct GenaiRun {
  ExecutionMode mode;
  KvCache cache;
  const char* name;
};
constexpr GenaiRun kGenaiRuns[] = {{ExecutionMode::kEager, KvCache::kAuto, "EagerStatic"},
                                   {ExecutionMode::kCompiled, KvCache::kAuto, "CompiledStatic"},
                                   {ExecutionMode::kCompiled, KvCache::kDynamic, "CompiledDynamic"}};

class GenaiDecoderTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(GenaiDecoderTest, GreedyEqualsOnnxRuntimeGenai) {
  const auto& [build, run_index] = GetParam();
  const GenaiRun& run = kGenaiRuns[run_index];
  const fs::path folder = fixture("genai_" + build);
  std::ifstream in(folder / "expected.json");
  const json expected = json::parse(in);
  PipelineOptions options;
  options.mode = run.mode;
  auto pipe = TextGeneration::open(folder.string(), options, run.cache);
  EXPECT_EQ(pipe.cache(), run.cache == KvCache::kAuto ? KvCache::kStatic : run.cache)
      << "GroupQueryAttention decoders take the static cache by default";
  generation::GenerationConfig config = pipe.default_config();
  config.max_new_tokens = expected["max_new_tokens"];
  for (const json& c : expected["cases"]) {
    auto outputs = pipe.generate({c["prompt_token_ids"].get<std::vector<int64_t>>()}, config);
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(outputs[0].tokens, c["new_token_ids"].get<std::vector<int64_t>>())
        << build << " prompt '" << c["prompt"].get<std::string>() << "'";
  }
  if (run.mode == ExecutionMode::kCompiled && pipe.cache() == KvCache::kStatic) {
    EXPECT_EQ(pipe.compile_stats().plans_built, 1u) << "the decode steps of every prompt share one plan";
  }
}

INSTANTIATE_TEST_SUITE_P(Builds, GenaiDecoderTest,
                         ::testing::Combine(::testing::Values("llama_fp32", "llama_int4", "qwen2_h16_fp32",
                                                              "qwen2_h16_int4", "phi3_h16_fp32",
                                                              "phi3_h16_int4", "gemma_fp32", "gemma_int4",
                                                              "gemma2_fp32", "gemma2_int4", "gpt_oss_fp32",
                                                              "lfm2_moe_fp32", "lfm2_moe_int4"),
                                            ::testing::Range(0, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
                           return std::get<0>(info.param) + "_" + kGenaiRuns[std::get<1>(info.param)].name;
                         });

// Right-aligned pasts admit no left padding: prompts of different lengths are refused with a reason,
// prompts of one length run as a batch (each row as it runs alone).
TEST(TextGeneration, GroupQueryAttentionBatchesNeedOneLength) {
  auto pipe = TextGeneration::open(fixture("genai_llama_fp32").string());
  generation::GenerationConfig config = pipe.default_config();
  config.max_new_tokens = 6;
  const std::string error = error_of<PipelineError>([&] {
    pipe.generate({{805, 362, 745}, {805, 362}}, config);
  });
  EXPECT_NE(error.find("prompts of different lengths (3 and 2 tokens)"), std::string::npos) << error;
  auto batch = pipe.generate({{805, 362, 745}, {616, 88, 12}}, config);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].tokens, pipe.generate({{805, 362, 745}}, config)[0].tokens);
  EXPECT_EQ(batch[1].tokens, pipe.generate({{616, 88, 12}}, config)[0].tokens);
}

TEST(TextGeneration, StreamsTheDecodedText) {
  auto pipe = TextGeneration::open(fixture("llama_decoder").string());
  generation::GenerationConfig config = pipe.default_config();
  config.max_new_tokens = 12;
  std::string streamed;
  auto outputs =
      pipe(std::vector<std::string>{"The quick brown fox"}, config, [&](size_t row, std::string_view piece) {
        EXPECT_EQ(row, 0u);
        streamed += piece;
      });
  EXPECT_EQ(streamed, outputs[0].text);
  EXPECT_EQ(outputs[0].tokens.size(), 12u);
}

TEST(TextGeneration, OnePlanServesEveryDecodeStep) {
  PipelineOptions options;
  options.mode = ExecutionMode::kCompiled;
  auto pipe = TextGeneration::open(fixture("gpt2_decoder").string(), options);
  ASSERT_EQ(pipe.cache(), KvCache::kStatic);
  generation::GenerationConfig config = pipe.default_config();
  config.eos_token_ids.clear();  // run every step
  config.max_new_tokens = 56;    // the fixture's context is 64 positions
  GenerationSummary summary;
  for (int call = 0; call < 4; ++call) pipe.generate({{805, 362, 745, 616}}, config, {}, &summary);
  EXPECT_EQ(summary.steps, 56u);
  EXPECT_EQ(pipe.compile_stats().plans_built, 1u);  // 4 x 55 decode steps, one plan
}

// optimum's merged decoder (tests/models/merged_decoder: an If on use_cache_branch between the graph
// without past and the graph with past, scripts/make_merged_decoder.py): the prefill takes the branch
// without past, the decode steps the other. Both branches share the weights, so greedy generation with
// the cache equals generation that reruns the whole sequence through the no-past branch every step.
TEST(TextGeneration, MergedDecoderTakesTheCacheBranchAfterThePrefill) {
  fs::path dir = fs::temp_directory_path() / ("transmuter_merged_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(fs::path(TRANSMUTER_SOURCE_DIR) / "tests/models/merged_decoder/model.onnx", dir / "model.onnx");
  // Any tokenizer will do for generating from ids (the model's vocabulary is 64 ids).
  fs::copy(fixture("gpt2_decoder") / "tokenizer.json", dir / "tokenizer.json");
  generation::GenerationConfig config;
  config.max_new_tokens = 12;
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 33}, {9, 2}};
  auto cached = TextGeneration::open(dir.string(), {}, KvCache::kAuto);
  EXPECT_EQ(cached.cache(), KvCache::kDynamic);  // no position_ids input: no static cache
  auto rerun = TextGeneration::open(dir.string(), {}, KvCache::kNone);
  auto with_cache = cached.generate(prompts, config);
  auto without = rerun.generate(prompts, config);
  for (size_t r = 0; r < prompts.size(); ++r) {
    EXPECT_EQ(with_cache[r].tokens.size(), 12u);
    EXPECT_EQ(with_cache[r].tokens, without[r].tokens) << "row " << r;
  }
  EXPECT_NE(error_of<PipelineError>([&] {
              TextGeneration::open(dir.string(), {}, KvCache::kStatic);
            }).find("a static cache needs a position_ids input"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(TextGeneration, ClearErrors) {
  auto pipe = TextGeneration::open(fixture("gpt2_decoder").string());
  generation::GenerationConfig config = pipe.default_config();
  EXPECT_EQ(error_of<PipelineError>([&] { pipe(std::vector<std::string>{""}, config); }),
            "prompt 0 is empty: it encodes to no tokens");
  std::vector<int64_t> too_long(64, 805);
  EXPECT_NE(
      error_of<PipelineError>([&] { pipe.generate({too_long}, config); }).find("the model's context of 64"),
      std::string::npos);
  EXPECT_NE(error_of<PipelineError>([&] {
              TextGeneration::open(fixture("bert_sentiment").string());
            }).find("is not one text generation fills"),
            std::string::npos);
  config.max_new_tokens = 61;
  EXPECT_NE(error_of<PipelineError>([&] {
              pipe.generate({{805, 362, 745, 616}}, config);
            }).find("(up to 65 in all) do not fit the model's context of 64"),
            std::string::npos);
  fs::path dir = fs::temp_directory_path() / ("transmuter_generation_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(fixture("gpt2_decoder"), dir);
  fs::remove(dir / "tokenizer.json");
  EXPECT_NE(
      error_of<PipelineError>([&] { TextGeneration::open(dir.string()); }).find("has no tokenizer.json"),
      std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace transmuter::pipelines
