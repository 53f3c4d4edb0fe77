// The allocator facts src/mlx_bridge/buffers.cpp relies on (zero-copy
// initializers); a failure here after an MLX upgrade means re-checking them.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "mlx_bridge/buffers.h"

namespace transmuter {
namespace {

TEST(MlxBridgeBuffers, CpuAllocatorKeepsASizeHeaderBeforeTheData) {
  // The CPU-only wheel cannot wrap foreign memory; zero-copy then depends on
  // this layout. If it changes, loading still works but copies.
  EXPECT_TRUE(allocator_uses_size_header());
}

TEST(MlxBridgeBuffers, AliasedArraysReadTheForeignBytesWithoutACopy) {
  std::vector<float> storage(8);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<float>(i);
  auto owner = std::make_shared<int>(0);
  std::span<const uint8_t> region(reinterpret_cast<const uint8_t*>(storage.data()), storage.size() * 4);
  // Elements 2..7: 8 bytes of the region lie before them, as the CPU layout needs.
  std::optional<mx::array> a = alias_memory(region.subspan(8), region, owner, {6}, mx::float32);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->data<float>(), storage.data() + 2) << "the array must point into the foreign memory";
  EXPECT_EQ(mx::sum(*a).item<float>(), 2.f + 3 + 4 + 5 + 6 + 7);
  storage[7] = 100.f;  // visible through the array: no copy was made
  EXPECT_EQ(mx::max(*a).item<float>(), 100.f);
  EXPECT_GT(owner.use_count(), 1) << "the array must keep the owner alive";
}

TEST(MlxBridgeBuffers, AliasingRefusesWhatItCannotWrapSafely) {
  std::vector<float> storage(8);
  auto owner = std::make_shared<int>(0);
  std::span<const uint8_t> region(reinterpret_cast<const uint8_t*>(storage.data()), storage.size() * 4);
  EXPECT_FALSE(alias_memory(region, region, owner, {8}, mx::float32).has_value())
      << "no 8 readable bytes before the data";
  EXPECT_FALSE(alias_memory(region.subspan(9, 4), region, owner, {1}, mx::float32).has_value()) << "misaligned";
  EXPECT_FALSE(alias_memory(region.subspan(8), region, nullptr, {6}, mx::float32).has_value()) << "no owner";
}

TEST(MlxBridgeBuffers, MlxBufferBecomesAnArray) {
  MlxBuffer buffer(3 * sizeof(int32_t));
  int32_t values[3] = {4, 5, 6};
  std::memcpy(buffer.as<int32_t>(), values, sizeof(values));
  mx::array a = buffer.into_array({3}, mx::int32);
  EXPECT_EQ(mx::sum(a).item<int32_t>(), 15);
}

TEST(MlxBridgeBuffers, LargeModelBuffersStartOnAHugePageAndComposeWithoutCopies) {
  // 2.25 MiB, a 768 x 768 float weight: a mapping of its own (see MlxBuffer).
  constexpr int kSide = 768;
  MlxBuffer buffer(size_t{kSide} * kSide * sizeof(float));
  float* data = buffer.as<float>();
  const auto address = reinterpret_cast<uintptr_t>(data);
  EXPECT_EQ(address % 64, 0u);
  EXPECT_EQ((address - 64) % (uintptr_t{2} << 20), 0u) << "the data start 64 bytes past a 2 MiB boundary";
  std::iota(data, data + kSide * kSide, 0.0f);
  mx::array a = buffer.into_array({kSide, kSide}, mx::float32);
  EXPECT_EQ(a.buffer_size(), a.nbytes()) << "MLX reads the size from the header before the data";
  EXPECT_FALSE(a.is_donatable()) << "the mapping is the array's own, not MLX's to reuse";
  // contiguous() of a row-major array shares its buffer only when the size header is right.
  mx::array same = mx::contiguous(a);
  same.eval();
  EXPECT_EQ(same.data<float>(), a.data<float>());
  mx::array keep = a;
  EXPECT_EQ(host_bytes(a, /*as_float32=*/true, keep).data(), reinterpret_cast<const uint8_t*>(data));
  EXPECT_EQ(mx::sum(mx::slice(a, {kSide - 1, 0}, {kSide, 2})).item<float>(),
            static_cast<float>(kSide * kSide - kSide) * 2 + 1);
}

// Whether each page of [data, data + bytes) is resident (mincore).
std::vector<bool> resident_pages(const void* data, size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
  std::vector<unsigned char> flags((end - begin) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, flags.data()) != 0) ADD_FAILURE() << "mincore";
  std::vector<bool> resident(flags.size());
  for (size_t i = 0; i < flags.size(); ++i) resident[i] = (flags[i] & 1) != 0;
  return resident;
}

size_t count_resident(const std::vector<bool>& pages) { return std::count(pages.begin(), pages.end(), true); }

TEST(MlxBridgeBuffers, PackedBuffersShareASlabAndGiveBackTheirPagesWhenTheyDie) {
  constexpr size_t kBytes = size_t{256} << 10;
  MlxBuffer first(kBytes, BufferLifetime::kPacked), second(kBytes, BufferLifetime::kPacked);
  auto* a = first.as<uint8_t>();
  auto* b = second.as<uint8_t>();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(b, a + kBytes + 64) << "carved one after the other, each after its 64-byte header slot";
  std::memset(a, 1, kBytes);
  std::memset(b, 2, kBytes);
  mx::array first_array = first.into_array({static_cast<int>(kBytes)}, mx::uint8);
  mx::array second_array = second.into_array({static_cast<int>(kBytes)}, mx::uint8);
  EXPECT_EQ(first_array.buffer_size(), kBytes) << "the size header MLX reads";
  EXPECT_FALSE(first_array.is_donatable()) << "the slab's memory, not MLX's to reuse";
  EXPECT_EQ(mx::sum(mx::astype(second_array, mx::int32)).item<int32_t>(), static_cast<int32_t>(2 * kBytes));
  EXPECT_EQ(count_resident(resident_pages(a, kBytes)), resident_pages(a, kBytes).size());
  first_array = mx::array(0);  // the first buffer dies while the second keeps the slab mapped
  const std::vector<bool> after = resident_pages(a, kBytes);
  EXPECT_LE(count_resident(after), 2u) << "at most the pages it shares with its neighbours stay";
  EXPECT_EQ(second_array.data<uint8_t>()[kBytes - 1], 2) << "the neighbour keeps its bytes";
}

TEST(MlxBridgeBuffers, TheSlabTailPastTheLastPackedBufferIsGivenBack) {
  constexpr size_t kBytes = size_t{64} << 10;
  MlxBuffer buffer(kBytes, BufferLifetime::kPacked);
  auto* data = buffer.as<uint8_t>();
  std::memset(data, 3, kBytes);
  mx::array array = buffer.into_array({static_cast<int>(kBytes)}, mx::uint8);
  // The pages after it up to the next 2 MiB boundary may have come in with a huge page.
  const auto end = reinterpret_cast<uintptr_t>(data) + kBytes;
  const uintptr_t boundary = (end + (uintptr_t{2} << 20) - 1) / (uintptr_t{2} << 20) * (uintptr_t{2} << 20);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t tail = (end + page - 1) / page * page;
  release_packed_slab_tail();
  if (boundary > tail) {
    EXPECT_EQ(count_resident(resident_pages(reinterpret_cast<void*>(tail), boundary - tail)), 0u);
  }
  EXPECT_EQ(count_resident(resident_pages(data, kBytes)), resident_pages(data, kBytes).size())
      << "the buffer itself stays";
  EXPECT_EQ(array.data<uint8_t>()[kBytes - 1], 3);
}

TEST(MlxBridgeBuffers, RunBuffersComeFromMlxsAllocator) {
  MlxBuffer buffer(size_t{3} << 20, BufferLifetime::kRun);
  mx::array a = buffer.into_array({static_cast<int>((size_t{3} << 20) / 4)}, mx::float32);
  EXPECT_TRUE(a.is_donatable()) << "MLX's own buffer, reused through its cache";
}

TEST(MlxBridgeBuffers, HostBytesReadAnEvaluatedRowMajorArrayInPlace) {
  // An array aliasing a model file has no trustworthy size header: host_bytes
  // must not go through mx::contiguous, which would copy it.
  std::vector<float> storage(1026);
  std::iota(storage.begin(), storage.end(), 0.0f);
  auto owner = std::make_shared<int>(0);
  std::span<const uint8_t> region(reinterpret_cast<const uint8_t*>(storage.data()), storage.size() * 4);
  std::optional<mx::array> a = alias_memory(region.subspan(8), region, owner, {32, 32}, mx::float32);
  ASSERT_TRUE(a.has_value());
  mx::array keep = *a;
  EXPECT_EQ(host_bytes(*a, /*as_float32=*/true, keep).data(), region.data() + 8);
  // A strided view is still made row-major (a copy).
  mx::array transposed = mx::transpose(*a);
  transposed.eval();
  const std::span<const uint8_t> bytes = host_bytes(transposed, /*as_float32=*/true, keep);
  float second;
  std::memcpy(&second, bytes.data() + sizeof(float), sizeof(float));
  EXPECT_EQ(second, storage[2 + 32]) << "element [0, 1] of the transpose";
}

TEST(MlxBridgeBuffers, DeferredCopyIsMadeWhenEvaluatedAndReportsItsPieces) {
  // 2.5 MiB of floats one byte past an aligned address: several 1 MiB pieces.
  constexpr size_t kCount = (size_t{5} << 19) / sizeof(float);
  auto storage = std::make_shared<std::vector<uint8_t>>(kCount * sizeof(float) + 8);
  std::span<const uint8_t> bytes(storage->data() + 1, kCount * sizeof(float));
  std::vector<float> values(kCount);
  std::iota(values.begin(), values.end(), 0.0f);
  std::memcpy(storage->data() + 1, values.data(), bytes.size());
  std::vector<std::span<const uint8_t>> pieces;
  mx::array a = deferred_copy(bytes, storage, {static_cast<int>(kCount)}, mx::float32,
                              [&](std::span<const uint8_t> piece) { pieces.push_back(piece); });

  ASSERT_TRUE(deferred_bytes(a).has_value()) << "not evaluated yet: its source bytes are readable in place";
  EXPECT_EQ(deferred_bytes(a)->data(), bytes.data());
  mx::array keep = a;
  EXPECT_EQ(host_bytes(a, /*as_float32=*/true, keep).data(), bytes.data()) << "read in place, no copy";
  EXPECT_FALSE(a.is_available());
  EXPECT_TRUE(pieces.empty());

  a.eval();
  EXPECT_FALSE(deferred_bytes(a).has_value());
  EXPECT_NE(a.data<uint8_t>(), bytes.data());
  EXPECT_EQ(std::memcmp(a.data<float>(), values.data(), bytes.size()), 0);
  ASSERT_GE(pieces.size(), 3u);
  const uint8_t* next = bytes.data();
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].data(), next) << "pieces follow each other";
    next = pieces[i].data() + pieces[i].size();
    if (i + 1 < pieces.size()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(next) % 4096, 0u) << "a piece ends on a page boundary";
    }
  }
  EXPECT_EQ(next, bytes.data() + bytes.size());
}

TEST(MlxBridgeBuffers, HostBytesReadUnderAReshapeWithoutEvaluatingIt) {
  auto storage = std::make_shared<std::vector<uint8_t>>(6 * sizeof(int8_t) + 1);
  const int8_t values[6] = {1, -2, 3, -4, 5, -6};
  std::memcpy(storage->data() + 1, values, sizeof(values));
  std::span<const uint8_t> bytes(storage->data() + 1, sizeof(values));
  mx::array filters = deferred_copy(bytes, storage, {3, 2, 1, 1}, mx::int8);  // a 1x1 conv's weight
  mx::array matrix = mx::reshape(filters, {3, 2});
  mx::array keep = matrix;
  EXPECT_EQ(host_bytes(matrix, /*as_float32=*/false, keep).data(), bytes.data())
      << "the file's bytes in place";
  EXPECT_FALSE(matrix.is_available());
  EXPECT_FALSE(filters.is_available()) << "no copy made";
  // Converted to float32, the reshape's values come in its row-major order.
  const std::span<const uint8_t> floats = host_bytes(matrix, /*as_float32=*/true, keep);
  ASSERT_EQ(floats.size(), 6 * sizeof(float));
  float converted[6];
  std::memcpy(converted, floats.data(), sizeof(converted));
  EXPECT_EQ(converted[3], -4.0f);
  // Another lazy op is evaluated as before.
  mx::array negated = mx::negative(matrix);
  const std::span<const uint8_t> evaluated = host_bytes(negated, /*as_float32=*/false, keep);
  EXPECT_NE(evaluated.data(), bytes.data());
  EXPECT_EQ(static_cast<int8_t>(evaluated[1]), 2);
}

TEST(MlxBridgeBuffers, ADeferredRepackIsMadeOnlyWhenEvaluated) {
  mx::array source = mx::arange(6.0f);
  source.eval();
  int repacks = 0;
  std::vector<float> released;
  auto reverse = [&](const mx::array& s) {
    ++repacks;
    mx::array made = mx::reshape(mx::slice(s, {5}, {-7}, {-1}), {2, 3});  // 5 4 3 / 2 1 0
    made = mx::contiguous(made);
    made.eval();
    return made;
  };
  mx::array later = deferred_repack(source, {2, 3}, mx::float32, reverse,
                                    [&](const mx::array& s) { released.push_back(s.data<float>()[5]); });
  ASSERT_TRUE(pending_repack_source(later).has_value());
  EXPECT_EQ(pending_repack_source(later)->data<float>(), source.data<float>()) << "the source itself";
  EXPECT_EQ(repacks, 0) << "nothing made before it is evaluated";
  EXPECT_FALSE(pending_repack_source(source).has_value()) << "any other array";

  EXPECT_EQ(mx::sum(later * mx::array({1.0f, 0.0f, 0.0f}))  // composes like any array
                .item<float>(),
            5.0f + 2.0f);
  EXPECT_EQ(repacks, 1);
  EXPECT_EQ(released, std::vector<float>{5.0f}) << "`after` saw the source once the repack was made";
  EXPECT_FALSE(pending_repack_source(later).has_value());
  EXPECT_EQ(later.data<float>()[1], 4.0f);

  mx::array unevaluated = mx::arange(3.0f) + 1.0f;
  EXPECT_THROW(deferred_repack(unevaluated, {3}, mx::float32, reverse), std::invalid_argument)
      << "a source that needs evaluating could not be repacked inside an evaluation";
  mx::array wrong = deferred_repack(source, {3, 2}, mx::float32, reverse);
  EXPECT_THROW(wrong.eval(), std::logic_error) << "a repacking of another shape";
}

TEST(MlxBridgeBuffers, DeferredCopiesComposeAndConvertLikeAnyArray) {
  auto storage = std::make_shared<std::vector<uint8_t>>(4 * sizeof(int32_t) + 3);
  const int32_t values[4] = {1, -2, 30, 400};
  std::memcpy(storage->data() + 3, values, sizeof(values));
  std::span<const uint8_t> bytes(storage->data() + 3, sizeof(values));
  mx::array a = deferred_copy(bytes, storage, {2, 2}, mx::int32);
  mx::array keep = a;
  const std::span<const uint8_t> floats = host_bytes(a, /*as_float32=*/true, keep);
  ASSERT_EQ(floats.size(), 4 * sizeof(float));
  float converted[4];
  std::memcpy(converted, floats.data(), sizeof(converted));
  EXPECT_EQ(converted[3], 400.0f) << "an int32 tensor read as float32 is converted";
  EXPECT_EQ(mx::sum(mx::transpose(a)).item<int32_t>(), 429);
  EXPECT_THROW(deferred_copy(bytes, storage, {3}, mx::int32), std::invalid_argument)
      << "the bytes must fill the array";
}

TEST(MlxBridgeBuffers, DeferredRowsAreWrappedAsBytesWhereTheyLie) {
  // A [3, 2] int32 table 11 bytes into its storage: misaligned for int32, never for bytes.
  auto storage = std::make_shared<std::vector<uint8_t>>(6 * sizeof(int32_t) + 16);
  const int32_t values[6] = {1, -2, 30, 400, -5000, 60000};
  std::memcpy(storage->data() + 11, values, sizeof(values));
  std::span<const uint8_t> bytes(storage->data() + 11, sizeof(values));
  mx::array table =
      deferred_copy(bytes, storage, {3, 2}, mx::int32, nullptr, std::span<const uint8_t>(*storage));

  std::optional<mx::array> rows = deferred_rows_as_bytes(table);
  ASSERT_TRUE(rows.has_value());
  EXPECT_EQ(rows->dtype(), mx::uint8);
  EXPECT_EQ(rows->shape(), (mx::Shape{3, 8}));
  EXPECT_EQ(rows->data<uint8_t>(), bytes.data()) << "no copy";
  // Row 2, read back as int32 through a gathered (aligned) copy.
  mx::array row = mx::view(mx::take(*rows, mx::array(2), 0), mx::int32);
  EXPECT_TRUE(mx::array_equal(row, mx::array({-5000, 60000})).item<bool>());
  EXPECT_FALSE(table.is_available()) << "the table itself is never copied";

  EXPECT_FALSE(deferred_rows_as_bytes(mx::array({1, 2})).has_value()) << "not a deferred copy";
  EXPECT_FALSE(deferred_rows_as_bytes(deferred_copy(bytes, storage, {3, 2}, mx::int32)).has_value())
      << "made without its region: whether the bytes before it are readable is unknown";
  table.eval();
  EXPECT_FALSE(deferred_rows_as_bytes(table).has_value()) << "copied already";
}

// The VmFlags of the mapping that holds `address` (/proc/self/smaps), or "" when none does.
std::string mapping_flags(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find('-') < line.find(' ')) {
      inside = begin <= target && target < end;
    } else if (inside && line.starts_with("VmFlags:")) {
      return line + " ";
    }
  }
  return "";
}

// Last in this file: stopping is for the rest of the process.
TEST(MlxBridgeBuffers, AfterASlowHugePageFreshBuffersAreAdvisedSmallPages) {
  constexpr size_t kBytes = size_t{4} << 20;  // a mapping of its own
  MlxBuffer before(kBytes, BufferLifetime::kModel);
  if (advising_huge_pages()) {  // no slow huge page in this process yet
    EXPECT_NE(mapping_flags(before.as<uint8_t>()).find(" hg "), std::string::npos)
        << mapping_flags(before.as<uint8_t>());
  }
  stop_advising_huge_pages();
  EXPECT_FALSE(advising_huge_pages());
  MlxBuffer model(kBytes, BufferLifetime::kModel);
  // Packed buffers just under 2 MiB until one is carved from a slab mapped after the stop (a slab
  // holds 32 MiB; the one in use may have been mapped before). Untouched, they cost no memory.
  std::vector<MlxBuffer> packed;
  for (int i = 0; i < 20; ++i) packed.emplace_back((size_t{2} << 20) - 4096, BufferLifetime::kPacked);
  for (MlxBuffer* buffer : {&model, &packed.back()}) {
    const std::string flags = mapping_flags(buffer->as<uint8_t>());
    EXPECT_NE(flags.find(" nh "), std::string::npos) << flags;
    EXPECT_EQ(flags.find(" hg "), std::string::npos) << flags;
  }
  std::memset(model.as<uint8_t>(), 5, kBytes);
  mx::array a = model.into_array({static_cast<int>(kBytes)}, mx::uint8);
  EXPECT_EQ(mx::sum(mx::astype(a, mx::int32)).item<int32_t>(), static_cast<int32_t>(5 * kBytes));
}

}  // namespace
}  // namespace transmuter
