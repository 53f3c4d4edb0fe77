#include "onnx/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "transmuter/error.h"

namespace transmuter {

namespace {

// Closes the descriptor on every path out of the constructor; the mapping
// stays valid after close.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void fail(const std::filesystem::path& path, const char* what) {
  throw ModelFormatError(str(path.string(), ": cannot ", what, ": ", std::strerror(errno)));
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "an unknown kind of file";
}

void require_regular(const std::filesystem::path& path, const struct stat& info) {
  if (!S_ISREG(info.st_mode)) {
    throw ModelFormatError(str(path.string(), ": is ", file_kind(info.st_mode),
                               "; model and external data files must be regular files"));
  }
}

// The address ranges of the live mappings, for release_if_file_backed.
std::mutex live_mutex;
std::vector<std::pair<uintptr_t, uintptr_t>> live_mappings;

}  // namespace

MappedFile::MappedFile(std::filesystem::path path) : path_(std::move(path)) {
  // Checked before open(): opening a FIFO for reading blocks until a writer
  // appears, and a device may have side effects or never end.
  struct stat info {};
  if (::stat(path_.c_str(), &info) != 0) fail(path_, "open");
  require_regular(path_, info);
  // O_NONBLOCK: should the path be swapped for a FIFO after the check, open()
  // returns at once and the fstat below refuses it.
  FileDescriptor fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) fail(path_, "open");
  if (::fstat(fd.get(), &info) != 0) fail(path_, "stat");
  require_regular(path_, info);
  size_ = static_cast<size_t>(info.st_size);
  if (size_ == 0) return;  // mmap rejects length 0; an empty file has no bytes
  // One anonymous page before the file's bytes: an array aliasing the file reads the 8 bytes before
  // its data (MLX's allocator keeps a buffer's size there, see alias_memory), so without it the tensor
  // at offset 0 (an external data file's first weight, often the 113 MB embedding) was copied.
  void* reserved =
      ::mmap(nullptr, size_ + guard_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (reserved == MAP_FAILED) fail(path_, "mmap");
  // MAP_PRIVATE + PROT_WRITE: MLX may write into a buffer it believes it
  // owns (donation); copy-on-write keeps that away from the file.
  void* mapped = ::mmap(static_cast<uint8_t*>(reserved) + guard_bytes(), size_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_FIXED, fd.get(), 0);
  if (mapped == MAP_FAILED) {
    const int error = errno;
    ::munmap(reserved, size_ + guard_bytes());
    errno = error;
    fail(path_, "mmap");
  }
  data_ = static_cast<uint8_t*>(mapped);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data_);
  std::lock_guard lock(live_mutex);
  live_mappings.emplace_back(begin, begin + size_);
}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  {
    std::lock_guard lock(live_mutex);
    std::erase(live_mappings,
               std::pair{reinterpret_cast<uintptr_t>(data_), reinterpret_cast<uintptr_t>(data_) + size_});
  }
  ::munmap(data_ - guard_bytes(), size_ + guard_bytes());
}

size_t MappedFile::guard_bytes() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

std::shared_ptr<MappedFile> MappedFile::open(std::filesystem::path path) {
  return std::make_shared<MappedFile>(std::move(path));
}

void release_mapped_pages(std::span<const uint8_t> bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

bool release_if_file_backed(std::span<const uint8_t> bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()), end = begin + bytes.size();
  std::lock_guard lock(live_mutex);
  const bool mapped = std::any_of(live_mappings.begin(), live_mappings.end(), [&](const auto& range) {
    return range.first <= begin && end <= range.second;
  });
  if (mapped) release_mapped_pages(bytes);
  return mapped;
}

}  // namespace transmuter
