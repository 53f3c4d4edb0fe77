// Text2TextGeneration: the decode loop of an encoder-decoder model (optimum's seq2seq exports), choosing
// tokens as transformers' generate() does (src/pipelines/decode_rows.h).
//
// The encoder runs once: input_ids, attention_mask [batch, S] (right padded) -> last_hidden_state
// [batch, S, hidden]. The decoder's files, as optimum writes them:
//   decoder_model.onnx            input_ids [batch, T], encoder_attention_mask [batch, S],
//                                 encoder_hidden_states -> logits [batch, T, vocab],
//                                 present.N.decoder.key/value [batch, heads, T, head_dim],
//                                 present.N.encoder.key/value [batch, heads, S, head_dim]
//   decoder_with_past_model.onnx  input_ids [batch, 1], encoder_attention_mask,
//                                 past_key_values.N.decoder.* (the self-attention past, growing by one a
//                                 step), past_key_values.N.encoder.* (the cross-attention past, fixed) ->
//                                 logits, present.N.decoder.* (and, in some exports, present.N.encoder.*)
//   decoder_model_merged.onnx     both, as the branches of an If on use_cache_branch: every input is fed
//                                 at every step (empty pasts on the first, the encoder's hidden states on
//                                 the later ones, where the with-past branch ignores them)
// Every row's decoder sequence starts with decoder_start_token_id and grows by one token a step, so the
// decoder needs no attention mask of its own; finished rows go on with the pad token, as in transformers.
#include <algorithm>
#include <map>
#include <mutex>
#include <optional>

#include <mlx/ops.h>
#include <mlx/transforms.h>

#include "pipelines/decode_rows.h"
#include "pipelines/encoder_session.h"
#include "pipelines/model_config.h"
#include "pipelines/model_folder.h"
#include "pipelines/model_runner.h"

namespace transmuter::pipelines {
namespace {

namespace fs = std::filesystem;
using generation::GenerationConfig;

constexpr const char* kPastPrefix = "past_key_values.";
constexpr const char* kPresentPrefix = "present.";

/** One past input of a decoder file and the output that updates it. */
struct PastSlot {
  std::string input;    // past_key_values.N.decoder.key, ...
  std::string present;  // present.N.decoder.key, ...
  bool cross = false;   // an encoder (cross-attention) past: fixed after the first step
  int heads = 1;        // the input's numeric dims, for the empty pasts of a merged file's first step
  int head_dim = 1;
};

/** A decoder file: the model, how to run it, and what its inputs and outputs say. */
struct DecoderFile {
  DecoderFile(fs::path p, Model m) : path(std::move(p)), model(std::move(m)) {}

  fs::path path;
  Model model;
  std::unique_ptr<ModelRunner> runner;
  bool takes_encoder_mask = false;
  bool takes_hidden_states = false;
  bool has_cache_branch = false;  // merged: use_cache_branch picks the branch
  std::vector<PastSlot> past;     // empty for decoder_model.onnx
  std::vector<std::string> presents;

  bool has_output(const std::string& name) const {
    return std::find(presents.begin(), presents.end(), name) != presents.end();
  }
};

int numeric_dim(const ValueInfo& input, size_t axis) {
  return input.shape.size() > axis && input.shape[axis].value ? static_cast<int>(*input.shape[axis].value) : 1;
}

std::unique_ptr<DecoderFile> open_decoder(const fs::path& path, const PipelineOptions& options,
                                          const std::string& source) {
  auto file = std::make_unique<DecoderFile>(path, load(path.string(), options.load));
  const std::string where = str(source, " (", path.filename().string(), ")");
  bool has_ids = false;
  for (const auto& input : file->model.inputs()) {
    const std::string& name = input.name;
    if (name == "input_ids") {
      has_ids = true;
    } else if (name == "encoder_attention_mask") {
      file->takes_encoder_mask = true;
    } else if (name == "encoder_hidden_states") {
      file->takes_hidden_states = true;
    } else if (name == "use_cache_branch") {
      file->has_cache_branch = true;
    } else if (name.starts_with(kPastPrefix) &&
               (name.find(".decoder.") != std::string::npos || name.find(".encoder.") != std::string::npos)) {
      if (input.shape.size() != 4)
        throw PipelineError(str(where, ": past input '", name, "' should be [batch, heads, sequence, head_dim]"));
      PastSlot slot;
      slot.input = name;
      slot.present = kPresentPrefix + name.substr(std::string(kPastPrefix).size());
      slot.cross = name.find(".encoder.") != std::string::npos;
      slot.heads = numeric_dim(input, 1);
      slot.head_dim = numeric_dim(input, 3);
      file->past.push_back(std::move(slot));
    } else {
      throw PipelineError(str(where, ": the decoder's input '", name,
                              "' is not one generation fills (input_ids, encoder_attention_mask, "
                              "encoder_hidden_states, past_key_values.N.decoder/encoder.key/value, "
                              "use_cache_branch)"));
    }
  }
  if (!has_ids) throw PipelineError(str(where, ": the decoder has no input_ids input"));
  bool has_logits = false;
  for (const auto& output : file->model.outputs()) {
    has_logits = has_logits || output.name == "logits";
    if (output.name.starts_with(kPresentPrefix)) file->presents.push_back(output.name);
  }
  if (!has_logits) throw PipelineError(str(where, ": the decoder has no 'logits' output"));
  std::vector<std::string> static_inputs;
  if (file->has_cache_branch) static_inputs.push_back("use_cache_branch");  // picks the If branch
  file->runner = std::make_unique<ModelRunner>(file->model, options, static_inputs);
  return file;
}

}  // namespace

struct Text2TextGeneration::Impl {
  ModelFolder folder;
  PipelineOptions options;
  Model encoder;
  std::unique_ptr<ModelRunner> encoder_runner;
  std::string encoder_output;
  bool encoder_takes_mask = false;
  bool encoder_takes_ids = false;  // a text encoder; else the caller feeds its inputs (Whisper's features)
  // The first step's decoder (decoder_model.onnx, or the merged file) and the later steps' (with past;
  // the merged file again, or null: no cache possible).
  std::unique_ptr<DecoderFile> first;
  std::unique_ptr<DecoderFile> with_past_file;
  const DecoderFile* with_past = nullptr;
  text::Tokenizer tokenizer;
  ModelConfig config;
  GenerationConfig defaults;
  KvCache cache = KvCache::kNone;
  int64_t pad_id = 0;
  size_t max_input_length = 0;  // encoder tokens per text; 0: no limit
  mutable std::mutex mutex;     // guards token_texts
  mutable std::optional<generation::TokenTexts> token_texts;

  Impl(ModelFolder f, const PipelineOptions& o)
      : folder(std::move(f)),
        options(o),
        encoder(load(folder.model_path().string(), o.load)),
        tokenizer(folder.tokenizer()),
        config(read_model_config(folder)) {}

  /** What one call feeds the encoder, and the mask the decoder's cross-attention takes (nullopt: none,
   * every encoder position counts). */
  struct EncoderBatch {
    Inputs inputs;
    std::optional<mx::array> mask;
  };

  /** Token ids right padded, with their mask. */
  EncoderBatch encoder_batch(const std::vector<std::vector<int64_t>>& rows) const {
    size_t longest = 0;
    for (const auto& r : rows) longest = std::max(longest, r.size());
    std::vector<int64_t> ids, mask;
    for (const auto& r : rows) {
      ids.insert(ids.end(), r.begin(), r.end());
      ids.insert(ids.end(), longest - r.size(), pad_id);
      mask.insert(mask.end(), r.size(), 1);
      mask.insert(mask.end(), longest - r.size(), 0);
    }
    const int n = static_cast<int>(rows.size()), s = static_cast<int>(longest);
    EncoderBatch batch;
    batch.inputs.emplace("input_ids", int_matrix(ids, n, s));
    batch.mask = int_matrix(mask, n, s);
    if (encoder_takes_mask) batch.inputs.emplace("attention_mask", *batch.mask);
    return batch;
  }

  mx::array encode(const EncoderBatch& batch) const {
    Outputs outputs = (*encoder_runner)(batch.inputs);
    return outputs.tensor(encoder_output);
  }

  /** One decoder call: `ids` [rows, T]; `past` by input name (empty pasts where a merged file's first
   * step takes them). */
  Outputs run_decoder(const DecoderFile& file, mx::array ids, const EncoderBatch& batch,
                      const mx::array& hidden_states, const std::map<std::string, mx::array>& past,
                      bool with_past) const {
    Inputs inputs;
    const int rows = ids.shape(0);
    inputs.emplace("input_ids", std::move(ids));
    if (file.takes_encoder_mask)
      inputs.emplace("encoder_attention_mask",
                     batch.mask ? *batch.mask
                                : mx::ones({hidden_states.shape(0), hidden_states.shape(1)}, mx::int64));
    if (file.takes_hidden_states) inputs.emplace("encoder_hidden_states", hidden_states);
    if (file.has_cache_branch) inputs.emplace("use_cache_branch", mx::array({with_past}));
    for (const auto& slot : file.past) {
      auto it = past.find(slot.input);
      if (with_past) {
        if (it == past.end())
          throw PipelineError(str(folder.source(), ": no present output of the first step feeds the past '",
                                  slot.input, "'"));
        inputs.emplace(slot.input, it->second);
      } else {
        inputs.emplace(slot.input, mx::zeros({rows, slot.heads, 0, slot.head_dim}, mx::float32));
      }
    }
    // Compiled plans are keyed by shape, and every decoder step has a new one (the past grows, or the whole
    // sequence does without a cache): a plan per step would be traced once and never reused. So only the
    // first step of a cached run (its shape repeats for inputs of the same length) may compile.
    const bool shape_repeats = !with_past && cache == KvCache::kDynamic;
    return (*file.runner)(inputs, shape_repeats);
  }

  /** The pasts of the next step: every present the call returned for a past input of `next`. */
  static void keep_presents(const Outputs& outputs, const DecoderFile& produced, const DecoderFile& next,
                            std::map<std::string, mx::array>& past) {
    for (const auto& slot : next.past)
      if (produced.has_output(slot.present)) past.insert_or_assign(slot.input, outputs.tensor(slot.present));
  }

  /** The decode loop: `reported` is what each result gives as its prompt; `prompt` the decoder's first
   * tokens (empty: decoder_start_token_id, else bos_token_id). */
  std::vector<GeneratedText> decode(const EncoderBatch& batch, const std::vector<std::vector<int64_t>>& reported,
                                    std::vector<int64_t> prompt, const GenerationConfig& config,
                                    const TextStreamer& streamer, GenerationSummary* summary) const;

  const generation::TokenTexts& texts() const {
    std::lock_guard lock(mutex);
    if (!token_texts) token_texts = generation::TokenTexts::from_file(*folder.find("tokenizer.json"));
    return *token_texts;
  }
};

namespace {

/** The last position's logits of each row, float32 [rows, vocab], evaluated with the pasts. */
mx::array evaluated_last_logits(const Outputs& outputs, const std::map<std::string, mx::array>& past,
                                const std::string& source) {
  mx::array last = last_position_logits(outputs.tensor("logits"), source);
  std::vector<mx::array> to_eval{last};
  for (const auto& [name, value] : past) to_eval.push_back(value);
  mx::eval(to_eval);
  return last;
}

}  // namespace

Text2TextGeneration Text2TextGeneration::open(const std::string& source, const PipelineOptions& options,
                                              KvCache cache) {
  if (!options.model_file.empty())
    throw PipelineError(str(source, ": an encoder-decoder's files are found by their names (encoder_model, "
                            "decoder_model_merged, ...); model_file is not used"));
  auto impl = std::make_shared<Impl>(ModelFolder::open(source, options, "encoder_model"), options);
  Impl& m = *impl;
  for (const auto& input : m.encoder.inputs()) {
    m.encoder_takes_mask = m.encoder_takes_mask || input.name == "attention_mask";
    m.encoder_takes_ids = m.encoder_takes_ids || input.name == "input_ids";
  }
  m.encoder_output = m.encoder.outputs().at(0).name;
  for (const auto& output : m.encoder.outputs())
    if (output.name == "last_hidden_state") m.encoder_output = output.name;
  m.encoder_runner = std::make_unique<ModelRunner>(m.encoder, options);

  if (auto merged = m.folder.find_model("decoder_model_merged")) {
    m.first = open_decoder(*merged, options, source);
    if (!m.first->has_cache_branch)
      throw PipelineError(str(source, ": ", merged->filename().string(), " has no use_cache_branch input"));
    m.with_past = m.first.get();
  } else if (auto plain = m.folder.find_model("decoder_model")) {
    m.first = open_decoder(*plain, options, source);
    if (auto past = m.folder.find_model("decoder_with_past_model")) {
      m.with_past_file = open_decoder(*past, options, source);
      m.with_past = m.with_past_file.get();
      if (m.with_past->past.empty())
        throw PipelineError(str(source, ": ", past->filename().string(), " has no past_key_values inputs"));
    }
  } else {
    throw PipelineError(str(source, ": an encoder-decoder needs decoder_model_merged.onnx or decoder_model.onnx "
                            "beside its encoder (dtype ", options.load.dtype, ")"));
  }
  if (!m.first->takes_hidden_states)
    throw PipelineError(str(source, ": ", m.first->path.filename().string(),
                            " has no encoder_hidden_states input, which the first decoder step needs"));

  if (cache == KvCache::kStatic)
    throw PipelineError(str(source, ": an encoder-decoder's decoder takes its positions from the past's length, "
                            "so it cannot run with a static cache"));
  if (cache == KvCache::kDynamic && m.with_past == nullptr)
    throw PipelineError(str(source, ": there is no decoder with past (decoder_with_past_model.onnx or "
                            "decoder_model_merged.onnx), so it can only run without a cache"));
  m.cache = cache == KvCache::kAuto ? (m.with_past ? KvCache::kDynamic : KvCache::kNone) : cache;

  auto generation_file = m.folder.find("generation_config.json");
  auto config_file = m.folder.find("config.json");
  if (generation_file || config_file)
    m.defaults = GenerationConfig::from_folder((generation_file ? *generation_file : *config_file).parent_path());
  const auto special = read_special_tokens(m.folder);
  std::optional<int64_t> pad;
  if (auto p = special.find("pad_token"); p != special.end()) pad = m.tokenizer.token_to_id(p->second);
  m.pad_id = pad.value_or(m.defaults.pad_token_id_or_eos().value_or(0));
  m.max_input_length = resolve_max_length(options, m.tokenizer, m.config);
  return Text2TextGeneration(impl);
}

bool Text2TextGeneration::holds_encoder_decoder(const std::string& source, const PipelineOptions& options) {
  return ModelFolder::holds(source, options, "encoder_model");
}

const GenerationConfig& Text2TextGeneration::default_config() const { return impl_->defaults; }
const text::Tokenizer& Text2TextGeneration::tokenizer() const { return impl_->tokenizer; }
KvCache Text2TextGeneration::cache() const { return impl_->cache; }

std::vector<fs::path> Text2TextGeneration::model_files() const {
  std::vector<fs::path> files{impl_->folder.model_path(), impl_->first->path};
  if (impl_->with_past_file) files.push_back(impl_->with_past_file->path);
  return files;
}

CompileStats Text2TextGeneration::compile_stats() const {
  CompileStats total = impl_->first->runner->stats();
  if (impl_->with_past_file) {
    const CompileStats more = impl_->with_past_file->runner->stats();
    total.plans_built += more.plans_built;
    total.cache_hits += more.cache_hits;
    total.evictions += more.evictions;
  }
  return total;
}

std::vector<GeneratedText> Text2TextGeneration::operator()(std::span<const std::string> texts,
                                                           const GenerationConfig& config,
                                                           const TextStreamer& streamer,
                                                           GenerationSummary* summary) const {
  const Impl& impl = *impl_;
  const size_t limit = impl.max_input_length;
  const bool reject = impl.options.long_inputs == LongInputs::kReject;
  text::EncodeOptions options;
  if (limit > 0 && !reject) {
    options.truncation = text::Truncation{};
    options.truncation->max_length = limit;
  }
  std::vector<std::vector<int64_t>> ids;
  for (size_t i = 0; i < texts.size(); ++i) {
    ids.push_back(impl.tokenizer.encode(texts[i], options).ids);
    if (ids.back().empty()) throw PipelineError(str("text ", i, " is empty: it encodes to no tokens"));
    if (reject && limit > 0 && ids.back().size() > limit)
      throw PipelineError(str("text ", i, " has ", ids.back().size(), " tokens, more than the model's limit of ",
                              limit, " (truncate long inputs, or raise max_length)"));
  }
  return generate(ids, config, streamer, summary);
}

std::vector<GeneratedText> Text2TextGeneration::generate(const std::vector<std::vector<int64_t>>& encoder_ids,
                                                         const GenerationConfig& config,
                                                         const TextStreamer& streamer,
                                                         GenerationSummary* summary) const {
  const Impl& impl = *impl_;
  if (encoder_ids.empty()) return {};
  if (!impl.encoder_takes_ids)
    throw PipelineError(str(impl.folder.source(), ": the encoder takes no input_ids (its inputs: ",
                            impl.encoder.inputs().front().name, ", ...): give them with generate(Inputs, ...)"));
  for (size_t i = 0; i < encoder_ids.size(); ++i)
    if (encoder_ids[i].empty())
      throw PipelineError(str("input ", i, " is empty: the encoder needs at least one token"));
  return impl.decode(impl.encoder_batch(encoder_ids), encoder_ids, {}, config, streamer, summary);
}

std::vector<GeneratedText> Text2TextGeneration::generate(const Inputs& encoder_inputs,
                                                         const std::vector<int64_t>& decoder_prompt,
                                                         const GenerationConfig& config,
                                                         const TextStreamer& streamer,
                                                         GenerationSummary* summary) const {
  const Impl& impl = *impl_;
  std::string expected;
  for (const auto& input : impl.encoder.inputs()) {
    expected += (expected.empty() ? "" : ", ") + input.name;
    if (!encoder_inputs.contains(input.name))
      throw PipelineError(str(impl.folder.source(), ": the encoder's input '", input.name, "' is not given"));
  }
  for (const auto& [name, value] : encoder_inputs)
    if (std::none_of(impl.encoder.inputs().begin(), impl.encoder.inputs().end(),
                     [&](const ValueInfo& input) { return input.name == name; }))
      throw PipelineError(str(impl.folder.source(), ": the encoder has no input '", name, "' (its inputs: ", expected,
                              ")"));
  Impl::EncoderBatch batch;
  batch.inputs = encoder_inputs;
  if (auto mask = encoder_inputs.find("attention_mask"); mask != encoder_inputs.end() && mask->second.is_tensor())
    batch.mask = mask->second.tensor();
  if (encoder_inputs.empty() || !encoder_inputs.begin()->second.is_tensor() ||
      encoder_inputs.begin()->second.tensor().ndim() == 0)
    throw PipelineError("the encoder's inputs must be tensors with a batch axis first");
  const size_t rows = static_cast<size_t>(encoder_inputs.begin()->second.tensor().shape(0));
  return impl.decode(batch, std::vector<std::vector<int64_t>>(rows, decoder_prompt), decoder_prompt, config,
                     streamer, summary);
}

std::vector<GeneratedText> Text2TextGeneration::Impl::decode(const EncoderBatch& batch,
                                                             const std::vector<std::vector<int64_t>>& reported,
                                                             std::vector<int64_t> prompt,
                                                             const GenerationConfig& config,
                                                             const TextStreamer& streamer,
                                                             GenerationSummary* summary) const {
  if (prompt.empty()) {
    const std::optional<int64_t> start_token =
        config.decoder_start_token_id ? config.decoder_start_token_id : config.bos_token_id;
    if (!start_token)
      throw PipelineError(str(folder.source(), ": the generation config gives neither decoder_start_token_id "
                              "nor bos_token_id, so the decoder has no first token"));
    prompt = {*start_token};
  }
  std::optional<generation::TokenTexts> stop_texts;
  if (!config.stop_strings.empty()) stop_texts = texts();
  const size_t rows = reported.size();
  DecodeRows choices(config, tokenizer, reported, prompt.size(), stop_texts, this->config.max_position_embeddings,
                     config.pad_token_id_or_eos().value_or(pad_id), streamer);
  const std::optional<size_t> positions = this->config.max_position_embeddings;
  if (positions && choices.max_length() > *positions)
    throw PipelineError(str("up to ", choices.max_length(), " decoder tokens do not fit the model's ", *positions,
                            " positions: lower max_new_tokens"));

  const mx::array hidden_states = encode(batch);
  if (hidden_states.ndim() != 3 || static_cast<size_t>(hidden_states.shape(0)) != rows)
    throw PipelineError(str(folder.source(), ": the encoder's '", encoder_output, "' should be [", rows,
                            ", sequence, hidden], got ", hidden_states.shape()));
  std::vector<std::vector<int64_t>> decoded(rows, prompt);
  std::map<std::string, mx::array> past;
  size_t steps = 0;
  while (true) {
    // 1. Run the decoder on what its cache has not seen: the whole sequence without a cache (or on the
    // first step), the last token with one.
    const bool first_step = cache == KvCache::kNone || steps == 0;
    const size_t count = first_step ? decoded.front().size() : 1;
    std::vector<int64_t> flat;
    for (const auto& row : decoded) flat.insert(flat.end(), row.end() - static_cast<std::ptrdiff_t>(count), row.end());
    mx::array ids = int_matrix(flat, static_cast<int>(rows), static_cast<int>(count));
    const DecoderFile& file = first_step ? *first : *with_past;
    Outputs outputs = run_decoder(file, std::move(ids), batch, hidden_states, past, !first_step);
    ++steps;
    if (cache == KvCache::kDynamic) keep_presents(outputs, file, *with_past, past);
    mx::array logits = evaluated_last_logits(outputs, past, folder.source());

    // 2. Choose each row's next token.
    if (choices.step(logits, decoded, [&](size_t row, int64_t token) { decoded[row].push_back(token); })) break;
  }
  return choices.finish(summary, steps);
}

}  // namespace transmuter::pipelines
