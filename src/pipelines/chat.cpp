// Chat: a conversation kept as messages, rendered by the model's chat template for each turn.
#include <nlohmann/json.hpp>

#include "transmuter/pipelines.h"


namespace transmuter::pipelines {

Chat Chat::open(const std::string& source, const PipelineOptions& options, KvCache cache) {
  TextGeneration generation = TextGeneration::open(source, options, cache);
  // The template's files, from the folder (or commit) the model came from.
  auto tokenizer_config = generation.find_file("tokenizer_config.json");
  auto jinja = generation.find_file("chat_template.jinja");
  if (!tokenizer_config && !jinja)
    throw PipelineError(
        str(source, ": the model has no chat template (chat_template.jinja or tokenizer_config.json)"));
  return Chat(std::move(generation),
              text::ChatTemplate::from_folder((jinja ? *jinja : *tokenizer_config).parent_path()));
}

Chat::Chat(TextGeneration generation, text::ChatTemplate chat_template)
    : generation_(std::move(generation)), template_(std::move(chat_template)) {}

void Chat::set_system(std::string_view text) {
  if (!messages_.empty() && messages_.front().first == "system") {
    messages_.front().second = std::string(text);
  } else {
    messages_.insert(messages_.begin(), {"system", std::string(text)});
  }
}

std::string Chat::messages_json() const {
  nlohmann::json messages = nlohmann::json::array();
  for (const auto& [role, content] : messages_) messages.push_back({{"role", role}, {"content", content}});
  return messages.dump();
}

std::string Chat::send(std::string_view user_text, const generation::GenerationConfig& config,
                       const TextStreamer& streamer, GenerationSummary* summary) {
  if (user_text.empty()) throw PipelineError("chat: the message is empty");
  messages_.emplace_back("user", std::string(user_text));
  try {
    text::ChatTemplateOptions options;
    options.add_generation_prompt = true;
    const std::string prompt = template_.render(messages_json(), options);
    text::EncodeOptions encode;
    encode.add_special_tokens = false;  // the template writes them
    std::vector<int64_t> ids = generation_.tokenizer().encode(prompt, encode).ids;
    auto outputs = generation_.generate({ids}, config, streamer, summary);
    messages_.emplace_back("assistant", outputs.front().text);
    return outputs.front().text;
  } catch (...) {
    messages_.pop_back();  // a failed turn leaves the conversation as it was
    throw;
  }
}

}  // namespace transmuter::pipelines
