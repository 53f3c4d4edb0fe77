// download_model: the ONNX file of an hf:// source, chosen by dtype as
// transformers.js chooses it, and the external-data files it names.
#include <string>
#include <vector>

#include "hub/file_download.h"
#include "hub/repo_paths.h"
#include "onnx/external_data.h"
#include "transmuter/hub.h"

namespace transmuter::hub {

namespace {

std::string folder_in_repo(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

// The first candidate the repo has. Only "no such file" moves on to the next one:
// any other failure (access, network, integrity) is the answer.
CachedFile first_existing(const HubSource& source, const std::vector<std::string>& candidates,
                          std::string_view dtype, std::string_view base, const HubOptions& options) {
  std::string tried;
  for (const std::string& candidate : candidates) {
    try {
      return fetch_file(source.repo_id, candidate, source.revision, options);
    } catch (const HubError& e) {
      if (e.kind() != HubError::Kind::kEntryNotFound && e.kind() != HubError::Kind::kOfflineMiss) throw;
      tried += str("\n  ", e.what());
    }
  }
  const auto kind = *options.offline ? HubError::Kind::kOfflineMiss : HubError::Kind::kEntryNotFound;
  throw HubError(kind,
                 str("hf://", source.repo_id, "@", source.revision, " has no ONNX file '", base, "' for dtype '", dtype,
                     "'; tried:", tried, "\n(name the file: hf://", source.repo_id, "/path/to/model.onnx)"));
}

}  // namespace

ModelFiles download_model(std::string_view source_text, std::string_view dtype, const HubOptions& options,
                          std::string_view base) {
  const HubOptions resolved = options.resolved();
  const HubSource source = parse_hub_source(source_text);
  const CachedFile model = source.path.empty()
                               ? first_existing(source, onnx_file_candidates(dtype, base), dtype, base, resolved)
                               : fetch_file(source.repo_id, source.path, source.revision, resolved);
  ModelFiles files;
  files.model = model.path;
  files.commit = model.commit;
  files.repo_path =
      source.path.empty()
          ? model.path
                .lexically_relative(RepoFolder(resolved.cache_dir, source.repo_id).snapshot_dir(model.commit))
                .generic_string()
          : source.path;
  files.blobs_dir = RepoFolder(resolved.cache_dir, source.repo_id).root() / "blobs";
  if (!files.repo_path.ends_with(".onnx")) return files;  // a config or tokenizer file: nothing beside it

  // The data files sit beside the model in the repo, at the same commit, so a
  // branch that moves meanwhile cannot mix two versions.
  const std::string folder = folder_in_repo(files.repo_path);
  for (std::string location : external_data_locations(files.model)) {
    while (location.starts_with("./")) location.erase(0, 2);
    const std::string path = folder + location;
    check_repo_file_path(path, str(source_text, ": external data '", location, "' of ", files.repo_path));
    files.external_data.push_back(fetch_file(source.repo_id, path, model.commit, resolved).path);
  }
  return files;
}

}  // namespace transmuter::hub
