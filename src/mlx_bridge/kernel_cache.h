// Where MLX's CPU backend writes and loads the shared objects of fused kernels.
//
// MLX compiles each fused kernel with the system compiler into
// `std::filesystem::temp_directory_path() / "mlx" / <version> / "cpu"` and
// dlopen()s whatever file of the expected name is there. Under /tmp that
// folder is shared by every user, so a file planted there would run inside
// every Transmuter process. MLX reads the folder from $TMPDIR on each compile,
// so Transmuter points $TMPDIR at a private per-user folder before its first
// compile.
#pragma once

#include <filesystem>
#include <string>

namespace transmuter {

/** The private folder for MLX's compiled kernels, set up once per process:
 * $TRANSMUTER_KERNEL_CACHE, else $XDG_CACHE_HOME/transmuter/mlx-kernels, else
 * $HOME/.cache/transmuter/mlx-kernels. It is created with mode 0700 when
 * missing and must be owned by the effective user and not writable by group or
 * others, and so must every folder above it unless it is root's and sticky
 * (like /tmp). Sets $TMPDIR to it (once, thread-safe against concurrent
 * callers). Throws transmuter::Error naming the folder and what is wrong. */
const std::filesystem::path& secure_kernel_cache();

/** Checks `dir` (which must exist) and its ancestors as above; returns "" when
 * safe, else what is wrong. */
std::string kernel_folder_problem(const std::filesystem::path& dir);

}  // namespace transmuter
