// A bounds-checked reader of the protobuf wire format over a byte span.
// https://protobuf.dev/programming-guides/encoding/
//
// It never copies length-delimited payloads (they come back as sub-spans of
// the input) and never reads past the span: every malformed input becomes a
// ModelFormatError whose message names the message path, e.g.
//   "model.onnx: graph.initializer[3] 'w': truncated length-delimited field 9"
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

namespace transmuter {

/** Where a message sits in the file, for error messages. Frames live on the
 * parser's stack and point at their parent; the root names the file. */
class MessagePath {
 public:
  /** The root: `file` is what messages start with ("model.onnx"). */
  explicit MessagePath(std::string file);
  /** A child message: `field` ("initializer"), its repeated index or -1,
   * and the message's name when known ("w"). */
  MessagePath(const MessagePath& parent, std::string_view field, int64_t index = -1,
              std::string name = {});
  MessagePath(const MessagePath&) = delete;
  MessagePath& operator=(const MessagePath&) = delete;

  /** Messages nest at most this deep (subgraphs in attributes in nodes...):
   * hostile files cannot exhaust the stack. */
  static constexpr int kMaxDepth = 256;

  void set_name(std::string name) { name_ = std::move(name); }
  int depth() const { return depth_; }
  const std::string& name() const { return name_; }

  /** "model.onnx: graph.initializer[3] 'w'" (just "model.onnx" at the root). */
  std::string text() const;
  /** Throws ModelFormatError "<text()>: <what>". */
  [[noreturn]] void fail(std::string_view what) const;

 private:
  void append_frames(std::string& out) const;

  const MessagePath* parent_ = nullptr;
  std::string label_;  // file at the root, field otherwise
  int64_t index_ = -1;
  std::string name_;
  int depth_ = 0;
};

/** Protobuf wire types; 3 and 4 (groups) are deprecated and rejected. */
enum class WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

/** Walks the fields of one message:
 *   WireReader r(bytes, path);
 *   while (r.next()) switch (r.field()) { case 1: x = r.int64(); break; default: r.skip(); }
 * After next() returns true, exactly one read or skip() must consume the value. */
class WireReader {
 public:
  WireReader(std::span<const uint8_t> bytes, const MessagePath& path);

  /** Reads the next tag; false at the end of the message. */
  bool next();
  uint32_t field() const { return field_; }
  WireType wire_type() const { return wire_type_; }

  // Raw reads of the current field's value; each checks the wire type.
  uint64_t varint();
  uint32_t fixed32();
  uint64_t fixed64();
  /** The payload of a length-delimited field, as a sub-span (no copy). */
  std::span<const uint8_t> bytes();

  // Typed reads with protobuf's conversions.
  int64_t int64() { return static_cast<int64_t>(varint()); }
  /** int32/enum: the varint's low 32 bits (negative values use 10 bytes). */
  int32_t int32() { return static_cast<int32_t>(static_cast<uint32_t>(varint())); }
  float float32();
  double float64();
  std::string string();

  // Repeated scalars, packed (one length-delimited field) or not (one value per tag).
  void append_int64s(std::vector<int64_t>& out);
  void append_uint64s(std::vector<uint64_t>& out);
  void append_int32s(std::vector<int32_t>& out);
  void append_floats(std::vector<float>& out);
  void append_doubles(std::vector<double>& out);

  /** Skips the current field's value, whatever its (valid) wire type. */
  void skip();

  /** Throws ModelFormatError naming the path, e.g. "<path>: field 9: <what>". */
  [[noreturn]] void fail(std::string_view what) const;
  const MessagePath& path() const { return path_; }

 private:
  void expect(WireType type);
  // `what` names the varint in an error, followed by the field's number when of_field.
  uint64_t read_varint_raw(const char* what, bool of_field = true);
  template <typename T, WireType kFixed>
  void append_fixed(std::vector<T>& out);
  template <typename T>
  void append_varints(std::vector<T>& out);

  const uint8_t* pos_;
  const uint8_t* end_;
  const MessagePath& path_;
  uint32_t field_ = 0;
  WireType wire_type_ = WireType::kVarint;
};

/** The first string found in field `field` of a message, or "" when absent or
 * malformed. Never throws: used to name a message in errors before parsing it. */
std::string peek_string_field(std::span<const uint8_t> message, uint32_t field);

/** A StringStringEntryProto (key = field 1, value = field 2): metadata_props
 * and TensorProto.external_data entries. */
std::pair<std::string, std::string> read_string_string_entry(std::span<const uint8_t> message,
                                                             const MessagePath& path);

}  // namespace transmuter
