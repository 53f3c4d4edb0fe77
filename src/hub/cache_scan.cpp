// scan_cache and remove_from_cache: what `hf cache ls` / `hf cache rm` show and
// do, over the layout of repo_paths.h.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>

#include "hub/repo_paths.h"
#include "transmuter/hub.h"

namespace transmuter::hub {

namespace fs = std::filesystem;

namespace {

// "models--org--name" -> {"model", "org/name"}; nullopt for other folders.
std::optional<std::pair<std::string, std::string>> parse_repo_folder(const std::string& name) {
  static const std::pair<std::string_view, std::string_view> kTypes[] = {
      {"models--", "model"}, {"datasets--", "dataset"}, {"spaces--", "space"}};
  for (const auto& [prefix, type] : kTypes) {
    if (!name.starts_with(prefix) || name.size() == prefix.size()) continue;
    std::string id;
    for (size_t i = prefix.size(); i < name.size(); ++i) {
      const bool separator = name.compare(i, 2, "--") == 0;
      id += separator ? '/' : name[i];
      i += separator ? 1 : 0;
    }
    return std::pair(std::string(type), id);
  }
  return std::nullopt;
}

uint64_t size_of(const fs::path& file) {
  std::error_code error;
  const uint64_t size = fs::file_size(file, error);
  return error ? 0 : size;
}

// The blobs a snapshot's symlinks point at (resolved paths), each once.
std::set<fs::path> blobs_of(const fs::path& snapshot, size_t* file_count = nullptr) {
  std::set<fs::path> blobs;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(snapshot, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it->is_directory(error) && !it->is_symlink(error)) continue;
    if (file_count != nullptr) ++*file_count;
    std::error_code resolve_error;
    const fs::path target = fs::canonical(it->path(), resolve_error);
    if (!resolve_error) blobs.insert(target);
  }
  return blobs;
}

// commit -> the names under refs/ (refs/pr/1 included) that point at it.
std::map<std::string, std::vector<std::string>> refs_by_commit(const RepoFolder& folder) {
  std::map<std::string, std::vector<std::string>> refs;
  const fs::path refs_dir = folder.root() / "refs";
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(refs_dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (!it->is_regular_file(error)) continue;
    const std::string name = it->path().lexically_relative(refs_dir).generic_string();
    if (auto commit = folder.read_ref(name)) refs[*commit].push_back(name);
  }
  return refs;
}

std::vector<fs::path> snapshot_dirs(const RepoFolder& folder) {
  std::vector<fs::path> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder.root() / "snapshots", error)) {
    if (entry.is_directory(error)) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

CachedRepo scan_repo(const fs::path& cache_dir, const std::string& type, const std::string& repo_id,
                     const fs::path& path) {
  CachedRepo repo;
  repo.repo_id = repo_id;
  repo.repo_type = type;
  repo.path = path;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(path / "blobs", error)) {
    if (entry.is_regular_file(error)) repo.size_on_disk += size_of(entry.path());
  }
  const RepoFolder folder(cache_dir, repo_id);
  auto refs = refs_by_commit(folder);
  std::set<fs::path> used;
  for (const fs::path& snapshot : snapshot_dirs(folder)) {
    CachedRevision revision;
    revision.commit = snapshot.filename().string();
    revision.snapshot = snapshot;
    for (const fs::path& blob : blobs_of(snapshot, &revision.file_count)) {
      revision.size_on_disk += size_of(blob);
      used.insert(blob);
    }
    revision.refs = refs[revision.commit];
    repo.revisions.push_back(std::move(revision));
  }
  repo.file_count = used.size();
  return repo;
}

}  // namespace

std::vector<CachedRepo> scan_cache(const HubOptions& options) {
  const fs::path cache_dir = options.resolved().cache_dir;
  std::vector<CachedRepo> repos;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(cache_dir, error)) {
    if (!entry.is_directory(error)) continue;
    auto parsed = parse_repo_folder(entry.path().filename().string());
    // RepoFolder names model repos only; others are listed with their own path.
    if (parsed) repos.push_back(scan_repo(cache_dir, parsed->first, parsed->second, entry.path()));
  }
  std::sort(repos.begin(), repos.end(), [](const CachedRepo& a, const CachedRepo& b) {
    return std::tie(a.repo_id, a.repo_type) < std::tie(b.repo_id, b.repo_type);
  });
  return repos;
}

uint64_t remove_from_cache(const std::string& repo_id, const std::string& revision,
                           const HubOptions& options) {
  check_repo_id(repo_id, "cache rm");
  const HubOptions resolved = options.resolved();
  const RepoFolder folder(resolved.cache_dir, repo_id);
  if (!fs::is_directory(folder.root())) {
    throw HubError(HubError::Kind::kEntryNotFound,
                   str(repo_id, " is not in the cache (", resolved.cache_dir.string(), ")"));
  }
  if (revision.empty()) {
    uint64_t freed = scan_repo(resolved.cache_dir, "model", repo_id, folder.root()).size_on_disk;
    fs::remove_all(folder.root());
    std::error_code ignored;
    fs::remove_all(resolved.cache_dir / ".locks" / folder.root().filename(), ignored);
    return freed;
  }

  check_revision(revision, "cache rm");
  const std::optional<std::string> commit =
      is_commit_hash(revision) ? std::optional(revision) : folder.read_ref(revision);
  if (!commit || !fs::is_directory(folder.snapshot_dir(*commit))) {
    throw HubError(
        HubError::Kind::kRevisionNotFound,
        str("revision '", revision, "' of ", repo_id, " is not in the cache (", folder.root().string(), ")"));
  }
  std::set<fs::path> kept;
  for (const fs::path& snapshot : snapshot_dirs(folder)) {
    if (snapshot.filename() != *commit) kept.merge(blobs_of(snapshot));
  }
  // Only this repo's blobs: a link planted to lead elsewhere removes nothing there.
  const fs::path blobs_dir = fs::weakly_canonical(folder.root() / "blobs");
  uint64_t freed = 0;
  for (const fs::path& blob : blobs_of(folder.snapshot_dir(*commit))) {
    if (kept.count(blob) || blob.parent_path() != blobs_dir) continue;
    freed += size_of(blob);
    fs::remove(blob);
  }
  fs::remove_all(folder.snapshot_dir(*commit));
  std::error_code ignored;
  fs::remove_all(folder.root() / ".no_exist" / *commit, ignored);
  auto refs = refs_by_commit(folder);
  for (const std::string& ref : refs[*commit]) fs::remove(folder.root() / "refs" / ref);
  return freed;
}

}  // namespace transmuter::hub
