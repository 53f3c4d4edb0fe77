// `transmuter embed|classify|ner|fill-mask MODEL [TEXT...]`: the encoder pipelines from the command
// line, texts from the arguments or stdin (one per line), one JSON line out per text.
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli.h"
#include "json_out.h"
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
}  // namespace transmuter::cli

#endif
