#include <limits>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::int_attr;
using testing::ints_attr;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;
using testing::to_ints;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = 1e-6) {
  testing::expect_all_near(actual, expected, tol);
}

// [[1, 2, 3], [4, 5, 6], [7, 8, 9]] as [1, 1, 3, 3]
mx::array grid3() { return mx::reshape(mx::arange(1.0, 10.0, 1.0, mx::float32), {1, 1, 3, 3}); }

TEST(MaxPool, PadsNeverWinEvenAgainstNegativeValues) {
  mx::array x = mx::negative(grid3());
  auto out = run_op(
      "MaxPool", 12, {x},
      {ints_attr("kernel_shape", {2, 2}), ints_attr("pads", {1, 1, 1, 1}), ints_attr("strides", {2, 2})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 1, 2, 2}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{-1, -2, -4, -5}));
}

TEST(MaxPool, CeilModeAddsAWindowButNotOneStartingInThePadding) {
  // Length 4, kernel 2, stride 2: floor -> 2 windows; ceil -> still 2 (a third
  // would start at 4, past the input). Length 5: ceil gives 3.
  auto even = run_op("MaxPool", 12, {mx::ones({1, 1, 4})},
                     {ints_attr("kernel_shape", {2}), ints_attr("strides", {2}), int_attr("ceil_mode", 1)});
  EXPECT_EQ(even[0].tensor().shape(), (mx::Shape{1, 1, 2}));
  mx::array x = mx::array({1.f, 5.f, 2.f, 0.f, 7.f}, {1, 1, 5});
  auto odd = run_op("MaxPool", 12, {x},
                    {ints_attr("kernel_shape", {2}), ints_attr("strides", {2}), int_attr("ceil_mode", 1)});
  EXPECT_EQ(to_doubles(odd[0].tensor()), (std::vector<double>{5, 2, 7}));
}

TEST(MaxPool, DilatedWindows) {
  mx::array x = mx::array({1.f, 9.f, 2.f, 0.f, 3.f}, {1, 1, 5});
  auto out = run_op("MaxPool", 12, {x}, {ints_attr("kernel_shape", {2}), ints_attr("dilations", {2})});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{2, 9, 3}));
}

TEST(MaxPool, IndicesRowAndColumnMajor) {
  // Two images (N=1, C=2): indices count through the whole [N, C, H, W] input.
  mx::array x = mx::concatenate({grid3(), mx::negative(grid3())}, 1);
  std::vector<Attribute> attrs = {ints_attr("kernel_shape", {2, 2})};
  auto row = run_op("MaxPool", 12, {x}, attrs, 2);
  EXPECT_EQ(row[1].tensor().dtype(), mx::int64);
  EXPECT_EQ(to_doubles(row[0].tensor()), (std::vector<double>{5, 6, 8, 9, -1, -2, -4, -5}));
  EXPECT_EQ(to_ints(row[1].tensor()), (std::vector<int64_t>{4, 5, 7, 8, 9, 10, 12, 13}));
  attrs.push_back(int_attr("storage_order", 1));
  auto col = run_op("MaxPool", 12, {x}, attrs, 2);
  // Column-major index of (h, w) is h + w * H.
  EXPECT_EQ(to_ints(col[1].tensor()), (std::vector<int64_t>{4, 7, 5, 8, 9, 12, 10, 13}));
}

TEST(MaxPool, FirstOfEqualMaximaGivesTheIndex) {
  auto out = run_op("MaxPool", 12, {mx::ones({1, 1, 2, 2})}, {ints_attr("kernel_shape", {2, 2})}, 2);
  EXPECT_EQ(to_ints(out[1].tensor()), (std::vector<int64_t>{0}));
}

TEST(MaxPool, Uint8PadsWithZero) {
  mx::array x = mx::astype(grid3(), mx::uint8);
  auto out = run_op("MaxPool", 12, {x}, {ints_attr("kernel_shape", {3, 3}), ints_attr("pads", {1, 1, 1, 1})});
  EXPECT_EQ(out[0].tensor().dtype(), mx::uint8);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{5, 6, 6, 8, 9, 9, 8, 9, 9}));
}

TEST(MaxPool, TracesUnderCompile) {
  auto fn = [](const std::vector<mx::array>& in) {
    auto out = run_op("MaxPool", 12, {in[0]},
                      {ints_attr("kernel_shape", {2, 2}), ints_attr("pads", {0, 0, 1, 1})}, 2);
    return std::vector<mx::array>{out[0].tensor(), out[1].tensor()};
  };
  auto compiled = mx::compile(fn);
  auto out = compiled({grid3()});
  EXPECT_EQ(to_doubles(out[0]), (std::vector<double>{5, 6, 6, 8, 9, 9, 8, 9, 9}));
  EXPECT_EQ(to_ints(out[1]), (std::vector<int64_t>{4, 5, 5, 7, 8, 8, 7, 8, 8}));
}

TEST(AveragePool, CountIncludePadDecidesTheDivisor) {
  std::vector<Attribute> attrs = {ints_attr("kernel_shape", {2, 2}), ints_attr("pads", {1, 1, 0, 0}),
                                  ints_attr("strides", {2, 2})};
  auto excluded = run_op("AveragePool", 11, {grid3()}, attrs);
  // Windows: {1}, {2, 3}, {4, 7}, {5, 6, 8, 9}.
  expect_near(to_doubles(excluded[0].tensor()), {1, 2.5, 5.5, 7});
  attrs.push_back(int_attr("count_include_pad", 1));
  auto included = run_op("AveragePool", 11, {grid3()}, attrs);
  expect_near(to_doubles(included[0].tensor()), {0.25, 1.25, 2.75, 7});
}

TEST(AveragePool, CeilWindowsDoNotCountTheirOverhangEvenWithCountIncludePad) {
  // Length 5, kernel 2, stride 2, ceil: the last window covers {x4, overhang}.
  mx::array x = mx::array({1.f, 3.f, 5.f, 7.f, 9.f}, {1, 1, 5});
  auto out = run_op("AveragePool", 19, {x},
                    {ints_attr("kernel_shape", {2}), ints_attr("strides", {2}), int_attr("ceil_mode", 1),
                     int_attr("count_include_pad", 1)});
  expect_near(to_doubles(out[0].tensor()), {2, 6, 9});
}

TEST(AveragePool, SameLowerPadsAtTheStart) {
  mx::array x = mx::array({2.f, 4.f, 6.f}, {1, 1, 3});
  auto out =
      run_op("AveragePool", 11, {x}, {ints_attr("kernel_shape", {2}), string_attr("auto_pad", "SAME_LOWER")});
  expect_near(to_doubles(out[0].tensor()), {2, 3, 5});
}

TEST(AveragePool, DilationsOnThreeSpatialAxes) {
  auto out = run_op("AveragePool", 19, {mx::ones({1, 2, 5, 5, 5})},
                    {ints_attr("kernel_shape", {2, 2, 2}), ints_attr("dilations", {2, 2, 2})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 2, 3, 3, 3}));
  expect_near(to_doubles(out[0].tensor()), std::vector<double>(54, 1.0));
}

TEST(AveragePool, WindowLargerThanThePaddedInputIsAnError) {
  EXPECT_THROW(run_op("AveragePool", 11, {mx::ones({1, 1, 2})}, {ints_attr("kernel_shape", {3})}), OpError);
}

TEST(LpPool, PNormOfEachWindow) {
  mx::array x = mx::array({3.f, -4.f, 0.f, 1.f}, {1, 1, 4});
  auto l2 = run_op("LpPool", 18, {x}, {ints_attr("kernel_shape", {2}), ints_attr("strides", {2})});
  expect_near(to_doubles(l2[0].tensor()), {5, 1});
  // v1 takes p as a float.
  auto l1 = run_op("LpPool", 1, {x}, {ints_attr("kernel_shape", {2}), testing::float_attr("p", 1.f)});
  expect_near(to_doubles(l1[0].tensor()), {7, 4, 1});
}

TEST(GlobalPool, LpOverAllSpatialAxes) {
  auto out = run_op("GlobalLpPool", 2, {mx::array({3.f, 0.f, 0.f, 4.f}, {1, 1, 2, 2})}, {int_attr("p", 2)});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 1, 1, 1}));
  expect_near(to_doubles(out[0].tensor()), {5});
}

TEST(GlobalPool, AverageAndMaxKeepSpatialAxes) {
  auto avg = run_op("GlobalAveragePool", 1, {grid3()});
  auto max = run_op("GlobalMaxPool", 1, {grid3()});
  EXPECT_EQ(avg[0].tensor().shape(), (mx::Shape{1, 1, 1, 1}));
  expect_near(to_doubles(avg[0].tensor()), {5});
  EXPECT_EQ(to_doubles(max[0].tensor()), (std::vector<double>{9}));
}

TEST(MaxPool, HugeWindowsAreErrorsNotHangsOrTruncations) {
  const mx::array x = mx::zeros({1, 1, 4});
  EXPECT_EQ(testing::error_of<OpError>(
                [&] { run_op("MaxPool", 12, {x}, {ints_attr("kernel_shape", {(int64_t{1} << 32) + 2})}); }),
            "[MaxPool v1] node 'test_MaxPool': kernel_shape value 4294967298 does not fit in int32");
  // One slice per kernel offset along each axis: 2^20 would not finish.
  EXPECT_EQ(testing::error_of<OpError>([&] {
              run_op("MaxPool", 12, {x},
                     {ints_attr("kernel_shape", {int64_t{1} << 20}), ints_attr("pads", {0, 1 << 20})});
            }),
            "[MaxPool v1] node 'test_MaxPool': a window of 1048576 elements along its axes exceeds the 65536 "
            "supported");
  // With Indices, one slice per window element: 300 x 300 is too many.
  EXPECT_EQ(testing::error_of<OpError>([&] {
              run_op("MaxPool", 12, {mx::zeros({1, 1, 300, 300})}, {ints_attr("kernel_shape", {300, 300})},
                     2);
            }),
            "[MaxPool v1] node 'test_MaxPool': a window of 90000 elements exceeds the 65536 supported with "
            "Indices");
  // Three output dims of 2^31 - 1 each: the host tables' size would wrap.
  const int64_t b = int64_t{1} << 30, e = b - 2;
  std::string message = testing::error_of<OpError>([&] {
    run_op("MaxPool", 12, {mx::zeros({1, 1, 1, 1, 1})},
           {ints_attr("kernel_shape", {1, 1, 1}), ints_attr("pads", {b, b, b, e, e, e})});
  });
  EXPECT_NE(message.find("output size"), std::string::npos) << message;
  EXPECT_NE(message.find("overflows int64"), std::string::npos) << message;
}

// EfficientNet's pooler in transformers: AvgPool2d over the whole feature map,
// a window of 320 x 320 elements in the corpus' export. Pooled one axis at a
// time (320 + 320 slices, not 320^2): the mean of each image, its max, and
// (p = 1) its sum of magnitudes.
TEST(AveragePool, AWindowOfTheWholeInput) {
  const mx::array x = mx::random::normal({1, 2, 320, 320}, mx::float32, 0, 1, mx::random::key(3));
  const std::vector<int> spatial = {2, 3};
  auto avg =
      run_op("AveragePool", 19, {x}, {ints_attr("kernel_shape", {320, 320}), int_attr("ceil_mode", 1)});
  EXPECT_EQ(avg[0].tensor().shape(), (mx::Shape{1, 2, 1, 1}));
  expect_near(to_doubles(avg[0].tensor()), to_doubles(mx::mean(x, spatial, true)), 1e-5);
  auto max = run_op("MaxPool", 12, {x}, {ints_attr("kernel_shape", {320, 320})});
  EXPECT_EQ(to_doubles(max[0].tensor()), to_doubles(mx::max(x, spatial, true)));
  auto lp = run_op("LpPool", 18, {x}, {ints_attr("kernel_shape", {320, 320}), int_attr("p", 1)});
  // Sums of 102400 float32 magnitudes (~8e4) in another order: 1e-4 relative.
  expect_near(to_doubles(lp[0].tensor()), to_doubles(mx::sum(mx::abs(x), spatial, true)), 8.0);
}

}  // namespace
}  // namespace transmuter
