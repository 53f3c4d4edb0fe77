#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::i64;
using testing::int_attr;
using testing::iota;
using testing::run_compiled;
using testing::run_op;
using testing::to_doubles;
using testing::to_ints;

mx::array flags(std::vector<bool> v) {
  std::vector<uint8_t> bytes(v.begin(), v.end());
  return mx::astype(mx::array(bytes.data(), {static_cast<int>(bytes.size())}, mx::uint8), mx::bool_);
}

TEST(Compress, ShortConditionSelectsLeadingSlices) {
  // [3, 2]: rows 0 and 2 kept; the condition covers only 2 of 3 rows along axis 0 -> row 0.
  mx::array x = iota({3, 2});
  auto rows = run_op("Compress", 11, {x, flags({true, false})}, {int_attr("axis", 0)});
  EXPECT_EQ(rows[0].tensor().shape(), (mx::Shape{1, 2}));
  EXPECT_EQ(to_doubles(rows[0].tensor()), (std::vector<double>{0, 1}));
  auto columns = run_op("Compress", 11, {x, flags({false, true})}, {int_attr("axis", -1)});
  EXPECT_EQ(to_doubles(columns[0].tensor()), (std::vector<double>{1, 3, 5}));
  auto flat = run_op("Compress", 9, {x, flags({false, true, true, false, false, true})});
  EXPECT_EQ(to_doubles(flat[0].tensor()), (std::vector<double>{1, 2, 5}));
  auto none = run_op("Compress", 9, {x, flags({false})}, {int_attr("axis", 1)});
  EXPECT_EQ(none[0].tensor().shape(), (mx::Shape{3, 0}));
}

TEST(Compress, BadConditionIsAnOpError) {
  mx::array x = iota({2, 2});
  std::string longer = error_of<OpError>(
      [&] { run_op("Compress", 11, {x, flags({true, true, true})}, {int_attr("axis", 0)}); });
  EXPECT_NE(longer.find("condition has 3 entries"), std::string::npos);
  std::string rank =
      error_of<OpError>([&] { run_op("Compress", 11, {x, mx::reshape(flags({true, true}), {1, 2})}); });
  EXPECT_NE(rank.find("condition must be 1-D"), std::string::npos);
  std::string axis =
      error_of<OpError>([&] { run_op("Compress", 11, {x, flags({true})}, {int_attr("axis", 2)}); });
  EXPECT_NE(axis.find("[Compress v11]"), std::string::npos);
}

TEST(Unique, SortedAndFirstOccurrenceOrders) {
  mx::array x = mx::array({2.f, 1.f, 1.f, 3.f, 4.f, 3.f});
  auto sorted = run_op("Unique", 11, {x}, {}, 4);
  EXPECT_EQ(to_doubles(sorted[0].tensor()), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(to_ints(sorted[1].tensor()), (std::vector<int64_t>{1, 0, 3, 4}));
  EXPECT_EQ(to_ints(sorted[2].tensor()), (std::vector<int64_t>{1, 0, 0, 2, 3, 2}));
  EXPECT_EQ(to_ints(sorted[3].tensor()), (std::vector<int64_t>{2, 1, 2, 1}));
  auto unsorted = run_op("Unique", 11, {x}, {int_attr("sorted", 0)}, 4);
  EXPECT_EQ(to_doubles(unsorted[0].tensor()), (std::vector<double>{2, 1, 3, 4}));
  EXPECT_EQ(to_ints(unsorted[1].tensor()), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(to_ints(unsorted[2].tensor()), (std::vector<int64_t>{0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(to_ints(unsorted[3].tensor()), (std::vector<int64_t>{1, 2, 2, 1}));
}

TEST(Unique, NaNsSortLastAndMerge) {
  const float nan = std::nanf("");
  auto out = run_op("Unique", 11, {mx::array({nan, 1.f, nan, 0.f})}, {}, 4);
  std::vector<double> y = to_doubles(out[0].tensor());
  ASSERT_EQ(y.size(), 3u);
  EXPECT_EQ(y[0], 0);
  EXPECT_EQ(y[1], 1);
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(to_ints(out[3].tensor()), (std::vector<int64_t>{1, 1, 2}));
}

TEST(Unique, RowsAlongAnAxisSortLexicographically) {
  mx::array x = mx::array({1, 0, 0, 1, 1, 0}, {3, 2}, mx::int64);  // rows [1,0], [0,1], [1,0]
  auto out = run_op("Unique", 11, {x}, {int_attr("axis", 0)}, 4);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{0, 1, 1, 0}));
  EXPECT_EQ(to_ints(out[2].tensor()), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(to_ints(out[3].tensor()), (std::vector<int64_t>{1, 2}));
}

TEST(ReverseSequence, ReversesEachPrefixAndKeepsTheRest) {
  // batch_axis 0, time_axis 1: rows [0 1 2 3] with length 3 -> [2 1 0 3]; [4 5 6 7] with 1 -> unchanged.
  mx::array x = iota({2, 4});
  std::vector<Attribute> attrs = {int_attr("batch_axis", 0), int_attr("time_axis", 1)};
  auto out = run_op("ReverseSequence", 10, {x, i64({3, 1})}, attrs);
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{2, 1, 0, 3, 4, 5, 6, 7}));
  // Traced lengths under compile: same result.
  auto compiled = run_compiled("ReverseSequence", 10, {x, i64({3, 1})}, {0, 1}, attrs);
  EXPECT_EQ(to_doubles(compiled[0]), to_doubles(out[0].tensor()));
  // Time-major with an extra feature axis: [T=3, B=1, 2], length 2.
  auto time_major = run_op("ReverseSequence", 10, {iota({3, 1, 2}), i64({2})});
  EXPECT_EQ(to_doubles(time_major[0].tensor()), (std::vector<double>{2, 3, 0, 1, 4, 5}));
}

TEST(ReverseSequence, BadAxesOrLengthsAreOpErrors) {
  std::string axes = error_of<OpError>([&] {
    run_op("ReverseSequence", 10, {iota({2, 2}), i64({1, 1})},
           {int_attr("batch_axis", 1), int_attr("time_axis", 1)});
  });
  EXPECT_NE(axes.find("batch_axis and time_axis"), std::string::npos);
  std::string lengths =
      error_of<OpError>([&] { run_op("ReverseSequence", 10, {iota({2, 2}), i64({1, 1, 1})}); });
  EXPECT_NE(lengths.find("sequence_lens must have shape [2]"), std::string::npos);
  std::string longer = error_of<OpError>([&] { run_op("ReverseSequence", 10, {iota({2, 2}), i64({3, 1})}); });
  EXPECT_NE(longer.find("sequence length 3 outside [0, 2]"), std::string::npos);
}

}  // namespace
}  // namespace transmuter
