#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "runtime/compiler.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::to_doubles;

// out = ReduceSum(Cast(NonZero(Relu(x)))): NonZero has a data-dependent
// shape, so it runs eagerly between two compiled segments.
Model nonzero_model() {
  Attribute to_float = testing::int_attr("to", static_cast<int64_t>(OnnxType::kFloat));
  return GraphBuilder()
      .input("x", OnnxType::kFloat, {-1})
      .node("Relu", {"x"}, {"r"})
      .node("NonZero", {"r"}, {"nz"})
      .node("Cast", {"nz"}, {"f"}, {to_float})
      .node("ReduceSum", {"f"}, {"s"})
      .output("s")
      .build();
}

TEST(Compile, MatchesEagerAndCachesPlans) {
  Model model = GraphBuilder()
                    .input("x", OnnxType::kFloat, {-1})
                    .node("Exp", {"x"}, {"e"})
                    .node("Softmax", {"e"}, {"y"})
                    .output("y")
                    .build();
  mx::array x3 = mx::array({0.1f, 0.2f, -0.3f});
  CompiledModel compiled = compile(model, {{"x", x3}}, {{}, 8, mx::Device::cpu});
  EXPECT_EQ(compiled.stats().plans_built, 1u);
  EXPECT_EQ(compiled.stats().segments, 1u);
  EXPECT_EQ(compiled.stats().graph_breaks, 0u);
  auto eager = to_doubles(run(model, model.params(), {{"x", x3}}, {mx::Device::cpu}).tensor("y"));
  auto comp = to_doubles(compiled({{"x", x3}}).tensor("y"));
  ASSERT_EQ(eager.size(), comp.size());
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_NEAR(eager[i], comp[i], 1e-6);
  EXPECT_EQ(compiled.stats().cache_hits, 1u);
  compiled({{"x", mx::zeros({5})}});
  EXPECT_EQ(compiled.stats().plans_built, 2u);
}

TEST(Compile, EvictsLeastRecentlyUsedPlan) {
  Model model = GraphBuilder().input("x", OnnxType::kFloat, {-1}).node("Neg", {"x"}, {"y"}).output("y").build();
  CompiledModel compiled = compile(model, {}, {{}, 2, mx::Device::cpu});
  compiled({{"x", mx::zeros({1})}});
  compiled({{"x", mx::zeros({2})}});
  compiled({{"x", mx::zeros({1})}});  // hit: {1} becomes most recent
  compiled({{"x", mx::zeros({3})}});  // evicts {2}
  EXPECT_EQ(compiled.stats().evictions, 1u);
  compiled({{"x", mx::zeros({1})}});  // still cached
  EXPECT_EQ(compiled.stats().cache_hits, 2u);
  compiled({{"x", mx::zeros({2})}});  // rebuilt
  EXPECT_EQ(compiled.stats().plans_built, 4u);
}

TEST(Compile, GraphBreakAroundDataDependentShape) {
  Model model = nonzero_model();
  CompiledModel compiled = compile(model, {}, {{}, 8, mx::Device::cpu});
  // Nonzero positions of relu([1,-1,2,0]) are 0 and 2.
  EXPECT_EQ(to_doubles(compiled({{"x", mx::array({1.f, -1.f, 2.f, 0.f})}}).tensor("s")), std::vector<double>{2});
  EXPECT_EQ(compiled.stats().segments, 2u);
  EXPECT_EQ(compiled.stats().graph_breaks, 1u);
  // Same input shape (plan cache hit) but a different NonZero count: the
  // second segment must see the new shape, not a stale trace.
  EXPECT_EQ(to_doubles(compiled({{"x", mx::array({1.f, 1.f, 1.f, 1.f})}}).tensor("s")), std::vector<double>{6});
  EXPECT_EQ(compiled.stats().cache_hits, 1u);
  // Both segments are kernels (Relu; Cast and ReduceSum) recorded for direct runs, the second for NonZero's
  // first count: the new count must not run on the recorded shapes.
  EXPECT_EQ(compiled.stats().direct_segments, 2u);
}

// y = Reshape(x, shape) where `shape` is a graph input.
Model reshape_model() {
  return GraphBuilder()
      .input("x", OnnxType::kFloat, {6})
      .input("shape", OnnxType::kInt64, {2})
      .node("Reshape", {"x", "shape"}, {"y"})
      .output("y")
      .build();
}

TEST(Compile, ShapeFromDataIsAGraphBreak) {
  Model model = reshape_model();
  CompiledModel compiled = compile(model, {}, {{}, 8, mx::Device::cpu});
  Outputs out = compiled({{"x", mx::arange(6.f)}, {"shape", mx::array({2, 3}, mx::int64)}});
  EXPECT_EQ(out.tensor("y").shape(), (mx::Shape{2, 3}));
  EXPECT_EQ(compiled.stats().graph_breaks, 1u);
  out = compiled({{"x", mx::arange(6.f)}, {"shape", mx::array({3, 2}, mx::int64)}});
  EXPECT_EQ(out.tensor("y").shape(), (mx::Shape{3, 2}));
}

TEST(Compile, StaticInputsAreHostValuesAndJoinTheCacheKey) {
  Model model = reshape_model();
  CompileOptions options{{"shape"}, 8, mx::Device::cpu};
  CompiledModel compiled = compile(model, {}, options);
  Outputs out = compiled({{"x", mx::arange(6.f)}, {"shape", mx::array({2, 3}, mx::int64)}});
  EXPECT_EQ(out.tensor("y").shape(), (mx::Shape{2, 3}));
  EXPECT_EQ(compiled.stats().graph_breaks, 0u);
  out = compiled({{"x", mx::arange(6.f)}, {"shape", mx::array({3, 2}, mx::int64)}});
  EXPECT_EQ(out.tensor("y").shape(), (mx::Shape{3, 2}));
  EXPECT_EQ(compiled.stats().plans_built, 2u);
}

TEST(Compile, UnknownStaticInputIsAnError) {
  EXPECT_THROW(compile(reshape_model(), {}, {{"nope"}, 8, mx::Device::cpu}), InputError);
}

TEST(Compile, CastToStringRunsEagerly) {
  Model model = GraphBuilder()
                    .input("x", OnnxType::kFloat, {2})
                    .node("Cast", {"x"}, {"s"}, {testing::int_attr("to", static_cast<int64_t>(OnnxType::kString))})
                    .output("s")
                    .build();
  CompiledModel compiled = compile(model, {}, {{}, 8, mx::Device::cpu});
  Outputs out = compiled({{"x", mx::array({1.5f, -2.f})}});
  ASSERT_TRUE(out.at("s").is_strings());
  EXPECT_EQ(out.at("s").strings().data.size(), 2u);
  EXPECT_EQ(compiled.stats().graph_breaks, 1u);
}

}  // namespace
}  // namespace transmuter

namespace transmuter {
namespace {

// y = x * w + b with float initializers w, b and an int64 shape initializer
// read on the host (Reshape), which must stay a constant.
Model affine_model() {
  return testing::GraphBuilder()
      .input("x", OnnxType::kFloat, {2, 2})
      .initializer("w", mx::array({2.f, 3.f}))
      .initializer("b", mx::array({1.f, 1.f}))
      .initializer("shape", mx::array({4}, {1}, mx::int64))
      .node("Mul", {"x", "w"}, {"xw"})
      .node("Add", {"xw", "b"}, {"z"})
      .node("Reshape", {"z", "shape"}, {"y"})
      .output("y")
      .build();
}

TEST(CompileParams, NewParamsNeedNoNewPlanAndStayOutOfHostInputs) {
  Model model = affine_model();
  CompiledModel compiled =
      compile(model, {}, {.static_inputs = {}, .device = mx::Device::cpu, .params_as_arguments = true});
  Inputs in = {{"x", mx::ones({2, 2})}};
  EXPECT_EQ(testing::to_doubles(compiled(in).tensor("y")), (std::vector<double>{3, 4, 3, 4}));
  Params params = {{"w", mx::array({10.f, 20.f})}};
  EXPECT_EQ(testing::to_doubles(compiled(params, in).tensor("y")), (std::vector<double>{11, 21, 11, 21}));
  EXPECT_EQ(compiled.stats().plans_built, 1u);
  EXPECT_EQ(compiled.stats().graph_breaks, 0u);  // the int64 shape stays a constant
}

TEST(CompileParams, GradientsReachParamsThroughCompiledSegments) {
  Model model = affine_model();
  CompiledModel compiled =
      compile(model, {}, {.static_inputs = {}, .device = mx::Device::cpu, .params_as_arguments = true});
  Inputs in = {{"x", mx::array({1.f, 2.f, 3.f, 4.f}, {2, 2})}};
  auto loss = [&](const std::vector<mx::array>& wb) {
    return mx::sum(compiled({{"w", wb[0]}, {"b", wb[1]}}, in).tensor("y"));
  };
  auto [value, grads] = mx::value_and_grad(loss, std::vector<int>{0, 1})({mx::array({2.f, 3.f}), mx::array({1.f, 1.f})});
  // d/dw sum(x * w + b) = column sums of x; d/db = number of rows.
  EXPECT_EQ(testing::to_doubles(grads[0]), (std::vector<double>{4, 6}));
  EXPECT_EQ(testing::to_doubles(grads[1]), (std::vector<double>{2, 2}));
}

TEST(CompileParams, ParamsAreRefusedWithoutTheOptionOrWithAnotherShape) {
  Model model = affine_model();
  Inputs in = {{"x", mx::ones({2, 2})}};
  CompiledModel plain = compile(model, {}, {.static_inputs = {}, .device = mx::Device::cpu});
  EXPECT_THROW(plain({{"w", mx::array({1.f, 1.f})}}, in), InputError);
  CompiledModel trainable =
      compile(model, {}, {.static_inputs = {}, .device = mx::Device::cpu, .params_as_arguments = true});
  EXPECT_THROW(trainable({{"w", mx::array({1.f, 1.f, 1.f})}}, in), InputError);
  EXPECT_THROW(trainable({{"shape", mx::array({4}, {1}, mx::int64)}}, in), InputError);
}

}  // namespace
}  // namespace transmuter
