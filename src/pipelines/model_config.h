// The JSON files beside a model that the pipelines read: config.json (labels, problem type,
// positions), tokenizer_config.json and special_tokens_map.json (special tokens).
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipelines/model_folder.h"

namespace transmuter::pipelines {

/** Parses a JSON file; a PipelineError names the file when it cannot be read or parsed. */
nlohmann::json read_json(const std::filesystem::path& path);
/** The folder's `name` parsed, or an empty object when the folder has none. */
nlohmann::json read_optional_json(const ModelFolder& folder, const std::string& name);

struct ModelConfig {
  /** id2label in id order (transformers' LABEL_i names when only num_labels is given). */
  std::vector<std::string> labels;
  std::string problem_type;  // "" when unset
  std::optional<size_t> max_position_embeddings;
  // The attention's shape, for decoders whose past inputs leave it symbolic (onnxruntime-genai's
  // builder writes the head size as 'kv_cache_dim'): head_dim, or hidden_size / num_attention_heads;
  // num_key_value_heads, or num_attention_heads.
  std::optional<size_t> head_dim;
  std::optional<size_t> kv_heads;
  // sliding_window: the window of local-attention layers (their window-sized caches, below).
  std::optional<size_t> sliding_window;
};

/** config.json's fields; a malformed id2label (ids not 0..n-1, labels not strings) names the file. */
ModelConfig read_model_config(const ModelFolder& folder);

/** The special tokens by name ("mask_token" -> "[MASK]"): special_tokens_map.json, then
 * tokenizer_config.json over it (a token may be a string or an {"content": ...} object). */
std::map<std::string, std::string> read_special_tokens(const ModelFolder& folder);

}  // namespace transmuter::pipelines
