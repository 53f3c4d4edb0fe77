#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "support/expect_error.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::graph_attr;
using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;
using testing::to_doubles;
using testing::to_ints;

const RunOptions kCpu{mx::Device::cpu};
CompileOptions compile_options(std::vector<std::string> static_inputs = {}) {
  return {std::move(static_inputs), 8, mx::Device::cpu};
}

// --- If ----------------------------------------------------------------------------

// y = cond ? x + 1 : x * 2; both branches read x from the outer scope.
Model if_model(int opset = 16) {
  auto then_branch = GraphBuilder(opset)
                         .initializer("one", mx::array(1.f))
                         .node("Add", {"x", "one"}, {"then_out"})
                         .output("then_out")
                         .graph();
  auto else_branch = GraphBuilder(opset)
                         .initializer("two", mx::array(2.f))
                         .node("Mul", {"x", "two"}, {"else_out"})
                         .output("else_out")
                         .graph();
  return GraphBuilder(opset)
      .input("cond", OnnxType::kBool, {})
      .input("x", OnnxType::kFloat, {3})
      .node("If", {"cond"}, {"y"},
            {graph_attr("then_branch", then_branch), graph_attr("else_branch", else_branch)})
      .output("y")
      .build();
}

Inputs if_inputs(bool cond) { return {{"cond", mx::array(cond)}, {"x", mx::array({1.f, 2.f, 3.f})}}; }

TEST(If, TakesTheBranchTheConditionNamesAndSeesOuterNames) {
  Model model = if_model();
  EXPECT_EQ(to_doubles(run(model, model.params(), if_inputs(true), kCpu).tensor("y")),
            (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(to_doubles(run(model, model.params(), if_inputs(false), kCpu).tensor("y")),
            (std::vector<double>{2, 4, 6}));
}

TEST(If, StaticConditionTakesOneBranchInsideTheCompiledSegment) {
  Model model = if_model();
  ASSERT_EQ(model.inputs_read_on_host(), std::vector<std::string>{"cond"});
  CompiledModel compiled = compile(model, {}, compile_options({"cond"}));
  EXPECT_EQ(compiled.stats().graph_breaks, 0u);
  EXPECT_EQ(compiled.stats().segments, 1u);
  EXPECT_EQ(to_doubles(compiled(if_inputs(true)).tensor("y")), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(to_doubles(compiled(if_inputs(false)).tensor("y")), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(compiled.stats().plans_built, 2u);  // the condition's value is part of the plan key
}

TEST(If, TracedConditionIsAGraphBreak) {
  Model model = if_model();
  CompiledModel compiled = compile(model, {}, compile_options());
  EXPECT_EQ(compiled.stats().graph_breaks, 1u);
  EXPECT_EQ(to_doubles(compiled(if_inputs(true)).tensor("y")), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(to_doubles(compiled(if_inputs(false)).tensor("y")), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(compiled.stats().plans_built, 1u);  // one plan serves both conditions
}

TEST(If, GradientsFlowThroughTheTakenBranchCompiled) {
  Model model = if_model();
  for (bool traced_condition : {false, true}) {
    std::vector<std::string> static_inputs;
    if (!traced_condition) static_inputs.push_back("cond");
    CompiledModel compiled = compile(model, {}, compile_options(static_inputs));
    auto loss = [&](const std::vector<mx::array>& xs) {
      return mx::sum(compiled({{"cond", mx::array(false)}, {"x", xs[0]}}).tensor("y"));
    };
    auto [value, grads] = mx::value_and_grad(loss, 0)({mx::array({1.f, 2.f, 3.f})});
    EXPECT_EQ(to_doubles(grads[0]), (std::vector<double>{2, 2, 2})) << traced_condition;  // d(2x)/dx
  }
}

TEST(If, ConditionComputedFromShapesNeedsNoBreak) {
  // cond = Size(x) > 2: known while tracing, so the branch is traced in place.
  auto then_branch = GraphBuilder().node("Neg", {"x"}, {"t"}).output("t").graph();
  auto else_branch = GraphBuilder().node("Abs", {"x"}, {"e"}).output("e").graph();
  Model model = GraphBuilder()
                    .input("x", OnnxType::kFloat, {-1})
                    .initializer("two", mx::array(int64_t{2}))
                    .node("Size", {"x"}, {"n"})
                    .node("Greater", {"n", "two"}, {"cond"})
                    .node("If", {"cond"}, {"y"},
                          {graph_attr("then_branch", then_branch), graph_attr("else_branch", else_branch)})
                    .output("y")
                    .build();
  CompiledModel compiled = compile(model, {}, compile_options());
  EXPECT_EQ(to_doubles(compiled({{"x", mx::array({1.f, -2.f, 3.f})}}).tensor("y")),
            (std::vector<double>{-1, 2, -3}));
  EXPECT_EQ(to_doubles(compiled({{"x", mx::array({1.f, -2.f})}}).tensor("y")), (std::vector<double>{1, 2}));
  EXPECT_EQ(compiled.stats().graph_breaks, 0u);
}

TEST(If, BranchWithAGraphBreakMakesTheIfOne) {
  // A data-dependent NonZero inside the branch cannot be traced in place.
  auto then_branch = GraphBuilder().node("NonZero", {"x"}, {"t"}).output("t").graph();
  auto else_branch = GraphBuilder().node("NonZero", {"x"}, {"e"}).output("e").graph();
  Model model = GraphBuilder()
                    .input("cond", OnnxType::kBool, {})
                    .input("x", OnnxType::kFloat, {4})
                    .node("If", {"cond"}, {"y"},
                          {graph_attr("then_branch", then_branch), graph_attr("else_branch", else_branch)})
                    .output("y")
                    .build();
  CompiledModel compiled = compile(model, {}, compile_options({"cond"}));
  EXPECT_EQ(compiled.stats().graph_breaks, 1u);
  Outputs out = compiled({{"cond", mx::array(true)}, {"x", mx::array({0.f, 1.f, 0.f, 2.f})}});
  EXPECT_EQ(to_ints(out.tensor("y")), (std::vector<int64_t>{1, 3}));
}

TEST(If, ConditionWithTwoValuesIsAnOpErrorNamingTheNode) {
  auto branch = GraphBuilder().node("Not", {"cond"}, {"t"}).output("t").graph();
  Model model = GraphBuilder()
                    .input("cond", OnnxType::kBool, {2})
                    .node("If", {"cond"}, {"y"},
                          {graph_attr("then_branch", branch), graph_attr("else_branch", branch)})
                    .output("y")
                    .build();
  std::string message = error_of<OpError>(
      [&] { run(model, model.params(), {{"cond", mx::array({true, false})}}, kCpu); });
  EXPECT_NE(message.find("[If v16] node 'If_0': cond must hold one value"), std::string::npos) << message;
}

TEST(If, BranchOutputCountMustMatchTheNode) {
  auto one_output = GraphBuilder().node("Neg", {"x"}, {"t"}).output("t").graph();
  Model model = GraphBuilder()
                    .input("cond", OnnxType::kBool, {})
                    .input("x", OnnxType::kFloat, {1})
                    .node("If", {"cond"}, {"y", "z"},
                          {graph_attr("then_branch", one_output), graph_attr("else_branch", one_output)})
                    .output("y")
                    .build();
  Inputs inputs{{"cond", mx::array(true)}, {"x", mx::array({1.f})}};
  EXPECT_THROW(run(model, model.params(), inputs, kCpu), OpError);
}

// --- Loop ----------------------------------------------------------------------------

// Body: (i, cond, acc) -> (acc + step <= limit, acc + step, acc + step * i)
// with `step` and `limit` captured from the outer scope: the condition is
// computed in the body, and each iteration appends one scan value.
std::shared_ptr<Graph> accumulate_body() {
  return GraphBuilder(16)
      .input("i", OnnxType::kInt64, {})
      .input("cond_in", OnnxType::kBool, {})
      .input("acc", OnnxType::kFloat, {})
      .node("Add", {"acc", "step"}, {"next"})
      .node("LessOrEqual", {"next", "limit"}, {"cond_out"})
      .node("Cast", {"i"}, {"fi"}, {int_attr("to", static_cast<int64_t>(OnnxType::kFloat))})
      .node("Mul", {"step", "fi"}, {"scaled"})
      .node("Add", {"acc", "scaled"}, {"scan"})
      .output("cond_out")
      .output("next")
      .output("scan")
      .graph();
}

Model loop_model(bool with_trip_count) {
  GraphBuilder b(16);
  b.input("acc0", OnnxType::kFloat, {})
      .input("step", OnnxType::kFloat, {})
      .input("limit", OnnxType::kFloat, {});
  if (with_trip_count) b.input("M", OnnxType::kInt64, {});
  return b.initializer("true", mx::array(true))
      .node("Loop", {with_trip_count ? "M" : "", with_trip_count ? "true" : "", "acc0"}, {"acc", "scans"},
            {graph_attr("body", accumulate_body())})
      .output("acc")
      .output("scans")
      .build();
}

Inputs loop_inputs(float limit) {
  return {{"acc0", mx::array(0.f)}, {"step", mx::array(1.5f)}, {"limit", mx::array(limit)}};
}

TEST(Loop, ConditionFromTheBodyEndsALoopWithoutTripCountOrInitialCondition) {
  Model model = loop_model(false);
  Outputs out = run(model, model.params(), loop_inputs(5.f), kCpu);
  // acc: 1.5, 3, 4.5, 6 (6 > 5 stops after that iteration).
  EXPECT_EQ(to_doubles(out.tensor("acc")), (std::vector<double>{6}));
  EXPECT_EQ(to_doubles(out.tensor("scans")), (std::vector<double>{0, 3, 6, 9}));
}

TEST(Loop, TripCountLimitsTheIterations) {
  Model model = loop_model(true);
  Inputs inputs = loop_inputs(100.f);
  inputs["M"] = mx::array(int64_t{2});
  Outputs out = run(model, model.params(), inputs, kCpu);
  EXPECT_EQ(to_doubles(out.tensor("acc")), (std::vector<double>{3}));
  EXPECT_EQ(out.tensor("scans").shape(), (mx::Shape{2}));
}

TEST(Loop, ZeroIterationsKeepTheInitialValuesAndGiveEmptyScans) {
  Model model = loop_model(true);
  Inputs inputs = loop_inputs(100.f);
  inputs["M"] = mx::array(int64_t{0});
  Outputs out = run(model, model.params(), inputs, kCpu);
  EXPECT_EQ(to_doubles(out.tensor("acc")), (std::vector<double>{0}));
  EXPECT_EQ(out.tensor("scans").shape(), (mx::Shape{0}));
  EXPECT_EQ(out.tensor("scans").dtype(), mx::float32);  // the per-iteration value was a float scalar
}

TEST(Loop, RunsPerIterationAsAGraphBreakUnderCompile) {
  Model model = loop_model(false);
  CompiledModel compiled = compile(model, {}, compile_options());
  EXPECT_EQ(compiled.stats().graph_breaks, 1u);
  Outputs eager = run(model, model.params(), loop_inputs(5.f), kCpu);
  Outputs out = compiled(loop_inputs(5.f));
  EXPECT_EQ(to_doubles(out.tensor("scans")), to_doubles(eager.tensor("scans")));
  // Another limit runs another number of iterations with the same plan.
  EXPECT_EQ(to_doubles(compiled(loop_inputs(2.f)).tensor("acc")), (std::vector<double>{3}));
  EXPECT_EQ(compiled.stats().plans_built, 1u);
}

TEST(Loop, BodyInputCountMismatchIsAnOpError) {
  auto body = GraphBuilder(16)
                  .input("i", OnnxType::kInt64, {})
                  .input("cond_in", OnnxType::kBool, {})
                  .node("Identity", {"cond_in"}, {"cond_out"})
                  .output("cond_out")
                  .graph();
  Model model = GraphBuilder(16)
                    .input("x", OnnxType::kFloat, {})
                    .initializer("M", mx::array(int64_t{1}))
                    .node("Loop", {"M", "", "x"}, {"y"}, {graph_attr("body", body)})
                    .output("y")
                    .build();
  std::string message = error_of<OpError>([&] { run(model, model.params(), {{"x", mx::array(1.f)}}, kCpu); });
  EXPECT_NE(message.find("node 'Loop_0': body takes 2 inputs, expected 3"), std::string::npos) << message;
}

// --- Scan ----------------------------------------------------------------------------

// Body: (sum, row) -> (sum + row, sum + row): a running sum of rows.
std::shared_ptr<Graph> running_sum_body() {
  return GraphBuilder(16)
      .input("sum_in", OnnxType::kFloat, {2})
      .input("row", OnnxType::kFloat, {2})
      .node("Add", {"sum_in", "row"}, {"sum_out"})
      .node("Identity", {"sum_out"}, {"scan_out"})
      .output("sum_out")
      .output("scan_out")
      .graph();
}

// x is [2, 3] scanned along axis 1 (columns), in reverse; the scan output is
// stacked along axis 1 as well.
Model scan_model(int64_t input_direction, int64_t output_direction) {
  return GraphBuilder(16)
      .input("init", OnnxType::kFloat, {2})
      .input("x", OnnxType::kFloat, {2, 3})
      .node("Scan", {"init", "x"}, {"final", "scanned"},
            {graph_attr("body", running_sum_body()), int_attr("num_scan_inputs", 1),
             ints_attr("scan_input_axes", {1}), ints_attr("scan_input_directions", {input_direction}),
             ints_attr("scan_output_axes", {-1}), ints_attr("scan_output_directions", {output_direction})})
      .output("final")
      .output("scanned")
      .build();
}

Inputs scan_inputs() {
  return {{"init", mx::array({0.f, 0.f})}, {"x", mx::array({1.f, 2.f, 3.f, 10.f, 20.f, 30.f}, {2, 3})}};
}

TEST(Scan, ReverseInputAxisOneAndNegativeOutputAxis) {
  Model model = scan_model(1, 0);
  Outputs out = run(model, model.params(), scan_inputs(), kCpu);
  EXPECT_EQ(to_doubles(out.tensor("final")), (std::vector<double>{6, 60}));
  // Columns visited 3, 2, 1: running sums 3, 5, 6 (and 30, 50, 60).
  EXPECT_EQ(out.tensor("scanned").shape(), (mx::Shape{2, 3}));
  EXPECT_EQ(to_doubles(out.tensor("scanned")), (std::vector<double>{3, 5, 6, 30, 50, 60}));
}

TEST(Scan, ReverseOutputIsWrittenFromTheEnd) {
  Model model = scan_model(0, 1);
  Outputs out = run(model, model.params(), scan_inputs(), kCpu);
  EXPECT_EQ(to_doubles(out.tensor("scanned")), (std::vector<double>{6, 3, 1, 60, 30, 10}));
}

TEST(Scan, UnrollsInsideACompiledSegment) {
  Model model = scan_model(1, 1);
  CompiledModel compiled = compile(model, {}, compile_options());
  EXPECT_EQ(compiled.stats().graph_breaks, 0u);
  Outputs eager = run(model, model.params(), scan_inputs(), kCpu);
  Outputs out = compiled(scan_inputs());
  EXPECT_EQ(to_doubles(out.tensor("scanned")), to_doubles(eager.tensor("scanned")));
  EXPECT_EQ(to_doubles(out.tensor("final")), to_doubles(eager.tensor("final")));
}

TEST(Scan, GradientsFlowThroughTheUnrolledBodyEagerAndCompiled) {
  Model model = scan_model(1, 0);
  CompiledModel compiled = compile(model, {}, compile_options());
  mx::array init = mx::array({0.f, 0.f});
  for (bool use_compiled : {false, true}) {
    auto loss = [&](const std::vector<mx::array>& xs) {
      Inputs in{{"init", init}, {"x", xs[0]}};
      Outputs out = use_compiled ? compiled(in) : run(model, model.params(), in, kCpu);
      return mx::sum(out.tensor("scanned"));
    };
    auto [value, grads] = mx::value_and_grad(loss, 0)({scan_inputs().at("x").tensor()});
    // Reverse scan: column 2 enters all three running sums, column 0 only the last.
    EXPECT_EQ(to_doubles(grads[0]), (std::vector<double>{1, 2, 3, 1, 2, 3})) << use_compiled;
  }
}

TEST(Scan, BadDirectionIsAnOpError) {
  Model model = scan_model(2, 0);
  std::string message = error_of<OpError>([&] { run(model, model.params(), scan_inputs(), kCpu); });
  EXPECT_NE(message.find("node 'Scan_0': scan_input_directions holds 2"), std::string::npos) << message;
}

TEST(Scan, ScanInputsOfDifferentLengthsAreAnOpError) {
  auto body = GraphBuilder(16)
                  .input("a", OnnxType::kFloat, {})
                  .input("b", OnnxType::kFloat, {})
                  .node("Add", {"a", "b"}, {"c"})
                  .output("c")
                  .graph();
  Model model = GraphBuilder(16)
                    .input("x", OnnxType::kFloat, {3})
                    .input("y", OnnxType::kFloat, {2})
                    .node("Scan", {"x", "y"}, {"z"},
                          {graph_attr("body", body), int_attr("num_scan_inputs", 2)})
                    .output("z")
                    .build();
  Inputs inputs{{"x", mx::array({1.f, 2.f, 3.f})}, {"y", mx::array({1.f, 2.f})}};
  EXPECT_THROW(run(model, model.params(), inputs, kCpu), OpError);
}

TEST(Scan, Opset8ScansEachBatchEntryUpToItsLength) {
  auto body = GraphBuilder(8)
                  .input("sum_in", OnnxType::kFloat, {})
                  .input("v", OnnxType::kFloat, {})
                  .node("Add", {"sum_in", "v"}, {"sum_out"})
                  .node("Identity", {"sum_out"}, {"scan_out"})
                  .output("sum_out")
                  .output("scan_out")
                  .graph();
  Model model = GraphBuilder(8)
                    .input("lens", OnnxType::kInt64, {2})
                    .input("init", OnnxType::kFloat, {2})
                    .input("x", OnnxType::kFloat, {2, 3})
                    .node("Scan", {"lens", "init", "x"}, {"final", "scanned"},
                          {graph_attr("body", body), int_attr("num_scan_inputs", 1)})
                    .output("final")
                    .output("scanned")
                    .build();
  Inputs inputs{{"lens", testing::i64({3, 2})},
                {"init", mx::array({0.f, 0.f})},
                {"x", mx::array({1.f, 2.f, 3.f, 10.f, 20.f, 30.f}, {2, 3})}};
  Outputs out = run(model, model.params(), inputs, kCpu);
  EXPECT_EQ(to_doubles(out.tensor("final")), (std::vector<double>{6, 30}));
  EXPECT_EQ(to_doubles(out.tensor("scanned")), (std::vector<double>{1, 3, 6, 10, 30, 0}));  // zero-padded
}

}  // namespace
}  // namespace transmuter
