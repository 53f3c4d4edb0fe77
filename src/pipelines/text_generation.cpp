// TextGeneration: the decode loop of a decoder-only model with a KV cache, choosing tokens as
// transformers' generate() does (src/pipelines/logits_processing.cpp and friends).
//
// One step feeds input_ids [batch, new], attention_mask [batch, past + new], position_ids [batch, new]
// and past_key_values.N.key/value [batch, kv_heads, past, head_dim]; it reads logits [batch, new, vocab]
// and present.N.key/value [batch, kv_heads, past + new, head_dim]. Prompts are left-padded, so the last
// position of every row is a real token, and positions are cumsum(mask) - 1 as transformers computes
// them. The static cache keeps the past at a fixed capacity C: a decode step feeds all C slots with
// the mask covering the filled ones, and writes the new token's key/value (the present's slot C) into
// slot `filled` of the cache, so that every decode step has the same shapes.
//
// GroupQueryAttention decoders (onnxruntime-genai's builds: no position_ids) take each row's valid
// keys and positions from the attention mask's sum (seqlens_k = sum - 1) and the cache length from
// its width, with the past right-aligned at slot 0: their static step feeds a mask of the capacity's
// width, 1 over the row's tokens, and its present (the past with the new key at slot `filled`, the
// capacity wide) is the next past as it is. Right alignment admits no left padding: such a batch's
// prompts must have one length. Their local-attention layers (GroupQueryAttention's
// sliding_window_cache; the past's length is named 'past_sliding_length') keep a window-sized buffer
// in every mode, config.json's sliding_window rows from the prefill on, which the op itself evicts from.
//
// Recurrent states (onnxruntime-genai's LFM2 builds: past.N.conv [batch, channels, k - 1], the
// short convolution's last inputs) have one fixed shape: zeros before the prompt, and each step's
// present.N.conv is the next step's past as it is. Padding tokens would enter them, so their batches,
// too, need prompts of one length.
#include <algorithm>
#include <mutex>

#include <mlx/ops.h>
#include <mlx/transforms.h>

#include "pipelines/decode_rows.h"
#include "pipelines/model_config.h"
#include "pipelines/model_folder.h"
#include "pipelines/model_runner.h"

namespace transmuter::pipelines {
namespace {

namespace fs = std::filesystem;
using generation::GenerationConfig;
using generation::StopReason;

/** The static cache's capacity grows in these steps, so that calls of similar lengths share plans. */
constexpr size_t kStaticCapacityStep = 64;

/** What a decoder's inputs and outputs say about its cache. */
struct DecoderSignature {
  bool has_mask = false;
  bool has_positions = false;
  bool has_cache_branch = false;           // merged decoders: use_cache_branch picks the with-past graph
  bool positions_from_mask = false;        // GroupQueryAttention: positions are the mask's running sum
  std::vector<std::string> past_names;     // past_key_values.N.key, .value, layer by layer
  std::vector<std::string> present_names;  // present.N.key, .value, in the same order
  std::vector<int> window_rows;            // per past: its window-sized buffer's rows, 0 when it grows
  std::vector<std::string> state_names;    // recurrent states past.N.*, fed whole each step
  std::vector<std::string> state_present_names;  // present.N.*, the next step's state
  std::vector<mx::Shape> state_shapes;           // each state's shape after its batch axis
  std::vector<mx::Dtype> state_dtypes;
  int kv_heads = 0;
  int head_dim = 0;
  mx::Dtype past_dtype = mx::float32;
  std::string logits = "logits";
};

mx::Dtype float_dtype_of(OnnxType type) {
  if (type == OnnxType::kFloat16) return mx::float16;
  if (type == OnnxType::kBfloat16) return mx::bfloat16;
  return mx::float32;
}

/** A past input's dimension `axis`: its number, or config.json's when the export leaves it symbolic. */
int past_dimension(const ValueInfo& input, size_t axis, std::optional<size_t> from_config, const char* what,
                   const std::string& source) {
  if (input.shape[axis].value) return static_cast<int>(*input.shape[axis].value);
  if (from_config) return static_cast<int>(*from_config);
  throw PipelineError(str(source, ": past input '", input.name, "' leaves its ", what,
                          " symbolic and config.json does not give it"));
}

/** A recurrent state input past.N.<what>: its output present.N.<what> and its shape past the batch axis,
 * which must be known numbers. */
template <class HasOutput>
void read_recurrent_state(DecoderSignature& s, const ValueInfo& input, const HasOutput& has_output,
                          const std::string& source) {
  const std::string present = "present." + input.name.substr(std::string("past.").size());
  if (!has_output(present))
    throw PipelineError(str(source, ": state input '", input.name, "' has no output '", present, "'"));
  if (input.shape.empty())
    throw PipelineError(str(source, ": state input '", input.name, "' should be [batch, ...]"));
  mx::Shape shape;
  for (size_t axis = 1; axis < input.shape.size(); ++axis) {
    const auto& size = input.shape[axis].value;
    if (!size || *size < 0 || *size > (int64_t{1} << 30))
      throw PipelineError(str(source, ": state input '", input.name, "' has no fixed size on axis ", axis));
    shape.push_back(static_cast<int>(*size));
  }
  s.state_names.push_back(input.name);
  s.state_present_names.push_back(present);
  s.state_shapes.push_back(std::move(shape));
  s.state_dtypes.push_back(float_dtype_of(input.elem_type));
}

DecoderSignature read_signature(const Model& model, const ModelConfig& config, const std::string& source) {
  DecoderSignature s;
  auto has_output = [&](const std::string& name) {
    return std::any_of(model.outputs().begin(), model.outputs().end(),
                       [&](const ValueInfo& v) { return v.name == name; });
  };
  for (const auto& input : model.inputs()) {
    if (input.name == "input_ids") continue;
    if (input.name == "attention_mask") {
      s.has_mask = true;
    } else if (input.name == "position_ids") {
      s.has_positions = true;
    } else if (input.name == "use_cache_branch") {
      s.has_cache_branch = true;
    } else if (input.name.starts_with("past_key_values.")) {
      if (input.shape.size() != 4)
        throw PipelineError(str(source, ": past input '", input.name,
                                "' should be [batch, kv_heads, past_sequence, head_dim]"));
      s.kv_heads = past_dimension(input, 1, config.kv_heads, "key/value head count", source);
      s.head_dim = past_dimension(input, 3, config.head_dim, "head size", source);
      s.past_dtype = float_dtype_of(input.elem_type);
      s.window_rows.push_back(0);
      if (input.shape[2].symbol == "past_sliding_length") {
        if (!config.sliding_window)
          throw PipelineError(str(source, ": past input '", input.name,
                                  "' is a sliding-window cache, but config.json gives no sliding_window"));
        s.window_rows.back() = static_cast<int>(*config.sliding_window);
      }
      std::string present = "present." + input.name.substr(std::string("past_key_values.").size());
      if (!has_output(present))
        throw PipelineError(str(source, ": past input '", input.name, "' has no output '", present, "'"));
      s.past_names.push_back(input.name);
      s.present_names.push_back(present);
    } else if (input.name.starts_with("past.")) {
      read_recurrent_state(s, input, has_output, source);
    } else {
      throw PipelineError(str(source, ": the decoder's input '", input.name,
                              "' is not one text generation fills (input_ids, attention_mask, position_ids, "
                              "past_key_values.N.key/value, past.N.* states, use_cache_branch)"));
    }
  }
  if (!has_output(s.logits)) throw PipelineError(str(source, ": the decoder has no 'logits' output"));
  s.positions_from_mask =
      !s.has_positions && s.has_mask && model.op_histogram().contains("com.microsoft.GroupQueryAttention");
  return s;
}

KvCache resolve_cache(KvCache asked, const DecoderSignature& s, const std::string& source) {
  const bool has_past = !s.past_names.empty();
  const bool static_possible = s.has_positions || s.positions_from_mask;
  if (asked == KvCache::kAuto)
    return !has_past ? KvCache::kNone : (static_possible ? KvCache::kStatic : KvCache::kDynamic);
  if (asked != KvCache::kNone && !has_past)
    throw PipelineError(
        str(source, ": the model has no past_key_values inputs, so it can only run without a cache"));
  if (asked == KvCache::kStatic && !static_possible)
    throw PipelineError(str(source,
                            ": a static cache needs a position_ids input (the model would take positions "
                            "from the past's length, which is the capacity)"));
  return asked;
}

/** optimum's presents, present.N.key/value: the names new_rows_outputs is asked for (not present.N.conv
 * and the like: recurrent states). */
constexpr const char* kPresentKeys = "present.*.key";
constexpr const char* kPresentValues = "present.*.value";

// Generation reads the last position's logits alone: load() computes no others (the lm_head over a
// whole prompt is its largest product and its largest value). A cache that may be static takes the
// presents as the new rows alone (new_rows_outputs): it writes them into its own buffer, so the
// graph's Concat of the whole past and the new rows is not made.
LoadOptions decoder_load_options(LoadOptions load, KvCache cache) {
  const std::string logits = DecoderSignature{}.logits;
  if (std::find(load.last_position_outputs.begin(), load.last_position_outputs.end(), logits) ==
      load.last_position_outputs.end())
    load.last_position_outputs.push_back(logits);
  if (cache == KvCache::kAuto || cache == KvCache::kStatic) {
    load.new_rows_outputs.push_back(kPresentKeys);
    load.new_rows_outputs.push_back(kPresentValues);
  }
  return load;
}

}  // namespace

struct TextGeneration::Impl {
  ModelFolder folder;
  PipelineOptions options;
  Model model;
  text::Tokenizer tokenizer;
  ModelConfig config;
  GenerationConfig defaults;
  DecoderSignature signature;
  KvCache cache = KvCache::kNone;
  int64_t pad_id = 0;
  std::unique_ptr<ModelRunner> runner;
  mutable std::optional<generation::TokenTexts> token_texts;  // for stop strings, loaded on first use
  mutable std::mutex mutex;                                   // guards token_texts

  // The presents are the step's new rows alone (LoadOptions::new_rows_outputs applied).
  bool presents_are_new_rows = false;

  Impl(ModelFolder f, const PipelineOptions& o, KvCache asked)
      : folder(std::move(f)),
        options(o),
        model(load(folder.model_path().string(), decoder_load_options(o.load, asked))),
        tokenizer(folder.tokenizer()),
        config(read_model_config(folder)) {}

  /** The sequences of one call, with left padding. */
  struct Batch {
    std::vector<std::vector<int64_t>> rows;  // padding + prompt + generated, as transformers' input_ids
    std::vector<std::vector<int64_t>> mask;  // 0 for padding, 1 for tokens
    std::vector<int64_t> tokens;             // per row, the number of 1s in its mask
    size_t prompt_length = 0;                // the padded prompt length
    size_t rows_count() const { return rows.size(); }
    void append(size_t row, int64_t token) {
      rows[row].push_back(token);
      mask[row].push_back(1);
      ++tokens[row];
    }
  };

  Batch left_padded(const std::vector<std::vector<int64_t>>& prompts) const {
    Batch batch;
    for (const auto& p : prompts) batch.prompt_length = std::max(batch.prompt_length, p.size());
    for (const auto& p : prompts) {
      const size_t pad = batch.prompt_length - p.size();
      std::vector<int64_t> row(pad, pad_id);
      row.insert(row.end(), p.begin(), p.end());
      std::vector<int64_t> mask(pad, 0);
      mask.resize(batch.prompt_length, 1);
      batch.rows.push_back(std::move(row));
      batch.mask.push_back(std::move(mask));
      batch.tokens.push_back(static_cast<int64_t>(p.size()));
    }
    return batch;
  }

  /** position_ids of the last `count` tokens of each row: cumsum(mask) - 1, padding at 0 (as transformers
   * 5.23's generate; the padding is masked, so its positions change nothing). */
  mx::array positions(const Batch& b, size_t count) const {
    std::vector<int64_t> flat;
    if (count == 1) {
      // A decode step: the new token's position is the row's token count - 1 (no pass over the mask).
      for (int64_t tokens : b.tokens) flat.push_back(tokens - 1);
      return int_matrix(flat, static_cast<int>(b.rows_count()), 1);
    }
    for (const auto& mask : b.mask) {
      int64_t position = -1;
      std::vector<int64_t> all;
      for (int64_t m : mask) {
        position += m;
        all.push_back(m ? position : 0);
      }
      flat.insert(flat.end(), all.end() - static_cast<std::ptrdiff_t>(count), all.end());
    }
    return int_matrix(flat, static_cast<int>(b.rows_count()), static_cast<int>(count));
  }

  /** The last `count` tokens of each row. */
  mx::array last_tokens(const Batch& b, size_t count) const {
    std::vector<int64_t> flat;
    for (const auto& row : b.rows)
      flat.insert(flat.end(), row.end() - static_cast<std::ptrdiff_t>(count), row.end());
    return int_matrix(flat, static_cast<int>(b.rows_count()), static_cast<int>(count));
  }

  mx::array mask_of(const Batch& b) const {
    std::vector<int64_t> flat;
    for (const auto& m : b.mask) flat.insert(flat.end(), m.begin(), m.end());
    return int_matrix(flat, static_cast<int>(b.rows_count()), static_cast<int>(b.mask.front().size()));
  }

  /** The prefill's past: no rows, or a window-sized cache's zeros. */
  std::vector<mx::array> empty_past(int rows) const {
    std::vector<mx::array> past;
    for (size_t i = 0; i < signature.past_names.size(); ++i)
      past.push_back(mx::zeros({rows, signature.kv_heads, signature.window_rows[i], signature.head_dim},
                               signature.past_dtype));
    return past;
  }

  /** The recurrent states before the prompt: zeros. */
  std::vector<mx::array> initial_states(int rows) const {
    std::vector<mx::array> states;
    for (size_t i = 0; i < signature.state_names.size(); ++i) {
      mx::Shape shape = signature.state_shapes[i];
      shape.insert(shape.begin(), rows);
      states.push_back(mx::zeros(shape, signature.state_dtypes[i]));
    }
    return states;
  }

  /** The states after a step: its present states. */
  std::vector<mx::array> next_states(const Outputs& outputs) const {
    std::vector<mx::array> states;
    for (const auto& name : signature.state_present_names) states.push_back(outputs.tensor(name));
    return states;
  }

  Inputs step_inputs(mx::array ids, mx::array mask, mx::array positions, const std::vector<mx::array>& past,
                     const std::vector<mx::array>& states, bool with_past) const {
    Inputs inputs;
    inputs.emplace("input_ids", std::move(ids));
    if (signature.has_mask) inputs.emplace("attention_mask", std::move(mask));
    if (signature.has_positions) inputs.emplace("position_ids", std::move(positions));
    if (signature.has_cache_branch) inputs.emplace("use_cache_branch", mx::array({with_past}));
    for (size_t i = 0; i < past.size(); ++i) inputs.emplace(signature.past_names[i], past[i]);
    for (size_t i = 0; i < states.size(); ++i) inputs.emplace(signature.state_names[i], states[i]);
    return inputs;
  }

  /** The last position's logits of each row, float32 [rows, vocab] (not evaluated). */
  mx::array last_position_logits(const Outputs& outputs) const {
    return pipelines::last_position_logits(outputs.tensor(signature.logits), folder.source());
  }

  /** Each layer's present, the past with the step's rows appended, as the graph defines it. */
  std::vector<mx::array> presents(const Outputs& outputs, const std::vector<mx::array>& past) const {
    std::vector<mx::array> out;
    for (size_t i = 0; i < signature.present_names.size(); ++i) {
      mx::array present = outputs.tensor(signature.present_names[i]);
      if (presents_are_new_rows && past[i].shape(2) > 0) present = mx::concatenate({past[i], present}, 2);
      out.push_back(std::move(present));
    }
    return out;
  }

  /** Each layer's keys or values of the step's `count` new tokens (the presents' last rows). */
  std::vector<mx::array> new_rows(const Outputs& outputs, int count) const {
    std::vector<mx::array> out;
    for (const auto& name : signature.present_names) {
      mx::array present = outputs.tensor(name);
      const mx::Shape& shape = present.shape();
      if (!presents_are_new_rows)
        present = mx::slice(present, {0, 0, shape[2] - count, 0}, {shape[0], shape[1], shape[2], shape[3]});
      out.push_back(std::move(present));
    }
    return out;
  }

  const generation::TokenTexts& texts() const {
    std::lock_guard lock(mutex);
    if (!token_texts) token_texts = generation::TokenTexts::from_file(*folder.find("tokenizer.json"));
    return *token_texts;
  }
};

namespace {

/** The static cache's slots: presents of the prompt, then zeros up to the capacity (window-sized caches,
 * `window_rows` nonzero, stay as they are). */
std::vector<mx::array> fill_static_cache(const std::vector<mx::array>& presents, int capacity,
                                         const std::vector<int>& window_rows) {
  std::vector<mx::array> cache;
  for (size_t i = 0; i < presents.size(); ++i) {
    const mx::array& present = presents[i];
    if (window_rows[i] != 0) {
      cache.push_back(present);
      continue;
    }
    const int filled = present.shape(2);
    mx::array rest =
        mx::zeros({present.shape(0), present.shape(1), capacity - filled, present.shape(3)}, present.dtype());
    cache.push_back(mx::concatenate({present, rest}, 2));
  }
  return cache;
}

/** Writes the new token's key/value (`rows` [batch, kv_heads, 1, head_dim] of each layer) into slot
 * `filled` (MLX donates the cache's buffer to the update: nothing else holds it). */
void update_static_cache(std::vector<mx::array>& cache, const std::vector<mx::array>& rows, int filled) {
  for (size_t i = 0; i < cache.size(); ++i) {
    const mx::array& slot = rows[i];
    const mx::Shape begin = {0, 0, filled, 0};
    const mx::Shape end = {slot.shape(0), slot.shape(1), filled + 1, slot.shape(3)};
    cache[i] = mx::slice_update(cache[i], slot, begin, end);
  }
}

/** The static step's mask: the filled part as the batch's mask says, the empty slots 0, the new token 1. */
mx::array static_mask(const std::vector<std::vector<int64_t>>& mask, size_t capacity) {
  std::vector<int64_t> flat;
  for (const auto& m : mask) {
    // m covers the filled slots and the new token (its last entry).
    flat.insert(flat.end(), m.begin(), m.end() - 1);
    flat.insert(flat.end(), capacity - (m.size() - 1), 0);
    flat.push_back(1);
  }
  return int_matrix(flat, static_cast<int>(mask.size()), static_cast<int>(capacity + 1));
}

/** GroupQueryAttention's static step mask: 1 over each row's tokens (the new one included), then 0 up to
 * the capacity. */
mx::array mask_over_capacity(const std::vector<int64_t>& tokens, size_t capacity) {
  std::vector<int64_t> flat;
  for (int64_t count : tokens) {
    flat.insert(flat.end(), static_cast<size_t>(count), 1);
    flat.insert(flat.end(), capacity - static_cast<size_t>(count), 0);
  }
  return int_matrix(flat, static_cast<int>(tokens.size()), static_cast<int>(capacity));
}

size_t round_up(size_t n, size_t step) { return (n + step - 1) / step * step; }

}  // namespace

TextGeneration TextGeneration::open(const std::string& source, const PipelineOptions& options,
                                    KvCache cache) {
  auto impl = std::make_shared<Impl>(ModelFolder::open(source, options), options, cache);
  const auto& applied = impl->model.passes_applied();
  impl->presents_are_new_rows = std::find(applied.begin(), applied.end(), "new_rows_outputs") != applied.end();
  impl->signature = read_signature(impl->model, impl->config, source);
  impl->cache = resolve_cache(cache, impl->signature, source);
  std::vector<std::string> static_inputs;
  if (impl->signature.has_cache_branch) static_inputs.push_back("use_cache_branch");  // picks the If branch
  impl->runner = std::make_unique<ModelRunner>(impl->model, options, static_inputs);
  // generation_config.json, else config.json's ids (GenerationConfig::from_folder), from the folder
  // (for hf:// sources: the snapshot the files were fetched into).
  auto generation_file = impl->folder.find("generation_config.json");
  auto config_file = impl->folder.find("config.json");
  if (generation_file || config_file)
    impl->defaults =
        GenerationConfig::from_folder((generation_file ? *generation_file : *config_file).parent_path());
  const auto special = read_special_tokens(impl->folder);
  std::optional<int64_t> pad;
  if (auto p = special.find("pad_token"); p != special.end()) pad = impl->tokenizer.token_to_id(p->second);
  impl->pad_id = pad.value_or(impl->defaults.pad_token_id_or_eos().value_or(0));
  return TextGeneration(impl);
}

const GenerationConfig& TextGeneration::default_config() const { return impl_->defaults; }
const text::Tokenizer& TextGeneration::tokenizer() const { return impl_->tokenizer; }
KvCache TextGeneration::cache() const { return impl_->cache; }
std::optional<fs::path> TextGeneration::find_file(const std::string& name) const {
  return impl_->folder.find(name);
}
CompileStats TextGeneration::compile_stats() const { return impl_->runner->stats(); }

std::vector<GeneratedText> TextGeneration::operator()(std::span<const std::string> prompts,
                                                      const GenerationConfig& config,
                                                      const TextStreamer& streamer,
                                                      GenerationSummary* summary) const {
  std::vector<std::vector<int64_t>> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(impl_->tokenizer.encode(prompts[i]).ids);
    if (ids.back().empty()) throw PipelineError(str("prompt ", i, " is empty: it encodes to no tokens"));
  }
  return generate(ids, config, streamer, summary);
}

std::vector<GeneratedText> TextGeneration::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                    const GenerationConfig& config,
                                                    const TextStreamer& streamer,
                                                    GenerationSummary* summary) const {
  const Impl& impl = *impl_;
  if (prompts.empty()) return {};
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].empty())
      throw PipelineError(str("prompt ", i, " is empty: generation needs at least one token"));
  for (const auto& prompt : prompts) {
    if (prompt.size() == prompts.front().size()) continue;
    if (impl.signature.positions_from_mask)
      throw PipelineError(
          str("this decoder's GroupQueryAttention takes positions from the attention mask's sum, "
              "which admits no left padding: prompts of different lengths (",
              prompts.front().size(), " and ", prompt.size(), " tokens) must run one at a time"));
    if (!impl.signature.state_names.empty())
      throw PipelineError(str("this decoder's recurrent states (", impl.signature.state_names.front(),
                              ", ...) would take in the left padding: prompts of different lengths (",
                              prompts.front().size(), " and ", prompt.size(),
                              " tokens) must run one at a time"));
  }
  Impl::Batch batch = impl.left_padded(prompts);
  const size_t rows = batch.rows_count();
  if (impl.config.max_position_embeddings && batch.prompt_length >= *impl.config.max_position_embeddings)
    throw PipelineError(str("the prompt has ", batch.prompt_length,
                            " tokens, as many as the model's context of ",
                            *impl.config.max_position_embeddings, " or more"));

  std::optional<generation::TokenTexts> texts;
  if (!config.stop_strings.empty()) texts = impl.texts();
  const int64_t finished_token = config.pad_token_id_or_eos().value_or(impl.pad_id);
  DecodeRows choices(config, impl.tokenizer, prompts, batch.prompt_length, texts,
                     impl.config.max_position_embeddings, finished_token, streamer);
  const size_t max_length = choices.max_length();
  if (impl.config.max_position_embeddings && max_length > *impl.config.max_position_embeddings)
    throw PipelineError(str("the prompt's ", batch.prompt_length, " tokens and the new ones (up to ",
                            max_length, " in all) do not fit the model's context of ",
                            *impl.config.max_position_embeddings, ": lower max_new_tokens"));

  size_t generated = 0, steps = 0;
  std::vector<mx::array> past = impl.empty_past(static_cast<int>(rows));
  std::vector<mx::array> states = impl.initial_states(static_cast<int>(rows));
  const int capacity = static_cast<int>(round_up(max_length, kStaticCapacityStep));

  // One decode step: the model on the last token of every row (`ids` [rows, 1], host-known or still being
  // computed), the cache updated, the last position's float32 logits [rows, vocab]; nothing evaluated.
  auto decode_step = [&](mx::array ids) {
    const size_t length = batch.rows.front().size();
    mx::array mask = impl.cache != KvCache::kStatic       ? impl.mask_of(batch)
                     : impl.signature.positions_from_mask ? mask_over_capacity(batch.tokens, capacity)
                                                          : static_mask(batch.mask, capacity);
    Outputs outputs =
        (*impl.runner)(impl.step_inputs(std::move(ids), mask, impl.positions(batch, 1), past, states, true));
    ++steps;
    states = impl.next_states(outputs);
    if (impl.cache == KvCache::kDynamic || impl.signature.positions_from_mask)
      past = impl.presents(outputs, past);
    else
      update_static_cache(past, impl.new_rows(outputs, 1), static_cast<int>(length - 1));
    return impl.last_position_logits(outputs);
  };

  // Plain greedy decoding with a cache overlaps the host with the model: each step's token is the argmax
  // taken on the model's stream, fed to the next step before its value is known, so the next step's graph
  // is built while this one computes; the host reads each token one step behind (stopping then leaves one
  // step computed and unused; a finished row goes on with its argmax instead of the pad token, which only
  // its own discarded positions see). Compiled runs only: an eager step's graph is interpreted node by node on
  // the host, which then competes with the model's threads for the cores (measured slower on 2 cores).
  const bool overlap =
      impl.options.mode == ExecutionMode::kCompiled && impl.cache != KvCache::kNone && plain_greedy(config);
  constexpr int64_t kNotYetKnown = -1;
  std::optional<mx::array> in_flight;  // the tokens of the step the model is computing
  auto greedy_tokens = [](const mx::array& logits) {
    return mx::astype(mx::argmax(logits, 1, /*keepdims=*/true), mx::int64);
  };
  auto launch = [&](mx::array ids) {
    mx::array tokens = greedy_tokens(decode_step(std::move(ids)));
    std::vector<mx::array> pending{tokens};
    pending.insert(pending.end(), past.begin(), past.end());
    pending.insert(pending.end(), states.begin(), states.end());
    mx::async_eval(pending);
    return tokens;
  };

  while (true) {
    if (overlap && generated > 0) {
      if (!in_flight) in_flight = launch(impl.last_tokens(batch, 1));
      for (size_t r = 0; r < rows; ++r) batch.append(r, kNotYetKnown);
      // No step after the one that reaches max_length (every row ends there).
      std::optional<mx::array> next;
      if (batch.rows.front().size() < max_length) next = launch(*in_flight);
      in_flight->eval();
      const int64_t* tokens = in_flight->data<int64_t>();
      const bool all_done = choices.step_chosen(std::span(tokens, rows), batch.rows,
                                                [&](size_t row, int64_t token) { batch.rows[row].back() = token; });
      ++generated;
      if (all_done || !next) break;
      in_flight = next;
      continue;
    }
    // 1. Run the model on what the cache has not seen.
    mx::array logits = [&] {
      const size_t length = batch.rows.front().size();
      const bool prefill = generated == 0;
      if (impl.cache != KvCache::kNone && !prefill) return decode_step(impl.last_tokens(batch, 1));
      const std::vector<mx::array> inputs_past = impl.empty_past(static_cast<int>(rows));
      // Without a cache, each step reruns the whole sequence from the first state.
      auto inputs = impl.step_inputs(impl.last_tokens(batch, length), impl.mask_of(batch),
                                     impl.positions(batch, length), inputs_past,
                                     impl.initial_states(static_cast<int>(rows)), false);
      // A static cache prefills eagerly: its one compiled plan is the decode step's.
      Outputs outputs = (*impl.runner)(inputs, impl.cache != KvCache::kStatic);
      ++steps;
      states = impl.next_states(outputs);
      if (impl.cache == KvCache::kDynamic)
        past = impl.presents(outputs, inputs_past);
      else if (impl.cache == KvCache::kStatic)
        past = fill_static_cache(impl.presents(outputs, inputs_past), capacity, impl.signature.window_rows);
      return impl.last_position_logits(outputs);
    }();
    std::vector<mx::array> to_eval{logits};
    to_eval.insert(to_eval.end(), past.begin(), past.end());
    to_eval.insert(to_eval.end(), states.begin(), states.end());
    mx::eval(to_eval);

    // 2. Choose each row's next token; a finished row gets the pad token, as in transformers.
    const bool all_done =
        choices.step(logits, batch.rows, [&](size_t row, int64_t token) { batch.append(row, token); });
    ++generated;
    if (all_done) break;
  }
  return choices.finish(summary, steps);
}

}  // namespace transmuter::pipelines
