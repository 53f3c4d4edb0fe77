#include "onnx/wire_reader.h"

#include <bit>
#include <cstring>

#include "transmuter/error.h"

namespace transmuter {

static_assert(std::endian::native == std::endian::little,
              "the wire format and ONNX raw_data are little-endian; add byte swaps to port");

// ---------------------------------------------------------------- MessagePath

MessagePath::MessagePath(std::string file) : label_(std::move(file)) {}

MessagePath::MessagePath(const MessagePath& parent, std::string_view field, int64_t index,
                         std::string name)
    : parent_(&parent), label_(field), index_(index), name_(std::move(name)),
      depth_(parent.depth_ + 1) {
  if (depth_ > kMaxDepth) parent.fail(str("messages nest deeper than ", kMaxDepth, " levels"));
}

void MessagePath::append_frames(std::string& out) const {
  if (parent_ == nullptr) return;  // the root is the file, written separately
  parent_->append_frames(out);
  if (parent_->parent_ != nullptr) out += '.';
  out += label_;
  if (index_ >= 0) out += str('[', index_, ']');
  if (!name_.empty()) out += str(" '", name_, "'");
}

std::string MessagePath::text() const {
  const MessagePath* root = this;
  while (root->parent_ != nullptr) root = root->parent_;
  std::string frames;
  append_frames(frames);
  return frames.empty() ? root->label_ : root->label_ + ": " + frames;
}

void MessagePath::fail(std::string_view what) const {
  throw ModelFormatError(str(text(), ": ", what));
}

// ----------------------------------------------------------------- WireReader

namespace {

const char* wire_type_name(WireType type) {
  switch (type) {
    case WireType::kVarint: return "varint";
    case WireType::kFixed64: return "fixed64";
    case WireType::kLengthDelimited: return "length-delimited";
    case WireType::kStartGroup: return "start-group";
    case WireType::kEndGroup: return "end-group";
    case WireType::kFixed32: return "fixed32";
  }
  return "unknown";
}

constexpr int kMaxVarintBytes = 10;

}  // namespace

WireReader::WireReader(std::span<const uint8_t> bytes, const MessagePath& path)
    : pos_(bytes.data()), end_(bytes.data() + bytes.size()), path_(path) {}

void WireReader::fail(std::string_view what) const { path_.fail(what); }

uint64_t WireReader::read_varint_raw(const char* what, bool of_field) {
  // The description is built only on failure: this runs for every tag and length of the file.
  auto fail_with = [&](const char* before, const char* after) {
    const std::string subject = of_field ? str(what, " ", field_) : std::string(what);
    fail(str(before, subject, after));
  };
  uint64_t value = 0;
  for (int i = 0; i < kMaxVarintBytes; ++i) {
    if (pos_ == end_) fail_with("truncated ", "");
    const uint8_t byte = *pos_++;
    if (i == kMaxVarintBytes - 1) {
      // The 10th byte must end the varint and holds bit 63 only.
      if ((byte & 0x80) != 0) fail_with("", " longer than 10 bytes");
      if (byte > 1) fail_with("", " overflows 64 bits");
    }
    value |= static_cast<uint64_t>(byte & 0x7F) << (7 * i);
    if ((byte & 0x80) == 0) return value;
  }
  fail_with("", " longer than 10 bytes");  // unreachable: the 10th byte ends or fails
}

bool WireReader::next() {
  if (pos_ == end_) return false;
  const uint64_t tag = read_varint_raw("field tag", /*of_field=*/false);
  const uint64_t field = tag >> 3;
  const auto type = static_cast<uint32_t>(tag & 7);
  if (field == 0 || field > 0x1FFFFFFF) fail(str("invalid field number ", field));
  field_ = static_cast<uint32_t>(field);
  if (type == 3 || type == 4) {
    fail(str("field ", field_, " uses deprecated group wire type ", type));
  }
  if (type > 5) fail(str("field ", field_, " has invalid wire type ", type));
  wire_type_ = static_cast<WireType>(type);
  return true;
}

void WireReader::expect(WireType type) {
  if (wire_type_ != type) {
    fail(str("field ", field_, " has wire type ", wire_type_name(wire_type_), ", expected ",
             wire_type_name(type)));
  }
}

uint64_t WireReader::varint() {
  expect(WireType::kVarint);
  return read_varint_raw("varint field");
}

uint32_t WireReader::fixed32() {
  expect(WireType::kFixed32);
  if (end_ - pos_ < 4) fail(str("truncated fixed32 field ", field_));
  uint32_t value;
  std::memcpy(&value, pos_, 4);
  pos_ += 4;
  return value;
}

uint64_t WireReader::fixed64() {
  expect(WireType::kFixed64);
  if (end_ - pos_ < 8) fail(str("truncated fixed64 field ", field_));
  uint64_t value;
  std::memcpy(&value, pos_, 8);
  pos_ += 8;
  return value;
}

std::span<const uint8_t> WireReader::bytes() {
  expect(WireType::kLengthDelimited);
  const uint64_t length = read_varint_raw("length of field");
  if (length > static_cast<uint64_t>(end_ - pos_)) {
    fail(str("truncated length-delimited field ", field_, " (", length, " bytes declared, ",
             end_ - pos_, " left)"));
  }
  std::span<const uint8_t> payload(pos_, static_cast<size_t>(length));
  pos_ += length;
  return payload;
}

float WireReader::float32() {
  const uint32_t bits = fixed32();
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

double WireReader::float64() {
  const uint64_t bits = fixed64();
  double value;
  std::memcpy(&value, &bits, 8);
  return value;
}

std::string WireReader::string() {
  const std::span<const uint8_t> payload = bytes();
  return {reinterpret_cast<const char*>(payload.data()), payload.size()};
}

template <typename T, WireType kFixed>
void WireReader::append_fixed(std::vector<T>& out) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  if (wire_type_ != WireType::kLengthDelimited) {
    expect(kFixed);
    if (end_ - pos_ < static_cast<ptrdiff_t>(sizeof(T))) {
      fail(str("truncated ", wire_type_name(kFixed), " field ", field_));
    }
    T value;
    std::memcpy(&value, pos_, sizeof(T));
    pos_ += sizeof(T);
    out.push_back(value);
    return;
  }
  const std::span<const uint8_t> payload = bytes();
  if (payload.size() % sizeof(T) != 0) {
    fail(str("packed field ", field_, " has ", payload.size(), " bytes, not a multiple of ",
             sizeof(T)));
  }
  const size_t old_size = out.size();
  out.resize(old_size + payload.size() / sizeof(T));
  if (!payload.empty()) std::memcpy(out.data() + old_size, payload.data(), payload.size());
}

template <typename T>
void WireReader::append_varints(std::vector<T>& out) {
  if (wire_type_ != WireType::kLengthDelimited) {
    out.push_back(static_cast<T>(varint()));
    return;
  }
  const std::span<const uint8_t> payload = bytes();
  // Read the packed varints with a reader over the payload alone, so a
  // varint cannot run past it.
  const uint8_t* const saved_end = end_;
  const uint8_t* const after = pos_;
  pos_ = payload.data();
  end_ = payload.data() + payload.size();
  while (pos_ != end_) out.push_back(static_cast<T>(read_varint_raw("packed varint field")));
  pos_ = after;
  end_ = saved_end;
}

void WireReader::append_int64s(std::vector<int64_t>& out) { append_varints(out); }
void WireReader::append_uint64s(std::vector<uint64_t>& out) { append_varints(out); }
void WireReader::append_int32s(std::vector<int32_t>& out) {
  // int32 is encoded as a sign-extended 64-bit varint; keep the low 32 bits.
  std::vector<uint64_t> wide;
  append_varints(wide);
  out.reserve(out.size() + wide.size());
  for (uint64_t v : wide) out.push_back(static_cast<int32_t>(static_cast<uint32_t>(v)));
}
void WireReader::append_floats(std::vector<float>& out) {
  append_fixed<float, WireType::kFixed32>(out);
}
void WireReader::append_doubles(std::vector<double>& out) {
  append_fixed<double, WireType::kFixed64>(out);
}

void WireReader::skip() {
  switch (wire_type_) {
    case WireType::kVarint: varint(); return;
    case WireType::kFixed64: fixed64(); return;
    case WireType::kLengthDelimited: bytes(); return;
    case WireType::kFixed32: fixed32(); return;
    case WireType::kStartGroup:
    case WireType::kEndGroup: break;  // next() already rejected these
  }
  fail(str("cannot skip field ", field_));
}

std::pair<std::string, std::string> read_string_string_entry(std::span<const uint8_t> message,
                                                             const MessagePath& path) {
  std::pair<std::string, std::string> entry;
  WireReader reader(message, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: entry.first = reader.string(); break;
      case 2: entry.second = reader.string(); break;
      default: reader.skip();
    }
  }
  return entry;
}

std::string peek_string_field(std::span<const uint8_t> message, uint32_t field) {
  MessagePath quiet("");
  try {
    WireReader reader(message, quiet);
    while (reader.next()) {
      if (reader.field() == field && reader.wire_type() == WireType::kLengthDelimited) {
        return reader.string();
      }
      reader.skip();
    }
  } catch (const Error&) {
    // Malformed: the real parse reports it with the full path.
  }
  return {};
}

}  // namespace transmuter
