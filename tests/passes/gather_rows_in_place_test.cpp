// gather_rows_in_place: a table misaligned in its file (a deferred copy) that only axis-0 Gathers read
// becomes ai.transmuter GatherRows over its bytes, which stay where the file put them: never copied at
// load, the same values as Gather's (a copy of the same bytes), eager and compiled; other tables stay.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>

#include <mlx/mlx.h>

#include "mlx_bridge/buffers.h"
#include "support/expect_error.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;
using testing::random_array;

constexpr int kRows = 50;

// ids (int64 [2, 3]) -> Gather(T) -> Add(bias) -> y: an embedding lookup. T is float32 [50, 6].
GraphBuilder embedding(const mx::array& table) {
  GraphBuilder b(18);
  b.input("ids", OnnxType::kInt64, {2, 3})
      .initializer("T", table)
      .initializer("bias", random_array({6}, 2))
      .node("Gather", {"T", "ids"}, {"rows"})
      .node("Add", {"rows", "bias"}, {"y"})
      .output("y");
  return b;
}

Inputs ids_input(std::vector<int64_t> ids) {
  return {{"ids", Value(mx::array(ids.data(), {2, 3}, mx::int64))}};
}

TEST(GatherRowsInPlace, AMisalignedTableIsGatheredFromItsBytesWhereTheyLie) {
  const mx::array values = random_array({kRows, 6}, 1);
  const mx::array table = testing::misaligned_deferred(values);
  const std::span<const uint8_t> source = *deferred_bytes(table);
  Model model = embedding(table).build();

  EXPECT_EQ(model.op_histogram().at("ai.transmuter.GatherRows"), 1u);
  EXPECT_EQ(model.op_histogram().count("Gather"), 0u);
  EXPECT_FALSE(model.params().contains("T"));
  ASSERT_TRUE(model.params().contains("T/rows"));
  const mx::array& rows = model.params().at("T/rows");
  EXPECT_EQ(rows.dtype(), mx::uint8);
  EXPECT_EQ(rows.shape(), (mx::Shape{kRows, 24}));
  EXPECT_EQ(rows.data<uint8_t>(), source.data()) << "the table's bytes must not be copied";

  // Negative ids count from the end, as Gather's do. The rows are copies of the same bytes: exact.
  const Inputs in = ids_input({0, 7, -1, 49, 3, -50});
  Model plain = embedding(values).build({.run_passes = false});
  const mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
  const mx::array eager = run(model, model.params(), in, {mx::Device::cpu}).tensor("y");
  const mx::array compiled = compile(model, in, {.device = mx::Device::cpu})(in).tensor("y");
  ASSERT_EQ(eager.shape(), (mx::Shape{2, 3, 6}));
  EXPECT_TRUE(mx::array_equal(eager, want).item<bool>());
  EXPECT_TRUE(mx::array_equal(compiled, want).item<bool>());
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);  // not vacuous
  EXPECT_EQ(rows.data<uint8_t>(), source.data()) << "running must not copy the table either";
}

TEST(GatherRowsInPlace, RowsOfAHigherRankTableComeBackInTheirShape) {
  const mx::array values = random_array({kRows, 2, 3}, 3);
  GraphBuilder b(18);
  b.input("i", OnnxType::kInt32, {})
      .input("ids", OnnxType::kInt32, {4})
      .initializer("T", testing::misaligned_deferred(values))
      .node("Gather", {"T", "i"}, {"one"}, {int_attr("axis", -3)})
      .node("Gather", {"T", "ids"}, {"many"})
      .output("one")
      .output("many");
  Model model = b.build();
  EXPECT_EQ(model.op_histogram().at("ai.transmuter.GatherRows"), 2u);  // both readers share T/rows
  EXPECT_EQ(model.params().size(), 1u);
  const int32_t ids[] = {5, -2, 0, 17};
  const Inputs in = {{"i", Value(mx::array(int32_t{-7}))}, {"ids", Value(mx::array(ids, {4}, mx::int32))}};
  const Outputs got = run(model, model.params(), in, {mx::Device::cpu});
  const mx::array one_want = mx::take(values, mx::array(kRows - 7), 0);
  const mx::array many_want = mx::take(values, mx::array({5, kRows - 2, 0, 17}), 0);
  ASSERT_EQ(got.tensor("one").shape(), (mx::Shape{2, 3}));
  ASSERT_EQ(got.tensor("many").shape(), (mx::Shape{4, 2, 3}));
  EXPECT_TRUE(mx::array_equal(got.tensor("one"), one_want).item<bool>());
  EXPECT_TRUE(mx::array_equal(got.tensor("many"), many_want).item<bool>());
}

TEST(GatherRowsInPlace, TablesReadOtherwiseStay) {
  const mx::array values = random_array({kRows, 6}, 4);
  // Aligned in its file: wrapped in place already, nothing to gain.
  EXPECT_EQ(embedding(values).build().op_histogram().count("ai.transmuter.GatherRows"), 0u);
  // Turned off.
  Model off =
      embedding(testing::misaligned_deferred(values)).build(testing::passes_except("gather_rows_in_place"));
  EXPECT_EQ(off.op_histogram().at("Gather"), 1u);
  EXPECT_FALSE(deferred_bytes(off.params().at("T")).has_value()) << "copied out at the end of the load";

  auto kept = [&](const std::string& why, GraphBuilder b) {
    Model model = b.build();
    EXPECT_EQ(model.op_histogram().count("ai.transmuter.GatherRows"), 0u) << why;
    EXPECT_TRUE(model.params().contains("T")) << why;
  };
  GraphBuilder also_added(18);  // read by an Add besides the Gather: the float table is needed anyway
  also_added.input("ids", OnnxType::kInt64, {2})
      .input("x", OnnxType::kFloat, {kRows, 6})
      .initializer("T", testing::misaligned_deferred(values))
      .node("Gather", {"T", "ids"}, {"g"})
      .node("Add", {"T", "x"}, {"s"})
      .output("g")
      .output("s");
  kept("also read by an Add", also_added);
  GraphBuilder columns(18);  // a Gather along axis 1 takes columns, not rows
  columns.input("ids", OnnxType::kInt64, {2})
      .initializer("T", testing::misaligned_deferred(values))
      .node("Gather", {"T", "ids"}, {"g"}, {int_attr("axis", 1)})
      .output("g");
  kept("gathered along axis 1", columns);
  GraphBuilder output(18);  // the table is itself an output
  output.input("ids", OnnxType::kInt64, {2})
      .initializer("T", testing::misaligned_deferred(values))
      .node("Gather", {"T", "ids"}, {"g"})
      .output("g")
      .output("T");
  kept("a graph output", output);
}

TEST(GatherRowsInPlace, AnIndexOutOfRangeIsAnErrorNamingTheNode) {
  Model model = embedding(testing::misaligned_deferred(random_array({kRows, 6}, 5))).build();
  const std::string message = testing::error_of<OpError>(
      [&] { run(model, model.params(), ids_input({0, 1, 2, 3, 4, kRows}), {mx::Device::cpu}); });
  EXPECT_NE(message.find("GatherRows"), std::string::npos) << message;
  EXPECT_NE(message.find("index 50 out of range for axis 0 of size 50"), std::string::npos) << message;
}

TEST(GatherRowsInPlace, GatherRowsRefusesRowsThatDoNotHoldTheRowShape) {
  auto message_for = [](mx::array rows, int64_t to, std::vector<int64_t> row_shape) {
    GraphBuilder b(18);
    b.input("ids", OnnxType::kInt64, {2})
        .initializer("R", std::move(rows))
        .domain_node("ai.transmuter", 1, "GatherRows", {"R", "ids"}, {"y"},
                     {int_attr("to", to), ints_attr("row_shape", std::move(row_shape))})
        .output("y");
    Model model = b.build({.run_passes = false});
    const int64_t ids[] = {0, 1};
    return testing::error_of<OpError>([&] {
      run(model, model.params(), {{"ids", Value(mx::array(ids, {2}, mx::int64))}}, {mx::Device::cpu});
    });
  };
  const auto kFloat = static_cast<int64_t>(OnnxType::kFloat);
  EXPECT_NE(message_for(mx::zeros({4, 8}, mx::float32), kFloat, {2}).find("rows must be uint8"),
            std::string::npos);
  EXPECT_NE(message_for(mx::zeros({4, 8}, mx::uint8), kFloat, {3}).find("each row has 8"), std::string::npos);
  EXPECT_NE(message_for(mx::zeros({4, 8}, mx::uint8), 9999, {2}).find("'to'"), std::string::npos);
}

}  // namespace
}  // namespace transmuter
