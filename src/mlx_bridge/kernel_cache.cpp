#include "mlx_bridge/kernel_cache.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "transmuter/error.h"

namespace transmuter {

namespace fs = std::filesystem;

namespace {

fs::path configured_folder() {
  if (const char* dir = std::getenv("TRANSMUTER_KERNEL_CACHE"); dir != nullptr && *dir != '\0') return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return fs::path(xdg) / "transmuter" / "mlx-kernels";
  }
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home != '/') {
    throw Error("cannot place MLX's kernel cache: set HOME, XDG_CACHE_HOME or TRANSMUTER_KERNEL_CACHE");
  }
  return fs::path(home) / ".cache" / "transmuter" / "mlx-kernels";
}

// Creates the missing folders of `dir` with mode 0700.
void create_private(const fs::path& dir) {
  fs::path partial;
  for (const fs::path& part : dir) {
    partial /= part;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      throw Error(str("cannot create the kernel cache folder ", partial.string(), ": ", std::strerror(errno)));
    }
  }
}

// One folder of the chain: the final one must be the user's alone; those
// above it must not let anyone else replace what is below them.
std::string folder_problem(const fs::path& dir, bool is_final) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return str(dir.string(), ": ", std::strerror(errno));
  if (S_ISLNK(st.st_mode)) {
    // A symlink is as safe as its target and the folder holding it.
    if (::stat(dir.c_str(), &st) != 0) return str(dir.string(), ": ", std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) return str(dir.string(), " is not a folder");
  const uid_t me = ::geteuid();
  if (is_final) {
    if (st.st_uid != me) return str(dir.string(), " is owned by uid ", st.st_uid, ", not by uid ", me);
    if (st.st_mode & (S_IWGRP | S_IWOTH)) return str(dir.string(), " is writable by group or others");
    return "";
  }
  if (st.st_uid != me && st.st_uid != 0) return str(dir.string(), " is owned by uid ", st.st_uid);
  bool shared_writable = st.st_mode & (S_IWGRP | S_IWOTH);
  bool sticky_root = (st.st_mode & S_ISVTX) && st.st_uid == 0;
  if (shared_writable && !sticky_root) return str(dir.string(), " is writable by group or others");
  return "";
}

}  // namespace

std::string kernel_folder_problem(const fs::path& dir) {
  fs::path absolute = fs::absolute(dir).lexically_normal();
  std::string problem = folder_problem(absolute, true);
  for (fs::path p = absolute.parent_path(); problem.empty(); p = p.parent_path()) {
    problem = folder_problem(p, false);
    if (p == p.root_path()) break;
  }
  return problem;
}

const fs::path& secure_kernel_cache() {
  static fs::path folder;
  static std::once_flag once;
  std::call_once(once, [] {
    fs::path dir = fs::absolute(configured_folder()).lexically_normal();
    create_private(dir);
    if (std::string problem = kernel_folder_problem(dir); !problem.empty()) {
      throw Error(str("refusing ", dir.string(), " as the folder for MLX's compiled kernels: ", problem,
                      " (another user could plant code there; set TRANSMUTER_KERNEL_CACHE to a private folder)"));
    }
    ::setenv("TMPDIR", dir.c_str(), 1);
    folder = dir;
  });
  return folder;
}

}  // namespace transmuter
