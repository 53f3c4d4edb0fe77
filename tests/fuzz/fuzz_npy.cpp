// libFuzzer target: the .npy reader (tools/npy.h) on arbitrary file contents.
// Every input must read or throw transmuter::Error; anything else is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <mlx/mlx.h>

#include "npy.h"
#include "transmuter/error.h"

namespace {

namespace fs = std::filesystem;

// read_npy takes a path: each input is written to one private file, removed
// at exit.
struct ScratchFile {
  fs::path path = (fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path()) /
                  ("transmuter_fuzz_npy_" + std::to_string(::getpid()) + ".npy");
  ~ScratchFile() {
    std::error_code ignored;
    fs::remove(path, ignored);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchFile scratch;
  const fs::path& path = scratch.path;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    mlx::core::array a = transmuter::read_npy(path);
    mlx::core::eval(a);
  } catch (const transmuter::Error&) {
  }
  return 0;
}
