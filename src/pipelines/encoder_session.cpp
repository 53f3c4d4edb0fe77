#include "pipelines/encoder_session.h"

#include <algorithm>
#include <cmath>

#include <mlx/ops.h>
#include <mlx/transforms.h>

namespace transmuter::pipelines {
namespace {

namespace fs = std::filesystem;

/** Compiled plans are keyed by shape: batches padded to a multiple of this share plans. */
constexpr size_t kCompiledPadMultiple = 16;

mx::array id_matrix(const std::vector<text::Encoding>& encodings,
                    const std::function<const std::vector<int64_t>&(const text::Encoding&)>& field,
                    OnnxType type) {
  const size_t rows = encodings.size();
  const size_t cols = encodings.empty() ? 0 : encodings.front().size();
  std::vector<int64_t> flat;
  flat.reserve(rows * cols);
  for (const auto& e : encodings) flat.insert(flat.end(), field(e).begin(), field(e).end());
  mx::array matrix(flat.begin(), {static_cast<int>(rows), static_cast<int>(cols)}, mx::int64);
  return type == OnnxType::kInt32 ? mx::astype(matrix, mx::int32) : matrix;
}

}  // namespace

size_t resolve_max_length(const PipelineOptions& options, const text::Tokenizer& tokenizer, const ModelConfig& config,
                          std::optional<size_t> extra_limit) {
  if (options.max_length > 0) return options.max_length;
  size_t limit = 0;
  auto tighten = [&](std::optional<size_t> bound) {
    if (bound && *bound > 0) limit = limit == 0 ? *bound : std::min(limit, *bound);
  };
  tighten(extra_limit);
  tighten(tokenizer.config().model_max_length);
  tighten(config.max_position_embeddings);
  return limit;
}

EncoderSession::EncoderSession(ModelFolder folder, const PipelineOptions& options,
                               std::optional<size_t> extra_limit)
    : folder_(std::move(folder)),
      options_(options),
      model_(load(folder_.model_path().string(), options.load)),
      tokenizer_(folder_.tokenizer()),
      config_(read_model_config(folder_)),
      special_tokens_(read_special_tokens(folder_)),
      runner_(model_, options) {
  if (options.batch_size == 0) throw PipelineError("batch_size must be at least 1");
  max_length_ = resolve_max_length(options, tokenizer_, config_, extra_limit);
  bool has_ids = false;
  for (const auto& input : model_.inputs()) {
    has_ids = has_ids || input.name == "input_ids";
    if (input.name != "input_ids" && input.name != "attention_mask" && input.name != "token_type_ids" &&
        input.name != "position_ids")
      throw PipelineError(
          str(folder_.source(), ": the model's input '", input.name,
              "' is not one a text pipeline fills (input_ids, attention_mask, token_type_ids, "
              "position_ids)"));
  }
  if (!has_ids) throw PipelineError(str(folder_.source(), ": the model has no input_ids input"));
}

std::string EncoderSession::output_named(std::initializer_list<const char*> preferred) const {
  for (const char* name : preferred)
    for (const auto& output : model_.outputs())
      if (output.name == name) return output.name;
  return model_.outputs().at(0).name;
}

std::vector<text::Encoding> EncoderSession::encode(std::span<const std::string> texts,
                                                   std::span<const std::string> pairs, size_t first) const {
  text::EncodeOptions options;
  const bool reject = options_.long_inputs == LongInputs::kReject;
  if (max_length_ > 0 && !reject) {
    options.truncation = text::Truncation{};
    options.truncation->max_length = max_length_;
  }
  if (texts.size() > 1 || options_.mode == ExecutionMode::kCompiled) {
    options.padding = text::Padding{};
    // Encoder pipelines pad on the right whatever the tokenizer says: every pooling and offset
    // below reads positions from the start.
    options.padding->side = text::Side::kRight;
    if (options_.mode == ExecutionMode::kCompiled) options.padding->multiple_of = kCompiledPadMultiple;
  }
  std::vector<text::Encoding> encodings = tokenizer_.encode_batch(texts, options, pairs);
  if (reject && max_length_ > 0) {
    for (size_t i = 0; i < encodings.size(); ++i) {
      const auto& mask = encodings[i].attention_mask;
      const size_t length = static_cast<size_t>(std::count(mask.begin(), mask.end(), 1));
      if (length > max_length_)
        throw PipelineError(str("text ", first + i, " has ", length,
                                " tokens, more than the model's limit of ", max_length_,
                                " (truncate long inputs, or raise max_length)"));
    }
  }
  return encodings;
}

Inputs EncoderSession::model_inputs(const std::vector<text::Encoding>& encodings) const {
  Inputs inputs;
  for (const auto& input : model_.inputs()) {
    if (input.name == "input_ids") {
      inputs.emplace(input.name, id_matrix(
                                     encodings, [](const text::Encoding& e) -> const auto& { return e.ids; },
                                     input.elem_type));
    } else if (input.name == "attention_mask") {
      inputs.emplace(input.name,
                     id_matrix(
                         encodings, [](const text::Encoding& e) -> const auto& { return e.attention_mask; },
                         input.elem_type));
    } else if (input.name == "token_type_ids") {
      inputs.emplace(
          input.name,
          id_matrix(
              encodings, [](const text::Encoding& e) -> const auto& { return e.type_ids; }, input.elem_type));
    } else {  // position_ids: 0, 1, ... (padding is on the right)
      const int rows = static_cast<int>(encodings.size());
      const int cols = encodings.empty() ? 0 : static_cast<int>(encodings.front().size());
      mx::array positions = mx::broadcast_to(mx::arange(cols, mx::int64), {rows, cols});
      inputs.emplace(input.name,
                     input.elem_type == OnnxType::kInt32 ? mx::astype(positions, mx::int32) : positions);
    }
  }
  return inputs;
}

void EncoderSession::for_each_batch(std::span<const std::string> texts, std::span<const std::string> pairs,
                                    const std::string& output,
                                    const std::function<void(const Batch&)>& visit) const {
  if (!pairs.empty() && pairs.size() != texts.size())
    throw PipelineError(
        str("got ", texts.size(), " texts and ", pairs.size(), " pairs: give one pair per text"));
  for (size_t first = 0; first < texts.size(); first += options_.batch_size) {
    const size_t count = std::min(options_.batch_size, texts.size() - first);
    Batch batch{.first = first,
                .encodings = encode(texts.subspan(first, count),
                                    pairs.empty() ? pairs : pairs.subspan(first, count), first),
                .output = mx::array(0.0f)};
    Outputs outputs = runner_(model_inputs(batch.encodings));
    // Row-contiguous, so that the pipelines may read it on the host.
    batch.output = mx::contiguous(mx::astype(outputs.tensor(output), mx::float32));
    mx::eval(batch.output);
    visit(batch);
  }
}

void softmax_rows(std::span<float> values, size_t width) {
  for (size_t row = 0; row + width <= values.size(); row += width) {
    std::span<float> v = values.subspan(row, width);
    const float top = *std::max_element(v.begin(), v.end());
    float sum = 0;
    for (float& x : v) sum += (x = std::exp(x - top));
    for (float& x : v) x /= sum;
  }
}

}  // namespace transmuter::pipelines
