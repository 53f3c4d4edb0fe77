#include "npy.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <mlx/allocator.h>
#include <mlx/mlx.h>

#include "transmuter/error.h"

namespace transmuter {

namespace mx = mlx::core;

namespace {

// The format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
// NumPy itself refuses headers over 10 000 bytes unless told otherwise; a
// larger bound still keeps a hostile length from allocating much.
constexpr uint32_t kMaxHeaderBytes = 1u << 20;
// NumPy's own limit (NPY_MAXDIMS).
constexpr size_t kMaxRank = 64;

struct NpyType {
  const char* descr;
  mx::Dtype dtype;
};

const NpyType kTypes[] = {
    {"|b1", mx::bool_},     {"|i1", mx::int8},     {"<i2", mx::int16},    {"<i4", mx::int32},
    {"<i8", mx::int64},     {"|u1", mx::uint8},    {"<u2", mx::uint16},   {"<u4", mx::uint32},
    {"<u8", mx::uint64},    {"<f2", mx::float16},  {"<f4", mx::float32},  {"<f8", mx::float64},
    {"<c8", mx::complex64},
};

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw InputError(str(where, ": ", what));
}

mx::Dtype dtype_of_descr(const std::string& descr, const std::string& where) {
  std::string d = descr;
  // Single-byte types may be spelled with '<', '>', '=' or '|'.
  if (d.size() == 3 && d[2] == '1' && (d[0] == '<' || d[0] == '=' || d[0] == '>')) d[0] = '|';
  if (d.size() == 3 && d[0] == '=') d[0] = '<';
  for (const NpyType& t : kTypes) {
    if (d == t.descr) return t.dtype;
  }
  fail(where, str("unsupported .npy dtype '", descr, "'"));
}

const char* descr_of_dtype(mx::Dtype dtype) {
  for (const NpyType& t : kTypes) {
    if (t.dtype == dtype) return t.descr;
  }
  throw Error("write_npy: no .npy dtype for this array");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

// A recursive-descent reader of the header's Python dict literal: the
// subset NumPy writes (strings, True/False, tuples of integers), nothing
// that recurses, so no input can exhaust the stack.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : text_(text), where_(where) {}

  NpyHeader parse() {
    NpyHeader header;
    bool has_descr = false, has_fortran = false, has_shape = false;
    skip_space();
    expect('{', "the header to start with '{'");
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const size_t key_at = pos_;
      const std::string key = string_literal("a key");
      skip_space();
      expect(':', str("':' after key '", key, "'"));
      skip_space();
      auto once = [&](bool& seen) {
        if (seen) fail_at(key_at, str("key '", key, "' appears twice"));
        seen = true;
      };
      if (key == "descr") {
        once(has_descr);
        if (peek() == '[') fail_at(pos_, "structured dtypes (a list in 'descr') are not supported");
        header.dtype = dtype_of_descr(string_literal("a string for 'descr'"), where_);
      } else if (key == "fortran_order") {
        once(has_fortran);
        header.fortran_order = boolean();
      } else if (key == "shape") {
        once(has_shape);
        header.shape = shape_tuple();
      } else {
        fail_at(key_at, str("unexpected key '", key, "' (only 'descr', 'fortran_order', 'shape')"));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail_at(pos_, "expected ',' or '}' after a value");
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != text_.size()) fail_at(pos_, "unexpected text after the closing '}'");
    if (!has_descr) fail_header("no 'descr' key");
    if (!has_fortran) fail_header("no 'fortran_order' key");
    if (!has_shape) fail_header("no 'shape' key");
    header.data_bytes = byte_size(header);
    return header;
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  // The padding NumPy writes is spaces and a final newline.
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void expect(char c, const std::string& what) {
    if (peek() != c) fail_at(pos_, str("expected ", what));
    ++pos_;
  }

  [[noreturn]] void fail_header(const std::string& what) const {
    fail(where_, str("malformed .npy header: ", what));
  }

  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    const std::string_view near = text_.substr(std::min(at, text_.size()), 24);
    fail_header(
        str(what, " at offset ", at, near.empty() ? " (end of header)" : str(" near '", near, "'")));
  }

  std::string string_literal(const std::string& what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail_at(pos_, str("expected ", what, " in quotes"));
    const size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') fail_at(pos_, "escape sequences in strings are not supported");
      ++pos_;
    }
    if (pos_ == text_.size()) fail_at(start - 1, "unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }

  bool boolean() {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail_at(pos_, "expected True or False for 'fortran_order'");
  }

  // "(2, 3)", "(5,)", "()"; Python 2 wrote long integers as "3L".
  std::vector<int64_t> shape_tuple() {
    std::vector<int64_t> shape;
    expect('(', "a tuple for 'shape'");
    skip_space();
    while (peek() != ')') {
      if (shape.size() == kMaxRank) fail_at(pos_, str("shape has more than ", kMaxRank, " dimensions"));
      shape.push_back(dimension(shape.size()));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        fail_at(pos_, "expected ',' or ')' in 'shape'");
      }
    }
    ++pos_;  // ')'
    return shape;
  }

  int64_t dimension(size_t index) {
    const size_t start = pos_;
    if (peek() == '-') fail_at(start, str("negative dimension in 'shape' (dimension ", index, ")"));
    if (peek() < '0' || peek() > '9') fail_at(start, "expected a dimension (a non-negative integer)");
    int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      value = value * 10 + (peek() - '0');
      ++pos_;
      if (value > std::numeric_limits<int32_t>::max()) {
        while (peek() >= '0' && peek() <= '9') ++pos_;
        const std::string_view digits = text_.substr(start, std::min<size_t>(pos_ - start, 40));
        fail(where_, str("dimension ", index, " of 'shape' (", digits, pos_ - start > 40 ? "..." : "",
                         ") exceeds the int32 range of MLX shapes"));
      }
    }
    if (peek() == 'L') ++pos_;
    return value;
  }

  // product(shape) * itemsize without overflow: a shape could otherwise
  // claim few bytes and index far past them.
  uint64_t byte_size(const NpyHeader& header) const {
    uint64_t count = 1;
    for (int64_t d : header.shape) {
      if (d == 0) return 0;
    }
    for (int64_t d : header.shape) {
      if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) {
        fail(where_, str("element count of shape ", shape_text(header.shape), " overflows"));
      }
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(header.dtype.size()), &bytes) ||
        bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(where_, str("byte size of shape ", shape_text(header.shape), " overflows"));
    }
    return bytes;
  }

  std::string_view text_;
  const std::string& where_;
  size_t pos_ = 0;
};

// Where the header text lies in the file.
struct Preamble {
  size_t header_offset;
  uint32_t header_bytes;
};

// Reads magic, version and header length from the first bytes of the file
// (`prefix`, at most 12 bytes; fewer when the file is shorter).
Preamble parse_preamble(std::span<const uint8_t> prefix, const std::string& where) {
  if (prefix.size() < kMagicSize + 2 || std::memcmp(prefix.data(), kMagic, kMagicSize) != 0) {
    fail(where, "not an .npy file (no \\x93NUMPY magic)");
  }
  const uint8_t major = prefix[6], minor = prefix[7];
  if (major < 1 || major > 3 || minor != 0) {
    fail(where, str("unsupported .npy format version ", int(major), ".", int(minor), " (1.0, 2.0, 3.0 are)"));
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  if (prefix.size() < 8 + length_bytes) fail(where, "truncated .npy header length");
  uint32_t length = 0;
  for (size_t i = 0; i < length_bytes; ++i) length |= uint32_t{prefix[8 + i]} << (8 * i);
  if (length > kMaxHeaderBytes) {
    fail(where, str(".npy header length ", length, " is over the limit of ", kMaxHeaderBytes, " bytes"));
  }
  return {8 + length_bytes, length};
}

NpyHeader checked_header(std::string_view text, const std::string& where) {
  NpyHeader header = parse_npy_header(text, where);
  if (header.fortran_order) fail(where, "Fortran-order .npy files are not supported");
  return header;
}

[[noreturn]] void fail_data_size(const std::string& where, uint64_t present, const NpyHeader& header) {
  fail(where, str(".npy data is ", present, " bytes, but shape ", shape_text(header.shape), " of ",
                  descr_of_dtype(header.dtype), " needs exactly ", header.data_bytes, " bytes"));
}

mx::Shape to_shape(const std::vector<int64_t>& dims) {
  mx::Shape shape;
  for (int64_t d : dims) shape.push_back(static_cast<int32_t>(d));  // each checked <= INT32_MAX
  return shape;
}

// An MLX buffer for the data; filled by the caller, then made an array.
mx::allocator::Data allocate(const NpyHeader& header, const std::string& where) {
  mx::allocator::Data data = mx::allocator::malloc(header.data_bytes);
  // MLX 0.32's malloc does not check: a failed allocation is a null buffer.
  if (header.data_bytes != 0 && data.buffer().ptr() == nullptr) {
    fail(where, str("cannot allocate ", header.data_bytes, " bytes for the .npy data"));
  }
  return data;
}

char* bytes_of(mx::allocator::Data& data) { return static_cast<char*>(data.buffer().raw_ptr()); }

// The filled buffer as an array. Bool bytes other than 0 and 1 are not valid
// C++ bools: normalized, as NumPy reads any non-zero byte as True.
mx::array to_array(mx::allocator::Data data, const NpyHeader& header) {
  if (header.dtype == mx::bool_) {
    char* bytes = bytes_of(data);
    for (uint64_t i = 0; i < header.data_bytes; ++i) bytes[i] = bytes[i] != 0;
  }
  return mx::array(std::move(data), to_shape(header.shape), header.dtype);
}

}  // namespace

NpyHeader parse_npy_header(std::string_view text, const std::string& where) {
  return HeaderParser(text, where).parse();
}

mx::array read_npy(const std::filesystem::path& path) {
  const std::string where = path.string();
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) fail(where, str("cannot open: ", std::strerror(errno)));
  if (S_ISDIR(info.st_mode)) fail(where, "is a directory, not an .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(where, "cannot open");

  uint8_t prefix[12] = {};
  in.read(reinterpret_cast<char*>(prefix), sizeof(prefix));
  const auto got = static_cast<size_t>(in.gcount());
  const Preamble preamble = parse_preamble({prefix, got}, where);
  in.clear();
  in.seekg(static_cast<std::streamoff>(preamble.header_offset));
  std::string text(preamble.header_bytes, '\0');
  if (!in.read(text.data(), preamble.header_bytes)) {
    fail(where, str("truncated .npy header (", preamble.header_bytes, " bytes declared)"));
  }
  const NpyHeader header = checked_header(text, where);
  // For a regular file the size is known: refuse a mismatch before allocating.
  if (S_ISREG(info.st_mode)) {
    const uint64_t file_size = static_cast<uint64_t>(info.st_size);
    const uint64_t header_end = preamble.header_offset + uint64_t{preamble.header_bytes};
    const uint64_t present = file_size - std::min(file_size, header_end);
    if (present != header.data_bytes) fail_data_size(where, present, header);
  }
  mx::allocator::Data data = allocate(header, where);
  if (header.data_bytes != 0 &&
      !in.read(bytes_of(data), static_cast<std::streamsize>(header.data_bytes))) {
    fail_data_size(where, static_cast<uint64_t>(in.gcount()), header);
  }
  // A pipe's length is known only now.
  if (in.peek() != std::char_traits<char>::eof()) {
    fail(where, str(".npy data is longer than the ", header.data_bytes, " bytes that shape ",
                    shape_text(header.shape), " of ", descr_of_dtype(header.dtype), " needs"));
  }
  return to_array(std::move(data), header);
}

mx::array read_npy_bytes(std::span<const uint8_t> bytes, const std::string& where) {
  const Preamble preamble = parse_preamble(bytes.first(std::min<size_t>(bytes.size(), 12)), where);
  const uint64_t header_end = preamble.header_offset + uint64_t{preamble.header_bytes};
  if (bytes.size() < header_end) {
    fail(where, str("truncated .npy header (", preamble.header_bytes, " bytes declared)"));
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + preamble.header_offset,
                              preamble.header_bytes);
  const NpyHeader header = checked_header(text, where);
  const std::span<const uint8_t> data = bytes.subspan(header_end);
  if (data.size() != header.data_bytes) fail_data_size(where, data.size(), header);
  mx::allocator::Data buffer = allocate(header, where);
  if (!data.empty()) std::memcpy(bytes_of(buffer), data.data(), data.size());
  return to_array(std::move(buffer), header);
}

void write_npy(const std::filesystem::path& path, const mx::array& input) {
  mx::array a = input.dtype() == mx::bfloat16 ? mx::astype(input, mx::float32, mx::Device::cpu) : input;
  a = mx::contiguous(a, false, mx::Device::cpu);
  mx::eval(a);
  std::string shape = "(";
  for (int d : a.shape()) shape += std::to_string(d) + ",";
  if (a.ndim() > 1) shape.pop_back();
  shape += ")";
  std::string header = str("{'descr': '", descr_of_dtype(a.dtype()), "', 'fortran_order': False, 'shape': ", shape, ", }");
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error(str(path.string(), ": cannot write"));
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(a.data<char>(), static_cast<std::streamsize>(a.nbytes()));
}

}  // namespace transmuter
