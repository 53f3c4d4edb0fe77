#include "mlx_bridge/buffers.h"

#include <sys/mman.h>

#include <cstdint>

namespace transmuter {

namespace {

// Asks for transparent huge pages over the 2 MiB-aligned interior of a large
// fresh buffer (where the system's policy is "madvise"): filling a model's
// weights through 4 KiB pages spends more time in page faults than copying.
void advise_huge_pages(void* data, size_t nbytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + nbytes) & ~(kHugePage - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)nbytes;
#endif
}

}  // namespace

MlxBuffer::MlxBuffer(size_t nbytes) : data_(mx::allocator::malloc(nbytes)) {
  if (nbytes != 0 && data_.buffer().ptr() == nullptr) throw AllocationFailure{nbytes};
  if (nbytes >= (size_t{4} << 20)) advise_huge_pages(data_.buffer().raw_ptr(), nbytes);
}

bool allocator_uses_size_header() {
  static const bool uses_header = [] {
    mx::allocator::Data probe = mx::allocator::malloc(1);
    mx::allocator::Buffer buffer = probe.buffer();
    return buffer.raw_ptr() == static_cast<char*>(buffer.ptr()) + sizeof(size_t);
  }();
  return uses_header;
}

std::optional<mx::array> alias_memory(std::span<const uint8_t> bytes, std::span<const uint8_t> region,
                                      std::shared_ptr<const void> owner, const mx::Shape& shape, mx::Dtype dtype) {
  if (owner == nullptr || bytes.empty()) return std::nullopt;
  const auto address = reinterpret_cast<uintptr_t>(bytes.data());
  if (address % mx::size_of(dtype) != 0) return std::nullopt;
  auto* data = const_cast<uint8_t*>(bytes.data());

  // Backends that can wrap foreign memory (Metal) take it through the
  // public constructor. Without that, the constructor would copy.
  mx::allocator::Buffer wrapped = mx::allocator::make_buffer(data, bytes.size());
  if (wrapped.ptr() != nullptr) {
    mx::allocator::release(wrapped);
    return mx::array(data, shape, dtype, [owner](void*) {});
  }
  // The 8 bytes before `data` must be readable: they only feed
  // Allocator::size(), which MLX consults for donation, and a Data with a
  // deleter is never donated (array::is_donatable requires is_owned()), nor
  // freed by the allocator.
  const uint8_t* header = bytes.data() - sizeof(size_t);
  if (!allocator_uses_size_header() || header < region.data()) return std::nullopt;
  mx::allocator::Data aliased(mx::allocator::Buffer(const_cast<uint8_t*>(header)),
                              [owner](mx::allocator::Buffer) {});
  return mx::array(std::move(aliased), shape, dtype);
}

}  // namespace transmuter
