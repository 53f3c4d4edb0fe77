#include <gtest/gtest.h>

#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::float_attr;
using testing::int_attr;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;
using testing::to_ints;

mx::array int64s(std::vector<int64_t> values, mx::Shape shape) {
  return mx::array(values.data(), shape, mx::int64);
}

TEST(MatMul, VectorTimesMatrixDropsThePromotedAxis) {
  mx::array v = mx::array({1.f, 2.f});
  mx::array m = mx::array({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  auto out = run_op("MatMul", 13, {v, m});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{9, 12, 15}));
}

TEST(MatMul, MatrixTimesVectorAndVectorDotVector) {
  mx::array m = mx::array({1.f, 2.f, 3.f, 4.f}, {2, 2});
  mx::array v = mx::array({1.f, -1.f});
  auto mv = run_op("MatMul", 13, {m, v});
  EXPECT_EQ(mv[0].tensor().shape(), (mx::Shape{2}));
  EXPECT_EQ(to_doubles(mv[0].tensor()), (std::vector<double>{-1, -1}));
  auto dot = run_op("MatMul", 13, {v, v});
  EXPECT_EQ(dot[0].tensor().ndim(), 0u);
  EXPECT_EQ(to_doubles(dot[0].tensor()), (std::vector<double>{2}));
}

TEST(MatMul, BroadcastsBatchAxes) {
  auto out = run_op("MatMul", 13, {mx::ones({3, 1, 2, 4}), mx::ones({1, 5, 4, 6})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3, 5, 2, 6}));
  EXPECT_EQ(to_doubles(out[0].tensor())[0], 4);
}

TEST(MatMul, Int64IsExactBeyondFloatPrecision) {
  // 2^40 + 1 is not representable in float32 (nor is the product in float64).
  const int64_t big = (int64_t{1} << 40) + 1;
  auto out = run_op("MatMul", 13, {int64s({big, 3}, {1, 2}), int64s({3, big}, {2, 1})});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int64);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{3 * big + 3 * big}));
}

TEST(MatMul, Int32BatchedMatchesHandComputed) {
  mx::array a = mx::array({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  mx::array b = mx::array({1, 0, 0, 1}, {2, 2});
  auto out = run_op("MatMul", 13, {a, b});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int32);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(MatMul, MismatchedInnerDimensionsIsAnError) {
  EXPECT_THROW(run_op("MatMul", 13, {mx::ones({2, 3}), mx::ones({2, 3})}), OpError);
}

TEST(Gemm, TransposesScalesAndBroadcastsC) {
  mx::array a = mx::array({1.f, 3.f, 2.f, 4.f}, {2, 2});  // A^T = [[1, 2], [3, 4]]
  mx::array b = mx::array({1.f, 0.f, 0.f, 1.f}, {2, 2});
  mx::array c = mx::array({10.f, 20.f}, {1, 2});
  auto out = run_op(
      "Gemm", 13, {a, b, c},
      {int_attr("transA", 1), int_attr("transB", 1), float_attr("alpha", 2.f), float_attr("beta", 0.5f)});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{7, 14, 11, 18}));
}

TEST(Gemm, COptionalFromV11) {
  auto out = run_op("Gemm", 11, {mx::ones({2, 3}), mx::ones({3, 4})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 4}));
  EXPECT_EQ(to_doubles(out[0].tensor())[0], 3);
}

TEST(Gemm, LegacyBroadcastOfAVectorC) {
  auto out = run_op("Gemm", 6, {mx::ones({2, 3}), mx::ones({3, 2}), mx::array({1.f, 2.f})},
                    {int_attr("broadcast", 1)});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{4, 5, 4, 5}));
}

TEST(Einsum, SpacesEllipsisAndRepeatedIndices) {
  // Batch diagonal: "...ii ->...i".
  mx::array x = mx::reshape(mx::arange(8.0, mx::float32), {2, 2, 2});
  auto out = run_op("Einsum", 12, {x}, {string_attr("equation", "...ii ->...i")});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{0, 3, 4, 7}));
}

TEST(Einsum, ImplicitOutputOfAnInnerProduct) {
  auto out =
      run_op("Einsum", 12, {mx::array({1.f, 2.f}), mx::array({3.f, 4.f})}, {string_attr("equation", "i,i")});
  EXPECT_EQ(out[0].tensor().ndim(), 0u);
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{11}));
}

TEST(Einsum, IntegerContractionKeepsTheDtype) {
  auto out = run_op("Einsum", 12, {int64s({1, 2, 3, 4}, {2, 2}), int64s({5, 6}, {2})},
                    {string_attr("equation", "ij,j->i")});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int64);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{17, 39}));
}

}  // namespace
}  // namespace transmuter
