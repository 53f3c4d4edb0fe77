// Byte counts and the machine's memory, for the limits that keep MLX from
// allocating what it cannot (its CPU allocator does not report failures).
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/array.h>

namespace transmuter {

/** Bytes a tensor of `shape` and `dtype` needs, or nullopt when a dim is
 * negative or the count overflows 64 bits. */
std::optional<uint64_t> checked_nbytes(const mlx::core::Shape& shape, mlx::core::Dtype dtype);

/** The machine's physical memory in bytes (the default memory limit). */
uint64_t physical_memory_bytes();

}  // namespace transmuter
