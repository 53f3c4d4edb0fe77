// TokenClassification: per-token label scores grouped into entities as transformers'
// token-classification pipeline groups them (gather_pre_entities, aggregate, group_entities).
#include <algorithm>
#include <numeric>

#include "pipelines/encoder_session.h"

namespace transmuter::pipelines {

namespace {

/** One token before aggregation; `scores` has one probability per label. */
struct TokenScores {
  std::string word;
  std::vector<float> scores;
  size_t start = 0, end = 0, index = 0;
  bool is_subword = false;
};

size_t utf8_length(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

size_t argmax(const std::vector<float>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

/** "B-PER" -> (B, PER); "I-PER" -> (I, PER); a label without a prefix counts as I. */
std::pair<char, std::string> tag_of(const std::string& label) {
  if (label.starts_with("B-")) return {'B', label.substr(2)};
  if (label.starts_with("I-")) return {'I', label.substr(2)};
  return {'I', label};
}

class Aggregator {
 public:
  Aggregator(const text::Tokenizer& tokenizer, const std::vector<std::string>& labels)
      : tokenizer_(tokenizer),
        labels_(labels),
        subword_prefix_(tokenizer.continuing_subword_prefix().value_or("")) {}
  /** transformers takes an unknown token's text from the sentence (tokenizer.unk_token_id). */
  void set_unk_token(const std::optional<std::string>& unk) {
    if (unk) unk_id_ = tokenizer_.token_to_id(*unk);
  }

  std::vector<TokenScores> gather(std::string_view text, const text::Encoding& e, const float* probs) const {
    std::vector<TokenScores> tokens;
    for (size_t i = 0; i < e.size(); ++i) {
      if (e.special_tokens_mask[i]) continue;
      TokenScores t;
      t.word = tokenizer_.id_to_token(e.ids[i]).value_or("");
      t.scores.assign(probs + i * labels_.size(), probs + (i + 1) * labels_.size());
      t.start = e.offsets[i].begin;
      t.end = e.offsets[i].end;
      t.index = i;
      const std::string_view word_ref = text.substr(t.start, t.end - t.start);
      if (!subword_prefix_.empty()) {
        // A continuation carries the prefix, so its token is longer than its text ("##ing" / "ing").
        t.is_subword = utf8_length(t.word) != utf8_length(word_ref);
      } else {
        // No prefix to tell: a token glued to the text before it (no space on either side).
        t.is_subword =
            t.start > 0 && text[t.start - 1] != ' ' && (t.start >= text.size() || text[t.start] != ' ');
      }
      if (unk_id_ && e.ids[i] == *unk_id_) {
        t.word = std::string(word_ref);
        t.is_subword = false;
      }
      tokens.push_back(std::move(t));
    }
    return tokens;
  }

  std::vector<Entity> aggregate(const std::vector<TokenScores>& tokens, Aggregation aggregation) const {
    std::vector<Entity> entities;
    if (aggregation == Aggregation::kNone || aggregation == Aggregation::kSimple) {
      for (const auto& t : tokens) {
        const size_t best = argmax(t.scores);
        entities.push_back({labels_[best], t.scores[best], t.index, t.word, t.start, t.end});
      }
    } else {
      entities = aggregate_words(tokens, aggregation);
    }
    return aggregation == Aggregation::kNone ? entities : group(entities);
  }

 private:
  /** A word's tokens as one entity; its label by the strategy. */
  Entity aggregate_word(std::span<const TokenScores> word, Aggregation aggregation) const {
    std::vector<std::string> pieces;
    for (const auto& t : word) pieces.push_back(t.word);
    std::vector<float> scores;
    if (aggregation == Aggregation::kFirst) {
      scores = word.front().scores;
    } else if (aggregation == Aggregation::kMax) {
      // The first token holding the word's highest score (Python's max keeps the first).
      auto best = std::max_element(word.begin(), word.end(), [](const TokenScores& a, const TokenScores& b) {
        return *std::max_element(a.scores.begin(), a.scores.end()) <
               *std::max_element(b.scores.begin(), b.scores.end());
      });
      scores = best->scores;
    } else {
      scores.assign(labels_.size(), 0.0f);
      for (const auto& t : word)
        for (size_t k = 0; k < scores.size(); ++k) scores[k] += t.scores[k];
      for (float& s : scores) s /= static_cast<float>(word.size());
    }
    const size_t best = argmax(scores);
    return {labels_[best],      scores[best],   std::nullopt, tokenizer_.tokens_to_string(pieces),
            word.front().start, word.back().end};
  }

  std::vector<Entity> aggregate_words(const std::vector<TokenScores>& tokens, Aggregation aggregation) const {
    std::vector<Entity> words;
    size_t first = 0;
    for (size_t i = 1; i <= tokens.size(); ++i) {
      if (i == tokens.size() || !tokens[i].is_subword) {
        if (i > first)
          words.push_back(aggregate_word(std::span(tokens).subspan(first, i - first), aggregation));
        first = i;
      }
    }
    return words;
  }

  /** Adjacent entities of one type (a B- tag starts a new one) merged: mean score, joined word. */
  Entity merge(std::span<const Entity> run) const {
    const std::string& label = run.front().entity;
    const size_t dash = label.find('-');
    std::vector<std::string> pieces;
    float sum = 0;
    for (const auto& e : run) {
      pieces.push_back(e.word);
      sum += e.score;
    }
    return {dash == std::string::npos ? label : label.substr(dash + 1),
            sum / static_cast<float>(run.size()),
            std::nullopt,
            tokenizer_.tokens_to_string(pieces),
            run.front().start,
            run.back().end};
  }

  std::vector<Entity> group(const std::vector<Entity>& entities) const {
    std::vector<Entity> groups;
    size_t first = 0;
    for (size_t i = 1; i <= entities.size(); ++i) {
      bool continues = false;
      if (i < entities.size()) {
        auto [bi, tag] = tag_of(entities[i].entity);
        continues = tag == tag_of(entities[i - 1].entity).second && bi != 'B';
      }
      if (!continues) {
        if (i > first) groups.push_back(merge(std::span(entities).subspan(first, i - first)));
        first = i;
      }
    }
    return groups;
  }

  const text::Tokenizer& tokenizer_;
  const std::vector<std::string>& labels_;
  std::string subword_prefix_;
  std::optional<int64_t> unk_id_;
};

}  // namespace

struct TokenClassification::Impl {
  std::unique_ptr<EncoderSession> session;
  std::string output;
  std::optional<Aggregator> aggregator;
};

TokenClassification TokenClassification::open(const std::string& source, const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->session = std::make_unique<EncoderSession>(source, options);
  const auto& labels = impl->session->config().labels;
  if (labels.empty())
    throw PipelineError(
        str(source, ": config.json has no id2label (or num_labels): a token classifier needs its labels"));
  impl->output = impl->session->output_named({"logits"});
  impl->aggregator.emplace(impl->session->tokenizer(), labels);
  const auto& special = impl->session->special_tokens();
  if (auto unk = special.find("unk_token"); unk != special.end())
    impl->aggregator->set_unk_token(unk->second);
  return TokenClassification(impl);
}

std::vector<std::vector<Entity>> TokenClassification::operator()(
    std::span<const std::string> texts, const TokenClassificationOptions& options) const {
  const size_t width = impl_->session->config().labels.size();
  std::vector<std::vector<Entity>> results;
  impl_->session->for_each_batch(texts, {}, impl_->output, [&](const EncoderSession::Batch& batch) {
    const auto& logits = batch.output;
    if (logits.ndim() != 3 || static_cast<size_t>(logits.shape(2)) != width)
      throw PipelineError(str(impl_->session->folder().source(), ": output '", impl_->output,
                              "' should be [batch, sequence, ", width, "] (one logit per label), got rank ",
                              logits.ndim()));
    const size_t row_size = static_cast<size_t>(logits.shape(1)) * width;
    std::vector<float> probs(logits.data<float>(), logits.data<float>() + logits.size());
    softmax_rows(probs, width);
    for (size_t row = 0; row < batch.encodings.size(); ++row) {
      const std::string& text = texts[batch.first + row];
      auto tokens = impl_->aggregator->gather(text, batch.encodings[row], probs.data() + row * row_size);
      std::vector<Entity> entities;
      for (auto& entity : impl_->aggregator->aggregate(tokens, options.aggregation)) {
        const auto& ignored = options.ignore_labels;
        if (std::find(ignored.begin(), ignored.end(), entity.entity) == ignored.end())
          entities.push_back(std::move(entity));
      }
      results.push_back(std::move(entities));
    }
  });
  return results;
}

const std::vector<std::string>& TokenClassification::labels() const {
  return impl_->session->config().labels;
}

}  // namespace transmuter::pipelines
