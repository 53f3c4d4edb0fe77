// TextEmbedding: token embeddings pooled as sentence-transformers pools them (its 1_Pooling module),
// then normalized when the folder's modules.json ends in a Normalize module.
#include <cmath>

#include <mlx/ops.h>
#include <mlx/transforms.h>

#include "pipelines/encoder_session.h"

namespace transmuter::pipelines {

namespace {

using nlohmann::json;

struct SentenceTransformersConfig {
  Pooling pooling = Pooling::kMean;
  bool normalize = false;
  std::optional<size_t> max_seq_length;
};

/** A pooling config's mode: the newer "pooling_mode" string, or the flags published models carry. */
Pooling pooling_of(const json& config, const std::string& file) {
  static const std::vector<std::pair<std::string, Pooling>> kFlags = {
      {"pooling_mode_cls_token", Pooling::kCls},
      {"pooling_mode_mean_tokens", Pooling::kMean},
      {"pooling_mode_max_tokens", Pooling::kMax},
      {"pooling_mode_mean_sqrt_len_tokens", Pooling::kMeanSqrtLen},
      {"pooling_mode_weightedmean_tokens", Pooling::kWeightedMean},
      {"pooling_mode_lasttoken", Pooling::kLastToken}};
  static const std::map<std::string, Pooling> kNames = {{"cls", Pooling::kCls},
                                                        {"mean", Pooling::kMean},
                                                        {"max", Pooling::kMax},
                                                        {"mean_sqrt_len_tokens", Pooling::kMeanSqrtLen},
                                                        {"weightedmean", Pooling::kWeightedMean},
                                                        {"lasttoken", Pooling::kLastToken}};
  if (auto mode = config.find("pooling_mode"); mode != config.end() && mode->is_string()) {
    auto known = kNames.find(mode->get<std::string>());
    if (known == kNames.end())
      throw PipelineError(str(file, ": unknown pooling_mode '", mode->get<std::string>(), "'"));
    return known->second;
  }
  std::vector<Pooling> on;
  for (const auto& [flag, pooling] : kFlags)
    if (auto value = config.find(flag); value != config.end() && value->is_boolean() && value->get<bool>())
      on.push_back(pooling);
  if (on.size() > 1)
    throw PipelineError(str(file, ": several pooling modes at once (their concatenation) are not supported"));
  return on.empty() ? Pooling::kMean : on.front();
}

SentenceTransformersConfig read_sentence_transformers(const ModelFolder& folder) {
  SentenceTransformersConfig config;
  json modules = read_optional_json(folder, "modules.json");
  if (modules.is_array()) {
    for (const auto& module : modules) {
      if (!module.is_object()) continue;
      const std::string type = module.value("type", "");
      if (type.ends_with(".Normalize")) config.normalize = true;
      if (type.ends_with(".Pooling")) {
        const std::string path = module.value("path", "");
        const std::string file = path.empty() ? "config.json" : path + "/config.json";
        if (auto found = folder.find(file)) config.pooling = pooling_of(read_json(*found), found->string());
      }
    }
  }
  json bert = read_optional_json(folder, "sentence_bert_config.json");
  if (auto m = bert.find("max_seq_length"); m != bert.end() && m->is_number_unsigned())
    config.max_seq_length = m->get<size_t>();
  return config;
}

/** [batch, hidden] from token embeddings [batch, seq, hidden] and the 0/1 mask [batch, seq]. */
mx::array pool(const mx::array& tokens, const mx::array& mask, Pooling pooling) {
  const mx::array m = mx::expand_dims(mask, -1);
  const int seq = tokens.shape(1);
  switch (pooling) {
    case Pooling::kCls:
      return mx::squeeze(mx::slice(tokens, {0, 0, 0}, {tokens.shape(0), 1, tokens.shape(2)}), 1);
    case Pooling::kMax:
      // Padding can never be the maximum (sentence-transformers sets it to -1e9).
      return mx::max(mx::where(m > 0.5f, tokens, mx::array(-1e9f)), 1);
    case Pooling::kLastToken: {
      // The last position the mask covers (padding is on the right).
      mx::array last = mx::astype(mx::sum(mask, 1), mx::int32) - 1;
      last = mx::maximum(last, mx::array(0, mx::int32));
      mx::array index = mx::reshape(last, {tokens.shape(0), 1, 1});
      return mx::squeeze(
          mx::take_along_axis(tokens, mx::broadcast_to(index, {tokens.shape(0), 1, tokens.shape(2)}), 1), 1);
    }
    case Pooling::kWeightedMean: {
      mx::array weights = m * mx::reshape(mx::arange(1.0f, seq + 1.0f, 1.0f), {1, seq, 1});
      return mx::sum(tokens * weights, 1) / mx::maximum(mx::sum(weights, 1), mx::array(1e-9f));
    }
    case Pooling::kMean:
    case Pooling::kMeanSqrtLen: {
      mx::array sum = mx::sum(tokens * m, 1);
      mx::array count = mx::maximum(mx::sum(m, 1), mx::array(1e-9f));
      return pooling == Pooling::kMean ? sum / count : sum / mx::sqrt(count);
    }
  }
  throw PipelineError("unknown pooling");
}

/** x / max(|x|, 1e-12) per row, as torch.nn.functional.normalize. */
mx::array l2_normalize(const mx::array& x) {
  mx::array norm = mx::sqrt(mx::sum(x * x, -1, true));
  return x / mx::maximum(norm, mx::array(1e-12f));
}

bool is_float(OnnxType type) {
  return type == OnnxType::kFloat || type == OnnxType::kFloat16 || type == OnnxType::kBfloat16 ||
         type == OnnxType::kDouble;
}

/** The token embeddings to pool: an output named so, else the first float output of rank 3 (exports
 * of sentence-transformers models may carry generated names), else one already pooled (rank 2). */
std::string embedding_output(const Model& model) {
  for (const char* name : {"last_hidden_state", "token_embeddings"})
    for (const auto& output : model.outputs())
      if (output.name == name) return output.name;
  for (size_t rank : {3, 2})
    for (const auto& output : model.outputs())
      if (is_float(output.elem_type) && output.has_shape && output.shape.size() == rank) return output.name;
  return model.outputs().at(0).name;
}

}  // namespace

struct TextEmbedding::Impl {
  SentenceTransformersConfig st;
  std::unique_ptr<EncoderSession> session;
  std::string output;
};

TextEmbedding TextEmbedding::open(const std::string& source, const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  ModelFolder folder = ModelFolder::open(source, options);
  impl->st = read_sentence_transformers(folder);
  impl->session = std::make_unique<EncoderSession>(std::move(folder), options, impl->st.max_seq_length);
  impl->output = embedding_output(impl->session->model());
  return TextEmbedding(impl);
}

Pooling TextEmbedding::default_pooling() const { return impl_->st.pooling; }
bool TextEmbedding::default_normalize() const { return impl_->st.normalize; }

mx::array TextEmbedding::operator()(std::span<const std::string> texts,
                                    const EmbeddingOptions& options) const {
  const Pooling pooling = options.pooling.value_or(impl_->st.pooling);
  const bool normalize = options.normalize.value_or(impl_->st.normalize);
  std::vector<mx::array> pieces;
  impl_->session->for_each_batch(texts, {}, impl_->output, [&](const EncoderSession::Batch& batch) {
    const auto& out = batch.output;
    mx::array vectors = out;
    if (out.ndim() == 3) {
      std::vector<float> mask;
      for (const auto& e : batch.encodings)
        mask.insert(mask.end(), e.attention_mask.begin(), e.attention_mask.end());
      mx::array m(mask.begin(), {out.shape(0), out.shape(1)}, mx::float32);
      vectors = pool(out, m, pooling);
    } else if (out.ndim() != 2) {
      throw PipelineError(str(impl_->session->folder().source(), ": output '", impl_->output, "' has rank ",
                              out.ndim(),
                              "; an embedding needs [batch, sequence, hidden] or [batch, hidden]"));
    }
    pieces.push_back(normalize ? l2_normalize(vectors) : vectors);
  });
  if (pieces.empty()) throw PipelineError("no texts to embed");
  // Row-contiguous: a pooled slice (CLS) is a strided view, and callers read data<float>().
  mx::array all = mx::contiguous(pieces.size() == 1 ? pieces.front() : mx::concatenate(pieces, 0));
  mx::eval(all);
  return all;
}

}  // namespace transmuter::pipelines
