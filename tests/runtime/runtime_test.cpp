#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include <mlx/mlx.h>

#include "kernels/cpu/kernel_lookahead.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::to_doubles;

// y = Relu(x @ w + b)
Model dense_relu(const LoadOptions& options = {}) {
  return GraphBuilder()
      .input("x", OnnxType::kFloat, {-1, 2})
      .initializer("w", mx::array({1.f, -1.f, 2.f, 0.5f}, {2, 2}))
      .initializer("b", mx::array({0.f, 1.f}))
      .node("MatMul", {"x", "w"}, {"xw"})
      .node("Add", {"xw", "b"}, {"z"})
      .node("Relu", {"z"}, {"y"})
      .output("y")
      .build(options);
}

TEST(Run, ComputesTheGraph) {
  Model model = dense_relu();
  Outputs out = run(model, model.params(), {{"x", mx::array({1.f, 1.f, -1.f, 0.f}, {2, 2})}}, {mx::Device::cpu});
  ASSERT_EQ(out.names, std::vector<std::string>{"y"});
  // [1,1]@w = [3, -0.5] + b = [3, 0.5]; [-1,0]@w = [-1, 1] + b = [-1, 2] -> relu
  EXPECT_EQ(to_doubles(out.tensor("y")), (std::vector<double>{3, 0.5, 0, 2}));
}

TEST(Run, ParamsReplaceInitializers) {
  Model model = dense_relu();
  Params params = model.params();
  params.insert_or_assign("b", mx::array({10.f, 10.f}));
  Outputs out = run(model, params, {{"x", mx::zeros({1, 2})}}, {mx::Device::cpu});
  EXPECT_EQ(to_doubles(out.tensor("y")), (std::vector<double>{10, 10}));
}

TEST(Run, GradientFlowsToParams) {
  // The file's weights by their names: the default passes would pack "w" for
  // the CPU GEMM (tests/passes/pack_matmul_weights_test.cpp differentiates that).
  Model model = dense_relu({.run_passes = false});
  mx::array x = mx::array({1.f, 2.f}, {1, 2});
  // loss = sum(y); with all pre-activations positive, dloss/dw[i][j] = x[i].
  auto loss = [&](const std::vector<mx::array>& w) {
    Params params = model.params();
    params.insert_or_assign("w", w[0]);
    params.insert_or_assign("b", mx::array({5.f, 5.f}));
    return std::vector<mx::array>{mx::sum(run(model, params, {{"x", x}}, {mx::Device::cpu}).tensor("y"))};
  };
  auto [values, grads] = mx::value_and_grad(loss)({model.params().at("w")});
  EXPECT_EQ(to_doubles(grads[0]), (std::vector<double>{1, 1, 2, 2}));
}

TEST(Run, NodeHookSeesEveryNodeInOrder) {
  Model model = dense_relu({.run_passes = false});
  std::vector<std::string> seen;
  RunOptions options{mx::Device::cpu};
  options.node_hook = [&](NodeRun& node) {
    ASSERT_EQ(node.outputs.size(), 1u);
    std::ostringstream line;
    line << node.index << " " << node.op_type << " " << node.output_names[0] << " "
         << to_doubles(node.outputs[0].tensor()).size();
    seen.push_back(line.str());
  };
  run(model, model.params(), {{"x", mx::array({1.f, 1.f}, {1, 2})}}, options);
  EXPECT_EQ(seen, (std::vector<std::string>{"0 MatMul xw 2", "1 Add z 2", "2 Relu y 2"}));
}

TEST(Run, NodeHookReplacesWhatLaterNodesRead) {
  Model model = dense_relu({.run_passes = false});
  RunOptions options{mx::Device::cpu};
  options.node_hook = [](NodeRun& node) {
    if (node.op_type == "Add") node.outputs[0] = mx::array({-5.f, 7.f}, {1, 2});
  };
  Outputs out = run(model, model.params(), {{"x", mx::array({1.f, 1.f}, {1, 2})}}, options);
  EXPECT_EQ(to_doubles(out.tensor("y")), (std::vector<double>{0, 7}));  // Relu of the replaced z
  // A run without the hook is unaffected: nothing it replaced was remembered.
  Outputs plain = run(model, model.params(), {{"x", mx::array({1.f, 1.f}, {1, 2})}}, {mx::Device::cpu});
  EXPECT_EQ(to_doubles(plain.tensor("y")), (std::vector<double>{3, 0.5}));
}

TEST(Run, NodeHookMustLeaveOneValuePerOutput) {
  Model model = dense_relu({.run_passes = false});
  RunOptions options{mx::Device::cpu};
  options.node_hook = [](NodeRun& node) { node.outputs.clear(); };
  try {
    run(model, model.params(), {{"x", mx::zeros({1, 2})}}, options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the node hook left 0 outputs, the node has 1"), std::string::npos)
        << e.what();
  }
}

TEST(Run, SetsMlxBufferCacheOnTheCpuWhenItChanges) {
  Model model = dense_relu();
  const Inputs in = {{"x", mx::ones({1, 2})}};
  const size_t before = mx::set_cache_limit(size_t{5} << 20);
  run(model, model.params(), in, {.device = mx::Device::cpu, .cpu_buffer_cache = size_t{64} << 20});
  EXPECT_EQ(mx::set_cache_limit(size_t{256} << 20), size_t{64} << 20) << "set to the requested limit";
  run(model, model.params(), in, {.device = mx::Device::cpu, .cpu_buffer_cache = size_t{64} << 20});
  EXPECT_EQ(mx::set_cache_limit(size_t{7} << 20), size_t{256} << 20)
      << "unchanged since the last run: the caller's limit stays";
  CompileOptions options;
  options.device = mx::Device::cpu;
  options.cpu_buffer_cache = size_t{48} << 20;
  CompiledModel compiled = compile(model, {}, options);
  compiled(in);
  EXPECT_EQ(mx::set_cache_limit(size_t{9} << 20), size_t{48} << 20) << "compiled plans set it too";
  run(model, model.params(), in, {.device = mx::Device::cpu});
  const size_t unset = mx::set_cache_limit(before);
  if (mx::is_available(mx::Device::gpu)) {
    EXPECT_EQ(unset, size_t{9} << 20) << "unset leaves a GPU build's cache alone";
  } else {
    EXPECT_EQ(unset, 0u) << "unset turns a CPU-only build's cache off";
  }
}

// x times 40 different scalars, summed in a chain: every product is a fresh
// 4 MiB buffer, and MLX encodes many of them before the first has run.
Model fan_out_and_sum(int branches) {
  GraphBuilder g;
  g.input("x", OnnxType::kFloat, {-1});
  std::string sum;
  for (int i = 0; i < branches; ++i) {
    const std::string c = "c" + std::to_string(i), p = "p" + std::to_string(i), s = "s" + std::to_string(i);
    g.initializer(c, mx::array(1.0f + static_cast<float>(i)));
    g.node("Mul", {"x", c}, {p});
    if (sum.empty()) {
      sum = p;
      continue;
    }
    g.node("Add", {sum, p}, {s});
    sum = s;
  }
  return g.node("Identity", {sum}, {"y"}).output("y").build({.run_passes = false});
}

// MLX's peak active memory while one run of `model` is evaluated, less the
// memory active before it. The look-ahead options bound MLX's scheduler:
// by default it evaluates the outputs, not the calling thread
// (RunOptions::evaluate_cpu_outputs).
size_t peak_growth_of_one_run(const Model& model, const Inputs& in, RunOptions options, bool by_mlx = true) {
  if (by_mlx) options.evaluate_cpu_outputs = false;
  mx::synchronize();
  const size_t before = mx::get_active_memory();
  mx::reset_peak_memory();
  mx::array y = run(model, model.params(), in, options).tensor("y");
  mx::eval(y);
  mx::synchronize();
  return mx::get_peak_memory() - before;
}

TEST(Run, BoundsHowFarMlxEvaluatesAheadOnTheCpu) {
  const int branches = 40;
  Model model = fan_out_and_sum(branches);
  mx::array x = mx::ones({1 << 20});  // 4 MiB
  mx::eval(x);
  const Inputs in = {{"x", x}};
  const size_t tensor = x.nbytes(), budget = size_t{16} << 20;
  const size_t mlx_limit = mx::get_memory_limit();

  // The products and sums are Transmuter kernels (kernels/cpu/elementwise.h), which pace themselves by
  // cpu_kernel_lookahead (below): off here, so that MLX's own look-ahead shows.
  const size_t unbounded = peak_growth_of_one_run(
      model, in, {.device = mx::Device::cpu, .cpu_eval_lookahead = 0, .cpu_kernel_lookahead = 0});
  EXPECT_EQ(mx::get_memory_limit(), mlx_limit) << "0 leaves MLX's limit alone";
  const size_t bounded = peak_growth_of_one_run(
      model, in, {.device = mx::Device::cpu, .cpu_eval_lookahead = budget, .cpu_kernel_lookahead = 0});
  const size_t limit_set = mx::get_memory_limit();
  mx::set_memory_limit(mlx_limit);

  // The run started with x and the model active: the limit is that plus the
  // budget, and the evaluation stays within it but for the ops already
  // encoded when it was reached (one add and its product at a time).
  EXPECT_GE(limit_set, budget + tensor);
  EXPECT_LE(limit_set, budget + tensor + (size_t{1} << 20));
  EXPECT_LE(bounded, budget + 3 * tensor) << "unbounded: " << unbounded;
  // Without the bound MLX runs far ahead here; if it stops doing so, this
  // option has no purpose left.
  EXPECT_GE(unbounded, 2 * bounded) << "bounded: " << bounded;

  // Values are unchanged: sum of 1..40.
  Outputs out = run(model, model.params(), in, {.device = mx::Device::cpu, .cpu_eval_lookahead = budget});
  mx::set_memory_limit(mlx_limit);
  EXPECT_EQ(to_doubles(mx::slice(out.tensor("y"), {0}, {2})), (std::vector<double>{820, 820}));
}

// x normalized by `branches` LayerNormalization nodes (Transmuter's CPU
// kernel) with different scales, summed in a chain: every normalization
// allocates a fresh 4 MiB output (x has other readers, so none is donated).
Model layer_norms_summed(int branches) {
  GraphBuilder g;
  g.input("x", OnnxType::kFloat, {-1, 1024});
  g.initializer("bias", testing::evaluated(mx::zeros({1024})));
  std::string sum;
  for (int i = 0; i < branches; ++i) {
    const std::string scale = "g" + std::to_string(i), n = "n" + std::to_string(i),
                      s = "s" + std::to_string(i);
    g.initializer(scale, testing::evaluated(mx::full({1024}, 1.0f + static_cast<float>(i))));
    g.node("LayerNormalization", {"x", scale, "bias"}, {n}, {testing::int_attr("axis", -1)});
    if (sum.empty()) {
      sum = n;
      continue;
    }
    g.node("Add", {sum, n}, {s});
    sum = s;
  }
  return g.node("Identity", {sum}, {"y"}).output("y").build({.run_passes = false});
}

TEST(Run, BoundsHowFarKernelsAllocateAheadOnTheCpu) {
  const int branches = 40;
  Model model = layer_norms_summed(branches);
  // Rows 0, 1, 2, ... 1023 within each row: LayerNorm gives the same row each time.
  mx::array x = mx::broadcast_to(mx::astype(mx::arange(1024), mx::float32), {1024, 1024});
  x = mx::contiguous(x);
  mx::eval(x);
  const Inputs in = {{"x", x}};
  const size_t tensor = x.nbytes(), budget = size_t{8} << 20;
  const size_t mlx_limit = mx::get_memory_limit();
  // MLX's own bound off in both runs (cpu_eval_lookahead 0): only the kernels' bound differs.
  const size_t unbounded = peak_growth_of_one_run(
      model, in, {.device = mx::Device::cpu, .cpu_eval_lookahead = 0, .cpu_kernel_lookahead = 0});
  EXPECT_EQ(kernels::kernel_lookahead(), 0u) << "0 turns the pacing off";
  const size_t bounded = peak_growth_of_one_run(
      model, in, {.device = mx::Device::cpu, .cpu_eval_lookahead = 0, .cpu_kernel_lookahead = budget});
  EXPECT_EQ(kernels::kernel_lookahead(), budget);
  EXPECT_EQ(mx::get_memory_limit(), mlx_limit);

  // Kernel outputs in flight stay within the budget plus the one being
  // admitted; the sum being built and an add's product come on top.
  EXPECT_LE(bounded, budget + 4 * tensor) << "unbounded: " << unbounded;
  // Without the bound MLX encodes far ahead here; if it stops doing so, this
  // option has no purpose left.
  EXPECT_GE(unbounded, 2 * bounded) << "bounded: " << bounded;

  // Values are unchanged: each normalized row times (1 + i), summed over i.
  Outputs paced = run(model, model.params(), in, {.device = mx::Device::cpu, .cpu_kernel_lookahead = budget});
  Outputs free = run(model, model.params(), in, {.device = mx::Device::cpu, .cpu_kernel_lookahead = 0});
  EXPECT_TRUE(mx::array_equal(paced.tensor("y"), free.tensor("y")).item<bool>());
  const double first = to_doubles(mx::slice(paced.tensor("y"), {0, 0}, {1, 1}))[0];
  EXPECT_NEAR(first, -std::sqrt(3.0) * 820 * 1023 / std::sqrt(1024.0 * 1024 - 1), 0.05);
}

TEST(Run, KeepsSmallKernelsWithinAQuarterOfTheLookAheadBehindTwoPending) {
  // The same chain over 128 rows: 512 KiB outputs, 16 of them in the 8 MiB budget (MLX alone
  // encodes ~20 ahead). Behind two pending kernels the evaluating thread keeps within a quarter.
  Model model = layer_norms_summed(40);
  mx::array x = mx::contiguous(mx::broadcast_to(mx::astype(mx::arange(1024), mx::float32), {128, 1024}));
  mx::eval(x);
  const Inputs in = {{"x", x}};
  const size_t tensor = x.nbytes(), budget = size_t{8} << 20;
  const size_t unbounded = peak_growth_of_one_run(
      model, in, {.device = mx::Device::cpu, .cpu_eval_lookahead = 0, .cpu_kernel_lookahead = 0});
  const size_t bounded = peak_growth_of_one_run(
      model, in, {.device = mx::Device::cpu, .cpu_eval_lookahead = 0, .cpu_kernel_lookahead = budget});
  EXPECT_LE(bounded, budget / 4 + 4 * tensor) << "unbounded: " << unbounded;
  EXPECT_GE(unbounded, 2 * bounded) << "bounded: " << bounded;
  // The calling thread's evaluation runs one kernel at a time and allocates nothing ahead: the sum being
  // built, a normalization and its product (and the next normalization, whose input's other readers keep x).
  const size_t here = peak_growth_of_one_run(model, in, {.device = mx::Device::cpu}, /*by_mlx=*/false);
  EXPECT_LE(here, 4 * tensor) << "bounded: " << bounded;
}

TEST(Run, RejectsWrongDtype) {
  Model model = dense_relu();
  try {
    run(model, model.params(), {{"x", mx::zeros({1, 2}, mx::int32)}});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x': expected dtype float32, got int32"), std::string::npos) << e.what();
  }
}

TEST(Run, RejectsWrongFixedDimension) {
  Model model = dense_relu();
  EXPECT_THROW(run(model, model.params(), {{"x", mx::zeros({1, 3})}}), InputError);
  EXPECT_THROW(run(model, model.params(), {{"x", mx::zeros({2})}}), InputError);
}

TEST(Run, RejectsMissingAndUnknownInputs) {
  Model model = dense_relu();
  EXPECT_THROW(run(model, model.params(), {}), InputError);
  EXPECT_THROW(run(model, model.params(), {{"x", mx::zeros({1, 2})}, {"nope", mx::zeros({1})}}), InputError);
}

TEST(Run, MlxErrorsNameTheNode) {
  Model model = GraphBuilder()
                    .input("a", OnnxType::kFloat, {2, 3})
                    .input("b", OnnxType::kFloat, {2, 3})
                    .node("MatMul", {"a", "b"}, {"c"})
                    .output("c")
                    .build();
  try {
    Outputs out = run(model, model.params(), {{"a", mx::zeros({2, 3})}, {"b", mx::zeros({2, 3})}});
    mx::eval(out.tensor("c"));
    FAIL();
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'MatMul_0'"), std::string::npos) << e.what();
  }
}

TEST(Load, ListsEveryUnsupportedOp) {
  try {
    GraphBuilder()
        .input("x", OnnxType::kFloat, {2})
        .node("NoSuchOp", {"x"}, {"y"})
        .node("AlsoMissing", {"y"}, {"z"})
        .output("z")
        .build();
    FAIL();
  } catch (const UnsupportedError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("2 operator(s) have no implementation"), std::string::npos) << m;
    EXPECT_NE(m.find("ai.onnx NoSuchOp (opset 18)"), std::string::npos) << m;
    EXPECT_NE(m.find("ai.onnx AlsoMissing (opset 18)"), std::string::npos) << m;
  }
}

TEST(Load, MissingFileIsAModelError) {
  EXPECT_THROW(load("/nonexistent/model.onnx"), Error);
}

}  // namespace
}  // namespace transmuter
