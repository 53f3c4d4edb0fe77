#include "core/memory.h"

#include <limits>

#include <unistd.h>

namespace transmuter {

std::optional<uint64_t> checked_nbytes(const mlx::core::Shape& shape, mlx::core::Dtype dtype) {
  uint64_t bytes = dtype.size();
  for (int dim : shape) {
    if (dim < 0) return std::nullopt;
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) return std::nullopt;
  }
  return bytes;
}

uint64_t physical_memory_bytes() {
  static const uint64_t bytes = [] {
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_size = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_size <= 0) return std::numeric_limits<uint64_t>::max();
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
  }();
  return bytes;
}

}  // namespace transmuter
