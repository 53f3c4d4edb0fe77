// MLX buffers that Transmuter fills or aliases itself: the loader's zero-copy
// initializers and decode targets.
//
// MLX internals used (tests/mlx_bridge/buffers_test.cpp checks them):
// - mx::allocator::malloc does not report failure in MLX 0.32 (the CPU
//   allocator returns a null buffer), so MlxBuffer checks it.
// - The CPU allocator cannot wrap foreign memory (mx::array(ptr, ..., deleter)
//   copies there); it reads data at Buffer::ptr() + sizeof(size_t). A Buffer
//   that starts 8 bytes before foreign data therefore aliases it. This layout
//   is probed once on a real allocation, never assumed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include <mlx/allocator.h>
#include <mlx/array.h>

namespace transmuter {

namespace mx = mlx::core;

/** Thrown by MlxBuffer when MLX's allocator cannot provide `nbytes`. */
struct AllocationFailure {
  size_t nbytes;
};

/** An MLX-owned, uninitialized buffer to decode into, then hand to an array. */
class MlxBuffer {
 public:
  /** Throws AllocationFailure when the allocation fails. */
  explicit MlxBuffer(size_t nbytes);
  template <typename T>
  T* as() {
    return static_cast<T*>(data_.buffer().raw_ptr());
  }
  /** The array over this buffer; the buffer is consumed. */
  mx::array into_array(const mx::Shape& shape, mx::Dtype dtype) { return mx::array(std::move(data_), shape, dtype); }

 private:
  mx::allocator::Data data_;
};

/** An array over `bytes` without a copy. `bytes` lie in `region`, which
 * `owner` keeps alive; the array holds `owner` until MLX releases it.
 * nullopt when that is not possible: no owner, empty, misaligned for `dtype`,
 * or an allocator that neither wraps foreign memory nor has the CPU layout
 * above (or `bytes` starts less than 8 bytes into `region`). */
std::optional<mx::array> alias_memory(std::span<const uint8_t> bytes, std::span<const uint8_t> region,
                                      std::shared_ptr<const void> owner, const mx::Shape& shape, mx::Dtype dtype);

/** True when this MLX build's allocator keeps a size_t header right before
 * the data, which alias_memory relies on for CPU arrays. */
bool allocator_uses_size_header();

}  // namespace transmuter
