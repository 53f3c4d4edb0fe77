#include "onnx/mapped_file.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <filesystem>
#include <fstream>
#include <vector>

namespace transmuter {
namespace {

// Pages of the mapping that holds `data` counted in this process's resident
// set (the Rss of its /proc/self/smaps entry). mincore would not do: it tells
// whether a file page is in the page cache, not whether we map it.
size_t resident_pages(const uint8_t* data) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(data);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      inside = begin <= address && address < end;
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      return std::stoul(line.substr(4)) * 1024 / static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    }
  }
  ADD_FAILURE() << "no mapping holds the address";
  return 0;
}

// Pages wholly inside a released range leave the resident set, the partial
// pages at its ends stay, and every byte still reads back from the file.
TEST(MappedFile, ReleasedPagesLeaveResidentMemoryAndReadBackUnchanged) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto path = std::filesystem::temp_directory_path() / ("transmuter_mapped_" + std::to_string(::getpid()));
  std::vector<uint8_t> contents(8 * page);
  for (size_t i = 0; i < contents.size(); ++i) contents[i] = static_cast<uint8_t>(i * 7 + 3);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(contents.data()),
                                               static_cast<std::streamsize>(contents.size()));
  {
    MappedFile file(path);
    uint64_t sum = 0;
    for (size_t i = 0; i < file.size(); ++i) sum += file.data()[i];  // fault every page in
    ASSERT_GT(sum, 0u);
    ASSERT_EQ(resident_pages(file.data()), 8u);

    // From the middle of page 1 to the middle of page 6: pages 2..5 are inside.
    release_mapped_pages(file.bytes().subspan(page + page / 2, 5 * page));
    EXPECT_EQ(resident_pages(file.data()), 4u);
    for (size_t i = 0; i < file.size(); ++i) ASSERT_EQ(file.data()[i], contents[i]) << "byte " << i;

    release_mapped_pages(file.bytes().subspan(10, 20));  // within one page: nothing to release
    EXPECT_EQ(resident_pages(file.data()), 8u);
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace transmuter
