// TextClassification: a sequence classifier's logits as scores per id2label, as transformers'
// text-classification pipeline post-processes them.
#include <algorithm>
#include <cmath>

#include "pipelines/encoder_session.h"

namespace transmuter::pipelines {

namespace {

/** transformers' choice when the caller names no function. */
ScoreFunction default_function(const ModelConfig& config) {
  if (config.problem_type == "regression") return ScoreFunction::kNone;
  if (config.problem_type == "multi_label_classification" || config.labels.size() == 1)
    return ScoreFunction::kSigmoid;
  return ScoreFunction::kSoftmax;
}

std::vector<float> scores_of(std::span<const float> logits, ScoreFunction function) {
  std::vector<float> scores(logits.begin(), logits.end());
  if (function == ScoreFunction::kSoftmax) softmax_rows(scores, scores.size());
  if (function == ScoreFunction::kSigmoid)
    for (float& x : scores) x = 1.0f / (1.0f + std::exp(-x));
  return scores;
}

/** The top_k labels, best first; ties keep id order (Python's stable sort). */
std::vector<LabelScore> ranked(const std::vector<std::string>& labels, const std::vector<float>& scores,
                               size_t top_k) {
  std::vector<LabelScore> out;
  for (size_t i = 0; i < scores.size(); ++i) out.push_back({labels[i], scores[i]});
  std::stable_sort(out.begin(), out.end(),
                   [](const LabelScore& a, const LabelScore& b) { return a.score > b.score; });
  if (top_k > 0 && top_k < out.size()) out.resize(top_k);
  return out;
}

}  // namespace

struct TextClassification::Impl {
  std::unique_ptr<EncoderSession> session;
  std::string output;

  std::vector<std::vector<LabelScore>> classify(std::span<const std::string> texts,
                                                std::span<const std::string> pairs,
                                                const ClassificationOptions& options) const {
    const auto& labels = session->config().labels;
    const ScoreFunction function = options.function.value_or(default_function(session->config()));
    std::vector<std::vector<LabelScore>> results;
    session->for_each_batch(texts, pairs, output, [&](const EncoderSession::Batch& batch) {
      const auto& logits = batch.output;
      if (logits.ndim() != 2 || static_cast<size_t>(logits.shape(1)) != labels.size())
        throw PipelineError(str(session->folder().source(), ": output '", output, "' should be [batch, ",
                                labels.size(), "] (one logit per label of config.json), got rank ",
                                logits.ndim()));
      const float* data = logits.data<float>();
      for (size_t row = 0; row < batch.encodings.size(); ++row) {
        std::span<const float> row_logits(data + row * labels.size(), labels.size());
        results.push_back(ranked(labels, scores_of(row_logits, function), options.top_k));
      }
    });
    return results;
  }
};

TextClassification TextClassification::open(const std::string& source, const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->session = std::make_unique<EncoderSession>(source, options);
  if (impl->session->config().labels.empty())
    throw PipelineError(
        str(source, ": config.json has no id2label (or num_labels): a classifier needs its labels"));
  impl->output = impl->session->output_named({"logits"});
  return TextClassification(impl);
}

std::vector<std::vector<LabelScore>> TextClassification::operator()(
    std::span<const std::string> texts, const ClassificationOptions& options) const {
  return impl_->classify(texts, {}, options);
}

std::vector<std::vector<LabelScore>> TextClassification::operator()(
    std::span<const std::string> texts, std::span<const std::string> pairs,
    const ClassificationOptions& options) const {
  if (pairs.size() != texts.size())
    throw PipelineError(
        str("got ", texts.size(), " texts and ", pairs.size(), " pairs: give one pair per text"));
  return impl_->classify(texts, pairs, options);
}

const std::vector<std::string>& TextClassification::labels() const { return impl_->session->config().labels; }

}  // namespace transmuter::pipelines
