#include "hub/repo_paths.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

#include "transmuter/hub.h"

namespace transmuter::hub {

namespace fs = std::filesystem;

namespace {

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

// Splits at '/' and hands each component to `check`.
template <typename Check>
void for_each_component(std::string_view path, Check check) {
  size_t start = 0;
  while (true) {
    const size_t end = path.find('/', start);
    check(path.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return;
    start = end + 1;
  }
}

void check_relative(std::string_view path, std::string_view what, std::string_view context) {
  auto refuse = [&](std::string_view why) {
    throw std::invalid_argument(str(context, ": ", what, " '", path, "' ", why));
  };
  if (path.empty()) refuse("is empty");
  if (path.front() == '/') refuse("is absolute");
  for (char c : path) {
    if (c == '\\') refuse("holds a backslash");
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) refuse("holds a control character");
  }
  for_each_component(path, [&](std::string_view part) {
    if (part.empty()) refuse("has an empty component");
    if (part == "." || part == "..") refuse(str("has a '", part, "' component, which could leave the cache"));
  });
}

void write_file_atomically(const fs::path& path, std::string_view content) {
  fs::create_directories(path.parent_path());
  const fs::path temporary = temporary_sibling(path, "tmp");
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!out) throw Error(str("cannot write ", temporary.string()));
  }
  fs::rename(temporary, path);
}

// `inner` lies inside `outer` once both are resolved (symlinks followed).
bool resolves_inside(const fs::path& inner, const fs::path& outer) {
  const fs::path a = fs::weakly_canonical(inner), b = fs::weakly_canonical(outer);
  auto [end, _] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
  return end == b.end();
}

}  // namespace

void check_repo_id(std::string_view repo_id, std::string_view context) {
  const size_t slash = repo_id.find('/');
  auto refuse = [&](std::string_view why) {
    throw std::invalid_argument(str(context, ": repo id '", repo_id, "' ", why, " (expected org/name)"));
  };
  if (slash == std::string_view::npos || repo_id.find('/', slash + 1) != std::string_view::npos) {
    refuse("must have exactly one '/'");
  }
  for (std::string_view part : {repo_id.substr(0, slash), repo_id.substr(slash + 1)}) {
    if (part.empty() || part == "." || part == "..") refuse("has an empty, '.' or '..' part");
    for (char c : part) {
      if (!is_name_char(c)) refuse("may hold only letters, digits, '.', '_' and '-'");
    }
  }
}

void check_repo_file_path(std::string_view path, std::string_view context) {
  check_relative(path, "file path", context);
}

void check_revision(std::string_view revision, std::string_view context) {
  check_relative(revision, "revision", context);
}

void check_served_name(std::string_view what, std::string_view value, std::string_view url) {
  bool safe = !value.empty() && value.size() <= 255 && value.front() != '.';
  for (char c : value) safe = safe && is_name_char(c);
  if (!safe) {
    throw HubError(HubError::Kind::kInvalidAnswer,
                   str(url, ": the server sent the ", what, " '", value.substr(0, 80),
                       "', which is not a plain file name; refusing to use it in the cache"));
  }
}

bool is_commit_hash(std::string_view text) {
  if (text.size() != 40) return false;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) return false;
  }
  return true;
}

std::string url_decode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string url_encode(std::string_view text, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += c;
    } else {
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

std::string repo_folder_name(std::string_view repo_id) {
  std::string out = "models--";
  for (char c : repo_id) {
    if (c == '/') {
      out += "--";
    } else {
      out += c;
    }
  }
  return out;
}

RepoFolder::RepoFolder(fs::path cache_dir, std::string_view repo_id)
    : cache_dir_(std::move(cache_dir)), root_(cache_dir_ / repo_folder_name(repo_id)) {}

fs::path RepoFolder::lock_file(std::string_view etag) const {
  return cache_dir_ / ".locks" / root_.filename() / (std::string(etag) + ".lock");
}

std::optional<std::string> RepoFolder::read_ref(std::string_view revision) const {
  std::ifstream in(root_ / "refs" / std::string(revision));
  std::string commit;
  if (!in || !std::getline(in, commit)) return std::nullopt;
  while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
  if (commit.empty()) return std::nullopt;
  return commit;
}

void RepoFolder::write_ref(std::string_view revision, std::string_view commit) const {
  if (revision == commit || read_ref(revision) == std::string(commit)) return;
  write_file_atomically(root_ / "refs" / std::string(revision), commit);
}

void RepoFolder::mark_missing(std::string_view commit, std::string_view file) const {
  const fs::path marker = root_ / ".no_exist" / std::string(commit) / std::string(file);
  fs::create_directories(marker.parent_path());
  std::ofstream touch(marker, std::ios::app);
}

bool RepoFolder::marked_missing(std::string_view commit, std::string_view file) const {
  return fs::exists(root_ / ".no_exist" / std::string(commit) / std::string(file));
}

void RepoFolder::link_pointer(std::string_view commit, std::string_view file, std::string_view etag) const {
  const fs::path pointer_path = pointer(commit, file);
  const fs::path folder = pointer_path.parent_path();
  fs::create_directories(folder);
  if (!resolves_inside(folder, snapshot_dir(commit))) {
    throw HubError(HubError::Kind::kInvalidAnswer,
                   str("cache: the folder of ", pointer_path.string(), " resolves outside its snapshot (",
                       fs::weakly_canonical(folder).string(), "); refusing to write there"));
  }
  // Relative, as huggingface_hub links them: the cache folder can move.
  const fs::path target = fs::relative(blob(etag), folder);
  const fs::path temporary = temporary_sibling(pointer_path, "link");
  fs::create_symlink(target, temporary);
  fs::rename(temporary, pointer_path);
}

std::optional<fs::path> RepoFolder::cached_file(std::string_view commit, std::string_view file) const {
  const fs::path pointer_path = pointer(commit, file);
  std::error_code error;
  if (!fs::exists(pointer_path, error)) return std::nullopt;  // follows the symlink
  return pointer_path;
}

FileLock::FileLock(const fs::path& path) {
  fs::create_directories(path.parent_path());
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(str("cannot open the lock file ", path.string(), ": ", std::strerror(errno)));
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    ::close(fd_);
    throw Error(str("cannot lock ", path.string(), ": ", std::strerror(error)));
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

fs::path temporary_sibling(const fs::path& path, std::string_view suffix) {
  static thread_local std::mt19937_64 random(std::random_device{}());
  char name[17];
  std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(random()));
  return fs::path(path.string() + "." + name + "." + std::string(suffix));
}

}  // namespace transmuter::hub
