#include "mlx_bridge/buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/ops.h>
#include <mlx/primitives.h>

namespace transmuter {

namespace {

// Buffers at least this large get a mapping of their own (below, one 2 MiB
// page could not be whole inside them).
constexpr size_t kOwnMappingBytes = size_t{2} << 20;
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
// The data start this far into the mapping: 64-byte aligned, with MLX's
// size header (allocator_uses_size_header) right before them.
constexpr uintptr_t kDataOffset = 64;

uintptr_t round_up(uintptr_t value, uintptr_t to) { return (value + to - 1) / to * to; }

// Whether fresh mappings are still advised as transparent huge pages. This
// project's VM gives freed 2 MiB blocks back to its host (free page
// reporting), so a huge page comes either recycled, 10-22 GB/s to fill, or
// backed by the host at first touch, 0.42-1.1 GB/s; 4 KiB pages fill at
// 2.1-3.1 GB/s either way (a C loop touching 4-64 MiB, 2026-12-08). A load
// gets recycled huge pages while the blocks a process freed moments before
// last (ResNet-50's: 0.05-0.19 ms a fault), then fresh ones (4.7-6.3 ms). So
// the first touch of each huge page is timed (touch_huge_page), and one slower
// than its 512 small pages would have been turns huge pages off for the rest
// of the process.
std::atomic<bool> huge_pages_pay{true};

}  // namespace

void stop_advising_huge_pages() { huge_pages_pay.store(false, std::memory_order_relaxed); }
bool advising_huge_pages() { return huge_pages_pay.load(std::memory_order_relaxed); }

namespace {

// Above this, a 2 MiB page came slower than 4 KiB pages fill it (~0.7 ms).
constexpr std::chrono::microseconds kSlowHugePage{1500};

// Advises [begin, end) as huge pages while they pay, as small pages after.
void advise_pages(uintptr_t begin, uintptr_t end) {
  if (end <= begin) return;
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
  ::madvise(reinterpret_cast<void*>(begin), end - begin,
            huge_pages_pay.load(std::memory_order_relaxed) ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
}

// Writes the first byte of the fresh huge page at `page` (2 MiB-aligned,
// advised, not yet touched: its contents are not anyone's yet), which faults
// the whole page in; when that took longer than kSlowHugePage, stops advising
// huge pages and advises [page + 2 MiB, rest_end) as small pages.
void touch_huge_page(uintptr_t page, uintptr_t rest_end) {
  if (!huge_pages_pay.load(std::memory_order_relaxed)) return;
  const auto start = std::chrono::steady_clock::now();
  *reinterpret_cast<volatile uint8_t*>(page) = 0;
  if (std::chrono::steady_clock::now() - start <= kSlowHugePage) return;
  stop_advising_huge_pages();
  advise_pages(page + kHugePage, rest_end);
}

// A fresh buffer of `nbytes` in an anonymous mapping of its own that starts
// on a 2 MiB boundary, its whole 2 MiB pages advised as transparent huge
// pages while they come fast (huge_pages_pay; "madvise" is the usual system
// policy). Filling a large buffer through 4 KiB pages faults 512 times per
// 2 MiB: 4-5x the time of one recycled huge page on this project's VM
// (docs/roadmap.md). MLX's malloc (tcmalloc or glibc's heap
// beneath it) places buffers anywhere, so a 2.25 MiB weight held no whole
// huge page. The array owns the mapping (its deleter unmaps it); MLX neither
// counts it in its active memory nor donates it. nullopt where the mapping
// fails or MLX's CPU allocator lacks the size header its readers expect.
std::optional<mx::allocator::Data> map_buffer(size_t nbytes) {
  if (!allocator_uses_size_header()) return std::nullopt;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t used = round_up(kDataOffset + nbytes, page);
  const uintptr_t reserved = used + kHugePage;
  void* base = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return std::nullopt;
  const auto first = reinterpret_cast<uintptr_t>(base);
  const uintptr_t start = round_up(first, kHugePage);
  if (start > first) ::munmap(base, start - first);
  if (first + reserved > start + used)
    ::munmap(reinterpret_cast<void*>(start + used), first + reserved - start - used);
  const uintptr_t huge_end = start + used / kHugePage * kHugePage;
  advise_pages(start, huge_end);
  touch_huge_page(start, huge_end);
  auto* header = reinterpret_cast<size_t*>(start + kDataOffset - sizeof(size_t));
  *header = nbytes;
  return mx::allocator::Data(mx::allocator::Buffer(header), [start, used](mx::allocator::Buffer) {
    ::munmap(reinterpret_cast<void*>(start), used);
  });
}

// Maps the pages under `bytes` in one system call (MADV_POPULATE_READ); errors
// are ignored: only time is at stake.
void prefault_for_reading(std::span<const uint8_t> bytes) {
#ifdef MADV_POPULATE_READ
  if (bytes.empty()) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
  const uintptr_t end = round_up(reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size(), page);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
#else
  (void)bytes;
#endif
}

// Packed weights below kOwnMappingBytes share slabs: 2 MiB-aligned mappings
// advised as huge pages and carved front to back, so that filling them faults
// once per 2 MiB instead of once per 4 KiB (on this project's VM 16 MiB took
// 6.2 ms through 4 KiB faults, 0.8 ms through huge pages; MobileNetV2's ~50
// packed convolutions each had a malloc'd buffer). A slab's space is never
// reused: it is unmapped when its last buffer dies, and a buffer that dies
// before gives back only the whole pages under it, which is why only buffers
// that live as long as their model come here (BufferLifetime::kPacked).
class Slab {
 public:
  static constexpr uintptr_t kBytes = uintptr_t{32} << 20;  // virtual; only touched pages are resident

  // nullptr where the mapping fails.
  static std::shared_ptr<Slab> make() {
    const uintptr_t reserved = kBytes + kHugePage;
    void* base = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    const auto first = reinterpret_cast<uintptr_t>(base);
    const uintptr_t start = round_up(first, kHugePage);
    if (start > first) ::munmap(base, start - first);
    ::munmap(reinterpret_cast<void*>(start + kBytes), first + reserved - start - kBytes);
    advise_pages(start, start + kBytes);
    return std::shared_ptr<Slab>(new Slab(start));
  }
  ~Slab() { ::munmap(reinterpret_cast<void*>(start_), kBytes); }
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;

  // The header address of a fresh buffer of `nbytes` (data kDataOffset after
  // its start, 64-byte aligned), or 0 when the slab has no room left.
  uintptr_t carve(size_t nbytes) {
    const uintptr_t begin = round_up(start_ + used_, kDataOffset);
    if (begin + kDataOffset + nbytes > start_ + kBytes) return 0;
    used_ = begin + kDataOffset + nbytes - start_;
    for (; touched_ < start_ + used_; touched_ += kHugePage) touch_huge_page(touched_, start_ + kBytes);
    return begin + kDataOffset - sizeof(size_t);
  }

  // Gives back the whole pages of [begin, end), a buffer that died.
  static void release(uintptr_t begin, uintptr_t end) {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t first = round_up(begin, page), last = end / page * page;
    if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }

  // Gives back the pages past the last buffer: a huge page that the last
  // buffer only began would otherwise stay resident whole.
  void release_tail() const {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t end = round_up(start_ + used_, page);
    const uintptr_t huge_end = std::min(round_up(start_ + used_, kHugePage), start_ + kBytes);
    if (huge_end > end) ::madvise(reinterpret_cast<void*>(end), huge_end - end, MADV_DONTNEED);
  }

 private:
  explicit Slab(uintptr_t start) : start_(start), touched_(start) {}
  uintptr_t start_;
  uintptr_t used_ = 0;
  uintptr_t touched_;  // the huge pages before it have been touched (touch_huge_page)
};

struct SlabState {
  std::mutex mutex;
  std::shared_ptr<Slab> current;
};

SlabState& slab_state() {
  static SlabState* state = new SlabState;  // never destroyed: buffers may outlive static destruction
  return *state;
}

std::optional<mx::allocator::Data> carve_from_slab(size_t nbytes) {
  if (!allocator_uses_size_header()) return std::nullopt;
  SlabState& state = slab_state();
  std::lock_guard lock(state.mutex);
  uintptr_t header = state.current ? state.current->carve(nbytes) : 0;
  if (header == 0) {
    state.current = Slab::make();
    if (!state.current) return std::nullopt;
    header = state.current->carve(nbytes);
  }
  *reinterpret_cast<size_t*>(header) = nbytes;
  const uintptr_t data = header + sizeof(size_t);
  return mx::allocator::Data(mx::allocator::Buffer(reinterpret_cast<void*>(header)),
                             [slab = state.current, data, nbytes](mx::allocator::Buffer) {
                               if (slab.use_count() > 1)
                                 Slab::release(data, data + nbytes);  // else unmapped now
                             });
}

// Below this, packed weights come from MLX's malloc: their pages are few.
constexpr size_t kSlabMinBytes = size_t{16} << 10;

mx::allocator::Data fresh_buffer(size_t nbytes, BufferLifetime lifetime) {
  if (lifetime != BufferLifetime::kRun && nbytes >= kOwnMappingBytes) {
    if (std::optional<mx::allocator::Data> mapped = map_buffer(nbytes)) return std::move(*mapped);
  } else if (lifetime == BufferLifetime::kPacked && nbytes >= kSlabMinBytes) {
    if (std::optional<mx::allocator::Data> carved = carve_from_slab(nbytes)) return std::move(*carved);
  }
  return mx::allocator::malloc(nbytes);
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
  DeferredCopy(std::span<const uint8_t> bytes, std::span<const uint8_t> region,
               std::shared_ptr<const void> owner, AfterCopy after_copy)
      : mx::UnaryPrimitive(mx::default_stream(mx::Device::cpu)),
        bytes_(bytes),
        region_(region),
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
  std::span<const uint8_t> region() const { return region_; }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  std::span<const uint8_t> bytes_;
  std::span<const uint8_t> region_;
  std::shared_ptr<const void> owner_;
  AfterCopy after_copy_;
};

// deferred_repack's primitive: no inputs (the source is held, so that MLX
// does not evaluate it first: a deferred copy is read where it lies), the
// repacking made on the evaluating thread.
class DeferredRepack : public mx::UnaryPrimitive {
 public:
  DeferredRepack(mx::array source, std::function<mx::array(const mx::array&)> repack,
                 std::function<void(const mx::array&)> after)
      : mx::UnaryPrimitive(mx::default_stream(mx::Device::cpu)),
        source_(std::move(source)),
        repack_(std::move(repack)),
        after_(std::move(after)) {}

  void eval_cpu(const std::vector<mx::array>& /*inputs*/, mx::array& out) override {
    if (!source_) throw std::logic_error("DeferredRepack evaluated twice");
    const mx::array made = repack_(*source_);
    if (!made.is_available() || made.shape() != out.shape() || made.dtype() != out.dtype() ||
        !made.flags().row_contiguous) {
      throw std::logic_error("deferred_repack: the repacking does not have the promised shape and type");
    }
    out.copy_shared_buffer(made);
    if (after_) after_(*source_);
    source_.reset();
  }
  void eval_gpu(const std::vector<mx::array>& /*inputs*/, mx::array& /*out*/) override {
    throw std::logic_error("DeferredRepack runs on the CPU stream only");
  }
  const char* name() const override { return "DeferredRepack"; }

  const std::optional<mx::array>& source() const { return source_; }

 private:
  std::optional<mx::array> source_;
  std::function<mx::array(const mx::array&)> repack_;
  std::function<void(const mx::array&)> after_;
};

}  // namespace

MlxBuffer::MlxBuffer(size_t nbytes, BufferLifetime lifetime) : data_(fresh_buffer(nbytes, lifetime)) {
  if (nbytes != 0 && data_.buffer().ptr() == nullptr) throw AllocationFailure{nbytes};
}

void release_packed_slab_tail() {
  SlabState& state = slab_state();
  std::lock_guard lock(state.mutex);
  if (state.current) state.current->release_tail();
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
                        const mx::Shape& shape, mx::Dtype dtype, AfterCopy after_copy,
                        std::span<const uint8_t> region) {
  auto primitive = std::make_shared<DeferredCopy>(bytes, region, std::move(owner), std::move(after_copy));
  mx::array out(shape, dtype, std::move(primitive), {});
  if (out.nbytes() != bytes.size())
    throw std::invalid_argument("deferred_copy: the bytes do not fill the array");
  return out;
}

namespace {

const DeferredCopy* pending_deferred_copy(const mx::array& a) {
  if (a.is_available() || !a.has_primitive()) return nullptr;
  return dynamic_cast<const DeferredCopy*>(&a.primitive());
}

}  // namespace

mx::array deferred_repack(const mx::array& source, const mx::Shape& shape, mx::Dtype dtype,
                          std::function<mx::array(const mx::array&)> repack,
                          std::function<void(const mx::array&)> after) {
  if (!source.is_available() && !deferred_bytes(source))
    throw std::invalid_argument("deferred_repack: the source must be evaluated or a deferred copy");
  return mx::array(shape, dtype,
                   std::make_shared<DeferredRepack>(source, std::move(repack), std::move(after)), {});
}

std::optional<mx::array> pending_repack_source(const mx::array& a) {
  if (a.is_available() || !a.has_primitive()) return std::nullopt;
  const auto* repack = dynamic_cast<const DeferredRepack*>(&a.primitive());
  if (repack == nullptr) return std::nullopt;
  return repack->source();
}

std::optional<std::span<const uint8_t>> deferred_bytes(const mx::array& a) {
  const DeferredCopy* copy = pending_deferred_copy(a);
  if (copy == nullptr) return std::nullopt;
  return copy->bytes();
}

std::optional<mx::array> deferred_rows_as_bytes(const mx::array& a) {
  const DeferredCopy* copy = pending_deferred_copy(a);
  if (copy == nullptr || a.ndim() == 0 || a.shape(0) == 0 || copy->region().empty()) return std::nullopt;
  const int rows = a.shape(0);
  const int64_t row_bytes = static_cast<int64_t>(a.nbytes()) / rows;
  if (row_bytes > std::numeric_limits<int>::max()) return std::nullopt;
  return alias_memory(copy->bytes(), copy->region(), copy->owner(), {rows, static_cast<int>(row_bytes)},
                      mx::uint8);
}

std::span<const uint8_t> host_bytes(const mx::array& a, bool as_float32, mx::array& keep) {
  // A reshape not evaluated yet has its input's row-major bytes: reading
  // those saves a round trip to the CPU stream (int8 MobileNetV2's 1x1
  // filters, seen as matrices: ~35 of them a load) and reads a deferred
  // input in place.
  if (!a.is_available() && a.has_primitive() && std::strcmp(a.primitive().name(), "Reshape") == 0 &&
      a.inputs().size() == 1 && a.inputs()[0].dtype() == a.dtype()) {
    return host_bytes(a.inputs()[0], as_float32, keep);
  }
  if (!as_float32 || a.dtype() == mx::float32) {
    if (std::optional<std::span<const uint8_t>> bytes = deferred_bytes(a)) {
      prefault_for_reading(*bytes);
      return *bytes;
    }
    // Already row-major in memory: read in place. mx::contiguous would copy an
    // array aliasing its model file, whose allocator header (the file's bytes
    // before it) gives no buffer size it can trust.
    if (a.is_available() && a.flags().row_contiguous && a.data_size() == a.size()) {
      keep = a;
      const std::span<const uint8_t> bytes{a.data<uint8_t>(), a.nbytes()};
      prefault_for_reading(bytes);
      return bytes;
    }
  }
  keep = as_float32 ? mx::astype(a, mx::float32, mx::Device::cpu) : a;
  keep = mx::contiguous(keep, false, mx::Device::cpu);
  keep.eval();
  return {keep.data<uint8_t>(), keep.nbytes()};
}

std::span<const float> host_floats(const mx::array& a, mx::array& keep) {
  const std::span<const uint8_t> bytes = host_bytes(a, /*as_float32=*/true, keep);
  return {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)};
}

}  // namespace transmuter
