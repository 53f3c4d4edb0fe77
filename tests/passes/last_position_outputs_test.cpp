// last_position_outputs (LoadOptions::last_position_outputs): a named output is computed at the
// last position of its last-but-one axis only, cut before the product that makes it when only
// position-wise nodes follow; its values are the uncut model's last position.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include <algorithm>
#include <string>
#include <vector>

#include "passes/pass_manager.h"
#include "support/expect_error.h"
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
using testing::random_bytes;

constexpr int kBatch = 2, kSeq = 5, kK = 64, kVocab = 24;

// x [B, S, K] -> MatMul(W) -> Div(3) -> Tanh -> Mul(3) -> logits [B, S, V] (Gemma 2's soft cap).
GraphBuilder soft_capped_head(int64_t opset = 18) {
  GraphBuilder b(opset);
  b.input("x", OnnxType::kFloat, {kBatch, -1, kK})
      .initializer("W", random_array({kK, kVocab}, 1, 0.3f))
      .initializer("cap", mx::array(3.0f))
      .node("MatMul", {"x", "W"}, {"product"})
      .node("Div", {"product", "cap"}, {"scaled"})
      .node("Tanh", {"scaled"}, {"capped"})
      .node("Mul", {"capped", "cap"}, {"logits"})
      .output("logits", OnnxType::kFloat, {kBatch, -1, kVocab});
  return b;
}

// x [B, S, K] -> MatMulNBits (4 bits, block 32) -> logits [B, S, V].
GraphBuilder quantized_head() {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {kBatch, -1, kK})
      .initializer("B", random_bytes({kVocab, kK / 32, 16}, 2))
      .initializer("scales",
                   mx::random::uniform(0.01f, 0.03f, {kVocab * kK / 32}, mx::float32, mx::random::key(3)))
      .domain_node(
          "com.microsoft", 1, "MatMulNBits", {"x", "B", "scales"}, {"logits"},
          {int_attr("K", kK), int_attr("N", kVocab), int_attr("bits", 4), int_attr("block_size", 32)})
      .output("logits", OnnxType::kFloat, {kBatch, -1, kVocab});
  return b;
}

mx::array last_position(const mx::array& all) {
  const int s = all.shape(1);
  return mx::slice(all, {0, s - 1, 0}, {all.shape(0), s, all.shape(2)});
}

// The cut model's logits against the uncut model's last position, eager and compiled. The product
// over one row may take another GEMM path than over all of them: within 1e-5 (|logits| ~ 1).
void expect_last_position_of_uncut(const GraphBuilder& b) {
  Model uncut = b.build();
  Model cut = b.build({.last_position_outputs = {"logits"}});
  const mx::array x = random_array({kBatch, kSeq, kK}, 7);
  const mx::array want =
      last_position(run(uncut, uncut.params(), {{"x", x}}, {mx::Device::cpu}).tensor("logits"));
  ASSERT_GT(mx::max(mx::abs(want)).item<float>(), 0.1f);  // not vacuous
  const mx::array got = run(cut, cut.params(), {{"x", x}}, {mx::Device::cpu}).tensor("logits");
  EXPECT_EQ(got.shape(), (mx::Shape{kBatch, 1, kVocab}));
  EXPECT_LT(max_abs_diff(got, want), 1e-5f);
  CompiledModel compiled = compile(cut, {{"x", x}});
  EXPECT_LT(max_abs_diff(compiled({{"x", x}}).tensor("logits"), want), 1e-5f);
}

// The node reading the Slice's output, by op type.
std::string reader_of_slice(const Graph& graph) {
  auto slice = std::find_if(graph.nodes.begin(), graph.nodes.end(),
                            [](const Node& n) { return n.op_type == "Slice"; });
  if (slice == graph.nodes.end()) return "no Slice";
  for (const Node& n : graph.nodes) {
    if (std::find(n.inputs.begin(), n.inputs.end(), slice->outputs[0]) != n.inputs.end()) return n.op_type;
  }
  return "the graph output";
}

TEST(LastPositionOutputs, CutsBeforeTheProductUnderAPositionWiseTail) {
  std::shared_ptr<Graph> graph = soft_capped_head().graph();
  EXPECT_EQ(last_position_outputs(*graph, {"logits"}), 1u);
  EXPECT_EQ(reader_of_slice(*graph), "MatMul");
  const ValueInfo& declared = graph->outputs[0];
  ASSERT_EQ(declared.shape.size(), 3u);
  EXPECT_EQ(declared.shape[1].value, 1);
  expect_last_position_of_uncut(soft_capped_head());
}

TEST(LastPositionOutputs, CutsBeforeAQuantizedProduct) {
  std::shared_ptr<Graph> graph = quantized_head().graph();
  last_position_outputs(*graph, {"logits"});
  EXPECT_EQ(reader_of_slice(*graph), "MatMulNBits");
  expect_last_position_of_uncut(quantized_head());
}

TEST(LastPositionOutputs, Slice1BeforeOpset10) {
  std::shared_ptr<Graph> graph = soft_capped_head(9).graph();
  last_position_outputs(*graph, {"logits"});
  EXPECT_EQ(reader_of_slice(*graph), "MatMul");
  expect_last_position_of_uncut(soft_capped_head(9));
}

TEST(LastPositionOutputs, AskedForWithoutTheDefaultPasses) {
  Model cut = soft_capped_head().build({.run_passes = false, .last_position_outputs = {"logits"}});
  const mx::array x = random_array({kBatch, kSeq, kK}, 7);
  EXPECT_EQ(run(cut, cut.params(), {{"x", x}}, {mx::Device::cpu}).tensor("logits").shape(),
            (mx::Shape{kBatch, 1, kVocab}));
  EXPECT_EQ(cut.params().size(), 2u);  // the file's weights: the Slice's bounds are Constant nodes
}

TEST(LastPositionOutputs, AValueReadElsewhereStopsTheWalkAtTheOutput) {
  // The product is also an output: cutting before it would change that output too.
  GraphBuilder b = soft_capped_head();
  b.output("product");
  std::shared_ptr<Graph> graph = b.graph();
  last_position_outputs(*graph, {"logits"});
  EXPECT_EQ(reader_of_slice(*graph), "the graph output");
  expect_last_position_of_uncut(b);
  Model cut = b.build({.last_position_outputs = {"logits"}});
  const mx::array x = random_array({kBatch, kSeq, kK}, 7);
  EXPECT_EQ(run(cut, cut.params(), {{"x", x}}, {mx::Device::cpu}).tensor("product").shape(),
            (mx::Shape{kBatch, kSeq, kVocab}));
}

TEST(LastPositionOutputs, AnOutputOfOtherNodesIsSlicedWhereItIsMade) {
  // Positions mix (a softmax over the positions axis): only the output itself can be cut.
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {kBatch, -1, kVocab})
      .node("Softmax", {"x"}, {"logits"}, {int_attr("axis", 1)})
      .output("logits", OnnxType::kFloat, {kBatch, -1, kVocab});
  Model uncut = b.build();
  Model cut = b.build({.last_position_outputs = {"logits"}});
  const mx::array x = random_array({kBatch, kSeq, kVocab}, 8);
  const mx::array want =
      last_position(run(uncut, uncut.params(), {{"x", x}}, {mx::Device::cpu}).tensor("logits"));
  const mx::array got = run(cut, cut.params(), {{"x", x}}, {mx::Device::cpu}).tensor("logits");
  EXPECT_EQ(got.shape(), (mx::Shape{kBatch, 1, kVocab}));
  EXPECT_EQ(max_abs_diff(got, want), 0.0f);
}

TEST(LastPositionOutputs, RefusesWhatItCannotCut) {
  auto load_error = [](const GraphBuilder& b, const std::string& name) {
    return testing::error_of<Error>([&] { b.build({.last_position_outputs = {name}}); });
  };
  std::string message = load_error(soft_capped_head(), "scores");
  EXPECT_NE(message.find("'scores', which is no output of the model (outputs: logits)"), std::string::npos)
      << message;

  GraphBuilder read_inside = soft_capped_head();
  read_inside.node("Neg", {"logits"}, {"negated"}).output("negated");
  message = load_error(read_inside, "logits");
  EXPECT_NE(message.find("'logits' is also read inside the graph (by Neg node"), std::string::npos)
      << message;

  GraphBuilder rank_one;
  rank_one.input("x", OnnxType::kFloat, {kVocab})
      .node("Neg", {"x"}, {"y"})
      .output("y", OnnxType::kFloat, {kVocab});
  message = load_error(rank_one, "y");
  EXPECT_NE(message.find("output 'y' has rank 1"), std::string::npos) << message;
}

}  // namespace
}  // namespace transmuter
