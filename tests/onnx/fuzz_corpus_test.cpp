// Replays the loader fuzzer's committed seeds (tests/fuzz/corpus/model_bytes)
// through read_model_bytes in every build, the sanitizer builds included:
// each seed is a valid model and must parse.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "onnx/model_file.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = fs::path(TRANSMUTER_SOURCE_DIR) / "tests" / "fuzz";

std::vector<fs::path> files_in(const fs::path& folder) {
  std::vector<fs::path> files;
  if (!fs::is_directory(folder)) return files;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  return files;
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// "parsed", "error: <message>", or a test failure for anything else.
std::string read_outcome(const fs::path& path) {
  const std::string bytes = bytes_of(path);
  try {
    read_model_bytes(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "");
    return "parsed";
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": non-transmuter exception: " << e.what();
    return "other";
  }
}

TEST(FuzzCorpus, EverySeedModelParses) {
  const std::vector<fs::path> seeds = files_in(kFuzzDir / "corpus" / "model_bytes");
  ASSERT_GE(seeds.size(), 5u) << "seed corpus missing: run tests/fuzz/make_corpus.py";
  for (const fs::path& seed : seeds) {
    if (seed.filename() == "external_data.onnx") {
      // Its weights.bin exists only next to the fuzzer's model folder; from
      // memory without a folder it must be refused with an error, not read.
      const std::string outcome = read_outcome(seed);
      EXPECT_EQ(outcome.rfind("error: ", 0), 0u) << outcome;
      EXPECT_NE(outcome.find("weights.bin"), std::string::npos) << outcome;
      continue;
    }
    EXPECT_EQ(read_outcome(seed), "parsed") << seed;
  }
}

}  // namespace
}  // namespace transmuter
