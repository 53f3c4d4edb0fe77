// Reading and writing NumPy .npy files (format version 1.0/2.0/3.0, C order,
// little-endian): bool, int8..int64, uint8..uint64, float16/32/64, complex64.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <mlx/array.h>

namespace transmuter {

/** What an .npy header declares. */
struct NpyHeader {
  mlx::core::Dtype dtype = mlx::core::float32;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  uint64_t data_bytes = 0;  // product(shape) * itemsize, the exact size of the data
};

/** Parses the header's dict literal, e.g. "{'descr': '<f4', 'fortran_order':
 * False, 'shape': (2, 3), }" followed by padding. The keys 'descr',
 * 'fortran_order' and 'shape' may come in any order and are all required;
 * others are errors. Dimensions must fit MLX's int32 shapes; the byte size
 * is computed with checked arithmetic. Throws InputError naming `where`. */
NpyHeader parse_npy_header(std::string_view text, const std::string& where);

/** Reads an .npy file. The data must be exactly as long as the header's
 * shape and dtype say. Throws InputError naming the file and what is wrong. */
mlx::core::array read_npy(const std::filesystem::path& path);

/** Reads .npy bytes held in memory (a fuzzer's input); `where` names them in
 * errors. */
mlx::core::array read_npy_bytes(std::span<const uint8_t> bytes, const std::string& where);

/** Writes `a` (evaluated here) as an .npy file. bfloat16 is written as
 * float32 because NumPy has no bfloat16. Tensors of float8/float4/int4/int2
 * element types are held widened (each element exactly a value of the narrow
 * type) and written so, as float32, int8 or uint8: NumPy has no such dtypes
 * (ml_dtypes saves them as opaque '|V1' bytes). */
void write_npy(const std::filesystem::path& path, const mlx::core::array& a);

}  // namespace transmuter
