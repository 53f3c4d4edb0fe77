#include "pipelines/model_config.h"

#include <fstream>
#include <sstream>

namespace transmuter::pipelines {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> labels_of(const json& config, const fs::path& file) {
  auto id2label = config.find("id2label");
  if (id2label == config.end() || id2label->is_null()) {
    std::vector<std::string> labels;
    if (auto n = config.find("num_labels"); n != config.end() && n->is_number_unsigned())
      for (size_t i = 0; i < n->get<size_t>(); ++i) labels.push_back(str("LABEL_", i));
    return labels;
  }
  if (!id2label->is_object()) throw PipelineError(str(file.string(), ": id2label must be an object"));
  std::vector<std::string> labels(id2label->size());
  std::vector<bool> seen(labels.size(), false);
  for (const auto& [key, value] : id2label->items()) {
    size_t id = 0;
    std::istringstream in(key);
    if (!(in >> id) || !in.eof() || id >= labels.size() || seen[id])
      throw PipelineError(
          str(file.string(), ": id2label key '", key, "' is not one of the ids 0..", labels.size() - 1));
    if (!value.is_string()) throw PipelineError(str(file.string(), ": id2label[", key, "] is not a string"));
    labels[id] = value.get<std::string>();
    seen[id] = true;
  }
  return labels;
}

/** A special token as transformers writes it: "[MASK]" or {"content": "[MASK]", ...}. */
std::optional<std::string> token_text(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object()) {
    auto content = value.find("content");
    if (content != value.end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

void add_special_tokens(const json& file, std::map<std::string, std::string>& tokens) {
  if (!file.is_object()) return;
  for (const auto& [key, value] : file.items()) {
    if (!key.ends_with("_token")) continue;
    if (auto text = token_text(value)) tokens[key] = *text;
  }
}

}  // namespace

json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PipelineError(str(path.string(), ": cannot be read"));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw PipelineError(str(path.string(), ": malformed JSON (", e.what(), ")"));
  }
}

json read_optional_json(const ModelFolder& folder, const std::string& name) {
  auto path = folder.find(name);
  return path ? read_json(*path) : json::object();
}

ModelConfig read_model_config(const ModelFolder& folder) {
  ModelConfig config;
  auto path = folder.find("config.json");
  if (!path) return config;
  json file = read_json(*path);
  if (!file.is_object()) throw PipelineError(str(path->string(), ": not a JSON object"));
  config.labels = labels_of(file, *path);
  if (auto p = file.find("problem_type"); p != file.end() && p->is_string())
    config.problem_type = p->get<std::string>();
  // GPT-2-style configs call it n_positions.
  for (const char* key : {"max_position_embeddings", "n_positions"}) {
    if (auto m = file.find(key);
        m != file.end() && m->is_number_unsigned() && !config.max_position_embeddings)
      config.max_position_embeddings = m->get<size_t>();
  }
  auto count = [&](const char* key) -> std::optional<size_t> {
    auto v = file.find(key);
    if (v == file.end() || !v->is_number_unsigned() || v->get<size_t>() == 0) return std::nullopt;
    return v->get<size_t>();
  };
  const std::optional<size_t> heads = count("num_attention_heads"), hidden = count("hidden_size");
  config.head_dim = count("head_dim");
  if (!config.head_dim && heads && hidden && *hidden % *heads == 0) config.head_dim = *hidden / *heads;
  config.kv_heads = count("num_key_value_heads");
  if (!config.kv_heads) config.kv_heads = heads;
  config.sliding_window = count("sliding_window");
  return config;
}

std::map<std::string, std::string> read_special_tokens(const ModelFolder& folder) {
  std::map<std::string, std::string> tokens;
  add_special_tokens(read_optional_json(folder, "special_tokens_map.json"), tokens);
  add_special_tokens(read_optional_json(folder, "tokenizer_config.json"), tokens);
  return tokens;
}

}  // namespace transmuter::pipelines
