// Direct runs of compiled CPU segments (src/runtime/direct_run.h): a small CNN made only of Transmuter's
// kernels and views runs directly from its first call on (recorded, then run), with the bytes of the MLX
// path (CompileOptions::direct_cpu_runs off) over several new inputs, from two threads at once, and with
// its gradient through the MLX path (traced arguments); a graph with an MLX computation keeps the MLX path; a
// segment whose outputs include its argument and a constant; DirectRun::record itself on hand-made graphs
// (constants folded once, the primitive that stops it named).
#include "runtime/direct_run.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include <mlx/mlx.h>

#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;

// Computed at once: weights read from two threads must not be lazy arrays of the main thread's stream.
mx::array uniform(mx::Shape shape, uint64_t seed) {
  return testing::evaluated(testing::random_uniform(shape, seed));
}

// x [1, 3, 16, 16] -> Conv 3x3 (8) + Relu -> depthwise Conv 3x3 -> GlobalAveragePool -> Flatten -> Gemm (4):
// after the passes, channels-last kernels, a pooled mean, a packed product and the views between them.
GraphBuilder small_cnn() {
  GraphBuilder b(13);
  b.input("x", OnnxType::kFloat, {1, 3, 16, 16})
      .initializer("w1", uniform({8, 3, 3, 3}, 1))
      .initializer("b1", uniform({8}, 2))
      .initializer("w2", uniform({8, 1, 3, 3}, 3))
      .initializer("w3", uniform({4, 8}, 4))
      .initializer("b3", uniform({4}, 5))
      .node("Conv", {"x", "w1", "b1"}, {"c1"}, {ints_attr("pads", {1, 1, 1, 1})})
      .node("Relu", {"c1"}, {"r1"})
      .node("Conv", {"r1", "w2"}, {"c2"}, {ints_attr("pads", {1, 1, 1, 1}), int_attr("group", 8)})
      .node("GlobalAveragePool", {"c2"}, {"p"})
      .node("Flatten", {"p"}, {"f"})
      .node("Gemm", {"f", "w3", "b3"}, {"y"}, {int_attr("transB", 1)});
  return b;
}

CompileOptions on_cpu(bool direct) {
  CompileOptions o;
  o.device = mx::Device::cpu;
  o.direct_cpu_runs = direct;
  return o;
}

TEST(DirectRun, KernelsAndViewsRunDirectlyWithTheMlxPathsBytes) {
  Model model = small_cnn().output("y").build();
  CompiledModel direct = compile(model, {}, on_cpu(true));
  CompiledModel mlx_path = compile(model, {}, on_cpu(false));
  for (uint64_t seed = 10; seed < 14; ++seed) {  // the first call records, then runs directly as the others
    const Inputs in = {{"x", Value(mx::random::normal({1, 3, 16, 16}, mx::float32, 0.0f, 1.0f,
                                                      mx::random::key(seed)))}};  // lazy
    mx::array got = direct(in).tensor("y");
    mx::array want = mlx_path(in).tensor("y");
    EXPECT_EQ(got.status(), mx::array::Status::available) << "seed " << seed;
    EXPECT_TRUE(mx::array_equal(got, want).item<bool>()) << "seed " << seed;
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.0f);
  }
  EXPECT_EQ(direct.stats().direct_segments, 1u);
  EXPECT_EQ(mlx_path.stats().direct_segments, 0u);
}

TEST(DirectRun, TwoThreadsRunTheirOwnPlans) {
  Model model = small_cnn().output("y").build();
  CompiledModel direct = compile(model, {}, on_cpu(true));
  CompiledModel mlx_path = compile(model, {}, on_cpu(false));
  const Inputs in = {{"x", Value(uniform({1, 3, 16, 16}, 20))}};
  mx::array want = mlx_path(in).tensor("y");
  mx::eval(want);
  std::vector<int> equal(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int call = 0; call < 20; ++call) {
        mx::array got = direct(in).tensor("y");
        equal[t] += mx::array_equal(got, want).item<bool>() ? 1 : 0;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(equal, (std::vector<int>{20, 20}));
  EXPECT_EQ(direct.stats().direct_segments, 2u);  // one plan per thread
}

// One array passed for both inputs on the recorded call, then two different ones: each input keeps its slot.
TEST(DirectRun, AnArrayPassedForTwoInputsStillFillsTwoSlots) {
  GraphBuilder b(13);
  b.input("x", OnnxType::kFloat, {1, 3, 8, 8})
      .input("z", OnnxType::kFloat, {1, 3, 8, 8})
      .initializer("w", uniform({4, 3, 3, 3}, 60))
      .node("Conv", {"x", "w"}, {"cx"}, {ints_attr("pads", {1, 1, 1, 1})})
      .node("Conv", {"z", "w"}, {"cz"}, {ints_attr("pads", {1, 1, 1, 1})});
  Model model = b.output("cx").output("cz").build();
  CompiledModel direct = compile(model, {}, on_cpu(true));
  CompiledModel mlx_path = compile(model, {}, on_cpu(false));
  const mx::array same = uniform({1, 3, 8, 8}, 61);
  direct({{"x", Value(same)}, {"z", Value(same)}});
  const Inputs in = {{"x", Value(uniform({1, 3, 8, 8}, 62))}, {"z", Value(uniform({1, 3, 8, 8}, 63))}};
  Outputs got = direct(in), want = mlx_path(in);
  EXPECT_EQ(direct.stats().direct_segments, 1u);
  EXPECT_TRUE(mx::array_equal(got.tensor("cx"), want.tensor("cx")).item<bool>());
  EXPECT_TRUE(mx::array_equal(got.tensor("cz"), want.tensor("cz")).item<bool>());
  EXPECT_FALSE(mx::array_equal(got.tensor("cx"), got.tensor("cz")).item<bool>());
}

// A Reshape of a transposed view (attention heads merged back) is made dense on the calling thread:
// MLX's own copy would still be queued on the stream when the next kernel reads it.
TEST(DirectRun, ReshapesOfViewsAreCopiedHere) {
  Model model = GraphBuilder(13)
                    .input("x", OnnxType::kFloat, {1, 12, 16, 32})
                    .initializer("shape", mx::array({1, 16, 384}, {3}, mx::int64))
                    .initializer("bias", uniform({384}, 7))
                    .node("Transpose", {"x"}, {"t"}, {ints_attr("perm", {0, 2, 1, 3})})
                    .node("Reshape", {"t", "shape"}, {"r"})
                    .node("Add", {"r", "bias"}, {"y"})
                    .output("y")
                    .build();
  CompiledModel direct = compile(model, {}, on_cpu(true));
  CompiledModel mlx_path = compile(model, {}, on_cpu(false));
  for (uint64_t seed = 50; seed < 53; ++seed) {
    const Inputs in = {{"x", Value(uniform({1, 12, 16, 32}, seed))}};
    EXPECT_TRUE(mx::array_equal(direct(in).tensor("y"), mlx_path(in).tensor("y")).item<bool>()) << seed;
  }
  EXPECT_EQ(direct.stats().direct_segments, 1u);
}

// A traced argument (the gradient with respect to the input) takes the MLX path: the kernels' references.
TEST(DirectRun, GradientsTakeTheMlxPath) {
  Model model = small_cnn().output("y").build();
  CompiledModel direct = compile(model, {}, on_cpu(true));
  CompiledModel mlx_path = compile(model, {}, on_cpu(false));
  const mx::array x = uniform({1, 3, 16, 16}, 30);
  direct({{"x", Value(x)}});
  direct({{"x", Value(x)}});  // recorded and run directly once
  auto gradient = [&](CompiledModel& compiled) {
    auto loss = [&](const mx::array& input) { return mx::sum(compiled({{"x", Value(input)}}).tensor("y")); };
    return mx::grad(loss)(x);
  };
  mx::array got = gradient(direct), want = gradient(mlx_path);
  EXPECT_TRUE(mx::allclose(got, want, 1e-6, 1e-6).item<bool>());
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.0f);
}

// A negation is an MLX computation: the segment keeps the MLX path, and the stats name it.
TEST(DirectRun, AnMlxComputationKeepsTheMlxPath) {
  GraphBuilder b = small_cnn();
  b.node("Neg", {"y"}, {"z"});
  Model model = b.output("z").build();
  CompiledModel direct = compile(model, {}, on_cpu(true));
  CompiledModel mlx_path = compile(model, {}, on_cpu(false));
  for (uint64_t seed = 40; seed < 43; ++seed) {
    const Inputs in = {{"x", Value(uniform({1, 3, 16, 16}, seed))}};
    EXPECT_TRUE(mx::array_equal(direct(in).tensor("z"), mlx_path(in).tensor("z")).item<bool>());
  }
  EXPECT_EQ(direct.stats().direct_segments, 0u);
  EXPECT_EQ(direct.stats().direct_blockers, std::vector<std::string>{"Negative"});
  EXPECT_TRUE(mlx_path.stats().direct_blockers.empty());  // never tried
}

// DirectRun::record on graphs made here: a constant's widening and reshape (folded once), a view of the
// argument, the argument itself and a constant among the outputs.
TEST(DirectRun, RecordFoldsConstantsAndReturnsArgumentsAndConstants) {
  const mx::array arg = mx::reshape(mx::arange(12.0f), {3, 4});
  mx::eval(arg);
  const mx::array constant = mx::array({1, 2, 3, 4}, mx::int32);
  const mx::array folded = mx::reshape(mx::astype(constant, mx::float32), {1, 4});  // constants alone
  const mx::array view = mx::transpose(arg, {1, 0});
  std::vector<std::string> why;
  std::optional<DirectRun> run = DirectRun::record({arg}, {view, arg, folded, constant}, &why);
  ASSERT_TRUE(run.has_value()) << ::testing::PrintToString(why);
  EXPECT_EQ(run->steps(), 1u);  // the transpose; the widening and reshape were evaluated at recording
  const mx::array other = mx::reshape(mx::arange(12.0f, 24.0f), {3, 4});
  mx::eval(other);
  std::vector<mx::array> out = (*run)({other});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_TRUE(mx::array_equal(out[0], mx::transpose(other, {1, 0})).item<bool>());
  EXPECT_TRUE(mx::array_equal(out[1], other).item<bool>());
  EXPECT_TRUE(mx::array_equal(out[2], mx::array({1.0f, 2.0f, 3.0f, 4.0f}, {1, 4})).item<bool>());
  EXPECT_TRUE(mx::array_equal(out[3], constant).item<bool>());

  // MLX computations on the argument: not recorded, and each named once, however often and wherever
  // it appears.
  const mx::array blocked = mx::add(mx::exp(mx::exp(arg)), mx::reshape(mx::exp(arg), {3, 4}));
  EXPECT_FALSE(DirectRun::record({arg}, {blocked}, &why).has_value());
  EXPECT_EQ(why, (std::vector<std::string>{"Add", "Exp"}));
}

}  // namespace
}  // namespace transmuter
