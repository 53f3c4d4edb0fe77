#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::int_attr;
using testing::ints_attr;
using testing::run_op;
using testing::to_doubles;
using testing::to_ints;

const double kInf = std::numeric_limits<double>::infinity();

// [[1, 2], [3, 4], [5, 6]]
mx::array three_by_two() { return mx::array({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {3, 2}); }

mx::array int64s(std::vector<int64_t> values) {
  int n = static_cast<int>(values.size());
  return mx::array(values.data(), {n}, mx::int64);
}

mx::array axes(std::vector<int64_t> values) { return int64s(std::move(values)); }

TEST(Reduction, SumTakesAxesFromAttributeBeforeV13) {
  auto out = run_op("ReduceSum", 11, {three_by_two()}, {ints_attr("axes", {0}), int_attr("keepdims", 0)});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{9, 12}));
}

TEST(Reduction, SumTakesAxesFromInputFromV13) {
  auto out = run_op("ReduceSum", 13, {three_by_two(), axes({-1})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3, 1}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{3, 7, 11}));
}

TEST(Reduction, MissingAxesReduceEverything) {
  auto out = run_op("ReduceMean", 18, {three_by_two()}, {int_attr("keepdims", 0)});
  EXPECT_EQ(out[0].tensor().ndim(), 0u);
  EXPECT_DOUBLE_EQ(to_doubles(out[0].tensor())[0], 3.5);
}

TEST(Reduction, EmptyAxesWithNoopReduceNothingButKeepTheElementwisePart) {
  // Reference semantics: ReduceSumSquare over no axes squares each element.
  auto out = run_op("ReduceSumSquare", 18, {three_by_two(), axes({})}, {int_attr("noop_with_empty_axes", 1)});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3, 2}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{1, 4, 9, 16, 25, 36}));
}

TEST(Reduction, EmptySetGivesTheIdentityOfEachReduction) {
  mx::array empty = mx::zeros({2, 0, 3});
  auto check = [&](const char* op, double expected) {
    auto out = run_op(op, 18, {empty, axes({1})});
    EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 1, 3})) << op;
    for (double v : to_doubles(out[0].tensor())) EXPECT_EQ(v, expected) << op;
  };
  check("ReduceMax", -kInf);
  check("ReduceMin", kInf);
  check("ReduceProd", 1);
  check("ReduceSum", 0);
  check("ReduceL2", 0);
  check("ReduceLogSum", -kInf);
  check("ReduceLogSumExp", -kInf);
}

TEST(Reduction, EmptySetOfIntegersUsesTheDtypeRange) {
  auto out = run_op("ReduceMax", 18, {mx::zeros({0, 2}, mx::int32), axes({0})}, {int_attr("keepdims", 0)});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int32);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{INT32_MIN, INT32_MIN}));
}

TEST(Reduction, BoolMaxAndMinStayBool) {
  mx::array x = mx::array({true, false, false, false}, {2, 2});
  auto max = run_op("ReduceMax", 20, {x, axes({1})}, {int_attr("keepdims", 0)});
  auto min = run_op("ReduceMin", 20, {x, axes({1})}, {int_attr("keepdims", 0)});
  EXPECT_EQ(max[0].tensor().dtype(), mx::bool_);
  EXPECT_EQ(to_ints(max[0].tensor()), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(to_ints(min[0].tensor()), (std::vector<int64_t>{0, 0}));
}

TEST(Reduction, IntegerMeanKeepsTheDtypeAndTruncates) {
  auto out =
      run_op("ReduceMean", 18, {mx::array({1, 2, -3, -4}, {2, 2}), axes({1})}, {int_attr("keepdims", 0)});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int32);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{1, -3}));  // 1.5 -> 1, -3.5 -> -3

  // Exact beyond float precision: (2^40 + 1 + 2^40 + 2) / 2 truncates to 2^40 + 1.
  const int64_t big = int64_t{1} << 40;
  auto wide = run_op("ReduceMean", 18, {int64s({big + 1, big + 2})}, {int_attr("keepdims", 0)});
  EXPECT_EQ(wide[0].tensor().dtype(), mx::int64);
  EXPECT_EQ(to_ints(wide[0].tensor()), (std::vector<int64_t>{big + 1}));
}

TEST(Reduction, LogSumExpIsStableForLargeValues) {
  auto out = run_op("ReduceLogSumExp", 18, {mx::array({1000.f, 1000.f}), axes({0})});
  EXPECT_NEAR(to_doubles(out[0].tensor())[0], 1000 + std::log(2.0), 1e-3);
}

TEST(Reduction, L1AndL2) {
  mx::array x = mx::array({3.f, -4.f});
  EXPECT_EQ(to_doubles(run_op("ReduceL1", 18, {x})[0].tensor()), (std::vector<double>{7}));
  EXPECT_EQ(to_doubles(run_op("ReduceL2", 18, {x})[0].tensor()), (std::vector<double>{5}));
}

TEST(Reduction, AxisOutOfRangeNamesTheNode) {
  try {
    run_op("ReduceSum", 13, {three_by_two(), axes({2})});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[ReduceSum v13] node 'test_ReduceSum'"), std::string::npos)
        << e.what();
  }
}

TEST(ArgExtreme, ReturnsInt64AndFirstIndexByDefault) {
  mx::array x = mx::array({2.f, 5.f, 5.f, 1.f, 1.f, 0.f}, {2, 3});
  auto out = run_op("ArgMax", 13, {x}, {int_attr("axis", 1)});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int64);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 1}));
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{1, 0}));
}

TEST(ArgExtreme, SelectLastIndexPicksTheLastOfEqualExtremes) {
  mx::array x = mx::array({2.f, 5.f, 5.f, 1.f, 1.f, 0.f}, {2, 3});
  auto max = run_op("ArgMax", 13, {x}, {int_attr("axis", 1), int_attr("select_last_index", 1)});
  EXPECT_EQ(to_ints(max[0].tensor()), (std::vector<int64_t>{2, 1}));

  mx::array y = mx::array({1.f, 0.f, 3.f, 1.f, 0.f, 2.f}, {2, 3});
  auto first = run_op("ArgMin", 13, {y}, {int_attr("axis", 0), int_attr("keepdims", 0)});
  auto last = run_op("ArgMin", 13, {y},
                     {int_attr("axis", 0), int_attr("keepdims", 0), int_attr("select_last_index", 1)});
  EXPECT_EQ(last[0].tensor().shape(), (mx::Shape{3}));
  EXPECT_EQ(to_ints(first[0].tensor()), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(to_ints(last[0].tensor()), (std::vector<int64_t>{1, 1, 1}));
}

TEST(CumSum, ExclusiveReverseAlongHostAxis) {
  mx::array x = mx::array({1, 2, 3, 4}, {4});
  auto out = run_op("CumSum", 14, {x, mx::array(0)}, {int_attr("exclusive", 1), int_attr("reverse", 1)});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int32);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{9, 7, 4, 0}));
}

TEST(CumSum, NegativeAxis) {
  auto out = run_op("CumSum", 11, {three_by_two(), mx::array(int64_t{-1})});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{1, 3, 3, 7, 5, 11}));
}

TEST(TopK, LargestSortedWithTiesInIndexOrder) {
  mx::array x = int64s({3, 7, 7, 1, 7});
  auto out = run_op("TopK", 11, {x, axes({3})}, {}, 2);
  EXPECT_EQ(out[0].tensor().dtype(), mx::int64);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(out[1].tensor().dtype(), mx::int64);
  EXPECT_EQ(to_ints(out[1].tensor()), (std::vector<int64_t>{1, 2, 4}));
}

TEST(TopK, SmallestAlongAxis0) {
  mx::array x = mx::array({4.f, 1.f, 2.f, 3.f, 0.f, 5.f}, {3, 2});
  auto out = run_op("TopK", 11, {x, axes({2})}, {int_attr("axis", 0), int_attr("largest", 0)}, 2);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(to_ints(out[1].tensor()), (std::vector<int64_t>{2, 0, 1, 1}));
}

TEST(TopK, UnsignedLargestDoesNotWrap) {
  std::vector<uint64_t> values = {0, UINT64_MAX, 5};
  mx::array x = mx::array(values.data(), {3}, mx::uint64);
  auto out = run_op("TopK", 11, {x, axes({2})}, {}, 2);
  EXPECT_EQ(to_ints(out[1].tensor()), (std::vector<int64_t>{1, 2}));
}

TEST(TopK, KIsAnAttributeBeforeV10) {
  auto out = run_op("TopK", 1, {mx::array({1.f, 3.f, 2.f})}, {int_attr("k", 1)}, 2);
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{3}));
  EXPECT_EQ(to_ints(out[1].tensor()), (std::vector<int64_t>{1}));
}

TEST(TopK, KLargerThanTheAxisIsAnError) {
  EXPECT_THROW(run_op("TopK", 11, {mx::array({1.f, 2.f}), axes({3})}, {}, 2), OpError);
}

TEST(TopK, KBeyondInt32NamesTheValue) {
  std::string message = testing::error_of<OpError>(
      [] { run_op("TopK", 11, {mx::array({1.f, 2.f}), axes({int64_t{1} << 40})}, {}, 2); });
  EXPECT_EQ(message, "[TopK v11] node 'test_TopK': k = 1099511627776 is out of range for axis 0 of size 2");
}

TEST(CumProd, ExclusiveAndReverse) {
  mx::array x = mx::array({1.0f, 2.0f, 3.0f, 4.0f});
  mx::array axis = testing::i64({0}, {});
  auto inclusive = testing::run_op("CumProd", 26, {x, axis});
  EXPECT_EQ(testing::to_doubles(inclusive[0].tensor()), (std::vector<double>{1, 2, 6, 24}));
  auto exclusive = testing::run_op("CumProd", 26, {x, axis}, {testing::int_attr("exclusive", 1)});
  EXPECT_EQ(testing::to_doubles(exclusive[0].tensor()), (std::vector<double>{1, 1, 2, 6}));
  auto reverse = testing::run_op("CumProd", 26, {x, axis}, {testing::int_attr("reverse", 1)});
  EXPECT_EQ(testing::to_doubles(reverse[0].tensor()), (std::vector<double>{24, 24, 12, 4}));
}

}  // namespace
}  // namespace transmuter
