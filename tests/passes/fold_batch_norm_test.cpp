#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

// channels_last_convs would turn the Convs this test counts into ConvNhwc.
const LoadOptions kWithoutLayout = testing::passes_except("channels_last_convs");

using testing::GraphBuilder;

mx::array uniform(mx::Shape shape, float low, float high, uint64_t seed) {
  return mx::random::uniform(low, high, shape, mx::float32, mx::random::key(seed));
}

// x[1,3,8,8] -> Conv(W[4,3,3,3], B[4]) -> BatchNormalization -> y, with
// `extra_reader` also reading the Conv's output (which must block the fold).
GraphBuilder conv_bn(bool extra_reader) {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {1, 3, 8, 8})
      .initializer("W", uniform({4, 3, 3, 3}, -1, 1, 1))
      .initializer("B", uniform({4}, -1, 1, 2))
      .initializer("scale", uniform({4}, 0.5, 2, 3))
      .initializer("beta", uniform({4}, -1, 1, 4))
      .initializer("mean", uniform({4}, -0.5, 0.5, 5))
      .initializer("var", uniform({4}, 0.1, 2, 6))
      .node("Conv", {"x", "W", "B"}, {"c"}, {testing::ints_attr("pads", {1, 1, 1, 1})})
      .node("BatchNormalization", {"c", "scale", "beta", "mean", "var"}, {"y"},
            {testing::float_attr("epsilon", 1e-3f)})
      .output("y");
  if (extra_reader) b.node("Relu", {"c"}, {"r"}).output("r");
  return b;
}

mx::array run_y(const Model& model, const mx::array& x) {
  return run(model, model.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
}

TEST(FoldBatchNorm, FoldsIntoTheConvAndKeepsResults) {
  Model folded = conv_bn(false).build(kWithoutLayout);
  Model plain = conv_bn(false).build({.run_passes = false});
  EXPECT_EQ(folded.passes_applied(), std::vector<std::string>{"fold_batch_norm_into_conv"});
  EXPECT_EQ(folded.op_histogram().count("BatchNormalization"), 0u);
  EXPECT_EQ(plain.op_histogram().at("BatchNormalization"), 1u);
  // The BN parameters and the unfolded weights are no longer params.
  EXPECT_EQ(folded.params().count("scale"), 0u);
  EXPECT_EQ(folded.params().count("W"), 0u);
  EXPECT_EQ(folded.params().size(), 2u);

  mx::array x = uniform({1, 3, 8, 8}, -2, 2, 7);
  mx::array expected = run_y(plain, x);
  mx::array got = run_y(folded, x);
  // Folding reorders float32 products and sums over 27 terms: a few ulps of
  // outputs of magnitude ~10.
  float worst = mx::max(mx::abs(mx::subtract(got, expected))).item<float>();
  EXPECT_LT(worst, 1e-4f);
  EXPECT_GT(mx::max(mx::abs(expected)).item<float>(), 1.0f);  // the comparison is not vacuous
}

TEST(FoldBatchNorm, LeavesAConvOutputReadElsewhere) {
  Model model = conv_bn(true).build(kWithoutLayout);
  EXPECT_TRUE(model.passes_applied().empty());
  EXPECT_EQ(model.op_histogram().at("BatchNormalization"), 1u);
}

TEST(FoldBatchNorm, LeavesTrainingModeAndComputedWeights) {
  Graph graph;
  graph.opsets[""] = 15;
  Node conv;
  conv.op_type = "Conv";
  conv.inputs = {"x", "W_computed"};  // not an initializer
  conv.outputs = {"c"};
  Node bn;
  bn.op_type = "BatchNormalization";
  bn.inputs = {"c", "s", "b", "m", "v"};
  bn.outputs = {"y"};
  graph.nodes = {conv, bn};
  EXPECT_EQ(fold_batch_norm_into_conv(graph), 0u);
  EXPECT_EQ(graph.nodes.size(), 2u);
}

}  // namespace
}  // namespace transmuter
