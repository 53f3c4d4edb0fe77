#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "npy.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

namespace fs = std::filesystem;

fs::path temp_file(const std::string& name) { return fs::temp_directory_path() / ("transmuter_npy_" + name); }

TEST(Npy, RoundTripsEveryDtype) {
  for (mx::Dtype dtype : {mx::bool_, mx::int8, mx::int16, mx::int32, mx::int64, mx::uint8, mx::uint16, mx::uint32,
                          mx::uint64, mx::float16, mx::float32, mx::float64}) {
    mx::array a = mx::astype(mx::reshape(mx::arange(6, mx::int32), {2, 3}), dtype, mx::Device::cpu);
    fs::path path = temp_file("roundtrip.npy");
    write_npy(path, a);
    mx::array b = read_npy(path);
    EXPECT_EQ(b.dtype(), dtype);
    EXPECT_EQ(b.shape(), (mx::Shape{2, 3}));
    EXPECT_EQ(testing::to_doubles(b), testing::to_doubles(a));
  }
}

TEST(Npy, ScalarsAndNonContiguousViews) {
  fs::path path = temp_file("scalar.npy");
  write_npy(path, mx::array(2.5f));
  EXPECT_EQ(read_npy(path).ndim(), 0u);
  EXPECT_EQ(testing::to_doubles(read_npy(path)), std::vector<double>{2.5});
  mx::array t = mx::transpose(mx::reshape(mx::arange(6.f), {2, 3}));
  write_npy(path, t);
  EXPECT_EQ(testing::to_doubles(read_npy(path)), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Npy, BadFilesAreErrorsNamingTheFile) {
  fs::path path = temp_file("bad.npy");
  std::ofstream(path, std::ios::binary) << "not numpy at all";
  try {
    read_npy(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
  // A valid header that promises more data than the file holds.
  mx::array a = mx::zeros({4, 4});
  write_npy(path, a);
  fs::resize_file(path, fs::file_size(path) - 8);
  EXPECT_THROW(read_npy(path), Error);
  EXPECT_THROW(read_npy(temp_file("does_not_exist.npy")), Error);
}

// Headers up to the shape tuple, for cases about the shape.
const std::string kF4 = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
const std::string kF8 = "{'descr': '<f8', 'fortran_order': False, 'shape': ";

// An .npy file from its parts: `header` is the dict text as written.
std::string npy_bytes(const std::string& header, const std::string& data, int version = 1) {
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  const std::string text = header + "\n";
  const size_t length_bytes = version == 1 ? 2 : 4;
  for (size_t i = 0; i < length_bytes; ++i) out += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text + data;
}

fs::path write_file(const std::string& name, const std::string& bytes) {
  const fs::path path = temp_file(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// The message read_npy throws for `bytes` (written to a file), checked to
// name the file; the same bytes read from memory must fail the same way.
std::string npy_error(const std::string& bytes) {
  const fs::path path = write_file("bad_case.npy", bytes);
  std::string message;
  try {
    read_npy(path);
    ADD_FAILURE() << "expected an error";
  } catch (const InputError& e) {
    message = e.what();
  }
  EXPECT_EQ(message.rfind(path.string() + ": ", 0), 0u) << message;
  const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  try {
    read_npy_bytes(span, "mem");
    ADD_FAILURE() << "expected an error from read_npy_bytes";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).substr(5), message.substr(path.string().size() + 2));
  }
  return message;
}

TEST(Npy, KeysInAnyOrderVersionsTwoAndThreeAndPython2Longs) {
  const std::string data = floats({1, 2, 3, 4, 5, 6});
  for (int version : {1, 2, 3}) {
    const fs::path path = write_file(
        "order.npy",
        npy_bytes("{\"shape\": (2L, 3L), 'fortran_order': False, 'descr': '<f4'}", data, version));
    mx::array a = read_npy(path);
    EXPECT_EQ(a.shape(), (mx::Shape{2, 3})) << "version " << version;
    EXPECT_EQ(testing::to_doubles(a), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  }
}

TEST(Npy, LongHeaderIsParsedWithoutRecursion) {
  // 50 KB of padding made std::regex overflow the stack.
  const std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }" + std::string(50000, ' ');
  const fs::path path = write_file("long_header.npy", npy_bytes(header, floats({7, 8}), 2));
  EXPECT_EQ(testing::to_doubles(read_npy(path)), (std::vector<double>{7, 8}));
  // 50 KB of dimensions: more than NumPy's 64.
  std::string shape;
  for (int i = 0; i < 16000; ++i) shape += "1, ";
  const std::string message =
      npy_error(npy_bytes(kF4 + "(" + shape + ")}", floats({1}), 2));
  EXPECT_NE(message.find("shape has more than 64 dimensions"), std::string::npos) << message;
}

TEST(Npy, ShapeProductOverflowIsAnError) {
  const std::string message = npy_error(
      npy_bytes(kF8 + "(2147483647, 2147483647, 2147483647, 8)}", ""));
  EXPECT_NE(message.find("element count of shape (2147483647, 2147483647, 2147483647, 8) overflows"),
            std::string::npos)
      << message;
  const std::string bytes_message = npy_error(
      npy_bytes(kF8 + "(2147483647, 2147483647, 4)}", ""));
  EXPECT_NE(bytes_message.find("byte size of shape"), std::string::npos) << bytes_message;
}

TEST(Npy, DataMustMatchTheShapeExactly) {
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  const std::string more = npy_error(npy_bytes(header, floats({1, 2, 3, 4, 5})));
  EXPECT_NE(more.find(".npy data is 20 bytes, but shape (2, 2) of <f4 needs exactly 16 bytes"),
            std::string::npos)
      << more;
  const std::string fewer = npy_error(npy_bytes(header, floats({1, 2, 3})));
  EXPECT_NE(fewer.find(".npy data is 12 bytes, but shape (2, 2) of <f4 needs exactly 16 bytes"),
            std::string::npos)
      << fewer;
  // A huge shape over a tiny file fails on the size, before allocating.
  const std::string huge =
      npy_error(npy_bytes(kF4 + "(1048576, 1048576)}", floats({1})));
  EXPECT_NE(huge.find("needs exactly 4398046511104 bytes"), std::string::npos) << huge;
}

TEST(Npy, BadDimensionsNameWhatIsWrong) {
  auto header = [](const std::string& shape) {
    return npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + "}", "");
  };
  EXPECT_NE(npy_error(header("(2, x)")).find("expected a dimension (a non-negative integer) at offset"),
            std::string::npos);
  EXPECT_NE(npy_error(header("(2, -3)")).find("negative dimension in 'shape' (dimension 1)"),
            std::string::npos);
  const std::string big = npy_error(header("(99999999999999999999999999,)"));
  EXPECT_NE(big.find("dimension 0 of 'shape' (99999999999999999999999999) exceeds the int32 range"),
            std::string::npos)
      << big;
  EXPECT_NE(npy_error(header("(4294967297,)")).find("exceeds the int32 range"), std::string::npos);
  EXPECT_NE(npy_error(header("[2, 3]")).find("expected a tuple for 'shape'"), std::string::npos);
  EXPECT_NE(npy_error(header("(2 3)")).find("expected ',' or ')' in 'shape'"), std::string::npos);
}

TEST(Npy, MalformedHeadersNameWhatIsWrong) {
  auto error_for = [](const std::string& header) { return npy_error(npy_bytes(header, "")); };
  EXPECT_NE(error_for("{'descr': '<f4', 'shape': (0,)}").find("no 'fortran_order' key"), std::string::npos);
  EXPECT_NE(error_for("{'fortran_order': False, 'shape': (0,)}").find("no 'descr' key"), std::string::npos);
  EXPECT_NE(error_for("{'descr': '<f4', 'fortran_order': False}").find("no 'shape' key"), std::string::npos);
  EXPECT_NE(error_for("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}")
                .find("key 'descr' appears twice"),
            std::string::npos);
  EXPECT_NE(error_for("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}")
                .find("unexpected key 'extra'"),
            std::string::npos);
  EXPECT_NE(error_for("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': ()}")
                .find("structured dtypes"),
            std::string::npos);
  EXPECT_NE(error_for("{'descr': '>f4', 'fortran_order': False, 'shape': ()}")
                .find("unsupported .npy dtype '>f4'"),
            std::string::npos);
  EXPECT_NE(error_for("{'descr': '<f4', 'fortran_order': True, 'shape': ()}").find("Fortran-order"),
            std::string::npos);
  EXPECT_NE(error_for("{'descr': '<f4', 'fortran_order': Maybe, 'shape': ()}").find("expected True or False"),
            std::string::npos);
  EXPECT_NE(error_for("{'descr' '<f4'}").find("expected ':' after key 'descr'"), std::string::npos);
  EXPECT_NE(error_for("{'descr': '<f4' 'fortran_order': False}").find("expected ',' or '}' after a value"),
            std::string::npos);
  EXPECT_NE(error_for("{'descr': '<f4', 'fortran_order': False, 'shape': ()} trailing")
                .find("unexpected text after the closing '}'"),
            std::string::npos);
  EXPECT_NE(error_for("{'descr': '<f4").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_for("").find("expected the header to start with '{'"), std::string::npos);
}

TEST(Npy, BadPreamblesNameWhatIsWrong) {
  EXPECT_NE(npy_error("\x93NUMPY").find("not an .npy file"), std::string::npos);
  std::string version4 = npy_bytes("{}", "");
  version4[6] = 4;
  EXPECT_NE(npy_error(version4).find("unsupported .npy format version 4.0"), std::string::npos);
  EXPECT_NE(npy_error(std::string("\x93NUMPY\x02\x00\x10", 9)).find("truncated .npy header length"),
            std::string::npos);
  std::string huge_length = npy_bytes("{}", "", 2);
  huge_length[11] = 0x7f;  // 2 GB header
  EXPECT_NE(npy_error(huge_length).find("over the limit of"), std::string::npos);
  std::string short_header = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': ()}", "");
  short_header.resize(30);
  EXPECT_NE(npy_error(short_header).find("truncated .npy header"), std::string::npos);
}

TEST(Npy, BoolBytesAreNormalized) {
  const fs::path path = write_file(
      "bool.npy",
      npy_bytes("{'descr': '|b1', 'fortran_order': False, 'shape': (3,)}", std::string("\x00\x07\x01", 3)));
  const mx::array a = read_npy(path);
  EXPECT_EQ(a.dtype(), mx::bool_);
  const mx::array bytes = mx::view(a, mx::uint8);
  mx::eval(bytes);
  EXPECT_EQ(std::vector<uint8_t>(bytes.data<uint8_t>(), bytes.data<uint8_t>() + 3),
            (std::vector<uint8_t>{0, 1, 1}));
}

TEST(Npy, ReadsFromMemory) {
  const std::vector<int64_t> values = {5, 6, 7};
  const std::string bytes = npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (3,)}",
                                      std::string(reinterpret_cast<const char*>(values.data()), 24));
  const mx::array a =
      read_npy_bytes({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "memory");
  EXPECT_EQ(a.dtype(), mx::int64);
  EXPECT_EQ(testing::to_doubles(a), (std::vector<double>{5, 6, 7}));
}

}  // namespace
}  // namespace transmuter
