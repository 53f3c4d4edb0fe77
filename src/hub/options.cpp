// hf:// sources, the transformers.js file choice per dtype, and the options
// huggingface_hub reads from the environment.
#include <array>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <utility>

#include "hub/repo_paths.h"
#include "transmuter/hub.h"

namespace transmuter::hub {

namespace fs = std::filesystem;

namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// huggingface_hub's truthy values for boolean variables.
bool env_flag(const char* name) {
  std::optional<std::string> value = env(name);
  if (!value) return false;
  std::string lower;
  for (char c : *value) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower == "1" || lower == "true" || lower == "yes" || lower == "on";
}

double env_seconds(const char* name, double fallback) {
  std::optional<std::string> value = env(name);
  if (!value) return fallback;
  try {
    size_t used = 0;
    double seconds = std::stod(*value, &used);
    if (used == value->size() && seconds > 0) return seconds;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(str("$", name, " expects a positive number of seconds, got '", *value, "'"));
}

fs::path hf_home() {
  if (auto home = env("HF_HOME")) return *home;
  if (auto xdg = env("XDG_CACHE_HOME")) return fs::path(*xdg) / "huggingface";
  if (auto user_home = env("HOME")) return fs::path(*user_home) / ".cache" / "huggingface";
  return fs::path(".cache") / "huggingface";
}

std::string strip_whitespace(std::string text) {
  const char* space = " \t\r\n";
  size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

// The token as huggingface_hub finds it: variables first, then the token file.
std::string find_token() {
  if (auto token = env("HF_TOKEN")) return strip_whitespace(*token);
  if (auto token = env("HUGGING_FACE_HUB_TOKEN")) return strip_whitespace(*token);
  fs::path file = env("HF_TOKEN_PATH").value_or((hf_home() / "token").string());
  std::ifstream in(file);
  if (!in) return {};
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return strip_whitespace(token);
}

}  // namespace

HubOptions HubOptions::resolved() const {
  HubOptions out = *this;
  if (out.endpoint.empty()) out.endpoint = env("HF_ENDPOINT").value_or("https://huggingface.co");
  while (!out.endpoint.empty() && out.endpoint.back() == '/') out.endpoint.pop_back();
  if (!out.token) out.token = find_token();
  if (out.cache_dir.empty()) {
    if (auto cache = env("HF_HUB_CACHE")) {
      out.cache_dir = *cache;
    } else if (auto legacy = env("HUGGINGFACE_HUB_CACHE")) {
      out.cache_dir = *legacy;
    } else {
      out.cache_dir = hf_home() / "hub";
    }
  }
  if (out.ca_bundle.empty()) {
    out.ca_bundle =
        env("CURL_CA_BUNDLE").value_or(env("REQUESTS_CA_BUNDLE").value_or(env("SSL_CERT_FILE").value_or("")));
  }
  if (!out.offline) out.offline = env_flag("HF_HUB_OFFLINE") || env_flag("TRANSFORMERS_OFFLINE");
  if (!out.download_timeout_s) out.download_timeout_s = env_seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10);
  if (!out.etag_timeout_s) out.etag_timeout_s = env_seconds("HF_HUB_ETAG_TIMEOUT", 10);
  if (!out.retry_backoff_s) out.retry_backoff_s = env_seconds("TRANSMUTER_HUB_RETRY_BACKOFF_S", 1);
  if (out.max_retries < 0) out.max_retries = 0;
  return out;
}

bool is_hub_source(std::string_view source) { return source.starts_with("hf://"); }

// hf://org/name[@revision][/path]. A revision holding '/' (refs/pr/1) is written
// URL-encoded (refs%2Fpr%2F1), as in the hub's own URLs.
HubSource parse_hub_source(std::string_view source) {
  if (!is_hub_source(source)) throw std::invalid_argument(str("'", source, "' is not an hf:// source"));
  std::string_view rest = source.substr(5);
  const size_t org_end = rest.find('/');
  if (org_end == std::string_view::npos || org_end == 0) {
    throw std::invalid_argument(str("'", source, "': expected hf://org/repo[@revision][/path]"));
  }
  const size_t name_end = rest.find('/', org_end + 1);
  std::string_view repo_and_revision = rest.substr(0, name_end);
  HubSource out;
  if (name_end != std::string_view::npos) out.path = std::string(rest.substr(name_end + 1));
  const size_t at = repo_and_revision.find('@');
  out.repo_id = std::string(repo_and_revision.substr(0, at));
  if (at != std::string_view::npos) {
    out.revision = url_decode(repo_and_revision.substr(at + 1));
    if (out.revision.empty()) throw std::invalid_argument(str("'", source, "': empty revision after '@'"));
  }
  check_repo_id(out.repo_id, source);
  if (!out.path.empty()) check_repo_file_path(out.path, source);
  check_revision(out.revision, source);
  return out;
}

std::vector<std::string> onnx_file_candidates(std::string_view dtype, std::string_view base) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 8> kSuffixes = {{
      {"fp32", ""},
      {"fp16", "_fp16"},
      {"q8", "_quantized"},
      {"int8", "_int8"},
      {"uint8", "_uint8"},
      {"q4", "_q4"},
      {"q4f16", "_q4f16"},
      {"bnb4", "_bnb4"},
  }};
  for (const auto& [name, suffix] : kSuffixes) {
    if (name != dtype) continue;
    std::string file = str(base, suffix, ".onnx");
    return {"onnx/" + file, file};
  }
  throw std::invalid_argument(
      str("unknown dtype '", dtype, "' (dtypes: fp32, fp16, q8, int8, uint8, q4, q4f16, bnb4)"));
}

}  // namespace transmuter::hub
