#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "support/expect_error.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::graph_attr;
using testing::GraphBuilder;
using testing::i64;
using testing::int_attr;
using testing::iota;
using testing::run_op;
using testing::to_doubles;
using testing::to_ints;

Value seq(std::vector<mx::array> items) {
  Sequence s(items.begin(), items.end());
  return Value::sequence(std::move(s));
}

const Sequence& items_of(const std::vector<Value>& out) { return out.at(0).sequence_items(); }

TEST(SequenceConstruct, KeepsOrderAndSequenceAtCountsFromTheBack) {
  auto s = run_op("SequenceConstruct", 11, {mx::array({1.f}), mx::array({2.f, 3.f})});
  ASSERT_EQ(items_of(s).size(), 2u);
  auto last = run_op("SequenceAt", 11, {s[0], i64({-1}, {})});
  EXPECT_EQ(to_doubles(last[0].tensor()), (std::vector<double>{2, 3}));
}

TEST(SequenceConstruct, MixedDtypesAreAnOpError) {
  std::string message = error_of<OpError>(
      [] { run_op("SequenceConstruct", 11, {mx::array({1.f}), mx::array({1}, {1}, mx::int32)}); });
  EXPECT_NE(message.find("does not match the sequence's float32"), std::string::npos) << message;
}

TEST(SequenceInsert, DefaultsToTheBackAndTakesNegativePositions) {
  Value s = seq({mx::array({1.f}), mx::array({2.f})});
  auto back = run_op("SequenceInsert", 11, {s, mx::array({9.f})});
  EXPECT_EQ(to_doubles(items_of(back)[2].tensor()), (std::vector<double>{9}));
  auto before_last = run_op("SequenceInsert", 11, {s, mx::array({9.f}), i64({-1}, {})});
  EXPECT_EQ(to_doubles(items_of(before_last)[1].tensor()), (std::vector<double>{9}));
  auto into_empty = run_op("SequenceInsert", 11, {run_op("SequenceEmpty", 11, {})[0], mx::array({4.f})});
  EXPECT_EQ(items_of(into_empty).size(), 1u);
}

TEST(SequenceInsert, PositionOutOfRangeIsAnOpError) {
  Value s = seq({mx::array({1.f})});
  std::string message =
      error_of<OpError>([&] { run_op("SequenceInsert", 11, {s, mx::array({2.f}), i64({3}, {})}); });
  EXPECT_NE(message.find("position 3 is outside [-1, 1]"), std::string::npos) << message;
  EXPECT_THROW(run_op("SequenceInsert", 11, {s, mx::array({1}, {1}, mx::int32)}), OpError);  // dtype
  // Not a sequence:
  EXPECT_THROW(run_op("SequenceInsert", 11, {mx::array({1.f}), mx::array({2.f})}), OpError);
}

TEST(SequenceErase, DefaultsToTheLastAndRefusesAnEmptySequence) {
  Value s = seq({mx::array({1.f}), mx::array({2.f}), mx::array({3.f})});
  auto out = run_op("SequenceErase", 11, {s});
  ASSERT_EQ(items_of(out).size(), 2u);
  EXPECT_EQ(to_doubles(items_of(out)[1].tensor()), (std::vector<double>{2}));
  auto first = run_op("SequenceErase", 11, {s, i64({-3}, {})});
  EXPECT_EQ(to_doubles(items_of(first)[0].tensor()), (std::vector<double>{2}));
  EXPECT_THROW(run_op("SequenceErase", 11, {seq({})}), OpError);
  EXPECT_THROW(run_op("SequenceAt", 11, {s, i64({3}, {})}), OpError);
}

TEST(SequenceLength, CountsItemsAsInt64Scalar) {
  auto out = run_op("SequenceLength", 11, {seq({mx::array({1.f}), mx::array({2.f})})});
  EXPECT_EQ(out[0].tensor().dtype(), mx::int64);
  EXPECT_EQ(out[0].tensor().ndim(), 0u);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{2}));
}

TEST(SplitToSequence, ScalarSplitLeavesASmallerLastChunk) {
  auto out = run_op("SplitToSequence", 24, {iota({5, 2}), mx::array(int64_t{2})});
  ASSERT_EQ(items_of(out).size(), 3u);
  EXPECT_EQ(items_of(out)[2].tensor().shape(), (mx::Shape{1, 2}));
}

TEST(SplitToSequence, NoSplitWithoutKeepdimsDropsTheAxis) {
  auto out = run_op("SplitToSequence", 11, {iota({2, 3})}, {int_attr("axis", -1), int_attr("keepdims", 0)});
  ASSERT_EQ(items_of(out).size(), 3u);
  EXPECT_EQ(items_of(out)[1].tensor().shape(), (mx::Shape{2}));
  EXPECT_EQ(to_doubles(items_of(out)[1].tensor()), (std::vector<double>{1, 4}));
}

TEST(SplitToSequence, SizesThatDoNotSumToTheAxisAreAnOpError) {
  std::string message = error_of<OpError>([] { run_op("SplitToSequence", 11, {iota({5}), i64({2, 2})}); });
  EXPECT_NE(message.find("split sizes sum to 4, the axis has 5"), std::string::npos) << message;
  EXPECT_THROW(run_op("SplitToSequence", 11, {iota({5}), i64({0}, {})}), OpError);  // chunk 0
  EXPECT_THROW(run_op("SplitToSequence", 11, {iota({5})}, {int_attr("axis", 1)}), OpError);
}

TEST(ConcatFromSequence, NewAxisStacksAndTakesAxisUpToRank) {
  Value s = seq({mx::array({1.f, 2.f}), mx::array({3.f, 4.f})});
  auto stacked = run_op("ConcatFromSequence", 11, {s}, {int_attr("axis", -1), int_attr("new_axis", 1)});
  EXPECT_EQ(stacked[0].tensor().shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_doubles(stacked[0].tensor()), (std::vector<double>{1, 3, 2, 4}));
  auto joined = run_op("ConcatFromSequence", 11, {s}, {int_attr("axis", 0)});
  EXPECT_EQ(joined[0].tensor().shape(), (mx::Shape{4}));
  EXPECT_THROW(run_op("ConcatFromSequence", 11, {s}, {int_attr("axis", 1)}), OpError);
  EXPECT_THROW(run_op("ConcatFromSequence", 11, {seq({})}, {int_attr("axis", 0)}), OpError);
}

TEST(Optional, EmptyOrHoldingAValue) {
  auto empty = run_op("OptionalHasElement", 18, {Value()});
  EXPECT_EQ(to_ints(empty[0].tensor()), (std::vector<int64_t>{0}));
  auto held = run_op("Optional", 15, {mx::array({1.f})});
  EXPECT_EQ(to_ints(run_op("OptionalHasElement", 15, {held[0]})[0].tensor()), (std::vector<int64_t>{1}));
  EXPECT_EQ(to_doubles(run_op("OptionalGetElement", 18, {held[0]})[0].tensor()), (std::vector<double>{1}));
  std::string message = error_of<OpError>([] { run_op("OptionalGetElement", 18, {Value()}); });
  EXPECT_NE(message.find("the optional input is empty"), std::string::npos) << message;
  EXPECT_THROW(run_op("Optional", 15, {Value()}), OpError);  // empty needs its type
}

// SequenceMap over SplitToSequence(x) with a tensor added to every item, then
// ConcatFromSequence: sequences live between compiled segments as C++ values.
Model sequence_map_model() {
  auto body = GraphBuilder(17)
                  .input("item", OnnxType::kFloat, {-1})
                  .input("bias", OnnxType::kFloat, {1})
                  .node("Add", {"item", "bias"}, {"shifted"})
                  .output("shifted")
                  .graph();
  return GraphBuilder(17)
      .input("x", OnnxType::kFloat, {4})
      .input("bias", OnnxType::kFloat, {1})
      .node("Relu", {"x"}, {"r"})
      .node("SplitToSequence", {"r"}, {"parts"})
      .node("SequenceMap", {"parts", "bias"}, {"mapped"}, {graph_attr("body", body)})
      .node("ConcatFromSequence", {"mapped"}, {"joined"}, {int_attr("axis", 0)})
      .node("Neg", {"joined"}, {"y"})
      .output("y")
      .build();
}

TEST(SequenceMap, AppliesTheBodyPerItemWithTensorsBroadcast) {
  Model model = sequence_map_model();
  Inputs inputs{{"x", mx::array({1.f, -2.f, 3.f, -4.f})}, {"bias", mx::array({10.f})}};
  std::vector<double> expected{-11, -10, -13, -10};
  EXPECT_EQ(to_doubles(run(model, model.params(), inputs, {mx::Device::cpu}).tensor("y")), expected);
  CompiledModel compiled = compile(model, {}, {{}, 8, mx::Device::cpu});
  EXPECT_EQ(to_doubles(compiled(inputs).tensor("y")), expected);
  EXPECT_GE(compiled.stats().graph_breaks, 3u);  // split, map, concat (and what reads their results)
  EXPECT_EQ(compiled.stats().segments, 1u);      // Relu
}

TEST(SequenceMap, SequencesOfDifferentLengthsAreAnOpError) {
  auto body = GraphBuilder(17)
                  .input("a", OnnxType::kFloat, {1})
                  .input("b", OnnxType::kFloat, {1})
                  .node("Add", {"a", "b"}, {"c"})
                  .output("c")
                  .graph();
  Model model = GraphBuilder(17)
                    .input("x", OnnxType::kFloat, {3})
                    .input("y", OnnxType::kFloat, {2})
                    .node("SplitToSequence", {"x"}, {"xs"})
                    .node("SplitToSequence", {"y"}, {"ys"})
                    .node("SequenceMap", {"xs", "ys"}, {"zs"}, {graph_attr("body", body)})
                    .node("ConcatFromSequence", {"zs"}, {"z"}, {int_attr("axis", 0)})
                    .output("z")
                    .build();
  Inputs inputs{{"x", mx::array({1.f, 2.f, 3.f})}, {"y", mx::array({1.f, 2.f})}};
  std::string message = error_of<OpError>([&] { run(model, model.params(), inputs, {mx::Device::cpu}); });
  EXPECT_NE(message.find("input 1 holds 2 items, input 0 holds 3"), std::string::npos) << message;
}

}  // namespace
}  // namespace transmuter
