#include "npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "transmuter/error.h"

namespace transmuter {

namespace mx = mlx::core;

namespace {

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

mx::Dtype dtype_of_descr(const std::string& descr, const std::filesystem::path& path) {
  std::string d = descr;
  // Single-byte types may be spelled with '<', '>', '=' or '|'.
  if (d.size() == 3 && d[2] == '1' && (d[0] == '<' || d[0] == '=' || d[0] == '>')) d[0] = '|';
  if (d.size() == 3 && d[0] == '=') d[0] = '<';
  for (const NpyType& t : kTypes) {
    if (d == t.descr) return t.dtype;
  }
  throw Error(str(path.string(), ": unsupported .npy dtype '", descr, "'"));
}

const char* descr_of_dtype(mx::Dtype dtype) {
  for (const NpyType& t : kTypes) {
    if (t.dtype == dtype) return t.descr;
  }
  throw Error("write_npy: no .npy dtype for this array");
}

std::string header_field(const std::string& header, const std::string& pattern,
                         const std::filesystem::path& path) {
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(pattern))) {
    throw Error(str(path.string(), ": malformed .npy header: ", header));
  }
  return m[1].str();
}

}  // namespace

mx::array read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str(path.string(), ": cannot open"));
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
    throw Error(str(path.string(), ": not an .npy file"));
  }
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    unsigned char len[2];
    in.read(reinterpret_cast<char*>(len), 2);
    header_len = len[0] | (len[1] << 8);
  } else {
    unsigned char len[4];
    in.read(reinterpret_cast<char*>(len), 4);
    header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (uint32_t(len[3]) << 24);
  }
  if (!in || header_len > (1u << 20)) throw Error(str(path.string(), ": bad .npy header length"));
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) throw Error(str(path.string(), ": truncated .npy header"));
  std::string descr = header_field(header, "'descr':\\s*'([^']+)'", path);
  std::string fortran = header_field(header, "'fortran_order':\\s*(True|False)", path);
  std::string shape_text = header_field(header, "'shape':\\s*\\(([^)]*)\\)", path);
  if (fortran == "True") throw Error(str(path.string(), ": Fortran-order .npy files are not supported"));
  mx::Dtype dtype = dtype_of_descr(descr, path);
  mx::Shape shape;
  std::stringstream dims(shape_text);
  std::string item;
  size_t count = 1;
  while (std::getline(dims, item, ',')) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    long long d = std::stoll(item);
    if (d < 0 || d > INT32_MAX) throw Error(str(path.string(), ": bad dimension ", d));
    shape.push_back(static_cast<int>(d));
    count *= static_cast<size_t>(d);
  }
  std::vector<char> data(count * dtype.size());
  if (!in.read(data.data(), static_cast<std::streamsize>(data.size()))) {
    throw Error(str(path.string(), ": truncated .npy data (expected ", data.size(), " bytes)"));
  }
  mx::array out(mx::zeros(shape, dtype, mx::Device::cpu));
  mx::eval(out);
  std::memcpy(out.data<char>(), data.data(), data.size());
  return out;
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
