#include "onnx/tensor.h"

#include "onnx/mapped_file.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

#include "mlx_bridge/buffers.h"
#include "transmuter/dtype.h"
#include "transmuter/error.h"

namespace transmuter {

namespace fs = std::filesystem;

// ============================================================ float decoders

namespace {

// A finite value of a small float format with `man_bits` mantissa bits and
// exponent `bias` (subnormal when the exponent field is 0).
float decode_finite(uint32_t bits, int exp_bits, int man_bits, int bias) {
  const uint32_t mantissa = bits & ((1u << man_bits) - 1);
  const uint32_t exponent = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const bool negative = ((bits >> (man_bits + exp_bits)) & 1) != 0;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), 1 - bias - man_bits);
  } else {
    magnitude = std::ldexp(static_cast<float>((1u << man_bits) | mantissa),
                           static_cast<int>(exponent) - bias - man_bits);
  }
  return negative ? -magnitude : magnitude;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

// E4M3FN: no infinities; S.1111.111 is NaN, so the largest value is 448.
float float8e4m3fn_to_float(uint8_t bits) {
  if ((bits & 0x7F) == 0x7F) return kNaN;
  return decode_finite(bits, 4, 3, 7);
}

// FNUZ formats: no infinities, no negative zero; 0x80 is the only NaN.
float float8e4m3fnuz_to_float(uint8_t bits) {
  if (bits == 0x80) return kNaN;
  return decode_finite(bits, 4, 3, 8);
}

// E5M2 follows IEEE 754: exponent 31 is infinity (mantissa 0) or NaN.
float float8e5m2_to_float(uint8_t bits) {
  if ((bits & 0x7C) == 0x7C) {
    if ((bits & 0x03) != 0) return kNaN;
    return (bits & 0x80) ? -kInf : kInf;
  }
  return decode_finite(bits, 5, 2, 15);
}

float float8e5m2fnuz_to_float(uint8_t bits) {
  if (bits == 0x80) return kNaN;
  return decode_finite(bits, 5, 2, 16);
}

// E8M0: an exponent only, 2^(bits - 127); 0xFF is NaN (no zero, no sign).
float float8e8m0_to_float(uint8_t bits) {
  if (bits == 0xFF) return kNaN;
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

// E2M1: no NaN or infinity; values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives.
float float4e2m1_to_float(uint8_t bits) { return decode_finite(bits & 0x0F, 2, 1, 1); }

// ====================================================== external data files

ExternalDataStore::ExternalDataStore(fs::path base_dir, fs::path link_target_dir)
    : base_dir_(std::move(base_dir)), link_target_dir_(std::move(link_target_dir)) {}

namespace {

bool is_inside(const fs::path& folder, const fs::path& candidate) {
  auto [folder_end, candidate_pos] =
      std::mismatch(folder.begin(), folder.end(), candidate.begin(), candidate.end());
  return folder_end == folder.end();
}

}  // namespace

fs::path ExternalDataStore::resolve(const std::string& location, const MessagePath& path) {
  if (base_dir_.empty()) {
    path.fail(str("external data '", location, "' cannot be resolved: the model has no folder"));
  }
  if (location.empty()) path.fail("external data has no location");
  if (location.find('\0') != std::string::npos) path.fail("external data location holds a NUL byte");
  const fs::path relative(location);
  if (relative.is_absolute() || relative.has_root_name()) {
    path.fail(str("external data location '", location,
                  "' is absolute; it must be relative to the model's folder"));
  }
  std::error_code ec;
  const fs::path folder = fs::canonical(base_dir_, ec);
  if (ec) path.fail(str("model folder '", base_dir_.string(), "': ", ec.message()));
  // weakly_canonical follows every symlink that exists, so a link pointing
  // out of the folder resolves to its real target and fails the check below.
  const fs::path full = fs::weakly_canonical(folder / relative, ec);
  if (ec) path.fail(str("external data '", location, "': ", ec.message()));
  if (!link_target_dir_.empty() && is_inside(folder, (folder / relative).lexically_normal())) {
    const fs::path targets = fs::weakly_canonical(link_target_dir_, ec);
    if (!ec && is_inside(targets, full)) return full;
  }
  if (!is_inside(folder, full)) {
    path.fail(str("external data location '", location, "' resolves to '", full.string(),
                  "', outside the model's folder '", folder.string(), "'"));
  }
  return full;
}

ExternalDataStore::Bytes ExternalDataStore::read(const std::string& location, uint64_t offset,
                                                 std::optional<uint64_t> length,
                                                 const MessagePath& path) {
  const fs::path full = resolve(location, path);
  auto found = files_.find(full);
  if (found == files_.end()) {
    std::shared_ptr<const MappedFile> file;
    try {
      file = MappedFile::open(full);
    } catch (const Error& e) {
      path.fail(str("external data: ", e.what()));
    }
    found = files_.emplace(full, std::move(file)).first;
  }
  const MappedFile& file = *found->second;
  if (offset > file.size()) {
    path.fail(str("external data offset ", offset, " is past the end of '", location, "' (",
                  file.size(), " bytes)"));
  }
  const uint64_t available = file.size() - offset;
  const uint64_t count = length.value_or(available);
  if (count > available) {
    path.fail(str("external data [offset ", offset, ", length ", count, "] runs past the end of '",
                  location, "' (", file.size(), " bytes)"));
  }
  return {file.bytes().subspan(offset, count), found->second};
}

// ============================================================ TensorProto

namespace {

// The fields of one TensorProto, read in one pass before decoding (field
// order in the message is free, and the name helps every later error).
struct TensorFields {
  std::vector<int64_t> dims;
  int32_t data_type = 0;
  std::optional<std::span<const uint8_t>> raw_data;
  std::vector<float> float_data;
  std::vector<int32_t> int32_data;
  std::vector<std::string> string_data;
  std::vector<int64_t> int64_data;
  std::vector<double> double_data;
  std::vector<uint64_t> uint64_data;
  std::vector<std::pair<std::string, std::string>> external_data;
  int32_t data_location = 0;
  bool has_segment = false;
  std::string name;
};

TensorFields read_fields(std::span<const uint8_t> message, const MessagePath& path) {
  TensorFields t;
  WireReader reader(message, path);
  int external_index = 0;
  while (reader.next()) {
    switch (reader.field()) {
      case 1: reader.append_int64s(t.dims); break;
      case 2: t.data_type = reader.int32(); break;
      case 3: t.has_segment = true; reader.skip(); break;
      case 4: reader.append_floats(t.float_data); break;
      case 5: reader.append_int32s(t.int32_data); break;
      case 6: t.string_data.push_back(reader.string()); break;
      case 7: reader.append_int64s(t.int64_data); break;
      case 8: t.name = reader.string(); break;
      case 9: t.raw_data = reader.bytes(); break;
      case 10: reader.append_doubles(t.double_data); break;
      case 11: reader.append_uint64s(t.uint64_data); break;
      case 13: {
        MessagePath entry_path(path, "external_data", external_index++);
        t.external_data.push_back(read_string_string_entry(reader.bytes(), entry_path));
        break;
      }
      case 14: t.data_location = reader.int32(); break;
      default: reader.skip();
    }
  }
  return t;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i != 0) out += ',';
    out += std::to_string(dims[i]);
  }
  out += ']';
  return out;
}

// Checks the dims fit MLX (int32 per dimension) and returns the element count.
uint64_t checked_element_count(const std::vector<int64_t>& dims, const MessagePath& path) {
  uint64_t count = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i];
    if (d < 0) path.fail(str("negative dimension ", d, " at index ", i, " in dims ", dims_text(dims)));
    if (d > std::numeric_limits<int32_t>::max()) {
      path.fail(str("dimension ", d, " at index ", i,
                    " exceeds the int32 range of MLX shapes in dims ", dims_text(dims)));
    }
    // Bound by 2^62 so that byte counts (count * 16 at most) cannot overflow.
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count) || count > (1ull << 58)) {
      path.fail(str("element count of dims ", dims_text(dims), " overflows"));
    }
  }
  return count;
}

// How element values are stored and what they become.
enum class Storage {
  kDirect,    // bytes are already the MLX element type
  kBool,      // one byte per element, normalized to 0/1
  kFloat8,    // one byte per element, decoded to float32
  kPacked4,   // two 4-bit elements per byte
  kPacked2,   // four 2-bit elements per byte
  kString,
};

struct TypeInfo {
  Storage storage;
  mx::Dtype dtype;        // of the decoded array
  size_t stored_bits;     // bits per element in raw_data
};

TypeInfo type_info(OnnxType type, const MessagePath& path) {
  switch (type) {
    case OnnxType::kString: return {Storage::kString, mx::uint8, 0};
    case OnnxType::kBool: return {Storage::kBool, mx::bool_, 8};
    case OnnxType::kFloat8E4M3FN: case OnnxType::kFloat8E4M3FNUZ: case OnnxType::kFloat8E5M2:
    case OnnxType::kFloat8E5M2FNUZ: case OnnxType::kFloat8E8M0:
      return {Storage::kFloat8, mx::float32, 8};
    case OnnxType::kFloat4E2M1: return {Storage::kPacked4, mx::float32, 4};
    case OnnxType::kInt4: return {Storage::kPacked4, mx::int8, 4};
    case OnnxType::kUint4: return {Storage::kPacked4, mx::uint8, 4};
    case OnnxType::kInt2: return {Storage::kPacked2, mx::int8, 2};
    case OnnxType::kUint2: return {Storage::kPacked2, mx::uint8, 2};
    case OnnxType::kComplex128:
      path.fail("complex128 tensors are not supported (MLX has no complex128)");
    case OnnxType::kUndefined: path.fail("tensor has no data_type (UNDEFINED)");
    default: break;
  }
  const std::optional<mx::Dtype> dtype = to_mlx_dtype(type);
  if (!dtype) path.fail(str("unknown tensor data_type ", static_cast<int32_t>(type)));
  return {Storage::kDirect, *dtype, 8 * static_cast<size_t>(mx::size_of(*dtype))};
}

// Bytes that `count` elements take in raw_data (sub-byte types packed).
uint64_t stored_byte_count(const TypeInfo& info, uint64_t count, const std::vector<int64_t>& dims,
                           const MessagePath& path) {
  uint64_t bits = 0;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(info.stored_bits), &bits)) {
    path.fail(str("byte size of dims ", dims_text(dims), " overflows"));
  }
  return bits / 8 + (bits % 8 != 0);
}

mx::Shape to_shape(const std::vector<int64_t>& dims) {
  mx::Shape shape;
  for (int64_t d : dims) shape.push_back(static_cast<int32_t>(d));
  return shape;
}

mx::array copy_bytes(const uint8_t* src, size_t nbytes, const mx::Shape& shape, mx::Dtype dtype) {
  MlxBuffer out(nbytes);
  if (nbytes != 0) std::memcpy(out.as<uint8_t>(), src, nbytes);
  return out.into_array(shape, dtype);
}

using ByteDecoder = float (*)(uint8_t);

ByteDecoder float8_decoder(OnnxType type) {
  switch (type) {
    case OnnxType::kFloat8E4M3FN: return float8e4m3fn_to_float;
    case OnnxType::kFloat8E4M3FNUZ: return float8e4m3fnuz_to_float;
    case OnnxType::kFloat8E5M2: return float8e5m2_to_float;
    case OnnxType::kFloat8E5M2FNUZ: return float8e5m2fnuz_to_float;
    case OnnxType::kFloat8E8M0: return float8e8m0_to_float;
    default: return float4e2m1_to_float;
  }
}

// Decodes `count` one-byte float8 values through a 256-entry table.
mx::array decode_float8(std::span<const uint8_t> bytes, OnnxType type, const mx::Shape& shape) {
  float table[256];
  const ByteDecoder decode = float8_decoder(type);
  for (int b = 0; b < 256; ++b) table[b] = decode(static_cast<uint8_t>(b));
  MlxBuffer out(bytes.size() * sizeof(float));
  float* dst = out.as<float>();
  for (size_t i = 0; i < bytes.size(); ++i) dst[i] = table[bytes[i]];
  return out.into_array(shape, mx::float32);
}

// Unpacks sub-byte elements, first element in the least significant bits.
mx::array unpack_bits(std::span<const uint8_t> bytes, uint64_t count, OnnxType type, int bits,
                      const mx::Shape& shape) {
  const int per_byte = 8 / bits;
  const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
  auto element = [&](uint64_t i) {
    return static_cast<uint8_t>((bytes[i / per_byte] >> (bits * (i % per_byte))) & mask);
  };
  if (type == OnnxType::kFloat4E2M1) {
    MlxBuffer out(count * sizeof(float));
    float* dst = out.as<float>();
    for (uint64_t i = 0; i < count; ++i) dst[i] = float4e2m1_to_float(element(i));
    return out.into_array(shape, mx::float32);
  }
  const bool is_signed = type == OnnxType::kInt4 || type == OnnxType::kInt2;
  MlxBuffer out(count);
  uint8_t* dst = out.as<uint8_t>();
  const int shift = 8 - bits;
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t v = element(i);
    // Two's complement sign extension of a `bits`-wide field.
    dst[i] = is_signed ? static_cast<uint8_t>(static_cast<int8_t>(v << shift) >> shift) : v;
  }
  return out.into_array(shape, is_signed ? mx::int8 : mx::uint8);
}

// Wraps `bytes`, which lie in `memory.region` kept alive by `memory.owner`,
// as an array without a copy, where MLX allows it (src/mlx_bridge/buffers.h).
std::optional<mx::array> alias_bytes(std::span<const uint8_t> bytes, const mx::Shape& shape,
                                     mx::Dtype dtype, const OwnedMemory& memory) {
  return alias_memory(bytes, memory.region, memory.owner, shape, dtype);
}

// Tensors at least this large that cannot be aliased are copied when first
// evaluated, not while the file is read: most are weights that a load-time
// pass repacks from the bytes where they lie (84-89 % of the bytes of
// onnx.helper-made models sit misaligned, 32 % of a PyTorch export's).
constexpr size_t kDeferredCopyBytes = size_t{64} << 10;

// A copy of bytes that could not be aliased (misaligned in the file, most
// often). The file pages they came from are released once copied: they would
// otherwise stay resident beside the copy, doubling the weights' share of the
// peak RSS.
mx::array copy_out_of(std::span<const uint8_t> bytes, const mx::Shape& shape, mx::Dtype dtype,
                      const OwnedMemory& memory) {
  AfterCopy release = nullptr;
  if (memory.file_mapping) release = [](std::span<const uint8_t> copied) { release_mapped_pages(copied); };
  if (memory.owner != nullptr && bytes.size() >= kDeferredCopyBytes) {
    return deferred_copy(bytes, memory.owner, shape, dtype, std::move(release), memory.region);
  }
  mx::array copy = copy_bytes(bytes.data(), bytes.size(), shape, dtype);
  if (release) release(bytes);
  return copy;
}

// Decodes raw little-endian element bytes (raw_data or external data).
mx::array decode_raw(std::span<const uint8_t> bytes, const char* origin, OnnxType type,
                     const TypeInfo& info, uint64_t count, const std::vector<int64_t>& dims,
                     const OwnedMemory& memory, const MessagePath& path) {
  const uint64_t expected = stored_byte_count(info, count, dims, path);
  if (bytes.size() != expected) {
    path.fail(str(origin, " has ", bytes.size(), " bytes, expected ", expected, " for ",
                  onnx_type_name(type), dims_text(dims)));
  }
  const mx::Shape shape = to_shape(dims);
  switch (info.storage) {
    case Storage::kDirect:
      if (auto aliased = alias_bytes(bytes, shape, info.dtype, memory)) return *aliased;
      return copy_out_of(bytes, shape, info.dtype, memory);
    case Storage::kBool: {
      bool canonical = true;
      for (uint8_t b : bytes) canonical &= b <= 1;
      if (canonical) {
        if (auto aliased = alias_bytes(bytes, shape, info.dtype, memory)) return *aliased;
      }
      MlxBuffer out(count);
      uint8_t* dst = out.as<uint8_t>();
      for (uint64_t i = 0; i < count; ++i) dst[i] = bytes[i] != 0;
      return out.into_array(shape, mx::bool_);
    }
    case Storage::kFloat8: return decode_float8(bytes, type, shape);
    case Storage::kPacked4: return unpack_bits(bytes, count, type, 4, shape);
    case Storage::kPacked2: return unpack_bits(bytes, count, type, 2, shape);
    case Storage::kString: break;
  }
  path.fail(str(origin, " cannot hold ", onnx_type_name(type), " values (use string_data)"));
}

template <typename T>
void check_count(const std::vector<T>& values, uint64_t expected, const char* field, OnnxType type,
                 const std::vector<int64_t>& dims, const MessagePath& path) {
  if (values.size() != expected) {
    path.fail(str(onnx_type_name(type), dims_text(dims), " expects ", expected, " values in ",
                  field, ", found ", values.size()));
  }
}

// Narrows each int32_data entry to the element's storage width (the spec
// stores 8- and 16-bit elements, and fp16/bf16/fp8 bit patterns, one per
// int32; 4-bit and 2-bit elements packed per byte).
template <typename T>
mx::array narrow_int32s(const std::vector<int32_t>& values, const mx::Shape& shape, mx::Dtype dtype) {
  MlxBuffer out(values.size() * sizeof(T));
  T* dst = out.as<T>();
  for (size_t i = 0; i < values.size(); ++i) {
    dst[i] = static_cast<T>(static_cast<uint32_t>(values[i]));
  }
  return out.into_array(shape, dtype);
}

template <typename Src, typename Dst>
mx::array convert_values(const std::vector<Src>& values, const mx::Shape& shape, mx::Dtype dtype) {
  MlxBuffer out(values.size() * sizeof(Dst));
  Dst* dst = out.as<Dst>();
  for (size_t i = 0; i < values.size(); ++i) dst[i] = static_cast<Dst>(values[i]);
  return out.into_array(shape, dtype);
}

// Decodes the type-specific repeated fields (float_data, int32_data, ...).
mx::array decode_typed(const TensorFields& t, OnnxType type, const TypeInfo& info, uint64_t count,
                       const MessagePath& path) {
  const mx::Shape shape = to_shape(t.dims);
  auto bytes_of = [](const std::vector<int32_t>& values) {
    std::vector<uint8_t> bytes(values.size());
    for (size_t i = 0; i < values.size(); ++i) bytes[i] = static_cast<uint8_t>(values[i]);
    return bytes;
  };
  switch (type) {
    case OnnxType::kFloat:
      check_count(t.float_data, count, "float_data", type, t.dims, path);
      return convert_values<float, float>(t.float_data, shape, mx::float32);
    case OnnxType::kComplex64: {
      check_count(t.float_data, 2 * count, "float_data", type, t.dims, path);
      const auto* src = reinterpret_cast<const uint8_t*>(t.float_data.data());
      return copy_bytes(src, t.float_data.size() * sizeof(float), shape, mx::complex64);
    }
    case OnnxType::kDouble:
      check_count(t.double_data, count, "double_data", type, t.dims, path);
      return convert_values<double, double>(t.double_data, shape, mx::float64);
    case OnnxType::kInt64:
      check_count(t.int64_data, count, "int64_data", type, t.dims, path);
      return convert_values<int64_t, int64_t>(t.int64_data, shape, mx::int64);
    case OnnxType::kUint32:
      check_count(t.uint64_data, count, "uint64_data", type, t.dims, path);
      return convert_values<uint64_t, uint32_t>(t.uint64_data, shape, mx::uint32);
    case OnnxType::kUint64:
      check_count(t.uint64_data, count, "uint64_data", type, t.dims, path);
      return convert_values<uint64_t, uint64_t>(t.uint64_data, shape, mx::uint64);
    case OnnxType::kInt32:
      check_count(t.int32_data, count, "int32_data", type, t.dims, path);
      return convert_values<int32_t, int32_t>(t.int32_data, shape, mx::int32);
    case OnnxType::kInt16: case OnnxType::kUint16: case OnnxType::kFloat16:
    case OnnxType::kBfloat16:
      check_count(t.int32_data, count, "int32_data", type, t.dims, path);
      return narrow_int32s<uint16_t>(t.int32_data, shape, info.dtype);
    case OnnxType::kInt8: case OnnxType::kUint8:
      check_count(t.int32_data, count, "int32_data", type, t.dims, path);
      return narrow_int32s<uint8_t>(t.int32_data, shape, info.dtype);
    case OnnxType::kBool:
      check_count(t.int32_data, count, "int32_data", type, t.dims, path);
      return convert_values<int32_t, bool>(t.int32_data, shape, mx::bool_);
    default: break;
  }
  // One byte (or one packed byte of sub-byte elements) per int32_data entry.
  const uint64_t expected = stored_byte_count(info, count, t.dims, path);
  check_count(t.int32_data, expected, "int32_data", type, t.dims, path);
  const std::vector<uint8_t> bytes = bytes_of(t.int32_data);
  switch (info.storage) {
    case Storage::kFloat8: return decode_float8(bytes, type, shape);
    case Storage::kPacked4: return unpack_bits(bytes, count, type, 4, shape);
    case Storage::kPacked2: return unpack_bits(bytes, count, type, 2, shape);
    default: break;
  }
  path.fail(str("cannot decode ", onnx_type_name(type), " from typed fields"));
}

std::optional<uint64_t> parse_uint(const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

mx::array decode_external(const TensorFields& t, OnnxType type, const TypeInfo& info,
                          uint64_t count, const TensorSource& source, const MessagePath& path) {
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  for (const auto& [key, value] : t.external_data) {
    if (key == "location") {
      location = value;
    } else if (key == "offset" || key == "length") {
      const std::optional<uint64_t> number = parse_uint(value);
      if (!number) path.fail(str("external data ", key, " '", value, "' is not a number"));
      if (key == "offset") {
        offset = *number;
      } else {
        length = *number;
      }
    }
    // "checksum" and unknown keys are ignored.
  }
  if (source.external == nullptr) {
    path.fail(str("external data '", location, "' is not available when reading from memory"));
  }
  const ExternalDataStore::Bytes data = source.external->read(location, offset, length, path);
  const OwnedMemory memory{data.owner, data.owner->aliasable(), /*file_mapping=*/true};
  return decode_raw(data.bytes, "external data", type, info, count, t.dims, memory, path);
}

Value decode_strings(const TensorFields& t, uint64_t count, const MessagePath& path) {
  check_count(t.string_data, count, "string_data", OnnxType::kString, t.dims, path);
  return StringTensor{t.dims, t.string_data};
}

[[noreturn]] void fail_allocation(const AllocationFailure& failure, const MessagePath& path) {
  path.fail(str("cannot allocate ", failure.nbytes, " bytes for the decoded tensor"));
}

NamedValue decode_tensor(std::span<const uint8_t> message, const MessagePath& path,
                         const TensorSource& source) {
  TensorFields t = read_fields(message, path);
  if (t.has_segment) path.fail("segmented tensors (TensorProto.segment) are not supported");
  const auto type = static_cast<OnnxType>(t.data_type);
  const TypeInfo info = type_info(type, path);
  const uint64_t count = checked_element_count(t.dims, path);
  NamedValue out{std::move(t.name), Value()};
  if (t.data_location == 1) {
    if (info.storage == Storage::kString) path.fail("string tensors cannot use external data");
    out.value = decode_external(t, type, info, count, source, path);
  } else if (t.data_location != 0) {
    path.fail(str("unknown data_location ", t.data_location));
  } else if (info.storage == Storage::kString) {
    out.value = decode_strings(t, count, path);
  } else if (t.raw_data) {
    out.value = decode_raw(*t.raw_data, "raw_data", type, info, count, t.dims, source.memory, path);
  } else {
    out.value = decode_typed(t, type, info, count, path);
  }
  // float8, int4... are decoded widened; the value keeps its ONNX type.
  if (out.value.is_tensor()) out.value = Value(out.value.tensor(), type);
  return out;
}

}  // namespace

NamedValue read_tensor(std::span<const uint8_t> message, const MessagePath& path,
                       const TensorSource& source) {
  try {
    return decode_tensor(message, path, source);
  } catch (const AllocationFailure& failure) {
    fail_allocation(failure, path);
  }
}

// ====================================================== SparseTensorProto

namespace {

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return std::numeric_limits<uint64_t>::max();
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(pages), static_cast<uint64_t>(page_size),
                             &bytes)) {
    return std::numeric_limits<uint64_t>::max();
  }
  return bytes;
}

// The dense form of a sparse tensor is not in the file, so a few bytes could
// otherwise ask for terabytes. Refused before anything is allocated.
void check_dense_size(uint64_t dense_count, size_t itemsize, const std::vector<int64_t>& dims,
                      const MessagePath& path) {
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(dense_count, static_cast<uint64_t>(itemsize), &bytes)) {
    path.fail(str("byte size of sparse tensor dims ", dims_text(dims), " overflows"));
  }
  const uint64_t physical = physical_memory_bytes();
  const uint64_t limit = std::min(kMaxSparseDenseBytes, physical);
  if (bytes <= limit) return;
  const char* what =
      limit == physical ? "the machine's physical memory" : "the limit for densified sparse tensors";
  path.fail(str("sparse tensor of dims ", dims_text(dims), " would densify to ", bytes,
                " bytes, more than ", what, " (", limit, " bytes)"));
}

// Scatters `values` (one element of `itemsize` bytes each) into a zeroed
// dense buffer at the linear positions given by `indices`.
mx::array densify(const mx::array& values, const std::vector<int64_t>& positions,
                  const std::vector<int64_t>& dims, uint64_t dense_count, const MessagePath& path) {
  const size_t itemsize = values.itemsize();
  check_dense_size(dense_count, itemsize, dims, path);
  MlxBuffer out(dense_count * itemsize);
  uint8_t* dst = out.as<uint8_t>();
  if (dense_count != 0) std::memset(dst, 0, dense_count * itemsize);
  const mx::array contiguous = mx::contiguous(values);
  mx::eval(contiguous);
  const auto* src = contiguous.data<uint8_t>();
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t p = positions[i];
    if (p < 0 || static_cast<uint64_t>(p) >= dense_count) {
      path.fail(str("sparse index ", p, " (value ", i, ") is outside dims ", dims_text(dims)));
    }
    std::memcpy(dst + p * itemsize, src + i * itemsize, itemsize);
  }
  return out.into_array(to_shape(dims), values.dtype());
}

std::vector<int64_t> host_int64s(const mx::array& a) {
  const mx::array wide = mx::contiguous(mx::astype(a, mx::int64));
  mx::eval(wide);
  const int64_t* data = wide.data<int64_t>();
  return {data, data + wide.size()};
}

NamedValue decode_sparse_tensor(std::span<const uint8_t> message, const MessagePath& path,
                                const TensorSource& source) {
  std::optional<NamedValue> values;
  std::optional<NamedValue> indices;
  std::vector<int64_t> dims;
  WireReader reader(message, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: {
        const auto bytes = reader.bytes();
        MessagePath sub(path, "values", -1, peek_string_field(bytes, 8));
        values = read_tensor(bytes, sub, source);
        break;
      }
      case 2: {
        const auto bytes = reader.bytes();
        MessagePath sub(path, "indices", -1, peek_string_field(bytes, 8));
        indices = read_tensor(bytes, sub, source);
        break;
      }
      case 3: reader.append_int64s(dims); break;
      default: reader.skip();
    }
  }
  if (!values || !indices) path.fail("sparse tensor lacks values or indices");
  if (!values->value.is_tensor()) path.fail("sparse string tensors are not supported");
  if (!indices->value.is_tensor()) path.fail("sparse tensor indices must be integers");
  const mx::array& vals = values->value.tensor();
  const mx::array& idx = indices->value.tensor();
  if (!mx::issubdtype(idx.dtype(), mx::integer)) path.fail("sparse tensor indices must be integers");
  const uint64_t dense_count = checked_element_count(dims, path);
  const size_t nnz = vals.size();
  std::vector<int64_t> raw = host_int64s(idx);
  std::vector<int64_t> positions;
  if (idx.ndim() == 1 && idx.size() == nnz) {
    positions = std::move(raw);  // linear indices
  } else if (idx.ndim() == 2 && static_cast<size_t>(idx.shape(0)) == nnz &&
             static_cast<size_t>(idx.shape(1)) == dims.size()) {
    positions.resize(nnz);  // [NNZ, rank] coordinates, row-major
    for (size_t i = 0; i < nnz; ++i) {
      int64_t linear = 0;
      for (size_t d = 0; d < dims.size(); ++d) {
        const int64_t c = raw[i * dims.size() + d];
        if (c < 0 || c >= dims[d]) {
          path.fail(str("sparse index ", c, " (value ", i, ", axis ", d, ") is outside dims ",
                        dims_text(dims)));
        }
        linear = linear * dims[d] + c;
      }
      positions[i] = linear;
    }
  } else {
    path.fail(str("sparse indices of shape ", idx.ndim() == 1 ? "[N]" : "[N,r]", " do not match ",
                  nnz, " values and dims ", dims_text(dims)));
  }
  return {values->name, densify(vals, positions, dims, dense_count, path)};
}

}  // namespace

NamedValue read_sparse_tensor(std::span<const uint8_t> message, const MessagePath& path,
                              const TensorSource& source) {
  try {
    return decode_sparse_tensor(message, path, source);
  } catch (const AllocationFailure& failure) {
    fail_allocation(failure, path);
  }
}

}  // namespace transmuter
