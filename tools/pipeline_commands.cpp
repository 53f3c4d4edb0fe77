// `transmuter embed|classify|ner|fill-mask MODEL [TEXT...]`: the encoder pipelines from the command
// line, texts from the arguments or stdin (one per line), one JSON line out per text; `generate` and
// `chat` stream generated text to stdout and a summary per reply to stderr.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli.h"
#include "json_out.h"
#include "npy.h"
#include "transmuter/error.h"

#if TRANSMUTER_WITH_TEXT
#include "transmuter/pipelines.h"

namespace transmuter::cli {
namespace {

using namespace pipelines;

/** Looks `value` up in `names`, or says which values --option takes. */
template <typename T>
T choice(const Args& args, const std::string& option, const std::map<std::string, T>& names, T fallback) {
  if (!args.has(option)) return fallback;
  const std::string value = args.get(option, "");
  auto found = names.find(value);
  if (found != names.end()) return found->second;
  std::string known;
  for (const auto& [name, _] : names) known += (known.empty() ? "" : "|") + name;
  throw Error(str("--", option, " takes ", known, ", got '", value, "'"));
}

size_t count_option(const Args& args, const std::string& name, int fallback) {
  const int value = args.get_int(name, fallback);
  if (value < 0) throw Error(str("--", name, " must not be negative"));
  return static_cast<size_t>(value);
}

PipelineOptions pipeline_options(const Args& args) {
  PipelineOptions options;
  options.load.dtype = args.get("dtype", "fp32");
  options.load.hub = hub_options(args);
  options.model_file = args.get("model-file", "");
  // --passes default|none|NAME,...: the load-time passes, as for `run`.
  const std::string passes = args.get("passes", "default");
  if (passes == "none") {
    options.load.run_passes = false;
  } else if (passes != "default") {
    std::string name;
    for (char c : passes + ",") {
      if (c != ',') {
        name += c;
      } else if (!name.empty()) {
        options.load.only_passes.push_back(name);
        name.clear();
      }
    }
  }
  options.mode = choice<ExecutionMode>(
      args, "mode", {{"eager", ExecutionMode::kEager}, {"compiled", ExecutionMode::kCompiled}},
      ExecutionMode::kEager);
  options.max_length = count_option(args, "max-length", 0);
  options.long_inputs = args.has("reject-long") ? LongInputs::kReject : LongInputs::kTruncate;
  options.batch_size = count_option(args, "batch-size", 16);
  return options;
}

/** The texts: the arguments after MODEL, else stdin's lines. */
std::vector<std::string> input_texts(const Args& args) {
  std::vector<std::string> texts(args.positional.begin() + 1, args.positional.end());
  if (texts.empty())
    for (std::string line; std::getline(std::cin, line);) texts.push_back(line);
  return texts;
}

void require_model(const Args& args, const char* usage) {
  if (args.positional.empty()) throw Error(usage);
}

void write_labels(std::ostream& out, const std::vector<LabelScore>& labels) {
  out << '[';
  for (size_t i = 0; i < labels.size(); ++i) {
    out << (i ? ", " : "") << "{\"label\": ";
    write_json_string(out, labels[i].label);
    out << ", \"score\": ";
    write_json_float(out, labels[i].score);
    out << '}';
  }
  out << "]\n";
}

void write_entity(std::ostream& out, const Entity& e) {
  out << (e.index ? "{\"entity\": " : "{\"entity_group\": ");
  write_json_string(out, e.entity);
  out << ", \"score\": ";
  write_json_float(out, e.score);
  if (e.index) out << ", \"index\": " << *e.index;
  out << ", \"word\": ";
  write_json_string(out, e.word);
  out << ", \"start\": " << e.start << ", \"end\": " << e.end << '}';
}

void write_fills(std::ostream& out, const std::vector<MaskFill>& fills) {
  out << '[';
  for (size_t i = 0; i < fills.size(); ++i) {
    out << (i ? ", " : "") << "{\"score\": ";
    write_json_float(out, fills[i].score);
    out << ", \"token\": " << fills[i].token << ", \"token_str\": ";
    write_json_string(out, fills[i].token_str);
    out << ", \"sequence\": ";
    write_json_string(out, fills[i].sequence);
    out << '}';
  }
  out << ']';
}

}  // namespace

int embed_main(const Args& args) {
  require_model(
      args,
      "usage: transmuter embed MODEL [TEXT...] [--pooling mean|cls|max|lasttoken|mean_sqrt_len|weightedmean] "
      "[--normalize|--no-normalize]");
  auto embed = TextEmbedding::open(args.positional[0], pipeline_options(args));
  EmbeddingOptions options;
  if (args.has("pooling"))
    options.pooling = choice<Pooling>(args, "pooling",
                                      {{"mean", Pooling::kMean},
                                       {"cls", Pooling::kCls},
                                       {"max", Pooling::kMax},
                                       {"lasttoken", Pooling::kLastToken},
                                       {"mean_sqrt_len", Pooling::kMeanSqrtLen},
                                       {"weightedmean", Pooling::kWeightedMean}},
                                      Pooling::kMean);
  if (args.has("normalize")) options.normalize = true;
  if (args.has("no-normalize")) options.normalize = false;
  const auto texts = input_texts(args);
  if (texts.empty()) return 0;
  mx::array vectors = embed(texts, options);
  const float* data = vectors.data<float>();
  const size_t width = static_cast<size_t>(vectors.shape(1));
  for (size_t i = 0; i < texts.size(); ++i) {
    std::cout << "{\"embedding\": [";
    for (size_t k = 0; k < width; ++k) {
      if (k) std::cout << ", ";
      write_json_float(std::cout, data[i * width + k]);
    }
    std::cout << "]}\n";
  }
  return 0;
}

int classify_main(const Args& args) {
  require_model(args,
                "usage: transmuter classify MODEL [TEXT...] [--pair TEXT] [--top-k N] [--function "
                "softmax|sigmoid|none]");
  auto classify = TextClassification::open(args.positional[0], pipeline_options(args));
  ClassificationOptions options;
  options.top_k = count_option(args, "top-k", 1);
  if (args.has("function"))
    options.function = choice<ScoreFunction>(args, "function",
                                             {{"softmax", ScoreFunction::kSoftmax},
                                              {"sigmoid", ScoreFunction::kSigmoid},
                                              {"none", ScoreFunction::kNone}},
                                             ScoreFunction::kSoftmax);
  const auto texts = input_texts(args);
  if (texts.empty()) return 0;
  const std::vector<std::string> pairs(args.has("pair") ? texts.size() : 0, args.get("pair", ""));
  for (const auto& labels : pairs.empty() ? classify(texts, options) : classify(texts, pairs, options))
    write_labels(std::cout, labels);
  return 0;
}

int ner_main(const Args& args) {
  require_model(args,
                "usage: transmuter ner MODEL [TEXT...] [--aggregation none|simple|first|average|max] "
                "[--ignore LABEL]... "
                "[--no-ignore]");
  auto ner = TokenClassification::open(args.positional[0], pipeline_options(args));
  TokenClassificationOptions options;
  options.aggregation = choice<Aggregation>(args, "aggregation",
                                            {{"none", Aggregation::kNone},
                                             {"simple", Aggregation::kSimple},
                                             {"first", Aggregation::kFirst},
                                             {"average", Aggregation::kAverage},
                                             {"max", Aggregation::kMax}},
                                            Aggregation::kNone);
  if (args.has("ignore")) options.ignore_labels = args.all("ignore");
  if (args.has("no-ignore")) options.ignore_labels.clear();
  const auto texts = input_texts(args);
  if (texts.empty()) return 0;
  for (const auto& entities : ner(texts, options)) {
    std::cout << '[';
    for (size_t i = 0; i < entities.size(); ++i) {
      if (i) std::cout << ", ";
      write_entity(std::cout, entities[i]);
    }
    std::cout << "]\n";
  }
  return 0;
}

int fill_mask_main(const Args& args) {
  require_model(args, "usage: transmuter fill-mask MODEL [TEXT...] [--top-k N] [--target WORD]...");
  auto fill = FillMask::open(args.positional[0], pipeline_options(args));
  FillMaskOptions options;
  options.top_k = count_option(args, "top-k", 5);
  options.targets = args.all("target");
  const auto texts = input_texts(args);
  if (texts.empty()) return 0;
  for (const auto& per_mask : fill(texts, options)) {
    // As transformers: a list of fills for one mask, a list of lists for several.
    if (per_mask.size() == 1) {
      write_fills(std::cout, per_mask.front());
    } else {
      std::cout << '[';
      for (size_t m = 0; m < per_mask.size(); ++m) {
        if (m) std::cout << ", ";
        write_fills(std::cout, per_mask[m]);
      }
      std::cout << ']';
    }
    std::cout << '\n';
  }
  return 0;
}

namespace {

double number_option(const Args& args, const std::string& name, double fallback) {
  if (!args.has(name)) return fallback;
  const std::string value = args.get(name, "");
  try {
    size_t used = 0;
    const double number = std::stod(value, &used);
    if (used == value.size()) return number;
  } catch (const std::exception&) {
  }
  throw Error(str("--", name, " expects a number, got '", value, "'"));
}

/** The folder's generation config with the command line's settings over it. */
generation::GenerationConfig generation_config(const Args& args, const generation::GenerationConfig& defaults) {
  generation::GenerationConfig config = defaults;
  if (args.has("max-new-tokens")) config.max_new_tokens = count_option(args, "max-new-tokens", 0);
  if (args.has("min-new-tokens")) config.min_new_tokens = count_option(args, "min-new-tokens", 0);
  if (args.has("do-sample")) config.do_sample = true;
  config.temperature = number_option(args, "temperature", config.temperature);
  if (args.has("top-k")) config.top_k = static_cast<int64_t>(count_option(args, "top-k", 0));
  config.top_p = number_option(args, "top-p", config.top_p);
  if (args.has("min-p")) config.min_p = number_option(args, "min-p", 0);
  config.repetition_penalty = number_option(args, "repetition-penalty", config.repetition_penalty);
  if (args.has("no-repeat-ngram")) config.no_repeat_ngram_size = count_option(args, "no-repeat-ngram", 0);
  for (const auto& stop : args.all("stop")) config.stop_strings.push_back(stop);
  if (args.has("seed")) config.seed = static_cast<uint64_t>(count_option(args, "seed", 0));
  config.validate();
  return config;
}

KvCache cache_option(const Args& args) {
  return choice<KvCache>(args, "cache",
                         {{"auto", KvCache::kAuto},
                          {"none", KvCache::kNone},
                          {"dynamic", KvCache::kDynamic},
                          {"static", KvCache::kStatic}},
                         KvCache::kAuto);
}

/** One line on stderr per reply; compiled runs add how many plans the decode steps have built. */
template <typename Pipeline>
void print_summary(const GenerationSummary& s, const Pipeline& pipe, const Args& args) {
  char line[256];
  std::snprintf(
      line, sizeof line,
      "[%zu prompt tokens, %zu generated; first token after %.1f ms, then %.1f tokens/s; %.2f s in all",
      s.input_tokens, s.output_tokens, s.time_to_first_token_s * 1e3, s.tokens_per_s, s.total_s);
  std::cerr << line;
  if (args.get("mode", "eager") == "compiled")
    std::cerr << "; " << pipe.compile_stats().plans_built << " compiled plans";
  std::cerr << "]\n" << std::flush;
}

void stream_to_stdout(size_t, std::string_view piece) { std::cout << piece << std::flush; }

const char* reason_name(generation::StopReason reason) {
  switch (reason) {
    case generation::StopReason::kEosToken:
      return "eos_token";
    case generation::StopReason::kStopString:
      return "stop_string";
    case generation::StopReason::kMaxLength:
      return "max_length";
    case generation::StopReason::kNone:
      break;
  }
  return "none";
}

/** --jsonl: {"text", "tokens" (the new ids), "stop_reason"} instead of the streamed text. */
void write_generated(std::ostream& out, const GeneratedText& g) {
  out << "{\"text\": ";
  write_json_string(out, g.text);
  out << ", \"tokens\": [";
  for (size_t i = 0; i < g.tokens.size(); ++i) out << (i ? ", " : "") << g.tokens[i];
  out << "], \"stop_reason\": \"" << reason_name(g.reason) << "\"}";
}

}  // namespace

/** Generates from each prompt in turn: streamed to stdout (or one JSON line each), a summary on stderr. */
template <typename Pipeline>
int generate_each(const Args& args, const Pipeline& pipe) {
  const generation::GenerationConfig config = generation_config(args, pipe.default_config());
  const bool json = args.has("jsonl");
  for (const auto& prompt : input_texts(args)) {
    if (prompt.empty()) throw Error("the prompt is empty");
    GenerationSummary summary;
    auto outputs =
        pipe(std::vector<std::string>{prompt}, config, json ? TextStreamer{} : stream_to_stdout, &summary);
    if (json) write_generated(std::cout, outputs.front());
    std::cout << '\n' << std::flush;
    print_summary(summary, pipe, args);
  }
  return 0;
}

/** --input NAME=FILE.npy for an encoder that takes no text (Whisper's input_features), with
 * --decoder-prompt ID,ID,... (default: decoder_start_token_id): one JSON line or stream per call. */
int generate_from_encoder_inputs(const Args& args, const Text2TextGeneration& pipe) {
  Inputs inputs;
  for (const std::string& pair : args.all("input")) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0) throw Error(str("--input expects NAME=FILE.npy, got '", pair, "'"));
    inputs.emplace(pair.substr(0, eq), Value(read_npy(pair.substr(eq + 1))));
  }
  std::vector<int64_t> prompt;
  const std::string ids = args.get("decoder-prompt", "");
  for (size_t begin = 0; begin < ids.size();) {
    const size_t comma = std::min(ids.find(',', begin), ids.size());
    try {
      size_t used = 0;
      const std::string item = ids.substr(begin, comma - begin);
      prompt.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error(str("--decoder-prompt expects token ids separated by commas, got '", ids, "'"));
    }
    begin = comma + 1;
  }
  const generation::GenerationConfig config = generation_config(args, pipe.default_config());
  const bool json = args.has("jsonl");
  GenerationSummary summary;
  auto outputs = pipe.generate(inputs, prompt, config, json ? TextStreamer{} : stream_to_stdout, &summary);
  for (const auto& out : outputs) {
    if (json) write_generated(std::cout, out);
    std::cout << '\n';
  }
  std::cout << std::flush;
  print_summary(summary, pipe, args);
  return 0;
}

int generate_main(const Args& args) {
  require_model(
      args,
      "usage: transmuter generate MODEL [PROMPT...] [--max-new-tokens N] [--min-new-tokens N] [--do-sample] "
      "[--temperature T] "
      "[--top-k K] [--top-p P] [--min-p P] [--repetition-penalty R] [--no-repeat-ngram N] [--stop TEXT]... "
      "[--seed N] [--cache auto|none|dynamic|static] [--jsonl] "
      "[--input NAME=FILE.npy... --decoder-prompt ID,ID,...]");
  const PipelineOptions options = pipeline_options(args);
  // An encoder-decoder export (encoder_model.onnx + decoders): the prompt is the encoder's input.
  if (Text2TextGeneration::holds_encoder_decoder(args.positional[0], options)) {
    auto pipe = Text2TextGeneration::open(args.positional[0], options, cache_option(args));
    if (args.has("input")) return generate_from_encoder_inputs(args, pipe);
    return generate_each(args, pipe);
  }
  if (args.has("input") || args.has("decoder-prompt"))
    throw Error("--input and --decoder-prompt are for encoder-decoder models (encoder_model.onnx beside the decoder)");
  return generate_each(args, TextGeneration::open(args.positional[0], options, cache_option(args)));
}

int chat_session_main(const Args& args) {
  auto chat = Chat::open(args.positional[0], pipeline_options(args), cache_option(args));
  const generation::GenerationConfig config = generation_config(args, chat.generation().default_config());
  if (args.has("system")) chat.set_system(args.get("system", ""));
  // One user message per line of stdin; the conversation carries over from line to line. A turn that
  // fails (the conversation outgrew the context, ...) is reported and left out; the chat goes on, and
  // the exit code says that one failed.
  bool failed = false;
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    GenerationSummary summary;
    try {
      chat.send(line, config, stream_to_stdout, &summary);
    } catch (const Error& e) {
      std::cout << '\n' << std::flush;
      std::cerr << "transmuter chat: error: " << e.what() << "\n";
      failed = true;
      continue;
    }
    std::cout << '\n' << std::flush;
    print_summary(summary, chat.generation(), args);
  }
  return failed ? 1 : 0;
}

}  // namespace transmuter::cli

#else

namespace transmuter::cli {
namespace {
int without_text(const char* command) {
  throw Error(str(command, ": this transmuter is built without the text component (-DTRANSMUTER_TEXT=OFF)"));
}
}  // namespace
int embed_main(const Args&) { return without_text("embed"); }
int classify_main(const Args&) { return without_text("classify"); }
int ner_main(const Args&) { return without_text("ner"); }
int fill_mask_main(const Args&) { return without_text("fill-mask"); }
int generate_main(const Args&) { return without_text("generate"); }
int chat_session_main(const Args&) { return without_text("chat"); }
}  // namespace transmuter::cli

#endif
