// The allocator facts src/mlx_bridge/buffers.cpp relies on (zero-copy
// initializers); a failure here after an MLX upgrade means re-checking them.
#include <gtest/gtest.h>

#include <cstring>
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

}  // namespace
}  // namespace transmuter
