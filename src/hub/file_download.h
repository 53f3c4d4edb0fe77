// hf_hub_download as huggingface_hub 1.x does it: metadata from a HEAD on
// {endpoint}/{repo}/resolve/{revision}/{file}, the bytes into the shared cache
// (repo_paths.h) under a per-blob lock, checked, then linked into the snapshot.
#pragma once

#include <filesystem>
#include <string>

#include "transmuter/hub.h"

namespace transmuter::hub {

/** A file of the cache: snapshots/<commit>/<file>, and that commit. */
struct CachedFile {
  std::filesystem::path path;
  std::string commit;
};

/** One file at `revision`, from the cache or downloaded into it. `options` must
 * be resolved (HubOptions::resolved). Throws HubError. */
CachedFile fetch_file(const std::string& repo_id, const std::string& filename, const std::string& revision,
                      const HubOptions& options);

/** {endpoint}/{repo}/resolve/{revision}/{file}, revision and file percent-encoded. */
std::string file_url(const HubOptions& options, const std::string& repo_id, const std::string& revision,
                     const std::string& filename);

/** An ETag header without its weak marker and quotes, as huggingface_hub keeps it. */
std::string normalize_etag(std::string etag);

}  // namespace transmuter::hub
