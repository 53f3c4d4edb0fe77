// Evaluation on the calling thread (src/runtime/evaluate_here.h): eager CPU runs of a model made of
// Transmuter's kernels and views return evaluated outputs with the bytes of MLX's evaluation
// (RunOptions::evaluate_cpu_outputs off), a graph with an MLX computation and a traced run stay lazy, and
// evaluate_here itself on hand-made graphs: a kernel with several outputs read through a sibling, an input
// that an async_eval is computing, and a refusal that leaves the graph as it was.
#include "runtime/evaluate_here.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/dynamic_quantize.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;

mx::array uniform(mx::Shape shape, uint64_t seed) {
  return testing::evaluated(testing::random_uniform(shape, seed));
}

// x [1, 16, 32] -> heads split (Reshape, Transpose) and merged back -> LayerNormalization -> MatMul by a
// constant (packed at load) -> Relu -> Softmax: after the passes, kernels and the views between them.
GraphBuilder small_block() {
  GraphBuilder b(17);
  b.input("x", OnnxType::kFloat, {1, 16, 32})
      .initializer("heads", mx::array({1, 16, 4, 8}, {4}, mx::int64))
      .initializer("merged", mx::array({1, 16, 32}, {3}, mx::int64))
      .initializer("gamma", uniform({32}, 1))
      .initializer("beta", uniform({32}, 2))
      .initializer("w", uniform({32, 24}, 3))
      .node("Reshape", {"x", "heads"}, {"h"})
      .node("Transpose", {"h"}, {"t"}, {ints_attr("perm", {0, 2, 1, 3})})
      .node("Transpose", {"t"}, {"u"}, {ints_attr("perm", {0, 2, 1, 3})})
      .node("Reshape", {"u", "merged"}, {"m"})
      .node("LayerNormalization", {"m", "gamma", "beta"}, {"n"}, {int_attr("axis", -1)})
      .node("MatMul", {"n", "w"}, {"p"})
      .node("Relu", {"p"}, {"r"})
      .node("Softmax", {"r"}, {"y"}, {int_attr("axis", -1)});
  return b;
}

RunOptions on_cpu(bool evaluate_here) {
  RunOptions o;
  o.device = mx::Device::cpu;
  o.evaluate_cpu_outputs = evaluate_here;
  return o;
}

TEST(EvaluateHere, EagerCpuRunsReturnEvaluatedOutputsWithMlxsBytes) {
  Model model = small_block().output("y").build();
  for (uint64_t seed = 10; seed < 13;
       ++seed) {  // the first run records the signature's memo, the others replay it
    const Inputs in = {{"x", Value(uniform({1, 16, 32}, seed))}};
    mx::array got = run(model, model.params(), in, on_cpu(true)).tensor("y");
    mx::array want = run(model, model.params(), in, on_cpu(false)).tensor("y");
    EXPECT_EQ(got.status(), mx::array::Status::available) << "seed " << seed;
    EXPECT_EQ(want.status(), mx::array::Status::unscheduled);
    EXPECT_TRUE(mx::array_equal(got, want).item<bool>()) << "seed " << seed;
    EXPECT_GT(mx::max(want).item<float>(), 0.0f);
  }
}

// A negation is an MLX computation: the outputs come back lazy, as the ops built them.
TEST(EvaluateHere, AnMlxComputationLeavesTheOutputsLazy) {
  GraphBuilder b = small_block();
  b.node("Neg", {"y"}, {"z"});
  Model model = b.output("z").build();
  const Inputs in = {{"x", Value(uniform({1, 16, 32}, 20))}};
  mx::array got = run(model, model.params(), in, on_cpu(true)).tensor("z");
  EXPECT_EQ(got.status(), mx::array::Status::unscheduled);
  mx::array want = run(model, model.params(), in, on_cpu(false)).tensor("z");
  EXPECT_TRUE(mx::array_equal(got, want).item<bool>());
}

// Under mx::grad the arrays are traced: nothing is evaluated mid-transformation, and the gradient is MLX's.
TEST(EvaluateHere, GradientsThroughEagerRunsAreUnchanged) {
  Model model = small_block().output("y").build();
  const mx::array x = uniform({1, 16, 32}, 30);
  const mx::array weights = mx::arange(16 * 24, mx::float32);
  auto gradient = [&](bool evaluate_here) {
    auto loss = [&](const mx::array& input) {
      mx::array y = run(model, model.params(), {{"x", Value(input)}}, on_cpu(evaluate_here)).tensor("y");
      return mx::sum(mx::multiply(mx::reshape(y, {16 * 24}), weights));
    };
    return mx::grad(loss)(x);
  };
  mx::array got = gradient(true), want = gradient(false);
  EXPECT_TRUE(mx::array_equal(got, want).item<bool>());
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.0f);
}

// DynamicQuantizeLinear's kernel has three outputs; a consumer that reads the second (the scale) reaches the
// primitive through a sibling: all three outputs are computed, before the consumer.
TEST(EvaluateHere, KernelsWithSeveralOutputsAreReachedThroughAnySibling) {
  const mx::array x = uniform({4, 64}, 40);
  const mx::array factors = uniform({4, 64}, 41);  // evaluated: not an MLX computation of the graph
  auto build = [&] {
    std::vector<mx::array> q = kernels::dynamic_quantize_linear(
        kernels::bias_activation(x, std::nullopt, kernels::Activation::kTanh, mx::Device::cpu),
        mx::Device::cpu);
    mx::array scaled = kernels::bias_activation(mx::multiply(factors, q[1]), std::nullopt,
                                                kernels::Activation::kIdentity, mx::Device::cpu);
    return std::vector<mx::array>{scaled, q[0], q[2]};
  };
  std::vector<mx::array> want = build();
  mx::eval(want);
  std::vector<mx::array> lazy = build();
  std::vector<std::string> why;
  // The multiplication by the scale is MLX's: refused, nothing evaluated.
  EXPECT_FALSE(evaluate_here(lazy, &why));
  EXPECT_EQ(why, std::vector<std::string>{"Multiply"});
  for (const mx::array& a : lazy) EXPECT_EQ(a.status(), mx::array::Status::unscheduled);

  // Read through a sibling alone: the scale (output 1) first, then the others.
  std::vector<mx::array> q = kernels::dynamic_quantize_linear(
      kernels::bias_activation(x, std::nullopt, kernels::Activation::kTanh, mx::Device::cpu),
      mx::Device::cpu);
  ASSERT_TRUE(evaluate_here({q[1]}, &why)) << ::testing::PrintToString(why);
  for (const mx::array& a : q) EXPECT_EQ(a.status(), mx::array::Status::available);
  EXPECT_TRUE(mx::array_equal(q[0], want[1]).item<bool>());
  EXPECT_TRUE(mx::array_equal(q[2], want[2]).item<bool>());
  EXPECT_TRUE(mx::array_equal(mx::multiply(factors, q[1]), want[0]).item<bool>());
}

// An input that MLX is computing (async_eval) is waited for before the kernel reads it.
TEST(EvaluateHere, InputsInFlightAreWaitedFor) {
  const mx::array x = uniform({256, 256}, 50);
  mx::array computed = mx::exp(mx::matmul(x, x));  // MLX's work on the stream
  mx::async_eval(computed);
  mx::array y = kernels::bias_activation(computed, std::nullopt, kernels::Activation::kTanh, mx::Device::cpu);
  std::vector<std::string> why;
  ASSERT_TRUE(evaluate_here({y}, &why)) << ::testing::PrintToString(why);
  EXPECT_EQ(y.status(), mx::array::Status::available);
  mx::array want = kernels::bias_activation(mx::exp(mx::matmul(x, x)), std::nullopt,
                                            kernels::Activation::kTanh, mx::Device::cpu);
  mx::eval(want);  // the same kernel through MLX's scheduler
  EXPECT_TRUE(mx::array_equal(y, want).item<bool>());
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.0f);
}

}  // namespace
}  // namespace transmuter
