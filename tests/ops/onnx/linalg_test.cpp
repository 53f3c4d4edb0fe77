#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::run_op;
using testing::to_doubles;

TEST(Det, BatchOfMatricesByHand) {
  // det [[1, 2], [3, 4]] = -2; det [[2, 0], [0, 3]] = 6.
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f, 2.f, 0.f, 0.f, 3.f}, {2, 2, 2});
  auto out = run_op("Det", 11, {x});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2}));
  std::vector<double> d = to_doubles(out[0].tensor());
  EXPECT_NEAR(d[0], -2, 1e-5);  // float32 LU of small integers
  EXPECT_NEAR(d[1], 6, 1e-5);
  // A 3x3 permutation matrix with one swap: det -1.
  mx::array swap = mx::array({0.f, 1.f, 0.f, 1.f, 0.f, 0.f, 0.f, 0.f, 1.f}, {3, 3});
  EXPECT_NEAR(to_doubles(run_op("Det", 22, {swap})[0].tensor())[0], -1, 1e-6);
}

TEST(Det, NonSquareOrIntegerInputIsAnOpError) {
  std::string shape = testing::error_of<OpError>([] { run_op("Det", 11, {mx::zeros({2, 3})}); });
  EXPECT_NE(shape.find("[Det v11]"), std::string::npos);
  EXPECT_NE(shape.find("square matrices"), std::string::npos);
  std::string dtype = testing::error_of<OpError>([] { run_op("Det", 11, {mx::zeros({2, 2}, mx::int32)}); });
  EXPECT_NE(dtype.find("float tensor"), std::string::npos);
}

}  // namespace
}  // namespace transmuter
