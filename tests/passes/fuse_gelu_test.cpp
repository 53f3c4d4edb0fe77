// fuse_gelu: the exported GELU subgraphs become one com.microsoft node and
// give the values of the unfused graph; near misses stay as they are.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/runtime.h"
#include "support/random_arrays.h"

namespace transmuter {
namespace {

// This pass alone (the GEMM packing after it would take the MatMuls too).
const LoadOptions kThisPass{.only_passes = {"fuse_gelu"}};

using testing::max_abs_diff;
using testing::random_array;

using testing::GraphBuilder;
using testing::tensor_attr;

mx::array uniform(mx::Shape shape, float low, float high, uint64_t seed) {
  return mx::random::uniform(low, high, shape, mx::float32, mx::random::key(seed));
}

// A scalar as a Constant node, as PyTorch exports it.
void constant(GraphBuilder& b, const std::string& name, float v) {
  b.node("Constant", {}, {name}, {tensor_attr("value", Value(mx::array(v)))});
}

enum class Form { kDivMulThenHalf, kMulHalfFirst, kHalfThenX, kTanhPow, kTanhCube };

// x[2,5,8] -> MatMul(W[8,16]) -> Add(bias[16]) -> GELU (in `form`) -> y, with
// `add_one` as the constant after Erf/Tanh (1 in a real GELU).
GraphBuilder gelu_graph(Form form, float add_one = 1.0f) {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {2, 5, 8})
      .initializer("W", uniform({8, 16}, -1, 1, 1))
      .initializer("bias", uniform({16}, -1, 1, 2))
      .node("MatMul", {"x", "W"}, {"mm"})
      .node("Add", {"bias", "mm"}, {"h"});
  constant(b, "one", add_one);
  constant(b, "half", 0.5f);
  if (form == Form::kTanhPow || form == Form::kTanhCube) {
    constant(b, "k", 0.044715f);
    constant(b, "c", 0.7978845608f);
    if (form == Form::kTanhPow) {
      constant(b, "three", 3.0f);
      b.node("Pow", {"h", "three"}, {"cube"});
    } else {
      b.node("Mul", {"h", "h"}, {"sq"}).node("Mul", {"h", "sq"}, {"cube"});
    }
    b.node("Mul", {"k", "cube"}, {"kc"})
        .node("Add", {"h", "kc"}, {"inner"})
        .node("Mul", {"inner", "c"}, {"scaled"})
        .node("Tanh", {"scaled"}, {"t"})
        .node("Add", {"t", "one"}, {"a"})
        .node("Mul", {"h", "a"}, {"m"})
        .node("Mul", {"m", "half"}, {"y"});
    return b.output("y");
  }
  if (form == Form::kDivMulThenHalf) {
    constant(b, "sqrt2", 1.4142135f);
    b.node("Div", {"h", "sqrt2"}, {"s"});
  } else {
    constant(b, "rsqrt2", 0.70710678f);
    b.node("Mul", {"rsqrt2", "h"}, {"s"});
  }
  b.node("Erf", {"s"}, {"e"}).node("Add", {"one", "e"}, {"a"});
  if (form == Form::kDivMulThenHalf) {
    b.node("Mul", {"h", "a"}, {"m"}).node("Mul", {"half", "m"}, {"y"});
  } else if (form == Form::kMulHalfFirst) {
    b.node("Mul", {"h", "half"}, {"hh"}).node("Mul", {"a", "hh"}, {"y"});
  } else {
    b.node("Mul", {"a", "half"}, {"m"}).node("Mul", {"m", "h"}, {"y"});
  }
  return b.output("y");
}

mx::array run_y(const Model& model, const mx::array& x) {
  return run(model, model.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
}

void expect_fused(const GraphBuilder& b, const std::string& fused_op) {
  Model fused = b.build(kThisPass);
  Model plain = b.build({.run_passes = false});
  EXPECT_EQ(fused.passes_applied(), std::vector<std::string>{"fuse_gelu"});
  auto histogram = fused.op_histogram();
  EXPECT_EQ(histogram.count("com.microsoft." + fused_op), 1u) << fused_op;
  // Only the MatMul remains beside it: the bias Add and every GELU node are gone.
  EXPECT_EQ(histogram.size(), 2u);
  EXPECT_EQ(histogram.count("Constant"), 0u);
  mx::array x = uniform({2, 5, 8}, -2, 2, 7);
  mx::array want = run_y(plain, x);
  // Kernel erf vs the unfused path's erf: both within ~4e-7 of erf, on
  // outputs up to ~8; tanh 4 ulp.
  EXPECT_LT(max_abs_diff(run_y(fused, x), want), 1e-5f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 1.0f);  // not vacuous
}

TEST(FuseGelu, ErfFormsWithTheBiasAddBecomeBiasGelu) {
  expect_fused(gelu_graph(Form::kDivMulThenHalf), "BiasGelu");
  expect_fused(gelu_graph(Form::kMulHalfFirst), "BiasGelu");
  expect_fused(gelu_graph(Form::kHalfThenX), "BiasGelu");
}

TEST(FuseGelu, TanhFormsBecomeFastGelu) {
  expect_fused(gelu_graph(Form::kTanhPow), "FastGelu");
  expect_fused(gelu_graph(Form::kTanhCube), "FastGelu");
}

TEST(FuseGelu, InputReadElsewhereKeepsTheBiasAddAndUsesGelu) {
  GraphBuilder b = gelu_graph(Form::kDivMulThenHalf);
  b.node("Relu", {"h"}, {"r"}).output("r");
  Model fused = b.build(kThisPass);
  EXPECT_EQ(fused.op_histogram().count("com.microsoft.Gelu"), 1u);
  EXPECT_EQ(fused.op_histogram().at("Add"), 1u);
  Model plain = b.build({.run_passes = false});
  mx::array x = uniform({2, 5, 8}, -2, 2, 8);
  EXPECT_LT(max_abs_diff(run_y(fused, x), run_y(plain, x)), 1e-5f);
}

TEST(FuseGelu, NearMissesStay) {
  // 1 + erf replaced by 2 + erf.
  EXPECT_TRUE(gelu_graph(Form::kDivMulThenHalf, 2.0f).build(kThisPass).passes_applied().empty());
  // Div by a computed value instead of a constant.
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {4}).input("d", OnnxType::kFloat, {1});
  constant(b, "one", 1.0f);
  constant(b, "half", 0.5f);
  b.node("Div", {"x", "d"}, {"s"})
      .node("Erf", {"s"}, {"e"})
      .node("Add", {"e", "one"}, {"a"})
      .node("Mul", {"x", "a"}, {"m"})
      .node("Mul", {"m", "half"}, {"y"})
      .output("y");
  EXPECT_TRUE(b.build(kThisPass).passes_applied().empty());
  // An intermediate value (erf) also read by another node.
  GraphBuilder c = gelu_graph(Form::kDivMulThenHalf);
  c.output("e");
  Model model = c.build(kThisPass);
  EXPECT_TRUE(model.passes_applied().empty());
  EXPECT_EQ(model.op_histogram().at("Erf"), 1u);
}

}  // namespace
}  // namespace transmuter
