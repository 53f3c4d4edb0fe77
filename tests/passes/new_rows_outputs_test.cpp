// new_rows_outputs (LoadOptions::new_rows_outputs): a named output that is a Concat of a graph input
// (a past) and new rows becomes the new rows alone, the graph's own readers of the Concat still see all
// rows, and a list that does not fit changes nothing (all or nothing).
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::max_abs_diff;
using testing::random_array;

constexpr int kPast = 4, kNew = 2, kDim = 3;

// past_k -> [Identity] -> Concat(axis -2) with new_k -> present_k (output), also summed into `total`;
// past_v -> Concat with new_v -> present_v. `through_identity` puts an Identity after past_k.
GraphBuilder cache_graph(bool through_identity = false) {
  GraphBuilder b(17);
  std::string past_k = "past_k";
  b.input("past_k", OnnxType::kFloat, {1, kPast, kDim})
      .input("new_k", OnnxType::kFloat, {1, kNew, kDim})
      .input("past_v", OnnxType::kFloat, {1, kPast, kDim})
      .input("new_v", OnnxType::kFloat, {1, kNew, kDim});
  if (through_identity) {
    b.node("Identity", {"past_k"}, {"past_k_copy"});
    past_k = "past_k_copy";
  }
  b.node("Concat", {past_k, "new_k"}, {"present_k"}, {int_attr("axis", -2)})
      .node("Concat", {"past_v", "new_v"}, {"present_v"}, {int_attr("axis", 1)})
      .node("ReduceSum", {"present_k"}, {"total"}, {int_attr("keepdims", 0)})
      .output("present_k", OnnxType::kFloat, {1, kPast + kNew, kDim})
      .output("present_v", OnnxType::kFloat, {1, kPast + kNew, kDim})
      .output("total", OnnxType::kFloat, {});
  return b;
}

Inputs cache_inputs() {
  return {{"past_k", Value(random_array({1, kPast, kDim}, 1))},
          {"new_k", Value(random_array({1, kNew, kDim}, 2))},
          {"past_v", Value(random_array({1, kPast, kDim}, 3))},
          {"new_v", Value(random_array({1, kNew, kDim}, 4))}};
}

bool lists_pass(const Model& model) {
  const auto& applied = model.passes_applied();
  return std::find(applied.begin(), applied.end(), "new_rows_outputs") != applied.end();
}

TEST(NewRowsOutputs, PresentsBecomeTheNewRowsAndReadersSeeAllRows) {
  const Inputs in = cache_inputs();
  for (bool through_identity : {false, true}) {
    for (const std::vector<std::string>& names :
         {std::vector<std::string>{"present_k", "present_v"}, std::vector<std::string>{"present_*"},
          std::vector<std::string>{"pre*_k", "p*v"}}) {
      Model plain = cache_graph(through_identity).build({.run_passes = false});
      Model cut = cache_graph(through_identity).build({.new_rows_outputs = names});
      ASSERT_TRUE(lists_pass(cut)) << names.front();
      Outputs want = run(plain, plain.params(), in, {mx::Device::cpu});
      Outputs eager = run(cut, cut.params(), in, {mx::Device::cpu});
      Outputs compiled = compile(cut, in, {.device = mx::Device::cpu})(in);
      for (const Outputs* got : {&eager, &compiled}) {
        EXPECT_TRUE(mx::array_equal(got->tensor("present_k"), in.at("new_k").tensor()).item<bool>());
        EXPECT_TRUE(mx::array_equal(got->tensor("present_v"), in.at("new_v").tensor()).item<bool>());
        // ReduceSum still reads the whole Concat.
        EXPECT_LT(max_abs_diff(got->tensor("total"), want.tensor("total")), 1e-5f);
      }
      // The declared size along the Concat's axis is no longer past + new.
      for (const ValueInfo& output : cut.outputs()) {
        if (output.name.starts_with("present")) EXPECT_FALSE(output.shape[1].value.has_value()) << output.name;
      }
    }
  }
}

TEST(NewRowsOutputs, ChangesNothingUnlessEveryNameFits) {
  // "total" is no Concat; "missing*", "nothing", "*_kk" and "present_k*present_k" (too long to match
  // "present_k": the '*' stands between two copies) name no output.
  for (const std::vector<std::string>& names :
       {std::vector<std::string>{"present_k", "total"}, std::vector<std::string>{"present_k", "missing*"},
        std::vector<std::string>{"nothing"}, std::vector<std::string>{"present_*", "*_kk"},
        std::vector<std::string>{"present_k*present_k"}}) {
    std::shared_ptr<Graph> graph = cache_graph().graph();
    const size_t nodes = graph->nodes.size();
    EXPECT_EQ(new_rows_outputs(*graph, names), 0u) << names.back();
    EXPECT_EQ(graph->nodes.size(), nodes);
    Model model = cache_graph().build({.new_rows_outputs = names});
    EXPECT_FALSE(lists_pass(model));
    Outputs got = run(model, model.params(), cache_inputs(), {mx::Device::cpu});
    EXPECT_EQ(got.tensor("present_k").shape(1), kPast + kNew);
  }
  // A Concat whose first input is computed, not a graph input (no past to append to).
  GraphBuilder b(17);
  b.input("x", OnnxType::kFloat, {1, 2, kDim})
      .node("Neg", {"x"}, {"negated"})
      .node("Concat", {"negated", "x"}, {"joined"}, {int_attr("axis", 1)})
      .output("joined");
  EXPECT_EQ(new_rows_outputs(*b.graph(), {"joined"}), 0u);
}

// A real decoder (the tiny Llama fixture): one decode step after a 5-token past, presents cut to the
// new rows. The logits and the new rows equal the uncut model's (its presents' last row).
TEST(NewRowsOutputs, DecoderStepKeepsLogitsAndGivesTheNewRows) {
  const std::string path =
      (std::filesystem::path(TRANSMUTER_SOURCE_DIR) / "tests/pipelines/fixtures/llama_decoder/model.onnx").string();
  Model full = load(path);
  Model cut = load(path, {.new_rows_outputs = {"present.*"}});
  ASSERT_TRUE(lists_pass(cut));
  Inputs in = {{"input_ids", Value(mx::array({int64_t{7}}, {1, 1}))},
               {"attention_mask", Value(mx::ones({1, 6}, mx::int64))},
               {"position_ids", Value(mx::array({int64_t{5}}, {1, 1}))}};
  size_t presents = 0;
  for (const ValueInfo& input : full.inputs()) {
    if (!input.name.starts_with("past_key_values.")) continue;
    in.emplace(input.name, Value(random_array({1, 2, 5, 16}, 10 + presents++)));
  }
  ASSERT_GT(presents, 0u);
  Outputs want = run(full, full.params(), in, {mx::Device::cpu});
  Outputs eager = run(cut, cut.params(), in, {mx::Device::cpu});
  Outputs compiled = compile(cut, in, {.device = mx::Device::cpu})(in);
  for (const Outputs* got : {&eager, &compiled}) {
    EXPECT_LT(max_abs_diff(got->tensor("logits"), want.tensor("logits")), 1e-5f);
    for (size_t i = 0; i < want.names.size(); ++i) {
      if (!want.names[i].starts_with("present.")) continue;
      mx::array last_row = mx::slice(want.values[i].tensor(), {0, 0, 5, 0}, {1, 2, 6, 16});
      EXPECT_EQ(got->tensor(want.names[i]).shape(), (mx::Shape{1, 2, 1, 16})) << want.names[i];
      EXPECT_LT(max_abs_diff(got->tensor(want.names[i]), last_row), 1e-6f) << want.names[i];
    }
  }
}

}  // namespace
}  // namespace transmuter
