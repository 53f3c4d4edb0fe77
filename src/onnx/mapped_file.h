// A whole file mapped into memory, read-only in spirit but writable in fact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>

namespace transmuter {

/** RAII mmap of a whole file. The mapping is MAP_PRIVATE with
 * PROT_READ|PROT_WRITE: arrays that alias it may be donated by MLX and
 * written to; such writes stay private copy-on-write pages and never reach
 * the file. An empty file gives size() == 0 and a null data(). */
class MappedFile {
 public:
  /** Maps `path`; throws ModelFormatError when it cannot be opened or mapped. */
  explicit MappedFile(std::filesystem::path path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /** Maps `path` into a shared_ptr, the form tensors use to keep it alive. */
  static std::shared_ptr<MappedFile> open(std::filesystem::path path);

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  /** bytes() and the readable zero page before them: the region arrays may alias, so that a
   * tensor at offset 0 has the 8 readable bytes before it that MLX's allocator reads. */
  std::span<const uint8_t> aliasable() const {
    return data_ == nullptr ? bytes()
                            : std::span<const uint8_t>{data_ - guard_bytes(), size_ + guard_bytes()};
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static size_t guard_bytes();

  std::filesystem::path path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

/** Drops the pages that lie wholly inside `bytes`, a range of a MappedFile
 * whose contents were copied elsewhere and will not be read again, from the
 * process's resident memory (madvise MADV_DONTNEED). The mapping stays valid:
 * a later read faults the unchanged bytes back in from the file. Only for
 * pages never written (and never for memory that is not such a mapping:
 * anonymous pages would read back as zeros). Errors are ignored: this only
 * saves memory. */
void release_mapped_pages(std::span<const uint8_t> bytes);

/** release_mapped_pages(bytes) when `bytes` lie inside a live MappedFile (a
 * tensor that aliases its model file); nothing for any other memory. For
 * load-time passes that replace a weight they have copied (packed): returns
 * true when pages were dropped. */
bool release_if_file_backed(std::span<const uint8_t> bytes);

}  // namespace transmuter
