#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/expect_error.h"
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

using testing::i64;
using testing::iota;
using testing::out0;
using testing::run_compiled;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(Slice, StartsEndsAxesSteps) {
  auto out = run_op("Slice", 13, {iota({3, 4}), i64({1, 0}), i64({3, 4}), i64({0, 1}), i64({1, 2})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{4, 6, 8, 10}));
}

TEST(Slice, NegativeStepsReverseToTheFront) {
  auto all = run_op("Slice", 13, {iota({5}), i64({-1}), i64({kMin}), i64({0}), i64({-1})});
  EXPECT_EQ(to_doubles(out0(all)), (std::vector<double>{4, 3, 2, 1, 0}));
  auto part = run_op("Slice", 13, {iota({5}), i64({kMax}), i64({1}), i64({0}), i64({-2})});
  EXPECT_EQ(to_doubles(out0(part)), (std::vector<double>{4, 2}));
}

TEST(Slice, OutOfBoundsClampAndEmptyResult) {
  auto clamped = run_op("Slice", 13, {iota({5}), i64({-100}), i64({kMax})});
  EXPECT_EQ(out0(clamped).shape(), (mx::Shape{5}));
  auto empty = run_op("Slice", 13, {iota({5}), i64({10}), i64({1000})});
  EXPECT_EQ(out0(empty).shape(), (mx::Shape{0}));
  EXPECT_THROW(run_op("Slice", 13, {iota({5}), i64({0}), i64({1}), i64({0}), i64({0})}), OpError);
}

TEST(Slice, Opset1Attributes) {
  auto out = run_op("Slice", 9, {iota({2, 4})},
                    {ints_attr("starts", {0, 1}), ints_attr("ends", {-1, 1000}), ints_attr("axes", {0, 1})});
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{1, 2, 3}));
}

TEST(Gather, NegativeIndicesWrapAndShapeComposes) {
  auto out = run_op("Gather", 13, {iota({3, 2}), i64({-1, 0, 1, -3}, {2, 2})}, {int_attr("axis", 0)});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 2, 2}));
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{4, 5, 0, 1, 2, 3, 0, 1}));
  auto scalar = run_op("Gather", 13, {iota({3, 2}, mx::int64), mx::array(int64_t{1})}, {int_attr("axis", 1)});
  EXPECT_EQ(out0(scalar).shape(), (mx::Shape{3}));
  EXPECT_EQ(out0(scalar).dtype(), mx::int64);
}

TEST(GatherElements, SmallerIndicesAndNegatives) {
  // data [[0,1,2],[3,4,5],[6,7,8]], indices [[-1, 0], [1, 2]] along axis 1.
  auto out = run_op("GatherElements", 13, {iota({3, 3}), i64({-1, 0, 1, 2}, {2, 2})}, {int_attr("axis", 1)});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{2, 0, 4, 5}));
}

TEST(GatherND, TuplesAndBatchDims) {
  auto out = run_op("GatherND", 13, {iota({2, 2}), i64({0, 0, 1, -1}, {2, 2})});
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{0, 3}));
  auto rows = run_op("GatherND", 13, {iota({2, 2}), i64({1, 0}, {2, 1})});
  EXPECT_EQ(to_doubles(out0(rows)), (std::vector<double>{2, 3, 0, 1}));
  // batch_dims=1: data [2,2,2], per batch pick data[b][idx].
  auto batched = run_op("GatherND", 13, {iota({2, 2, 2}), i64({1, 0}, {2, 1})}, {int_attr("batch_dims", 1)});
  EXPECT_EQ(out0(batched).shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_doubles(out0(batched)), (std::vector<double>{2, 3, 4, 5}));
}

TEST(ScatterElements, ReplaceAddAndNegativeIndices) {
  auto out =
      run_op("ScatterElements", 18, {mx::zeros({3, 3}), i64({1, 0, 2, 0, 2, 1}, {2, 3}), iota({2, 3})});
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{3, 1, 0, 0, 0, 5, 0, 4, 2}));
  auto add =
      run_op("ScatterElements", 18, {mx::ones({1, 5}), i64({1, -4}, {1, 2}), mx::array({1.f, 2.f}, {1, 2})},
             {int_attr("axis", 1), string_attr("reduction", "add")});
  EXPECT_EQ(to_doubles(out0(add)), (std::vector<double>{1, 4, 1, 1, 1}));
  auto legacy =
      run_op("Scatter", 10, {mx::zeros({1, 3}), i64({2}, {1, 1}), mx::ones({1, 1})}, {int_attr("axis", 1)});
  EXPECT_EQ(to_doubles(out0(legacy)), (std::vector<double>{0, 0, 1}));
}

TEST(ScatterElements, MaxMinMulReductions) {
  const mx::array data = mx::array({5, 5}, {1, 2}, mx::int64);
  const mx::array idx = i64({0, 0, 1}, {1, 3});
  const mx::array upd = mx::array({7, 2, 3}, {1, 3}, mx::int64);
  auto mx_ =
      run_op("ScatterElements", 18, {data, idx, upd}, {int_attr("axis", 1), string_attr("reduction", "max")});
  EXPECT_EQ(to_ints(out0(mx_)), (std::vector<int64_t>{7, 5}));
  auto mn =
      run_op("ScatterElements", 18, {data, idx, upd}, {int_attr("axis", 1), string_attr("reduction", "min")});
  EXPECT_EQ(to_ints(out0(mn)), (std::vector<int64_t>{2, 3}));
  auto mul =
      run_op("ScatterElements", 18, {data, idx, upd}, {int_attr("axis", 1), string_attr("reduction", "mul")});
  EXPECT_EQ(to_ints(out0(mul)), (std::vector<int64_t>{70, 15}));
  EXPECT_EQ(out0(mul).dtype(), mx::int64);
}

TEST(ScatterND, SlicesAndReductions) {
  // Replace rows 2 and 0 of a [4, 2] tensor.
  auto out = run_op("ScatterND", 18, {mx::zeros({4, 2}), i64({2, -4}, {2, 1}), iota({2, 2})});
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{2, 3, 0, 0, 0, 1, 0, 0}));
  auto add = run_op("ScatterND", 18, {mx::ones({4}), i64({1, 1}, {2, 1}), mx::array({2.f, 3.f})},
                    {string_attr("reduction", "add")});
  EXPECT_EQ(to_doubles(out0(add)), (std::vector<double>{1, 6, 1, 1}));
  auto element = run_op("ScatterND", 18, {mx::zeros({2, 2}), i64({1, 0}, {1, 2}), mx::array({9.f})});
  EXPECT_EQ(to_doubles(out0(element)), (std::vector<double>{0, 0, 9, 0}));
}

TEST(Trilu, UpperLowerWithK) {
  auto upper = run_op("Trilu", 14, {iota({3, 3})});
  EXPECT_EQ(to_doubles(out0(upper)), (std::vector<double>{0, 1, 2, 0, 4, 5, 0, 0, 8}));
  auto lower = run_op("Trilu", 14, {iota({2, 3}, mx::int64), i64({-1}, {})}, {int_attr("upper", 0)});
  EXPECT_EQ(to_ints(out0(lower)), (std::vector<int64_t>{0, 0, 0, 3, 0, 0}));
  auto far = run_op("Trilu", 14, {iota({2, 3}), mx::array(int64_t{kMax})});
  EXPECT_EQ(to_doubles(out0(far)), (std::vector<double>(6, 0)));
}

TEST(OneHot, AxisNegativeIndicesAndOutOfRange) {
  auto out = run_op("OneHot", 11, {i64({1, -1, 5}), mx::array(int64_t{3}), mx::array({0.f, 2.f})});
  EXPECT_EQ(out0(out).shape(), (mx::Shape{3, 3}));
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{0, 2, 0, 0, 0, 2, 0, 0, 0}));
  auto axis0 = run_op("OneHot", 11, {i64({0, 2}), mx::array(3.f), mx::array({0, 1}, mx::int32)},
                      {int_attr("axis", 0)});
  EXPECT_EQ(out0(axis0).shape(), (mx::Shape{3, 2}));
  EXPECT_EQ(out0(axis0).dtype(), mx::int32);
  EXPECT_EQ(to_ints(out0(axis0)), (std::vector<int64_t>{1, 0, 0, 0, 0, 1}));
  // uint8 indices must reach classes beyond 255.
  auto wide = run_op("OneHot", 11,
                     {mx::array({200, 255}, mx::uint8), mx::array(int64_t{300}), mx::array({0.f, 1.f})});
  EXPECT_EQ(out0(wide).shape(), (mx::Shape{2, 300}));
  EXPECT_EQ(to_doubles(mx::sum(out0(wide))), (std::vector<double>{2}));
  EXPECT_EQ(to_doubles(mx::take(mx::flatten(out0(wide)), 300 + 255)), (std::vector<double>{1}));
}

TEST(NonZero, CoordinatesAsInt64) {
  auto out = run_op("NonZero", 13, {mx::array({1.f, 0.f, 0.f, 3.f}, {2, 2})});
  EXPECT_EQ(out0(out).dtype(), mx::int64);
  EXPECT_EQ(out0(out).shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_ints(out0(out)), (std::vector<int64_t>{0, 1, 0, 1}));
  auto none = run_op("NonZero", 13, {mx::zeros({3}, mx::bool_)});
  EXPECT_EQ(out0(none).shape(), (mx::Shape{1, 0}));
}

TEST(Indexing, ErrorsNameTheNode) {
  try {
    run_op("ScatterND", 18, {mx::zeros({4}), i64({1}, {1, 1}), mx::ones({1})},
           {string_attr("reduction", "xor")});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[ScatterND v11] node 'test_ScatterND'"), std::string::npos)
        << e.what();
  }
}

TEST(IndexingCompiled, TracedIndicesWrapNegatives) {
  auto gathered = run_compiled("Gather", 13, {iota({3}), i64({-1, 0})}, {0, 1});
  EXPECT_EQ(to_doubles(gathered[0]), (std::vector<double>{2, 0}));
  auto elements = run_compiled("GatherElements", 13, {iota({2, 2}), i64({-1, 0}, {1, 2})}, {0, 1});
  EXPECT_EQ(to_doubles(elements[0]), (std::vector<double>{2, 1}));
  auto nd = run_compiled("GatherND", 13, {iota({2, 2}), i64({-1, -1}, {1, 2})}, {0, 1});
  EXPECT_EQ(to_doubles(nd[0]), (std::vector<double>{3}));
  auto scattered = run_compiled("ScatterElements", 18, {mx::zeros({3}), i64({-1}), mx::array({5.f})},
                                {0, 1, 2}, {string_attr("reduction", "add")});
  EXPECT_EQ(to_doubles(scattered[0]), (std::vector<double>{0, 0, 5}));
  auto scattered_nd =
      run_compiled("ScatterND", 18, {mx::zeros({3}), i64({-3}, {1, 1}), mx::array({4.f})}, {0, 1, 2});
  EXPECT_EQ(to_doubles(scattered_nd[0]), (std::vector<double>{4, 0, 0}));
  auto hot = run_compiled("OneHot", 11, {i64({-1}), mx::array(int64_t{2}), mx::array({0.f, 1.f})}, {0, 2});
  EXPECT_EQ(to_doubles(hot[0]), (std::vector<double>{0, 1}));
  auto sliced = run_compiled("Slice", 13, {iota({4}), i64({-1}), i64({kMin}), i64({0}), i64({-2})}, {0});
  EXPECT_EQ(to_doubles(sliced[0]), (std::vector<double>{3, 1}));
  auto lower = run_compiled("Trilu", 14, {iota({2, 2}), mx::array(int64_t{0})}, {0}, {int_attr("upper", 0)});
  EXPECT_EQ(to_doubles(lower[0]), (std::vector<double>{0, 0, 2, 3}));
}

// --- Bad values (docs/architecture.md, "Bad values") ---------------------------------------

using testing::error_of;

constexpr int64_t kFar = int64_t{1} << 40;

// Runs the op eagerly and returns the OpError's message ("" and a failure when
// it throws nothing).
std::string op_error(const std::string& op, int opset, const std::vector<Value>& inputs,
                     const std::vector<Attribute>& attributes = {}) {
  return error_of<OpError>([&] { run_op(op, opset, inputs, attributes); });
}

TEST(BadIndices, GatherOutOfRangeNamesNodeAxisAndValue) {
  EXPECT_EQ(op_error("Gather", 13, {iota({5}), i64({1, 5})}),
            "[Gather v1] node 'test_Gather': index 5 out of range for axis 0 of size 5");
  EXPECT_EQ(op_error("Gather", 13, {iota({5}), i64({kFar})}),
            "[Gather v1] node 'test_Gather': index 1099511627776 out of range for axis 0 of size 5");
  EXPECT_EQ(op_error("Gather", 13, {iota({2, 5}), i64({-6})}, {int_attr("axis", 1)}),
            "[Gather v1] node 'test_Gather': index -6 out of range for axis 1 of size 5");
  // -size is the lowest valid index (ONNX), and int32 indices are read too.
  EXPECT_EQ(to_doubles(out0(run_op("Gather", 13, {iota({5}), i64({-5})}))), (std::vector<double>{0}));
  EXPECT_NE(op_error("Gather", 13, {iota({5}), mx::array({7}, mx::int32)}).find("index 7 out of range"),
            std::string::npos);
  // Indices read where they lie (evaluated, dense) and through MLX (lazy; a transposed view) alike.
  const mx::array lazy = mx::add(i64({4}), i64({1}));
  EXPECT_EQ(op_error("Gather", 13, {iota({5}), lazy}),
            "[Gather v1] node 'test_Gather': index 5 out of range for axis 0 of size 5");
  mx::array transposed = mx::transpose(i64({0, 1, 2, 9}, {2, 2}));
  mx::eval(transposed);
  EXPECT_EQ(op_error("Gather", 13, {iota({5}), transposed}),
            "[Gather v1] node 'test_Gather': index 9 out of range for axis 0 of size 5");
  EXPECT_EQ(op_error("Gather", 13, {iota({5}), mx::array({-6, 2}, mx::int32)}),
            "[Gather v1] node 'test_Gather': index -6 out of range for axis 0 of size 5");
}

TEST(BadIndices, GatherElementsAndGatherNDOutOfRange) {
  EXPECT_EQ(op_error("GatherElements", 13, {iota({2, 2}), i64({0, 2}, {1, 2})}, {int_attr("axis", 1)}),
            "[GatherElements v11] node 'test_GatherElements': index 2 out of range for axis 1 of size 2");
  // Each tuple column is checked against its own axis.
  EXPECT_EQ(op_error("GatherND", 13, {iota({2, 3}), i64({1, 3}, {1, 2})}),
            "[GatherND v11] node 'test_GatherND': index 3 out of range for axis 1 of size 3");
  EXPECT_EQ(op_error("GatherND", 13, {iota({2, 3}), i64({-3, 0}, {1, 2})}),
            "[GatherND v11] node 'test_GatherND': index -3 out of range for axis 0 of size 2");
  // With batch_dims the tuple starts after the batch axes.
  EXPECT_EQ(op_error("GatherND", 13, {iota({2, 2}), i64({0, kFar}, {2, 1})}, {int_attr("batch_dims", 1)}),
            "[GatherND v11] node 'test_GatherND': index 1099511627776 out of range for axis 1 of size 2");
}

TEST(BadIndices, ScattersOutOfRange) {
  EXPECT_EQ(op_error("ScatterElements", 18, {mx::zeros({3}), i64({3}), mx::ones({1})}),
            "[ScatterElements v11] node 'test_ScatterElements': index 3 out of range for axis 0 of size 3");
  EXPECT_EQ(op_error("Scatter", 10, {mx::zeros({1, 3}), i64({-4}, {1, 1}), mx::ones({1, 1})},
                     {int_attr("axis", 1)}),
            "[Scatter v9] node 'test_Scatter': index -4 out of range for axis 1 of size 3");
  EXPECT_EQ(op_error("ScatterND", 18, {mx::zeros({2, 3}), i64({1, 3}, {1, 2}), mx::ones({1})}),
            "[ScatterND v11] node 'test_ScatterND': index 3 out of range for axis 1 of size 3");
  // Off the scatter axis, positions come from the indices' shape: it must fit.
  EXPECT_NE(op_error("ScatterElements", 18, {mx::zeros({1, 2}), i64({0, 0}, {2, 1}), mx::ones({2, 1})},
                     {int_attr("axis", 1)})
                .find("indices dim 0 (2) exceeds the data's (1)"),
            std::string::npos);
}

TEST(BadIndices, ScalarDataHasNoAxisToIndex) {
  EXPECT_EQ(op_error("Gather", 13, {mx::array(1.f), i64({0})}),
            "[Gather v1] node 'test_Gather': data must have rank >= 1, got a scalar");
  EXPECT_NE(op_error("ScatterElements", 18, {mx::array(1.f), mx::array(int64_t{0}), mx::array(2.f)})
                .find("data must have rank >= 1"),
            std::string::npos);
}

TEST(BadIndices, NarrowSignedIndicesWrapWithoutOverflow) {
  // int8 -1 on an axis of 200: 200 does not fit int8, -1 + 200 neither.
  auto out = run_op("Gather", 13, {iota({200}), mx::array({-1, -128}, mx::int8)});
  EXPECT_EQ(to_doubles(out0(out)), (std::vector<double>{199, 72}));
}

TEST(BadIndicesCompiled, GathersClampTracedIndicesToTheNearestValidOne) {
  // 5 and 2^40 clamp to the last element, -100 to the first; -5 is valid.
  auto taken = run_compiled("Gather", 13, {iota({5}), i64({5, kFar, -100, -5, 2})}, {0, 1});
  EXPECT_EQ(to_doubles(taken[0]), (std::vector<double>{4, 4, 0, 0, 2}));
  // data [[0,1,2],[3,4,5]]; along axis 1: 3 -> 2, -4 -> 0, 7 -> 2.
  auto elements = run_compiled("GatherElements", 13, {iota({2, 3}), i64({3, -4, 7, 0}, {2, 2})}, {0, 1},
                               {int_attr("axis", 1)});
  EXPECT_EQ(to_doubles(elements[0]), (std::vector<double>{2, 0, 5, 3}));
  // Tuples (2, 9) -> (1, 2) and (-3, 1) -> (0, 1), each column clamped to its axis.
  auto nd = run_compiled("GatherND", 13, {iota({2, 3}), i64({2, 9, -3, 1}, {2, 2})}, {0, 1});
  EXPECT_EQ(to_doubles(nd[0]), (std::vector<double>{5, 1}));
}

TEST(BadIndicesCompiled, ScattersDropOutOfRangeUpdates) {
  auto dropped = run_compiled(
      "ScatterElements", 18,
      {mx::zeros({4}), i64({4, 1, -5, -1, kFar}), mx::array({1.f, 2.f, 3.f, 4.f, 5.f})}, {0, 1, 2});
  EXPECT_EQ(to_doubles(dropped[0]), (std::vector<double>{0, 2, 0, 4}));
  auto added =
      run_compiled("ScatterElements", 18, {mx::ones({4}), i64({1, 9, 1}), mx::array({1.f, 10.f, 2.f})},
                   {0, 1, 2}, {string_attr("reduction", "add")});
  EXPECT_EQ(to_doubles(added[0]), (std::vector<double>{1, 4, 1, 1}));
  auto along_rows = run_compiled("ScatterElements", 18,
                                 {mx::zeros({2, 3}), i64({3, 0}, {2, 1}), mx::array({7.f, 8.f}, {2, 1})},
                                 {0, 1, 2}, {int_attr("axis", 1)});
  EXPECT_EQ(to_doubles(along_rows[0]), (std::vector<double>{0, 0, 0, 8, 0, 0}));
  // ScatterND rows 3 and -4 of a [3, 2] tensor do not exist; row 1 does.
  auto rows =
      run_compiled("ScatterND", 18, {mx::zeros({3, 2}), i64({3, 1, -4}, {3, 1}), iota({3, 2})}, {0, 1, 2});
  EXPECT_EQ(to_doubles(rows[0]), (std::vector<double>{0, 0, 2, 3, 0, 0}));
  // A tuple is dropped whole when any coordinate is out of range.
  auto tuples = run_compiled(
      "ScatterND", 18, {mx::zeros({2, 2}), i64({1, 5, 0, 1}, {2, 2}), mx::array({7.f, 8.f})}, {0, 1, 2});
  EXPECT_EQ(to_doubles(tuples[0]), (std::vector<double>{0, 8, 0, 0}));
}

TEST(BadIndicesCompiled, ScatterNDIntoAnEmptyAxisWritesNothing) {
  auto out =
      run_compiled("ScatterND", 18, {mx::zeros({2, 0}), i64({0, 0}, {1, 2}), mx::ones({1})}, {0, 1, 2});
  EXPECT_EQ(out[0].shape(), (mx::Shape{2, 0}));
}

TEST(BadIndicesCompiled, KnownIndicesAreCheckedUnderCompileToo) {
  // Indices captured as a constant (as initializers are) are not tracers.
  std::string message = error_of<OpError>([] { run_compiled("Gather", 13, {iota({3}), i64({3})}, {0}); });
  EXPECT_EQ(message, "[Gather v1] node 'test_Gather': index 3 out of range for axis 0 of size 3");
}

TEST(BadIndicesCompiled, AnEmptyAxisCannotBeGathered) {
  std::string message =
      error_of<OpError>([] { run_compiled("Gather", 13, {mx::zeros({0}), i64({0})}, {0, 1}); });
  EXPECT_EQ(message, "[Gather v1] node 'test_Gather': axis 0 of size 0 cannot be indexed");
  // No index, nothing to clamp: the empty result is fine.
  auto empty = run_compiled("Gather", 13, {mx::zeros({0}), i64({})}, {0, 1});
  EXPECT_EQ(empty[0].shape(), (mx::Shape{0}));
}

TEST(Slice, ExtremeStartsEndsAndSteps) {
  // INT64_MIN as a step reverses with one element; INT64_MAX takes the first.
  auto back = run_op("Slice", 13, {iota({5}), i64({kMax}), i64({kMin}), i64({0}), i64({kMin})});
  EXPECT_EQ(to_doubles(out0(back)), (std::vector<double>{4}));
  auto front = run_op("Slice", 13, {iota({5}), i64({kMin}), i64({kMax}), i64({0}), i64({kMax})});
  EXPECT_EQ(to_doubles(out0(front)), (std::vector<double>{0}));
  EXPECT_NE(
      op_error("Slice", 13, {iota({5}), i64({0}), i64({5}), i64({0}), i64({0})}).find("step cannot be 0"),
      std::string::npos);
}

TEST(Trilu, ExtremeDiagonalOffsets) {
  auto all = run_op("Trilu", 14, {iota({2, 3}), mx::array(kMin)});
  EXPECT_EQ(to_doubles(out0(all)), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  auto none = run_op("Trilu", 14, {iota({2, 3}), mx::array(kMin)}, {int_attr("upper", 0)});
  EXPECT_EQ(to_doubles(out0(none)), (std::vector<double>(6, 0)));
}

}  // namespace
}  // namespace transmuter
