// libFuzzer target: the model reader on arbitrary bytes. Every input must
// parse or throw transmuter::Error; any other exception, crash, sanitizer
// report, hang or huge allocation is a finding.
//
// External data resolves inside a private folder holding one small file,
// weights.bin, so that seeds which reference it exercise that path too.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

#include "onnx/model_file.h"
#include "transmuter/error.h"

namespace {

namespace fs = std::filesystem;

// A folder with 64 bytes of external data: 16 float32 values 0..15. Removed
// at exit.
struct ModelFolder {
  fs::path path = fs::temp_directory_path() / ("transmuter_fuzz_model_" + std::to_string(::getpid()));
  ModelFolder() {
    fs::create_directories(path);
    std::ofstream out(path / "weights.bin", std::ios::binary);
    for (int i = 0; i < 16; ++i) {
      const float value = static_cast<float>(i);
      out.write(reinterpret_cast<const char*>(&value), sizeof value);
    }
  }
  ~ModelFolder() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

const fs::path& model_folder() {
  static const ModelFolder folder;
  return folder.path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    transmuter::read_model_bytes(std::span<const uint8_t>(data, size), model_folder());
  } catch (const transmuter::Error&) {
  }
  return 0;
}
