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
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;
using testing::to_ints;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol) {
  testing::expect_all_near(actual, expected, tol);
}

TEST(NonMaxSuppression, KeepsTheBestOfOverlappingBoxes) {
  // Boxes 0 and 1 overlap with IoU 0.81; box 2 is apart. Scores 0.9, 0.95, 0.5.
  mx::array boxes = mx::array({0.f, 0.f, 1.f, 1.f, 0.f, 0.1f, 1.f, 1.1f, 5.f, 5.f, 6.f, 6.f}, {1, 3, 4});
  mx::array scores = mx::array({0.9f, 0.95f, 0.5f}, {1, 1, 3});
  auto out = run_op("NonMaxSuppression", 11, {boxes, scores, i64({10}), mx::array({0.5f})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 3}));
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{0, 0, 1, 0, 0, 2}));
  // At most one box per class; a score threshold that removes box 2.
  auto one = run_op("NonMaxSuppression", 10, {boxes, scores, i64({1}), mx::array({0.5f})});
  EXPECT_EQ(to_ints(one[0].tensor()), (std::vector<int64_t>{0, 0, 1}));
  auto thresholded =
      run_op("NonMaxSuppression", 11, {boxes, scores, i64({10}), mx::array({0.9f}), mx::array({0.6f})});
  EXPECT_EQ(to_ints(thresholded[0].tensor()), (std::vector<int64_t>{0, 0, 1, 0, 0, 0}));
  // No max_output_boxes_per_class: no output.
  EXPECT_EQ(run_op("NonMaxSuppression", 11, {boxes, scores})[0].tensor().shape(), (mx::Shape{0, 3}));
}

TEST(NonMaxSuppression, MismatchedShapesAreOpErrors) {
  std::string m = error_of<OpError>(
      [] { run_op("NonMaxSuppression", 11, {mx::zeros({1, 3, 4}), mx::zeros({1, 1, 2}), i64({1})}); });
  EXPECT_NE(m.find("scores must be"), std::string::npos);
}

TEST(RoiAlign, AveragesBilinearSamplesOfARamp) {
  // X[h, w] = w on a 4x4 map: bilinear samples are their x coordinate, so
  // each bin's average is its center's x (inside the map). Region x 0..4
  // with half_pixel: x from -0.5 to 3.5, two bins centered at 0.5 and 2.5;
  // samples below 0 clamp to 0 (0.25 grid: -0.25 -> 0, 0.75 ... averages).
  mx::array x = mx::reshape(mx::tile(mx::array({0.f, 1.f, 2.f, 3.f}), {4}), {1, 1, 4, 4});
  mx::array rois = mx::array({1.f, 1.f, 3.f, 3.f}, {1, 4});
  auto out =
      run_op("RoiAlign", 16, {x, rois, i64({0})},
             {int_attr("output_height", 1), int_attr("output_width", 2), int_attr("sampling_ratio", 2)});
  // Region x 0.5..2.5: bins [0.5, 1.5] and [1.5, 2.5]; samples at 0.75, 1.25 and 1.75, 2.25.
  expect_near(to_doubles(out[0].tensor()), {1.0, 2.0}, 1e-6);
  // Legacy (v10, output_half_pixel): region x 1..3, samples 1.25, 1.75 and 2.25, 2.75.
  auto legacy =
      run_op("RoiAlign", 10, {x, rois, i64({0})},
             {int_attr("output_height", 1), int_attr("output_width", 2), int_attr("sampling_ratio", 2)});
  expect_near(to_doubles(legacy[0].tensor()), {1.5, 2.5}, 1e-6);
}

TEST(RoiAlign, BadAttributesOrIndicesAreOpErrors) {
  mx::array x = mx::zeros({1, 1, 4, 4});
  mx::array rois = mx::array({0.f, 0.f, 2.f, 2.f}, {1, 4});
  EXPECT_NE(error_of<OpError>([&] {
              run_op("RoiAlign", 16, {x, rois, i64({1})});
            }).find("batch index 1 out of range"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([&] {
              run_op("RoiAlign", 16, {x, rois, i64({0})}, {string_attr("mode", "sum")});
            }).find("mode must be avg or max"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([&] {
              run_op("RoiAlign", 16, {x, rois, i64({0})},
                     {string_attr("coordinate_transformation_mode", "x")});
            }).find("coordinate_transformation_mode"),
            std::string::npos);
}

TEST(DeformConv, ZeroOffsetsAreAPlainConvolution) {
  mx::array x = mx::multiply(iota({1, 2, 4, 4}), mx::array(0.1f));
  mx::array w = mx::multiply(iota({4, 1, 2, 2}), mx::array(0.05f));  // group 2: 2 outputs per input channel
  mx::array b = mx::array({0.5f, -1.f, 0.f, 2.f});
  std::vector<Attribute> attrs = {int_attr("group", 2), ints_attr("pads", {1, 0, 0, 1}),
                                  ints_attr("strides", {1, 2})};
  auto conv = run_op("Conv", 11, {x, w, b}, attrs);
  mx::array offset = mx::zeros({1, 2 * 4 * 2, 4, 2});  // offset_group 2, 4 taps, (dy, dx)
  attrs.push_back(int_attr("offset_group", 2));
  auto deform = run_op("DeformConv", 19, {x, w, offset, b}, attrs);
  EXPECT_EQ(deform[0].tensor().shape(), conv[0].tensor().shape());
  expect_near(to_doubles(deform[0].tensor()), to_doubles(conv[0].tensor()), 1e-5);
  // A mask of one half halves the convolution without bias.
  auto masked = run_op("DeformConv", 22, {x, w, offset, Value(), mx::full({1, 8, 4, 2}, 0.5f)}, attrs);
  auto conv_no_bias =
      run_op("Conv", 11, {x, w},
             {int_attr("group", 2), ints_attr("pads", {1, 0, 0, 1}), ints_attr("strides", {1, 2})});
  std::vector<double> half = to_doubles(conv_no_bias[0].tensor());
  for (double& v : half) v *= 0.5;
  expect_near(to_doubles(masked[0].tensor()), half, 1e-5);
}

TEST(DeformConv, ShiftByOnePixelReadsTheNeighbour) {
  // 1x1 kernel, offset dx = 1: output[h, w] = X[h, w + 1] (0 past the edge); dx = 0.5 averages.
  mx::array x = mx::reshape(iota({3}), {1, 1, 1, 3});
  mx::array w = mx::ones({1, 1, 1, 1});
  mx::array offset = mx::reshape(mx::array({0.f, 0.f, 0.f, 1.f, 1.f, 0.5f}), {1, 2, 1, 3});
  auto out = run_op("DeformConv", 19, {x, w, offset});
  expect_near(to_doubles(out[0].tensor()), {1, 2, 1}, 1e-6);  // x = 1, 2, 2.5 (half of 2 + half of 0 outside)
}

TEST(DeformConv, ThreeDimensionalZeroOffsetsAreAPlainConvolution) {
  mx::array x = mx::multiply(iota({1, 2, 3, 4, 3}), mx::array(0.1f));
  mx::array w = mx::multiply(iota({3, 2, 2, 1, 2}), mx::array(0.05f));
  std::vector<Attribute> attrs = {ints_attr("pads", {0, 1, 0, 1, 0, 1}), ints_attr("dilations", {1, 2, 1})};
  auto conv = run_op("Conv", 11, {x, w}, attrs);
  const mx::Shape& out = conv[0].tensor().shape();
  mx::array offset = mx::zeros({1, 4 * 3, out[2], out[3], out[4]});
  auto deform = run_op("DeformConv", 19, {x, w, offset}, attrs);
  EXPECT_EQ(deform[0].tensor().shape(), out);
  expect_near(to_doubles(deform[0].tensor()), to_doubles(conv[0].tensor()), 1e-5);
}

TEST(DeformConv, OneDimensionalMatchesTwoDimensionalWithHeightOne) {
  // With H = 1 and zero y offsets, every 2-D sample lies on row 0: the same
  // as the 1-D op with the x offsets (ONNX Runtime has only 2-D).
  mx::array x = mx::random::normal({2, 4, 9}, mx::float32, 0, 1, mx::random::key(3));
  mx::array w = mx::random::normal({6, 2, 3}, mx::float32, 0, 1, mx::random::key(4));
  mx::array dx =
      mx::multiply(mx::random::normal({2, 2, 3, 3}, mx::float32, 0, 1, mx::random::key(5)), mx::array(1.5f));
  mx::array mask = mx::random::uniform({2, 6, 3}, mx::random::key(6));
  auto one_d = run_op("DeformConv", 19, {x, w, mx::reshape(dx, {2, 6, 3}), Value(), mask},
                      {int_attr("group", 2), int_attr("offset_group", 2), ints_attr("pads", {1, 0}),
                       ints_attr("strides", {2}), ints_attr("dilations", {2})});
  // 2-D offsets interleave (dy, dx) per tap: [N, G, K, 2, 1, P].
  mx::array dxy = mx::stack({mx::zeros_like(dx), dx}, 3);
  auto two_d = run_op("DeformConv", 19,
                      {mx::expand_dims(x, 2), mx::expand_dims(w, 2), mx::reshape(dxy, {2, 12, 1, 3}), Value(),
                       mx::reshape(mask, {2, 6, 1, 3})},
                      {int_attr("group", 2), int_attr("offset_group", 2), ints_attr("pads", {0, 1, 0, 0}),
                       ints_attr("strides", {1, 2}), ints_attr("dilations", {1, 2})});
  expect_near(to_doubles(one_d[0].tensor()), to_doubles(two_d[0].tensor()), 1e-5);
}

TEST(DeformConv, BadShapesAreOpErrors) {
  EXPECT_NE(error_of<OpError>([] {
              run_op("DeformConv", 19, {mx::zeros({1, 1}), mx::zeros({1, 1}), mx::zeros({1, 1})});
            }).find("X must be [N, C, D1, ...]"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] {
              run_op("DeformConv", 19,
                     {mx::zeros({1, 1, 3, 3}), mx::zeros({1, 1, 2, 2}), mx::zeros({1, 8, 3, 3})});
            }).find("offset must have shape [1, 8, 2, 2]"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] {
              run_op("DeformConv", 19,
                     {mx::zeros({1, 3, 3, 3}), mx::zeros({1, 2, 2, 2}), mx::zeros({1, 8, 2, 2})});
            }).find("group 1 does not fit 3 input channels"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter
