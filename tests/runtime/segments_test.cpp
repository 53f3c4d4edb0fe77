#include <gtest/gtest.h>

#include "runtime/compiler.h"
#include "runtime/model_state.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;

TEST(Segments, ShapeOfTracedValueIsAHostValue) {
  // Reshape(x, Shape(x)) needs no break: shapes are concrete while tracing.
  Model model = GraphBuilder()
                    .input("x", OnnxType::kFloat, {-1, 2})
                    .node("Shape", {"x"}, {"s"})
                    .node("Reshape", {"x", "s"}, {"y"})
                    .output("y")
                    .build();
  SegmentLayout layout = plan_segments(*model.internal_state().bound, {});
  EXPECT_EQ(layout.graph_breaks, 0u);
  ASSERT_EQ(layout.compiled_segments, 1u);
  EXPECT_EQ(layout.steps[0].traced_inputs, std::vector<std::string>{"x"});
  EXPECT_EQ(layout.steps[0].traced_outputs, std::vector<std::string>{"y"});
}

TEST(Segments, ShapeAfterADataDependentBreakIsTraced) {
  // NonZero's output shape depends on data, so its Shape is data too and the
  // Reshape that reads it must run eagerly.
  Model model = GraphBuilder()
                    .input("x", OnnxType::kFloat, {4})
                    .node("NonZero", {"x"}, {"nz"})
                    .node("Shape", {"nz"}, {"s"})
                    .node("Neg", {"x"}, {"n"})
                    .node("Reshape", {"n", "s"}, {"y"})
                    .output("y")
                    .build();
  SegmentLayout layout = plan_segments(*model.internal_state().bound, {});
  ASSERT_EQ(layout.steps.size(), 3u);
  EXPECT_TRUE(layout.steps[0].eager);   // NonZero
  EXPECT_FALSE(layout.steps[1].eager);  // Shape, Neg
  EXPECT_TRUE(layout.steps[2].eager);   // Reshape
  // The segment hands both its results on as traced tensors.
  EXPECT_EQ(layout.steps[1].traced_outputs, (std::vector<std::string>{"s", "n"}));
}

TEST(Segments, HostValuesProducedInASegmentAreCaptured) {
  // s = Shape(x) is a host value: later steps read it from the plan, not as
  // a compiled output.
  Model model = GraphBuilder()
                    .input("x", OnnxType::kFloat, {-1})
                    .node("Shape", {"x"}, {"s"})
                    .node("NonZero", {"x"}, {"nz"})
                    .node("Reshape", {"x", "s"}, {"y"})
                    .output("y")
                    .output("nz")
                    .build();
  SegmentLayout layout = plan_segments(*model.internal_state().bound, {});
  ASSERT_EQ(layout.steps.size(), 3u);
  EXPECT_EQ(layout.steps[0].host_outputs, std::vector<std::string>{"s"});
  EXPECT_TRUE(layout.steps[0].traced_outputs.empty());
  EXPECT_EQ(layout.graph_breaks, 1u);
}

TEST(Segments, StaticInputsMakeHostInputsKnown) {
  Model model = GraphBuilder()
                    .input("x", OnnxType::kFloat, {6})
                    .input("shape", OnnxType::kInt64, {2})
                    .node("Reshape", {"x", "shape"}, {"y"})
                    .output("y")
                    .build();
  EXPECT_EQ(plan_segments(*model.internal_state().bound, {}).graph_breaks, 1u);
  EXPECT_EQ(plan_segments(*model.internal_state().bound, {"shape"}).graph_breaks, 0u);
}

}  // namespace
}  // namespace transmuter

namespace transmuter {
namespace {

using testing::graph_attr;
using testing::GraphBuilder;

// y = Reshape(x, If(cond){Shape(x)}): with a static condition the branch is
// traced in place and its output, a shape, stays a host value, so the Reshape
// needs no break. With a traced condition the If itself is the only break.
Model if_shape_model() {
  auto branch = GraphBuilder().node("Shape", {"x"}, {"s"}).output("s").graph();
  return GraphBuilder()
      .input("cond", OnnxType::kBool, {})
      .input("x", OnnxType::kFloat, {-1, 2})
      .node("If", {"cond"}, {"shape"}, {graph_attr("then_branch", branch), graph_attr("else_branch", branch)})
      .node("Reshape", {"x", "shape"}, {"y"})
      .output("y")
      .build();
}

TEST(Segments, IfOnAStaticConditionKeepsItsBranchOutputsHostValues) {
  Model model = if_shape_model();
  SegmentLayout layout = plan_segments(*model.internal_state().bound, {"cond"});
  EXPECT_EQ(layout.graph_breaks, 0u);
  ASSERT_EQ(layout.compiled_segments, 1u);
  EXPECT_EQ(layout.steps[0].traced_inputs, std::vector<std::string>{"x"});
}

TEST(Segments, IfOnATracedConditionIsABreakAndItsOutputsAreData) {
  Model model = if_shape_model();
  SegmentLayout layout = plan_segments(*model.internal_state().bound, {});
  ASSERT_EQ(layout.steps.size(), 2u);
  EXPECT_TRUE(layout.steps[0].eager);  // If
  EXPECT_TRUE(layout.steps[1].eager);  // Reshape reads the If's output on the host
}

TEST(Segments, NodeInsideABodyThatReadsTracedDataOnTheHostBreaksTheWholeNode) {
  // The branch's Reshape reads a traced outer tensor as its shape.
  auto branch = GraphBuilder().node("Reshape", {"x", "dims"}, {"r"}).output("r").graph();
  Model model = GraphBuilder()
                    .input("cond", OnnxType::kBool, {})
                    .input("x", OnnxType::kFloat, {4})
                    .input("dims", OnnxType::kInt64, {2})
                    .node("If", {"cond"}, {"y"},
                          {graph_attr("then_branch", branch), graph_attr("else_branch", branch)})
                    .output("y")
                    .build();
  EXPECT_EQ(plan_segments(*model.internal_state().bound, {"cond"}).graph_breaks, 1u);
  EXPECT_EQ(plan_segments(*model.internal_state().bound, {"cond", "dims"}).graph_breaks, 0u);
}

}  // namespace
}  // namespace transmuter
