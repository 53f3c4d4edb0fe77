// The cache layout of huggingface_hub, for one repo, and the checks that keep
// every name a server or a model file supplies inside it:
//
//   <cache>/models--org--name/
//     blobs/<etag>                        the file's bytes (etag: sha256 for LFS files)
//     snapshots/<commit>/<path>           relative symlink -> ../../blobs/<etag>
//     refs/<revision>                     the commit a branch or tag pointed at
//     .no_exist/<commit>/<path>           empty: the hub answered "no such file"
//   <cache>/.locks/models--org--name/<etag>.lock   one download of a blob at a time
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace transmuter::hub {

/** "org/name": two parts of letters, digits, '.', '_', '-', neither "." nor "..".
 * Throws std::invalid_argument mentioning `context`. */
void check_repo_id(std::string_view repo_id, std::string_view context);
/** A relative path inside a repo: no empty, "." or ".." component, no backslash,
 * no control character. Throws std::invalid_argument mentioning `context`. */
void check_repo_file_path(std::string_view path, std::string_view context);
/** A branch, tag or commit: refs/<revision> must stay inside refs/. */
void check_revision(std::string_view revision, std::string_view context);

/** An etag or commit from a server: a plain file name ([A-Za-z0-9._-], not starting
 * with '.'); anything else throws HubError(kInvalidAnswer) naming `url`. */
void check_served_name(std::string_view what, std::string_view value, std::string_view url);

/** 40 lowercase hex digits: a git commit, as huggingface_hub's REGEX_COMMIT_HASH. */
bool is_commit_hash(std::string_view text);

/** %XX decoding (a revision such as refs%2Fpr%2F1). */
std::string url_decode(std::string_view text);
/** Percent-encodes all but unreserved characters, and '/' too unless `keep_slash`. */
std::string url_encode(std::string_view text, bool keep_slash);

/** "models--org--name" for a model repo. */
std::string repo_folder_name(std::string_view repo_id);

/** Paths of one model repo in a cache directory, and the small atomic writes to them. */
class RepoFolder {
 public:
  RepoFolder(std::filesystem::path cache_dir, std::string_view repo_id);

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path blob(std::string_view etag) const { return root_ / "blobs" / std::string(etag); }
  std::filesystem::path snapshot_dir(std::string_view commit) const {
    return root_ / "snapshots" / std::string(commit);
  }
  std::filesystem::path pointer(std::string_view commit, std::string_view file) const {
    return snapshot_dir(commit) / std::string(file);
  }
  std::filesystem::path lock_file(std::string_view etag) const;

  /** The commit refs/<revision> holds, if any. */
  std::optional<std::string> read_ref(std::string_view revision) const;
  /** refs/<revision> := commit (write to a temporary file, then rename). */
  void write_ref(std::string_view revision, std::string_view commit) const;
  /** Records that `file` does not exist at `commit` (.no_exist/). */
  void mark_missing(std::string_view commit, std::string_view file) const;
  bool marked_missing(std::string_view commit, std::string_view file) const;
  /** snapshots/<commit>/<file> -> the blob, as a relative symlink created under a
   * temporary name and renamed into place. Refuses a folder that resolves outside
   * the snapshot (a symlink planted on the way). */
  void link_pointer(std::string_view commit, std::string_view file, std::string_view etag) const;
  /** snapshots/<commit>/<file> when it exists and its target does too. */
  std::optional<std::filesystem::path> cached_file(std::string_view commit, std::string_view file) const;

 private:
  std::filesystem::path cache_dir_;
  std::filesystem::path root_;
};

/** An exclusive flock(2) on `path` (created with its folders), held for the
 * object's lifetime: the same lock Python's filelock takes, so a Python process and
 * ours never download one blob at once. */
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

/** A unique sibling name for a temporary file: `<path>.<random>.<suffix>`. */
std::filesystem::path temporary_sibling(const std::filesystem::path& path, std::string_view suffix);

}  // namespace transmuter::hub
