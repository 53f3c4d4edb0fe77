#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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

}  // namespace
}  // namespace transmuter
