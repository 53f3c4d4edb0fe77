// GenerationConfig: reading generation_config.json (or config.json, transformers' fallback) and the
// checks transformers makes when generate() builds its processors. transformers is lenient about JSON
// types (Python takes what it gets); here a field of the wrong type is an error naming file and field.
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "transmuter/generation.h"

namespace transmuter::generation {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/** A JSON value for a message: its text, shortened. */
std::string shown(const json& value) {
  std::string text = value.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

/** Typed, optional fields of one JSON object; absent and null are both "unset" (as transformers
 * drops None). Errors read "<file>: field "<where><name>" must be <kind>, got <value>". */
class FieldReader {
 public:
  /** where: the object's path in the file ("text_config."); fields that `overridden_by` has count as
   * unset here (a sub-config only fills what the top level left unset). */
  FieldReader(const json& object, const fs::path& file, std::string where = {},
              const FieldReader* overridden_by = nullptr)
      : object_(object), file_(file), where_(std::move(where)), overridden_by_(overridden_by) {}

  bool has(const char* name) const { return field(name) != nullptr; }

  std::optional<bool> boolean(const char* name) const {
    const json* v = field(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) fail(name, "true or false", *v);
    return v->get<bool>();
  }

  std::optional<double> number(const char* name) const {
    const json* v = field(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) fail(name, "a number", *v);
    return v->get<double>();
  }

  std::optional<int64_t> integer(const char* name) const {
    const json* v = field(name);
    if (v == nullptr) return std::nullopt;
    return integer_value(name, *v);
  }

  std::optional<size_t> count(const char* name) const {
    std::optional<int64_t> v = integer(name);
    if (v && *v < 0) fail(name, "a non-negative integer", *field(name));
    return v ? std::optional<size_t>(static_cast<size_t>(*v)) : std::nullopt;
  }

  /** An int or a list of ints (eos_token_id). */
  std::optional<std::vector<int64_t>> ids(const char* name) const {
    const json* v = field(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array())
      return std::vector<int64_t>{integer_value(name, *v, "an integer or a list of integers")};
    std::vector<int64_t> out;
    for (const json& item : *v) out.push_back(integer_value(name, item, "an integer or a list of integers"));
    return out;
  }

  /** A string or a list of strings (stop_strings). */
  std::optional<std::vector<std::string>> strings(const char* name) const {
    const json* v = field(name);
    if (v == nullptr) return std::nullopt;
    if (v->is_string()) return std::vector<std::string>{v->get<std::string>()};
    if (!v->is_array()) fail(name, "a string or a list of strings", *v);
    std::vector<std::string> out;
    for (const json& item : *v) {
      if (!item.is_string()) fail(name, "a string or a list of strings", *v);
      out.push_back(item.get<std::string>());
    }
    return out;
  }

  [[noreturn]] void fail(const char* name, const std::string& kind, const json& got) const {
    throw GenerationConfigError(
        str(file_.string(), ": field \"", where_, name, "\" must be ", kind, ", got ", shown(got)));
  }

 private:
  const json* field(const char* name) const {
    if (overridden_by_ != nullptr && overridden_by_->has(name)) return nullptr;
    auto it = object_.find(name);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t integer_value(const char* name, const json& v, const char* kind = "an integer") const {
    const bool fits =
        v.is_number_integer() &&
        !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()));
    if (!fits) fail(name, kind, v);
    return v.get<int64_t>();
  }

  const json& object_;
  const fs::path& file_;
  std::string where_;
  const FieldReader* overridden_by_;
};

template <typename T>
void set_if(T& field, std::optional<T> value) {
  if (value) field = std::move(*value);
}
template <typename T>
void set_if(std::optional<T>& field, std::optional<T> value) {
  if (value) field = std::move(value);
}

/** Every GenerationConfig field `in` has (generation_config.json's names). */
void read_fields(const FieldReader& in, GenerationConfig& c) {
  set_if(c.max_new_tokens, in.count("max_new_tokens"));
  set_if(c.max_length, in.count("max_length"));
  set_if(c.min_length, in.count("min_length"));
  set_if(c.min_new_tokens, in.count("min_new_tokens"));
  set_if(c.do_sample, in.boolean("do_sample"));
  set_if(c.temperature, in.number("temperature"));
  set_if(c.top_k, in.integer("top_k"));
  set_if(c.top_p, in.number("top_p"));
  set_if(c.min_p, in.number("min_p"));
  set_if(c.repetition_penalty, in.number("repetition_penalty"));
  set_if(c.no_repeat_ngram_size, in.count("no_repeat_ngram_size"));
  set_if(c.eos_token_ids, in.ids("eos_token_id"));
  set_if(c.pad_token_id, in.integer("pad_token_id"));
  set_if(c.bos_token_id, in.integer("bos_token_id"));
  set_if(c.decoder_start_token_id, in.integer("decoder_start_token_id"));
  set_if(c.forced_bos_token_id, in.integer("forced_bos_token_id"));
  set_if(c.forced_eos_token_ids, in.ids("forced_eos_token_id"));
  set_if(c.suppress_tokens, in.ids("suppress_tokens"));
  set_if(c.begin_suppress_tokens, in.ids("begin_suppress_tokens"));
  set_if(c.stop_strings, in.strings("stop_strings"));
}

json read_json_object(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw GenerationConfigError(str(file.string(), ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  json parsed;
  try {
    parsed = json::parse(text.str());
  } catch (const json::parse_error& e) {
    throw GenerationConfigError(str(file.string(), ": malformed JSON: ", e.what()));
  }
  if (!parsed.is_object())
    throw GenerationConfigError(str(file.string(), ": must hold a JSON object, got ", shown(parsed)));
  return parsed;
}

/** The checks GenerationConfig.__init__ makes (validate()); the rest wait for use, as in transformers. */
void check_loaded(const GenerationConfig& config, const fs::path& file) {
  if (config.max_new_tokens && *config.max_new_tokens == 0)
    throw GenerationConfigError(
        str(file.string(), ": field \"max_new_tokens\" must be greater than 0, got 0"));
}

/** transformers' from_model_config takes decoder settings from the first non-empty sub-config. */
const json* decoder_subconfig(const json& model_config, std::string* name) {
  for (const char* key : {"decoder", "generator", "text_config"}) {
    auto it = model_config.find(key);
    if (it != model_config.end() && it->is_object() && !it->empty()) {
      *name = key;
      return &*it;
    }
  }
  return nullptr;
}

GenerationConfig from_model_config(const fs::path& file) {
  const json model_config = read_json_object(file);
  GenerationConfig config;
  FieldReader top(model_config, file);
  read_fields(top, config);
  std::string sub_name;
  if (const json* sub = decoder_subconfig(model_config, &sub_name))
    read_fields(FieldReader(*sub, file, sub_name + ".", &top), config);
  check_loaded(config, file);
  return config;
}

[[noreturn]] void invalid(const std::string& message) {
  throw GenerationConfigError("generation config: " + message);
}

}  // namespace

GenerationConfig GenerationConfig::from_file(const fs::path& generation_config_json) {
  const json object = read_json_object(generation_config_json);
  GenerationConfig config;
  read_fields(FieldReader(object, generation_config_json), config);
  check_loaded(config, generation_config_json);
  return config;
}

GenerationConfig GenerationConfig::from_folder(const fs::path& dir) {
  if (fs::exists(dir / "generation_config.json")) return from_file(dir / "generation_config.json");
  if (fs::exists(dir / "config.json")) return from_model_config(dir / "config.json");
  return {};
}

void GenerationConfig::validate() const {
  if (max_new_tokens && *max_new_tokens == 0) invalid("max_new_tokens must be greater than 0, got 0");
  if (repetition_penalty != 1.0 && !(repetition_penalty > 0))
    invalid(str("repetition_penalty must be a strictly positive float, got ", repetition_penalty));
  for (const std::string& stop : stop_strings)
    if (stop.empty()) invalid("stop_strings must not hold an empty string");
  if (!do_sample) return;  // the warpers below are built only for sampling
  if (temperature != 1.0 && !(temperature > 0))
    invalid(str("temperature must be strictly positive when do_sample is true, got ", temperature,
                " (for greedy decoding set do_sample to false)"));
  if (top_k < 0) invalid(str("top_k must be a non-negative integer (0: off), got ", top_k));
  if (!(top_p >= 0 && top_p <= 1)) invalid(str("top_p must be in [0, 1] (1: off), got ", top_p));
  if (min_p && !(*min_p >= 0 && *min_p <= 1)) invalid(str("min_p must be in [0, 1], got ", *min_p));
}

std::optional<int64_t> GenerationConfig::pad_token_id_or_eos() const {
  if (pad_token_id) return pad_token_id;
  if (!eos_token_ids.empty()) return eos_token_ids.front();
  return std::nullopt;
}

}  // namespace transmuter::generation
