// TensorProto (and SparseTensorProto) -> Value, for every ONNX element type.
//
// raw_data that lies in memory kept alive by `TensorSource::owner` (the model
// mapping, or an external data file's mapping) becomes an mx::array over that
// memory without a copy when the element type needs no conversion and the
// address is aligned to the element size. Everything else is copied, and
// types MLX lacks are widened: float8*/float4e2m1/float8e8m0 -> float32,
// int4/int2 -> int8, uint4/uint2 -> uint8 (exact decoding, as
// onnx.numpy_helper.to_array does).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "onnx/mapped_file.h"
#include "onnx/wire_reader.h"
#include "transmuter/value.h"

namespace transmuter {

/** The external data files of one model, each mapped once (keyed by its
 * canonical path). Locations must resolve inside `base_dir`, the model's
 * folder: absolute paths, `..` escapes and symlinks leading out are errors. */
class ExternalDataStore {
 public:
  /** An empty `base_dir` disables external data (every use is an error).
   * A non-empty `link_target_dir` lets symlinks inside `base_dir` lead into that
   * folder too (a hub snapshot's links into its repo's blobs/); the location
   * itself must still stay inside `base_dir` before links are followed. */
  explicit ExternalDataStore(std::filesystem::path base_dir, std::filesystem::path link_target_dir = {});

  struct Bytes {
    std::span<const uint8_t> bytes;
    std::shared_ptr<const MappedFile> owner;
  };
  /** Bytes [offset, offset + length) of `location`; no length: to the end. */
  Bytes read(const std::string& location, uint64_t offset, std::optional<uint64_t> length,
             const MessagePath& path);
  /** How many distinct files have been mapped (for tests). */
  size_t mapped_file_count() const { return files_.size(); }

 private:
  std::filesystem::path resolve(const std::string& location, const MessagePath& path);

  std::filesystem::path base_dir_;
  std::filesystem::path link_target_dir_;
  std::map<std::filesystem::path, std::shared_ptr<const MappedFile>> files_;
};

/** Memory that arrays may alias: `owner` keeps all of `region` alive. */
struct OwnedMemory {
  std::shared_ptr<const void> owner;  // null: nothing may be aliased
  std::span<const uint8_t> region;
  // `region` is a MappedFile: pages of bytes copied out of it may be released
  // (release_mapped_pages), which would zero anonymous memory.
  bool file_mapping = false;
};

/** Where a TensorProto's bytes live. */
struct TensorSource {
  /** The memory the messages lie in; raw_data inside it may be aliased.
   * MLX never writes into aliased memory (it never donates a buffer it does
   * not own), yet model mappings are writable private pages all the same. */
  OwnedMemory memory;
  /** Resolves data_location=EXTERNAL; null: external data is an error. */
  ExternalDataStore* external = nullptr;
};

/** A decoded tensor and its TensorProto.name. */
struct NamedValue {
  std::string name;
  Value value;
};

/** Decodes a TensorProto. Numeric types give an mx::array, STRING a
 * StringTensor. Throws ModelFormatError naming `path` (which should carry
 * the tensor's name) on malformed or inconsistent data. */
NamedValue read_tensor(std::span<const uint8_t> message, const MessagePath& path,
                       const TensorSource& source);

/** The most bytes a sparse tensor's dense form may take (also never more
 * than the machine's physical memory): that form is not in the file, so a
 * 200-byte message could otherwise ask for terabytes. */
inline constexpr uint64_t kMaxSparseDenseBytes = uint64_t{16} << 30;

/** Decodes a SparseTensorProto into the dense tensor it stands for (zeros
 * where no value is given). The name is that of its `values` tensor. Dense
 * forms over kMaxSparseDenseBytes are a ModelFormatError. */
NamedValue read_sparse_tensor(std::span<const uint8_t> message, const MessagePath& path,
                              const TensorSource& source);

/** Exact decoders of the 8-bit and 4-bit float formats (ONNX spec,
 * docs/technical/float8.md; NaN and infinity encodings per format). */
float float8e4m3fn_to_float(uint8_t bits);
float float8e4m3fnuz_to_float(uint8_t bits);
float float8e5m2_to_float(uint8_t bits);
float float8e5m2fnuz_to_float(uint8_t bits);
float float8e8m0_to_float(uint8_t bits);
/** `bits` holds one float4e2m1 value in its low 4 bits. */
float float4e2m1_to_float(uint8_t bits);

}  // namespace transmuter
