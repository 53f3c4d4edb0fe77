// ModelFolder: which ONNX file a folder or repo holds, and its other files by name.
#include "pipelines/model_folder.h"

#include <system_error>
#include <vector>

#if TRANSMUTER_WITH_HUB
#include "transmuter/hub.h"
#endif

namespace transmuter::pipelines {
namespace {

namespace fs = std::filesystem;

void check_relative(const std::string& name) {
  fs::path path(name);
  bool escapes = path.empty() || path.is_absolute();
  for (const auto& part : path) escapes = escapes || part == "..";
  if (escapes)
    throw PipelineError(str("file name '", name, "' must be relative and stay inside the model folder"));
}

/** The ONNX files to try for a dtype, best first, as transformers.js tries them. */
std::vector<std::string> candidates_for(const std::string& dtype, const std::string& base) {
#if TRANSMUTER_WITH_HUB
  return hub::onnx_file_candidates(dtype, base);
#else
  if (dtype != "fp32")
    throw PipelineError(str("dtype '", dtype, "' picks files by the hub's naming; name model_file instead"));
  return {"onnx/" + base + ".onnx", base + ".onnx"};
#endif
}

}  // namespace

ModelFolder ModelFolder::open(const std::string& source, const PipelineOptions& options,
                              const std::string& base) {
  ModelFolder folder;
  folder.source_ = source;
  folder.options_ = options;
  if (!options.model_file.empty()) check_relative(options.model_file);
  if (source.starts_with("hf://")) {
#if TRANSMUTER_WITH_HUB
    hub::HubSource parsed = hub::parse_hub_source(source);
    std::string with_file = source;
    if (parsed.path.empty() && !options.model_file.empty()) with_file += "/" + options.model_file;
    const hub::HubOptions hub_options = options.load.hub ? *options.load.hub : hub::HubOptions{};
    hub::ModelFiles files = hub::download_model(with_file, options.load.dtype, hub_options, base);
    folder.repo_id_ = parsed.repo_id;
    folder.commit_ = files.commit;
    folder.model_path_ = files.model;
    return folder;
#else
    throw PipelineError(str(source, ": this build has no hub client (configured with -DTRANSMUTER_HUB=OFF)"));
#endif
  }
  std::error_code ec;
  fs::path path(source);
  if (fs::is_regular_file(path, ec)) {
    folder.dir_ = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    if (path.extension() == ".onnx") {
      folder.model_path_ = path;
      return folder;
    }
    path = folder.dir_;  // another file of the folder (tokenizer.json) stands for the folder
  }
  if (!fs::is_directory(path, ec)) throw PipelineError(str(source, ": no such folder or file"));
  folder.dir_ = path;
  if (!options.model_file.empty()) {
    folder.model_path_ = path / options.model_file;
    if (!fs::is_regular_file(folder.model_path_, ec))
      throw PipelineError(str(source, ": no model file ", options.model_file));
    return folder;
  }
  if (auto found = folder.find_model(base)) {
    folder.model_path_ = *found;
    return folder;
  }
  std::string tried;
  for (const auto& candidate : candidates_for(options.load.dtype, base))
    tried += (tried.empty() ? "" : ", ") + candidate;
  throw PipelineError(str(source, ": no ONNX model for dtype ", options.load.dtype, " (tried ", tried, ")"));
}

bool ModelFolder::holds(const std::string& source, const PipelineOptions& options, const std::string& base) {
  PipelineOptions by_name = options;
  by_name.model_file.clear();
  try {
    open(source, by_name, base);
    return true;
  } catch (const PipelineError&) {
    return false;
  }
#if TRANSMUTER_WITH_HUB
  catch (const hub::HubError& e) {
    if (e.kind() == hub::HubError::Kind::kEntryNotFound || e.kind() == hub::HubError::Kind::kOfflineMiss)
      return false;
    throw;
  }
#endif
}

std::optional<fs::path> ModelFolder::find_model(const std::string& base) const {
  if (commit_.empty()) {
    std::error_code ec;
    for (const auto& candidate : candidates_for(options_.load.dtype, base))
      if (fs::is_regular_file(dir_ / candidate, ec)) return dir_ / candidate;
    return std::nullopt;
  }
#if TRANSMUTER_WITH_HUB
  try {
    const hub::HubOptions hub_options = options_.load.hub ? *options_.load.hub : hub::HubOptions{};
    return hub::download_model(str("hf://", repo_id_, "@", commit_), options_.load.dtype, hub_options, base).model;
  } catch (const hub::HubError& e) {
    if (e.kind() == hub::HubError::Kind::kEntryNotFound || e.kind() == hub::HubError::Kind::kOfflineMiss)
      return std::nullopt;
    throw;
  }
#else
  return std::nullopt;
#endif
}

text::Tokenizer ModelFolder::tokenizer() const {
  auto tokenizer_json = find("tokenizer.json");
  if (!tokenizer_json)
    throw PipelineError(
        str(source_, ": the model has no tokenizer.json (a text pipeline needs one beside the model)"));
  // Fetched too (hf://), so that from_folder finds it beside tokenizer.json.
  find("tokenizer_config.json");
  return text::Tokenizer::from_folder(tokenizer_json->parent_path());
}

std::optional<fs::path> ModelFolder::find(const std::string& name) const {
  check_relative(name);
  if (commit_.empty()) {
    std::error_code ec;
    fs::path path = dir_ / name;
    if (fs::is_regular_file(path, ec)) return path;
    return std::nullopt;
  }
#if TRANSMUTER_WITH_HUB
  try {
    const hub::HubOptions hub_options = options_.load.hub ? *options_.load.hub : hub::HubOptions{};
    return hub::download_file(repo_id_, name, commit_, hub_options);
  } catch (const hub::HubError& e) {
    if (e.kind() == hub::HubError::Kind::kEntryNotFound) return std::nullopt;
    throw;
  }
#else
  return std::nullopt;
#endif
}

}  // namespace transmuter::pipelines
