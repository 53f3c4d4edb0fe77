#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::i64;
using testing::int_attr;
using testing::ints_attr;
using testing::iota;
using testing::run_compiled;
using testing::run_op;
using testing::to_doubles;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol) {
  testing::expect_all_near(actual, expected, tol);
}

TEST(Lrn, WindowAcrossChannelsByHand) {
  // Channels [1, 2, 3], size 2 (window [c, c + 1]), alpha 2, beta 1, bias 1:
  // y_c = x_c / (1 + (2 / 2) * sum of squares in the window).
  mx::array x = mx::array({1.f, 2.f, 3.f}, {1, 3, 1});
  auto out = run_op(
      "LRN", 13, {x},
      {int_attr("size", 2), float_attr("alpha", 2.f), float_attr("beta", 1.f), float_attr("bias", 1.f)});
  expect_near(to_doubles(out[0].tensor()), {1.0 / (1 + 1 + 4), 2.0 / (1 + 4 + 9), 3.0 / (1 + 9)}, 1e-7);
  // A window wider than the channels covers them all.
  auto wide = run_op("LRN", 1, {x}, {int_attr("size", 9), float_attr("alpha", 9.f), float_attr("beta", 1.f)});
  expect_near(to_doubles(wide[0].tensor()), {1.0 / 15, 2.0 / 15, 3.0 / 15}, 1e-7);
}

TEST(Lrn, MissingSizeOrLowRankIsAnOpError) {
  EXPECT_NE(error_of<OpError>([] { run_op("LRN", 13, {mx::zeros({1, 3, 1})}); }).find("size"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] {
              run_op("LRN", 13, {mx::zeros({3, 1})}, {int_attr("size", 3)});
            }).find("rank >= 3"),
            std::string::npos);
}

TEST(MeanVarianceNormalization, ZeroMeanUnitVariancePerChannel) {
  // Two channels over (N, H, W): {1, 3} -> {-1, 1}; {0, 0} -> {0, 0}.
  mx::array x = mx::array({1.f, 3.f, 0.f, 0.f}, {1, 2, 1, 2});
  auto out = run_op("MeanVarianceNormalization", 13, {x});
  expect_near(to_doubles(out[0].tensor()), {-1, 1, 0, 0}, 1e-6);
  auto all = run_op("MeanVarianceNormalization", 9, {x}, {ints_attr("axes", {0, 1, 2, 3})});
  // mean 1, variance 1.5
  const double inv = 1 / std::sqrt(1.5);
  expect_near(to_doubles(all[0].tensor()), {0, 2 * inv, -inv, -inv}, 1e-6);
}

TEST(MaxUnpool, ScattersToTheRecordedPositions) {
  // MaxPool 2x2 stride 2 of a 4x4 map picked positions 5, 7, 13, 15.
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f}, {1, 1, 2, 2});
  mx::array indices = mx::array({5, 7, 13, 15}, {1, 1, 2, 2}, mx::int64);
  std::vector<Attribute> attrs = {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2})};
  auto out = run_op("MaxUnpool", 11, {x, indices}, attrs);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 1, 4, 4}));
  std::vector<double> expected(16, 0.0);
  expected[5] = 1, expected[7] = 2, expected[13] = 3, expected[15] = 4;
  EXPECT_EQ(to_doubles(out[0].tensor()), expected);
  // output_shape widens the map; traced indices beyond it are dropped.
  auto shaped = run_op("MaxUnpool", 11, {x, indices, i64({1, 1, 5, 5})}, attrs);
  EXPECT_EQ(shaped[0].tensor().shape(), (mx::Shape{1, 1, 5, 5}));
  mx::array far = mx::array({5, 7, 13, 99}, {1, 1, 2, 2}, mx::int64);
  auto dropped = run_compiled("MaxUnpool", 11, {x, far}, {0, 1}, attrs);
  expected[15] = 0;
  EXPECT_EQ(to_doubles(dropped[0]), expected);
}

TEST(MaxUnpool, KnownIndexOutsideTheOutputIsAnOpError) {
  mx::array far = mx::array({5, 7, 13, 16}, {1, 1, 2, 2}, mx::int64);
  std::string m = error_of<OpError>([&] {
    run_op("MaxUnpool", 11, {mx::ones({1, 1, 2, 2}), far},
           {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2})});
  });
  EXPECT_NE(m.find("index 16 out of range for 16 output elements"), std::string::npos);
}

TEST(MaxUnpool, BadAttributesAreOpErrors) {
  mx::array x = mx::zeros({1, 1, 2, 2});
  mx::array i = mx::zeros({1, 1, 2, 2}, mx::int64);
  EXPECT_NE(error_of<OpError>([&] {
              run_op("MaxUnpool", 11, {x, i}, {ints_attr("kernel_shape", {2})});
            }).find("kernel_shape must have 2 entries"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([&] {
              run_op("MaxUnpool", 11, {x, i, i64({1, 2, 4, 4})}, {ints_attr("kernel_shape", {2, 2})});
            }).find("output_shape"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter
