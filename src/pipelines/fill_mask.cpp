// FillMask: a masked language model's predictions at each mask token, as transformers' fill-mask
// pipeline ranks and decodes them.
#include <algorithm>
#include <numeric>

#include "pipelines/encoder_session.h"

namespace transmuter::pipelines {

struct FillMask::Impl {
  std::unique_ptr<EncoderSession> session;
  std::string output;
  std::string mask_token;
  int64_t mask_id = 0;
  std::optional<int64_t> pad_id;

  /** transformers' get_target_ids: each target's id, or its first token's when the vocabulary
   * lacks it; duplicates dropped. */
  std::vector<int64_t> target_ids(const std::vector<std::string>& targets) const {
    const auto& tokenizer = session->tokenizer();
    std::vector<int64_t> ids;
    for (const auto& target : targets) {
      std::optional<int64_t> id = tokenizer.token_to_id(target);
      if (!id) {
        text::EncodeOptions options;
        options.add_special_tokens = false;
        auto encoding = tokenizer.encode(target, options);
        if (encoding.ids.empty()) continue;  // transformers ignores it too
        id = encoding.ids.front();
      }
      if (std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
    }
    if (ids.empty()) throw PipelineError("fill-mask: none of the targets is a token or starts with one");
    return ids;
  }

  /** The top_k fills at one mask position, from that position's logits. */
  std::vector<MaskFill> fills_at(const text::Encoding& e, size_t mask_position, std::span<const float> logits,
                                 const std::vector<int64_t>& candidates, size_t top_k,
                                 bool single_mask) const {
    std::vector<float> probs(logits.begin(), logits.end());
    softmax_rows(probs, probs.size());
    std::vector<int64_t> order = candidates;
    if (order.empty()) {
      order.resize(probs.size());
      std::iota(order.begin(), order.end(), 0);
    }
    auto prob = [&](int64_t id) {
      return id >= 0 && static_cast<size_t>(id) < probs.size() ? probs[id] : 0.0f;
    };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return prob(a) > prob(b); });
    order.resize(std::min(order.size(), top_k));

    const auto& tokenizer = session->tokenizer();
    std::vector<MaskFill> fills;
    for (int64_t id : order) {
      // The encoding without padding (transformers drops every pad id), the mask replaced.
      std::vector<int64_t> tokens;
      for (size_t i = 0; i < e.size(); ++i) {
        const int64_t token = i == mask_position ? id : e.ids[i];
        if (e.attention_mask[i] && !(pad_id && token == *pad_id)) tokens.push_back(token);
      }
      const int64_t single[] = {id};
      fills.push_back({prob(id), id, tokenizer.decode(single), tokenizer.decode(tokens, single_mask)});
    }
    return fills;
  }
};

FillMask FillMask::open(const std::string& source, const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->session = std::make_unique<EncoderSession>(source, options);
  const auto& special = impl->session->special_tokens();
  auto mask = special.find("mask_token");
  if (mask == special.end())
    throw PipelineError(
        str(source, ": the tokenizer defines no mask_token (tokenizer_config.json): fill-mask needs one"));
  impl->mask_token = mask->second;
  auto mask_id = impl->session->tokenizer().token_to_id(impl->mask_token);
  if (!mask_id)
    throw PipelineError(str(source, ": the mask token '", impl->mask_token, "' is not in the vocabulary"));
  impl->mask_id = *mask_id;
  if (auto pad = special.find("pad_token"); pad != special.end())
    impl->pad_id = impl->session->tokenizer().token_to_id(pad->second);
  impl->output = impl->session->output_named({"logits"});
  return FillMask(impl);
}

const std::string& FillMask::mask_token() const { return impl_->mask_token; }

std::vector<std::vector<std::vector<MaskFill>>> FillMask::operator()(std::span<const std::string> texts,
                                                                     const FillMaskOptions& options) const {
  const std::vector<int64_t> candidates =
      options.targets.empty() ? std::vector<int64_t>{} : impl_->target_ids(options.targets);
  std::vector<std::vector<std::vector<MaskFill>>> results;
  impl_->session->for_each_batch(texts, {}, impl_->output, [&](const EncoderSession::Batch& batch) {
    const auto& logits = batch.output;
    if (logits.ndim() != 3)
      throw PipelineError(str(impl_->session->folder().source(), ": output '", impl_->output,
                              "' should be [batch, sequence, vocabulary], got rank ", logits.ndim()));
    const size_t vocab = static_cast<size_t>(logits.shape(2));
    const size_t row_size = static_cast<size_t>(logits.shape(1)) * vocab;
    for (size_t row = 0; row < batch.encodings.size(); ++row) {
      const auto& e = batch.encodings[row];
      std::vector<size_t> masks;
      for (size_t i = 0; i < e.size(); ++i)
        if (e.ids[i] == impl_->mask_id && e.attention_mask[i]) masks.push_back(i);
      if (masks.empty())
        throw PipelineError(str("text ", batch.first + row, " has no mask token ", impl_->mask_token));
      std::vector<std::vector<MaskFill>> per_mask;
      for (size_t position : masks) {
        std::span<const float> at(logits.data<float>() + row * row_size + position * vocab, vocab);
        per_mask.push_back(impl_->fills_at(e, position, at, candidates, options.top_k, masks.size() == 1));
      }
      results.push_back(std::move(per_mask));
    }
  });
  return results;
}

}  // namespace transmuter::pipelines
