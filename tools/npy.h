// Reading and writing NumPy .npy files (format version 1.0/2.0/3.0, C order,
// little-endian): bool, int8..int64, uint8..uint64, float16/32/64, complex64.
#pragma once

#include <filesystem>

#include <mlx/array.h>

namespace transmuter {

/** Reads an .npy file; throws transmuter::Error naming the file on bad input. */
mlx::core::array read_npy(const std::filesystem::path& path);

/** Writes `a` (evaluated here) as an .npy file. bfloat16 is written as
 * float32 because NumPy has no bfloat16. */
void write_npy(const std::filesystem::path& path, const mlx::core::array& a);

}  // namespace transmuter
