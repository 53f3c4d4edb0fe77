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
#include <functional>
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

/** How long a buffer's contents live: a model's (weights, constants), a
 * model's and made once (a load-time pass's packed weights, which nothing
 * replaces), or one run's (a decoded input). */
enum class BufferLifetime { kModel, kPacked, kRun };

/** An uninitialized buffer to decode or pack into, then hand to an array.
 * From MLX's allocator, except a model's buffers from 2 MiB up: each is a
 * mapping of its own in transparent huge pages (faster to fill; outside MLX's
 * active-memory count and its buffer cache, never donated); and packed
 * buffers from 16 KiB up, which share slabs of huge pages the same way (a
 * slab is unmapped when its last buffer dies; space in it is not reused). */
class MlxBuffer {
 public:
  /** Throws AllocationFailure when the allocation fails. */
  explicit MlxBuffer(size_t nbytes, BufferLifetime lifetime = BufferLifetime::kModel);
  template <typename T>
  T* as() {
    return static_cast<T*>(data_.buffer().raw_ptr());
  }
  /** The array over this buffer; the buffer is consumed. */
  mx::array into_array(const mx::Shape& shape, mx::Dtype dtype) { return mx::array(std::move(data_), shape, dtype); }
  /** The buffer itself, for a primitive's output (array::set_data); consumed. */
  mx::allocator::Data take() && { return std::move(data_); }

 private:
  mx::allocator::Data data_;
};

/** Whether fresh model and packed buffers are still advised as transparent
 * huge pages. They are until the first touch of one of their huge pages takes
 * longer than 4 KiB pages would have (a host that backs guest memory only when
 * touched, free page reporting): from then on the process advises small pages. */
bool advising_huge_pages();
/** Advise small pages from now on, as after a slow huge page (above). */
void stop_advising_huge_pages();

/** Gives back the pages past the last packed buffer of the slab now being
 * filled (those of a huge page it only began); load() calls it when done. */
void release_packed_slab_tail();

/** An array over `bytes` without a copy. `bytes` lie in `region`, which
 * `owner` keeps alive; the array holds `owner` until MLX releases it.
 * nullopt when that is not possible: no owner, empty, misaligned for `dtype`,
 * or an allocator that neither wraps foreign memory nor has the CPU layout
 * above (or `bytes` starts less than 8 bytes into `region`). */
std::optional<mx::array> alias_memory(std::span<const uint8_t> bytes, std::span<const uint8_t> region,
                                      std::shared_ptr<const void> owner, const mx::Shape& shape, mx::Dtype dtype);

/** Called with a deferred copy's source bytes once they have been copied. */
using AfterCopy = std::function<void(std::span<const uint8_t>)>;

/** An unevaluated array (on the CPU stream) whose evaluation copies `bytes`
 * into a fresh MLX buffer, then calls `after_copy(bytes)` when set. `owner`
 * keeps the bytes alive until then; `region` (what alias_memory needs; empty:
 * unknown) is the memory the bytes lie in. For tensors that cannot be aliased (raw
 * data misaligned in its file): a load-time pass that repacks such a weight
 * reads `deferred_bytes` in place, so the copy, and the fresh pages that the
 * kernel would zero for it, are never made. The array is an ordinary lazy MLX
 * array otherwise; `bytes` must hold exactly its row-major elements. */
mx::array deferred_copy(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner,
                        const mx::Shape& shape, mx::Dtype dtype, AfterCopy after_copy = nullptr,
                        std::span<const uint8_t> region = {});

/** The source bytes of an array made by deferred_copy that is not yet
 * evaluated (possibly misaligned for its dtype: read them with memcpy);
 * nullopt for any other array. */
std::optional<std::span<const uint8_t>> deferred_bytes(const mx::array& a);

/** The source bytes of an array made by deferred_copy that is not yet
 * evaluated, without a copy: uint8 [d0, bytes per row along axis 0], aliasing
 * them as alias_memory does (holding their owner), so never misaligned.
 * nullopt for any other array, a scalar or empty one, a copy made without a
 * region, or memory alias_memory cannot wrap. */
std::optional<mx::array> deferred_rows_as_bytes(const mx::array& a);

/** Makes a load-time repacking of `source`, a weight, when evaluated: on
 * evaluation, `repack(source)` runs on the evaluating thread and its result (of
 * `shape` and `dtype`) becomes the array's; `after(source)` is then called
 * when set (to give back the model file's pages it read), and `source` is let
 * go. Until then a later pass may replace the array by another made from
 * `source` (pending_repack_source), and no repacked copy is ever made.
 * `source` must be evaluated or a deferred copy, so that `repack` evaluates
 * nothing (an evaluation inside another's); throws std::invalid_argument
 * otherwise. */
mx::array deferred_repack(const mx::array& source, const mx::Shape& shape, mx::Dtype dtype,
                          std::function<mx::array(const mx::array&)> repack,
                          std::function<void(const mx::array&)> after = nullptr);

/** The source of an array made by deferred_repack that is not yet evaluated;
 * nullopt for any other array. */
std::optional<mx::array> pending_repack_source(const mx::array& a);

/** The row-major element bytes of `a` for a host-side reader that reads them
 * all: a deferred copy's source bytes in place (also under a reshape not yet
 * evaluated), or else `a` evaluated, as row-contiguous float32 when
 * `as_float32`. `keep` holds what the bytes lie
 * in. Bytes read in place (often a model file's pages) are mapped in one
 * system call first: faulting them in 64 KiB at a time costs more. */
std::span<const uint8_t> host_bytes(const mx::array& a, bool as_float32, mx::array& keep);

/** a's values as float32 on the host: host_bytes(a, true, keep) seen as floats. */
std::span<const float> host_floats(const mx::array& a, mx::array& keep);

/** True when this MLX build's allocator keeps a size_t header right before
 * the data, which alias_memory relies on for CPU arrays. */
bool allocator_uses_size_header();

}  // namespace transmuter
