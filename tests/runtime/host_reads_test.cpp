// Eager runs remember host reads that depend only on the input signature
// (runtime/host_reads.h) and read data-dependent ones afresh every run.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "runtime/compiler.h"
#include "runtime/host_reads.h"
#include "runtime/model_state.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;

// x [-1, -1, -1] and shape = [Shape(x)[0], -1], the PyTorch export pattern: Shape, Gather (d), Unsqueeze,
// Concat, the graph's first four nodes.
GraphBuilder with_shape_chain() {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {-1, -1, -1})
      .initializer("i", mx::array(int64_t{0}))
      .initializer("axes", mx::array({int64_t{0}}))
      .initializer("minus_one", mx::array({int64_t{-1}}))
      .node("Shape", {"x"}, {"s"})
      .node("Gather", {"s", "i"}, {"d"}, {int_attr("axis", 0)})
      .node("Unsqueeze", {"d", "axes"}, {"d1"})
      .node("Concat", {"d1", "minus_one"}, {"shape"}, {int_attr("axis", 0)});
  return b;
}

// y = Reshape(x, shape); z = Reshape(x, t) with t an input (data).
Model shape_chain_model() {
  return with_shape_chain()
      .input("t", OnnxType::kInt64, {2})
      .node("Reshape", {"x", "shape"}, {"y"})
      .node("Reshape", {"x", "t"}, {"z"})
      .output("y")
      .output("z")
      .build();
}

struct Result {
  mx::Shape y, z;
  uint64_t evaluations;  // host reads that evaluated an input
};

Result run_counted(const Model& model, const Params& params, mx::Shape x_shape, std::vector<int64_t> t) {
  Inputs inputs{{"x", mx::zeros(x_shape)}, {"t", mx::array(t.data(), {2}, mx::int64)}};
  uint64_t before = host_read_evaluations();
  Outputs out = run(model, params, inputs, {mx::Device::cpu});
  return {out.tensor("y").shape(), out.tensor("z").shape(), host_read_evaluations() - before};
}

TEST(HostReads, SecondRunWithTheSameShapesEvaluatesOnlyDataDependentReads) {
  Model model = shape_chain_model();
  Result first = run_counted(model, model.params(), {2, 3, 4}, {4, 6});
  EXPECT_EQ(first.y, (mx::Shape{2, 12}));
  EXPECT_EQ(first.z, (mx::Shape{4, 6}));
  EXPECT_EQ(first.evaluations, 3u);  // Unsqueeze axes, the shape chain, t

  // Same signature, other data: the chain is replayed, t is read again.
  Result second = run_counted(model, model.params(), {2, 3, 4}, {6, 4});
  EXPECT_EQ(second.y, (mx::Shape{2, 12}));
  EXPECT_EQ(second.z, (mx::Shape{6, 4}));
  EXPECT_EQ(second.evaluations, 1u);
  EXPECT_EQ(model.internal_state().host_reads->size(), 1u);
}

TEST(HostReads, NewShapesAreReadAgain) {
  Model model = shape_chain_model();
  run_counted(model, model.params(), {2, 3, 4}, {4, 6});
  Result other = run_counted(model, model.params(), {3, 2, 2}, {2, 6});
  EXPECT_EQ(other.y, (mx::Shape{3, 4}));
  EXPECT_EQ(other.z, (mx::Shape{2, 6}));
  EXPECT_EQ(other.evaluations, 3u);
  EXPECT_EQ(model.internal_state().host_reads->size(), 2u);
  // Both signatures are kept.
  EXPECT_EQ(run_counted(model, model.params(), {2, 3, 4}, {4, 6}).evaluations, 1u);
  EXPECT_EQ(run_counted(model, model.params(), {3, 2, 2}, {4, 3}).evaluations, 1u);
}

TEST(HostReads, ParamsReplacingAnInitializerAreReadAfresh) {
  Model model = shape_chain_model();
  run_counted(model, model.params(), {2, 3, 4}, {4, 6});
  Params params = model.params();
  params.insert_or_assign("i", mx::array(int64_t{1}));  // now Shape(x)[1]
  Result replaced = run_counted(model, params, {2, 3, 4}, {4, 6});
  EXPECT_EQ(replaced.y, (mx::Shape{3, 8}));
  EXPECT_EQ(replaced.evaluations, 3u);
  // A copy of the model's own params still replays.
  EXPECT_EQ(run_counted(model, Params(model.params()), {2, 3, 4}, {4, 6}).evaluations, 1u);
}

TEST(HostReads, OldSignaturesAreDropped) {
  Model model = shape_chain_model();
  for (int n = 1; n <= static_cast<int>(SignatureMemoCache::kCapacity) + 2; ++n) {
    run_counted(model, model.params(), {n, 2, 2}, {n, 4});
  }
  EXPECT_EQ(model.internal_state().host_reads->size(), SignatureMemoCache::kCapacity);
  EXPECT_EQ(run_counted(model, model.params(), {1, 2, 2}, {1, 4}).evaluations, 3u);  // dropped, read again
}

// The nodes of the shape chain compute values of the signature alone: a run
// with a known signature skips them and takes their remembered outputs.
TEST(HostReads, ShapeChainNodesAreReplayedNotRun) {
  Model model = shape_chain_model();
  EXPECT_EQ(signature_determined_nodes(*model.internal_state().bound),
            (std::vector<bool>{true, true, true, true, false, false}));  // Shape Gather Unsqueeze Concat | Reshapes
  run_counted(model, model.params(), {2, 3, 4}, {4, 6});
  // Replayed: the Reshape of y gets the remembered shape [2, -1] without a read.
  Result second = run_counted(model, model.params(), {2, 3, 4}, {3, 8});
  EXPECT_EQ(second.y, (mx::Shape{2, 12}));
  EXPECT_EQ(second.z, (mx::Shape{3, 8}));
}

// The plan of a replaying run: the remembered values that a running node's subgraph (the If's branches read
// "shape") and the graph's outputs ("d") read are bound; the rest of the chain is not visited.
TEST(HostReads, ReplayPlanBindsWhatRunningNodesReadAndSkipsTheOtherRememberedNodes) {
  auto branch = GraphBuilder().node("Reshape", {"x", "shape"}, {"r"}).output("r").graph();
  Model model =
      with_shape_chain()
          .input("cond", OnnxType::kBool, {})
          .node("If", {"cond"}, {"y"},
                {testing::graph_attr("then_branch", branch), testing::graph_attr("else_branch", branch)})
          .output("y")
          .output("d")
          .build();
  const BoundGraph& bound = *model.internal_state().bound;
  const std::vector<bool> replayable = signature_determined_nodes(bound);
  EXPECT_EQ(replayable, (std::vector<bool>{true, true, true, true, false}));
  SignatureMemo memo;
  for (size_t n = 0; n < 4; ++n) memo.remember_outputs(n, {Value(mx::array({int64_t(n)}))});
  ReplayPlan plan = plan_replay(bound, memo, replayable);
  EXPECT_EQ(plan.nodes, std::vector<size_t>{4});
  std::vector<std::string> bound_names;
  for (const auto& [name, value] : plan.bindings) bound_names.push_back(name);
  EXPECT_EQ(bound_names, (std::vector<std::string>{"d", "shape"}));

  // Run twice with one signature and other data: the second run replays, with the first run's values.
  for (float value : {1.0f, 2.0f}) {
    const Inputs in = {{"x", Value(mx::full({2, 3, 4}, value))}, {"cond", Value(mx::array(true))}};
    Outputs out = run(model, model.params(), in, {mx::Device::cpu});
    EXPECT_TRUE(mx::array_equal(out.tensor("y"), mx::full({2, 12}, value)).item<bool>()) << value;
    EXPECT_EQ(out.tensor("d").item<int64_t>(), 2);
  }
}

// Random ops (and what they feed) are never remembered: each run draws anew.
// A remembered output above the size limit is computed again each run.
TEST(HostReads, RandomAndLargeOutputsAreComputedEveryRun) {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {-1, -1})
      .node("RandomUniform", {}, {"r"}, {ints_attr("shape", {4})})
      .node("Neg", {"r"}, {"noise"})
      .node("Shape", {"x"}, {"s"})
      .node("ConstantOfShape", {"s"}, {"ones"}, {testing::tensor_attr("value", Value(mx::array({1.0f})))})
      .node("Add", {"x", "ones"}, {"y"})
      .output("noise")
      .output("y");
  Model model = b.build();
  EXPECT_EQ(signature_determined_nodes(*model.internal_state().bound),
            (std::vector<bool>{false, false, true, true, false}));
  // 300 x 300 floats (352 KiB): more than a remembered output may hold.
  Inputs inputs{{"x", mx::zeros({300, 300})}};
  Outputs first = run(model, model.params(), inputs, {mx::Device::cpu});
  Outputs second = run(model, model.params(), inputs, {mx::Device::cpu});
  EXPECT_FALSE(mx::array_equal(first.tensor("noise"), second.tensor("noise")).item<bool>());
  EXPECT_TRUE(mx::array_equal(second.tensor("y"), mx::ones({300, 300})).item<bool>());
  // Small enough to be remembered, and still right on replay.
  Inputs small{{"x", mx::full({3, 5}, 2.0f)}};
  run(model, model.params(), small, {mx::Device::cpu});
  EXPECT_TRUE(mx::array_equal(run(model, model.params(), small, {mx::Device::cpu}).tensor("y"), mx::full({3, 5}, 3.0f))
                  .item<bool>());
}

}  // namespace
}  // namespace transmuter
