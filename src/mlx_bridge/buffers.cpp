#include "mlx_bridge/buffers.h"

namespace transmuter {

MlxBuffer::MlxBuffer(size_t nbytes) : data_(mx::allocator::malloc(nbytes)) {
  if (nbytes != 0 && data_.buffer().ptr() == nullptr) throw AllocationFailure{nbytes};
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
