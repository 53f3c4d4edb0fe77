#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::floats_attr;
using testing::i64;
using testing::int_attr;
using testing::ints_attr;
using testing::run_compiled;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;

// float32 weighted sums of a few values of order 1.
constexpr double kTol = 1e-6;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = kTol) {
  testing::expect_all_near(actual, expected, tol);
}

const Value kNone;

mx::array scales(std::vector<float> v) {
  return mx::array(v.data(), {static_cast<int>(v.size())}, mx::float32);
}

TEST(Resize, NearestIntegerUpscaleRepeats) {
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f}, {1, 1, 2, 2});
  auto out = run_op("Resize", 19, {x, kNone, scales({1, 1, 2, 3})}, {string_attr("mode", "nearest")});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 1, 4, 6}));
  expect_near(to_doubles(out[0].tensor()),
              {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4});
}

TEST(Resize, BilinearHalfPixelUpscale) {
  // half_pixel, scale 2: outputs sit at -0.25, 0.25, 0.75, 1.25 (clamped at the edges).
  mx::array x = mx::array({1.f, 2.f}, {1, 2});
  auto out = run_op("Resize", 13, {x, kNone, scales({1, 2})}, {string_attr("mode", "linear")});
  expect_near(to_doubles(out[0].tensor()), {1, 1.25, 1.75, 2});
}

TEST(Resize, LinearDownscaleByTwoAveragesPairs) {
  mx::array x = mx::array({1.f, 3.f, 5.f, 9.f}, {1, 4});
  auto out = run_op("Resize", 19, {x, kNone, scales({1, 0.5f})}, {string_attr("mode", "linear")});
  expect_near(to_doubles(out[0].tensor()), {2, 7});
}

TEST(Resize, AlignCornersWithSizes) {
  mx::array x = mx::array({1.f, 2.f}, {2});
  auto out =
      run_op("Resize", 11, {x, mx::zeros({0}), mx::zeros({0}), i64({3})},
             {string_attr("mode", "linear"), string_attr("coordinate_transformation_mode", "align_corners")});
  expect_near(to_doubles(out[0].tensor()), {1, 1.5, 2});
}

TEST(Resize, CompiledMatchesEager) {
  mx::array x = testing::iota({1, 2, 3, 5});
  const std::vector<Attribute> attrs = {string_attr("mode", "cubic")};
  const std::vector<Value> inputs = {x, kNone, scales({1, 1, 1.7f, 2})};
  auto eager = run_op("Resize", 19, inputs, attrs);
  auto compiled = run_compiled("Resize", 19, inputs, {0}, attrs);
  expect_near(to_doubles(compiled[0]), to_doubles(eager[0].tensor()), 1e-5);
}

TEST(Resize, TfCropAndResizeExtrapolates) {
  // roi [0.5, 1.5] of a 3-element axis: sources 1, 2, 3; 3 lies outside.
  mx::array x = mx::array({10.f, 20.f, 30.f}, {3});
  auto out = run_op(
      "Resize", 13, {x, mx::array({0.5f, 1.5f}), kNone, i64({3})},
      {string_attr("mode", "linear"), string_attr("coordinate_transformation_mode", "tf_crop_and_resize"),
       testing::float_attr("extrapolation_value", -1.f)});
  expect_near(to_doubles(out[0].tensor()), {20, 30, -1});
}

TEST(Resize, AxesAndKeepAspectRatio) {
  // not_larger: 2x3 into at most 4x4 -> scale 4/3 -> 3x4 (rounded half up).
  mx::array x = testing::iota({2, 3});
  auto out = run_op("Resize", 18, {x, kNone, kNone, i64({4, 4})},
                    {string_attr("mode", "nearest"), ints_attr("axes", {0, 1}),
                     string_attr("keep_aspect_ratio_policy", "not_larger")});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3, 4}));
}

TEST(Resize, IntegerDataRoundsAndSaturates) {
  mx::array x = mx::array({0, 255}, {2}, mx::uint8);
  auto out = run_op("Resize", 19, {x, kNone, scales({2})}, {string_attr("mode", "linear")});
  EXPECT_EQ(out[0].tensor().dtype(), mx::uint8);
  // 63.75 -> 64 and 191.25 -> 191.
  expect_near(to_doubles(out[0].tensor()), {0, 64, 191, 255}, 0);
}

TEST(Resize, LegacyVersionsUseAsymmetricCoordinates) {
  mx::array x = mx::array({1.f, 2.f}, {1, 2});
  // asymmetric linear x2: sources 0, 0.5, 1, 1.5 (clamped).
  auto v10 = run_op("Resize", 10, {x, scales({1, 2})}, {string_attr("mode", "linear")});
  expect_near(to_doubles(v10[0].tensor()), {1, 1.5, 2, 2});
  auto v7 = run_op("Upsample", 7, {x}, {string_attr("mode", "nearest"), floats_attr("scales", {1, 2})});
  expect_near(to_doubles(v7[0].tensor()), {1, 1, 2, 2});
  auto v9 = run_op("Upsample", 9, {x, scales({1, 3})});
  expect_near(to_doubles(v9[0].tensor()), {1, 1, 1, 2, 2, 2});
}

TEST(Resize, BadInputsNameTheNode) {
  mx::array x = mx::ones({1, 1, 2, 2});
  std::string message =
      error_of<OpError>([&] { run_op("Resize", 19, {x, kNone, scales({1, 1, 2, 2}), i64({1, 1, 4, 4})}); });
  EXPECT_NE(message.find("[Resize v19]"), std::string::npos) << message;
  EXPECT_NE(message.find("exactly one of scales and sizes"), std::string::npos) << message;
  EXPECT_THROW(run_op("Resize", 19, {x, kNone, scales({1, 2})}), OpError);             // one scale per axis
  EXPECT_THROW(run_op("Resize", 19, {x, kNone, scales({1, 1, -2, 2})}), OpError);      // negative scale
  EXPECT_THROW(run_op("Resize", 19, {x, kNone, kNone, i64({1, 1, -4, 4})}), OpError);  // negative size
  EXPECT_THROW(run_op("Resize", 19, {x, kNone, scales({1, 1, 2, 2})}, {string_attr("mode", "area")}),
               OpError);
  EXPECT_THROW(run_op("Resize", 19, {x, kNone, scales({1, 1, 2, 2})},
                      {string_attr("coordinate_transformation_mode", "tf_crop_and_resize")}),
               OpError);                                                             // no roi
  EXPECT_THROW(run_op("Resize", 19, {x, kNone, scales({1, 1, 3e9f, 1})}), OpError);  // output beyond int32
  EXPECT_THROW(run_op("Resize", 10, {x, scales({1, 1, 2, 2})}, {string_attr("mode", "cubic")}), OpError);
  EXPECT_THROW(run_op("Upsample", 1, {mx::ones({2, 2})},
                      {testing::float_attr("height_scale", 2), testing::float_attr("width_scale", 2)}),
               OpError);  // v1 takes NCHW only
}

}  // namespace
}  // namespace transmuter
