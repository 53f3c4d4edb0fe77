#include "mlx_bridge/buffers.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/ops.h>
#include <mlx/primitives.h>

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

// Copies `bytes` to `destination` a piece at a time, calling `after_copy`
// with each piece copied. Pieces end on the source's page boundaries, so that
// an after_copy that releases the source's pages (a model file's) releases
// them all while at most one piece of them is resident beside the copy.
void copy_in_pieces(std::span<const uint8_t> bytes, uint8_t* destination, const AfterCopy& after_copy) {
  constexpr uintptr_t kPiece = uintptr_t{1} << 20;
  const auto start = reinterpret_cast<uintptr_t>(bytes.data());
  size_t done = 0;
  while (done < bytes.size()) {
    const uintptr_t piece_end = (start + done + kPiece) & ~(kPiece - 1);  // 1 MiB-aligned: page-aligned
    const size_t size = std::min<size_t>(piece_end - (start + done), bytes.size() - done);
    std::memcpy(destination + done, bytes.data() + done, size);
    if (after_copy) after_copy(bytes.subspan(done, size));
    done += size;
  }
}

// deferred_copy's primitive: no inputs, one output, the copy as the CPU
// stream's task.
class DeferredCopy : public mx::UnaryPrimitive {
 public:
  DeferredCopy(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner, AfterCopy after_copy)
      : mx::UnaryPrimitive(mx::default_stream(mx::Device::cpu)),
        bytes_(bytes),
        owner_(std::move(owner)),
        after_copy_(std::move(after_copy)) {}

  void eval_cpu(const std::vector<mx::array>& /*inputs*/, mx::array& out) override {
    MlxBuffer buffer(out.nbytes());
    auto* destination = buffer.as<uint8_t>();
    out.set_data(std::move(buffer).take());
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_output_array(out);
    encoder.dispatch([destination, bytes = bytes_, owner = owner_, after_copy = after_copy_] {
      copy_in_pieces(bytes, destination, after_copy);
    });
  }
  void eval_gpu(const std::vector<mx::array>& /*inputs*/, mx::array& /*out*/) override {
    throw std::logic_error("DeferredCopy runs on the CPU stream only");
  }
  const char* name() const override { return "DeferredCopy"; }

  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::span<const uint8_t> bytes_;
  std::shared_ptr<const void> owner_;
  AfterCopy after_copy_;
};

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

mx::array deferred_copy(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner,
                        const mx::Shape& shape, mx::Dtype dtype, AfterCopy after_copy) {
  auto primitive = std::make_shared<DeferredCopy>(bytes, std::move(owner), std::move(after_copy));
  mx::array out(shape, dtype, std::move(primitive), {});
  if (out.nbytes() != bytes.size())
    throw std::invalid_argument("deferred_copy: the bytes do not fill the array");
  return out;
}

std::optional<std::span<const uint8_t>> deferred_bytes(const mx::array& a) {
  if (a.is_available() || !a.has_primitive()) return std::nullopt;
  const auto* copy = dynamic_cast<const DeferredCopy*>(&a.primitive());
  if (copy == nullptr) return std::nullopt;
  return copy->bytes();
}

std::span<const uint8_t> host_bytes(const mx::array& a, bool as_float32, mx::array& keep) {
  if (!as_float32 || a.dtype() == mx::float32) {
    if (std::optional<std::span<const uint8_t>> bytes = deferred_bytes(a)) return *bytes;
  }
  keep = as_float32 ? mx::astype(a, mx::float32, mx::Device::cpu) : a;
  keep = mx::contiguous(keep, false, mx::Device::cpu);
  keep.eval();
  return {keep.data<uint8_t>(), keep.nbytes()};
}

}  // namespace transmuter
