#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::i64;
using testing::int_attr;
using testing::ints_attr;
using testing::run_compiled;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;

// float32 weighted sums of a few values of order 1.
constexpr double kTol = 1e-5;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = kTol) {
  testing::expect_all_near(actual, expected, tol);
}

// X [1, 1, 1, 3] = {10, 20, 30}; a grid of 1 x 4 points at normalized x
// positions `xs` (y = 0).
mx::array row() { return mx::array({10.f, 20.f, 30.f}, {1, 1, 1, 3}); }
mx::array points(std::vector<float> xs) {
  std::vector<float> grid;
  for (float x : xs) grid.insert(grid.end(), {x, 0.f});
  return mx::array(grid.data(), {1, 1, static_cast<int>(xs.size()), 2}, mx::float32);
}

TEST(GridSample, LinearAtCellCentresReturnsTheInput) {
  // Without align_corners cell i's centre is (2i + 1) / 3 - 1.
  auto out = run_op("GridSample", 22, {row(), points({-2.f / 3, 0.f, 2.f / 3})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 1, 1, 3}));
  expect_near(to_doubles(out[0].tensor()), {10, 20, 30});
}

TEST(GridSample, PaddingModesOutsideTheInput) {
  // x = 1.5 is pixel 3.25, beyond the border at 2.5; x = -1 is pixel -0.5,
  // the border itself.
  mx::array grid = points({1.5f, -1.f});
  auto zeros = run_op("GridSample", 22, {row(), grid}, {string_attr("padding_mode", "zeros")});
  expect_near(to_doubles(zeros[0].tensor()), {0, 5});  // -0.5: half of pixel 0, half of nothing
  auto border = run_op("GridSample", 22, {row(), grid}, {string_attr("padding_mode", "border")});
  expect_near(to_doubles(border[0].tensor()), {30, 10});
  // Reflection about 2.5: 3.25 -> 1.75, between 20 and 30.
  auto reflection = run_op("GridSample", 22, {row(), grid}, {string_attr("padding_mode", "reflection")});
  expect_near(to_doubles(reflection[0].tensor()), {27.5, 10});
}

TEST(GridSample, NearestRoundsHalfToEven) {
  // align_corners: x = -0.5 is pixel 0.5 -> 0; x = 0.5 is pixel 1.5 -> 2.
  auto out = run_op("GridSample", 20, {row(), points({-0.5f, 0.5f})},
                    {string_attr("mode", "nearest"), int_attr("align_corners", 1)});
  expect_near(to_doubles(out[0].tensor()), {10, 30});
}

TEST(GridSample, Version16SpellsModesBilinearAndBicubic) {
  auto out = run_op("GridSample", 16, {row(), points({0.f})}, {string_attr("mode", "bicubic")});
  expect_near(to_doubles(out[0].tensor()), {20});
  EXPECT_THROW(run_op("GridSample", 16, {row(), points({0.f})}, {string_attr("mode", "cubic")}), OpError);
}

TEST(GridSample, CompiledWithTracedGrid) {
  const std::vector<Value> inputs = {row(), points({-0.9f, -0.1f, 0.3f, 1.2f})};
  auto eager = run_op("GridSample", 22, inputs, {string_attr("mode", "cubic")});
  auto compiled = run_compiled("GridSample", 22, inputs, {0, 1}, {string_attr("mode", "cubic")});
  expect_near(to_doubles(compiled[0]), to_doubles(eager[0].tensor()));
}

TEST(GridSample, BadInputsNameTheNode) {
  std::string message = error_of<OpError>([] { run_op("GridSample", 22, {row(), mx::zeros({1, 1, 4, 3})}); });
  EXPECT_NE(message.find("[GridSample v22]"), std::string::npos) << message;
  EXPECT_NE(message.find("Grid must have shape"), std::string::npos) << message;
  EXPECT_THROW(run_op("GridSample", 22, {mx::zeros({1, 1, 2, 2, 2}), mx::zeros({1, 1, 1, 1, 3})},
                      {string_attr("mode", "cubic")}),
               OpError);  // cubic is 4-D only
  EXPECT_THROW(run_op("GridSample", 16, {mx::zeros({1, 1, 2, 2, 2}), mx::zeros({1, 1, 1, 1, 3})}), OpError);
  EXPECT_THROW(run_op("GridSample", 22, {row(), points({0.f})}, {string_attr("padding_mode", "wrap")}),
               OpError);
}

TEST(AffineGrid, IdentityGivesCellCentres) {
  mx::array theta = mx::array({1.f, 0.f, 0.f, 0.f, 1.f, 0.f}, {1, 2, 3});
  auto out = run_op("AffineGrid", 20, {theta, i64({1, 1, 1, 2})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 1, 2, 2}));
  expect_near(to_doubles(out[0].tensor()), {-0.5, 0, 0.5, 0});
  auto aligned = run_op("AffineGrid", 20, {theta, i64({1, 1, 1, 2})}, {int_attr("align_corners", 1)});
  expect_near(to_doubles(aligned[0].tensor()), {-1, -1, 1, -1});
}

TEST(AffineGrid, ThetaMustMatchSize) {
  EXPECT_THROW(run_op("AffineGrid", 20, {mx::zeros({1, 3, 4}), i64({1, 1, 2, 2})}), OpError);
  EXPECT_THROW(run_op("AffineGrid", 20, {mx::zeros({1, 2, 3}), i64({1, 1, 2})}), OpError);
}

TEST(CenterCropPad, CropsAndPadsAroundTheCentre) {
  // Axis 0: 3 -> 1 keeps the middle row; axis 1: 2 -> 5 pads 1 before, 2 after.
  mx::array x = testing::iota({3, 2});
  auto out = run_op("CenterCropPad", 18, {x, i64({1, 5})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 5}));
  expect_near(to_doubles(out[0].tensor()), {0, 2, 3, 0, 0});
  auto axes = run_op("CenterCropPad", 18, {x, i64({2})}, {ints_attr("axes", {-2})});
  expect_near(to_doubles(axes[0].tensor()), {0, 1, 2, 3});  // odd difference: the extra row goes at the end
}

TEST(CenterCropPad, ShapeMustMatchAxes) {
  EXPECT_THROW(run_op("CenterCropPad", 18, {testing::iota({3, 2}), i64({1})}), OpError);
  EXPECT_THROW(run_op("CenterCropPad", 18, {testing::iota({3, 2}), i64({1, -1})}), OpError);
}

TEST(Col2Im, OverlappingBlocksAddUp) {
  // Image 1 x 3, blocks 1 x 2 at stride 1: two blocks, columns [k, l].
  mx::array cols = mx::array({1.f, 2.f, 10.f, 20.f}, {1, 2, 2});  // k=0: 1, 2; k=1: 10, 20
  auto out = run_op("Col2Im", 18, {cols, i64({1, 3}), i64({1, 2})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 1, 1, 3}));
  expect_near(to_doubles(out[0].tensor()), {1, 12, 20});
}

TEST(Col2Im, BlockCountMustMatch) {
  std::string message =
      error_of<OpError>([] { run_op("Col2Im", 18, {mx::zeros({1, 2, 3}), i64({1, 3}), i64({1, 2})}); });
  EXPECT_NE(message.find("[Col2Im v18]"), std::string::npos) << message;
  EXPECT_THROW(run_op("Col2Im", 18, {mx::zeros({1, 3, 2}), i64({1, 3}), i64({1, 2})}), OpError);
  EXPECT_THROW(
      run_op("Col2Im", 18, {mx::zeros({1, 2, 2}), i64({1, 3}), i64({1, 2})}, {ints_attr("strides", {0, 1})}),
      OpError);
}

}  // namespace
}  // namespace transmuter
