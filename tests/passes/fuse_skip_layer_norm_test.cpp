// fuse_skip_layer_norm: residual + (bias) + layer/RMS norm, and the
// decomposed LayerNorm/RMSNorm of older exports, become one node each and give
// the values of the unfused graph; near misses stay.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

// This pass alone (the GEMM packing after it would take the MatMuls too).
const LoadOptions kThisPass{.only_passes = {"fuse_skip_layer_norm"}};

using testing::max_abs_diff;
using testing::random_array;

using testing::float_attr;
using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;
using testing::tensor_attr;

mx::array uniform(mx::Shape shape, float low, float high, uint64_t seed) {
  return mx::random::uniform(low, high, shape, mx::float32, mx::random::key(seed));
}

void constant(GraphBuilder& b, const std::string& name, float v) {
  b.node("Constant", {}, {name}, {tensor_attr("value", Value(mx::array(v)))});
}

constexpr int kD = 24;

// x, r: [2, 5, 24]. h = MatMul(x, W) + bias; s = h + r; y = LayerNorm(s).
// `pre_ln` also reads s (as pre-LN blocks do for the next residual).
GraphBuilder post_ln(bool pre_ln, bool rms = false) {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {2, 5, kD})
      .input("r", OnnxType::kFloat, {2, 5, kD})
      .initializer("W", uniform({kD, kD}, -0.5, 0.5, 1))
      .initializer("bias", uniform({kD}, -1, 1, 2))
      .initializer("gamma", uniform({kD}, 0.5, 1.5, 3))
      .initializer("beta", uniform({kD}, -1, 1, 4))
      .node("MatMul", {"x", "W"}, {"mm"})
      .node("Add", {"mm", "bias"}, {"h"})
      .node("Add", {"h", "r"}, {"s"});
  if (rms) {
    // Llama: Pow 2 -> ReduceMean -> Add eps -> Sqrt -> Reciprocal -> Mul -> Mul gamma
    constant(b, "two", 2.0f);
    constant(b, "eps", 1e-6f);
    b.initializer("last_axis", testing::i64({-1}))
        .node("Pow", {"s", "two"}, {"sq"})
        .node("ReduceMean", {"sq", "last_axis"}, {"ms"})  // opset 18: axes as an input
        .node("Add", {"ms", "eps"}, {"mse"})
        .node("Sqrt", {"mse"}, {"root"})
        .node("Reciprocal", {"root"}, {"inv"})
        .node("Mul", {"s", "inv"}, {"n"})
        .node("Mul", {"gamma", "n"}, {"y"});
  } else {
    b.node("LayerNormalization", {"s", "gamma", "beta"}, {"y"}, {float_attr("epsilon", 1e-12f)});
  }
  b.output("y");
  if (pre_ln) b.node("Add", {"s", "x"}, {"next"}).output("next");
  return b;
}

std::map<std::string, mx::array> run_all(const Model& model, uint64_t seed,
                                         const std::vector<std::string>& names) {
  mx::array x = uniform({2, 5, kD}, -2, 2, seed), r = uniform({2, 5, kD}, -2, 2, seed + 1);
  Outputs out = run(model, model.params(), {{"x", x}, {"r", r}}, {mx::Device::cpu});
  std::map<std::string, mx::array> values;
  for (const std::string& n : names) values.emplace(n, out.tensor(n));
  return values;
}

// One-pass statistics vs MLX's reductions: a few ulps of unit-scale outputs.
constexpr float kTolerance = 1e-5f;

void expect_same_outputs(const GraphBuilder& b, const std::vector<std::string>& names) {
  auto fused = run_all(b.build(kThisPass), 11, names);
  auto plain = run_all(b.build({.run_passes = false}), 11, names);
  for (const std::string& n : names) EXPECT_LT(max_abs_diff(fused.at(n), plain.at(n)), kTolerance) << n;
}

TEST(FuseSkipLayerNorm, PostLayerNormBecomesSkipLayerNormalizationWithBias) {
  Model model = post_ln(false).build(kThisPass);
  EXPECT_EQ(model.passes_applied(), std::vector<std::string>{"fuse_skip_layer_norm"});
  auto h = model.op_histogram();
  EXPECT_EQ(h.count("com.microsoft.SkipLayerNormalization"), 1u);
  EXPECT_EQ(h.count("Add"), 0u);  // the bias and the residual Add are folded in
  EXPECT_EQ(h.count("LayerNormalization"), 0u);
  expect_same_outputs(post_ln(false), {"y"});
}

TEST(FuseSkipLayerNorm, PreLayerNormKeepsTheSumAsOutput3) {
  Model model = post_ln(true).build(kThisPass);
  EXPECT_EQ(model.op_histogram().count("com.microsoft.SkipLayerNormalization"), 1u);
  EXPECT_EQ(model.op_histogram().at("Add"), 1u);  // only the next block's residual
  expect_same_outputs(post_ln(true), {"y", "next"});
}

TEST(FuseSkipLayerNorm, DecomposedRmsNormWithResidualBecomesSkipSimplified) {
  Model model = post_ln(false, true).build(kThisPass);
  auto h = model.op_histogram();
  EXPECT_EQ(h.count("com.microsoft.SkipSimplifiedLayerNormalization"), 1u);
  EXPECT_EQ(h.size(), 2u);  // and the MatMul
  expect_same_outputs(post_ln(false, true), {"y"});
}

// transformers' LlamaRMSNorm as exported: Cast(to float) around the normalization; on float32 both
// Casts are identities, and the second one joins the fused node. The weight comes through an Identity,
// as PyTorch's exporter shares equal initializers (fresh norms are all ones).
TEST(FuseSkipLayerNorm, DecomposedRmsNormWithTransformersCastsIsFused) {
  GraphBuilder b;
  constant(b, "two", 2.0f);
  constant(b, "eps", 1e-6f);
  constant(b, "one", 1.0f);
  b.input("x", OnnxType::kFloat, {2, 5, kD})
      .input("r", OnnxType::kFloat, {2, 5, kD})
      .initializer("gamma", uniform({kD}, 0.5, 1.5, 3))
      .initializer("last_axis", testing::i64({-1}))
      .node("Cast", {"x"}, {"xf"}, {int_attr("to", 1)})
      .node("Pow", {"xf", "two"}, {"sq"})
      .node("ReduceMean", {"sq", "last_axis"}, {"ms"})
      .node("Add", {"ms", "eps"}, {"mse"})
      .node("Sqrt", {"mse"}, {"root"})
      .node("Div", {"one", "root"}, {"inv"})
      .node("Mul", {"xf", "inv"}, {"n"})
      .node("Cast", {"n"}, {"nc"}, {int_attr("to", 1)})
      .node("Identity", {"gamma"}, {"shared_gamma"})
      .node("Mul", {"shared_gamma", "nc"}, {"y"})
      .output("y");
  auto h = b.build(kThisPass).op_histogram();
  EXPECT_EQ(h.count("com.microsoft.SimplifiedLayerNormalization"), 1u);
  EXPECT_EQ(h.at("Cast"), 1u);  // the first one stays
  EXPECT_EQ(h.size(), 3u);      // and the Identity
  expect_same_outputs(b, {"y"});
}

// The LayerNorm of BERT exports before opset 17, on a graph input (no residual).
GraphBuilder decomposed_layer_norm(bool reciprocal, int64_t axis = -1) {
  GraphBuilder b(13);
  b.input("x", OnnxType::kFloat, {2, 5, kD})
      .input("r", OnnxType::kFloat, {2, 5, kD})
      .initializer("gamma", uniform({kD}, 0.5, 1.5, 3))
      .initializer("beta", uniform({kD}, -1, 1, 4));
  constant(b, "two", 2.0f);
  constant(b, "eps", 1e-5f);
  b.node("ReduceMean", {"x"}, {"mean"}, {ints_attr("axes", {axis})})
      .node("Sub", {"x", "mean"}, {"d"})
      .node("Pow", {"d", "two"}, {"sq"})
      .node("ReduceMean", {"sq"}, {"var"}, {ints_attr("axes", {axis})})
      .node("Add", {"var", "eps"}, {"ve"})
      .node("Sqrt", {"ve"}, {"sd"});
  if (reciprocal) {
    constant(b, "one", 1.0f);
    b.node("Div", {"one", "sd"}, {"inv"}).node("Mul", {"d", "inv"}, {"n"});
  } else {
    b.node("Div", {"d", "sd"}, {"n"});
  }
  b.node("Mul", {"n", "gamma"}, {"g"}).node("Add", {"g", "beta"}, {"y"}).output("y");
  return b;
}

TEST(FuseSkipLayerNorm, DecomposedLayerNormBecomesLayerNormalization) {
  for (bool reciprocal : {false, true}) {
    Model model = decomposed_layer_norm(reciprocal).build(kThisPass);
    auto h = model.op_histogram();
    EXPECT_EQ(h.count("LayerNormalization"), 1u);
    EXPECT_EQ(h.size(), 1u) << "every node of the decomposition is gone";
    expect_same_outputs(decomposed_layer_norm(reciprocal), {"y"});
  }
}

TEST(FuseSkipLayerNorm, NearMissesStay) {
  // Normalization over axis 1, not the last one.
  EXPECT_TRUE(decomposed_layer_norm(false, 1).build(kThisPass).passes_applied().empty());
  // LayerNormalization over the last two axes (axis 1 of rank 3).
  GraphBuilder b;
  b.input("a", OnnxType::kFloat, {2, 3, 4})
      .input("c", OnnxType::kFloat, {2, 3, 4})
      .initializer("gamma", uniform({3, 4}, 0.5, 1.5, 3))
      .node("Add", {"a", "c"}, {"s"})
      .node("LayerNormalization", {"s", "gamma"}, {"y"}, {int_attr("axis", 1)})
      .output("y");
  EXPECT_TRUE(b.build(kThisPass).passes_applied().empty());
  // A residual Add whose operand is a constant: a bias, nothing to skip.
  GraphBuilder c;
  c.input("a", OnnxType::kFloat, {2, kD})
      .initializer("k", uniform({2, kD}, -1, 1, 5))
      .initializer("gamma", uniform({kD}, 0.5, 1.5, 3))
      .node("Add", {"a", "k"}, {"s"})
      .node("LayerNormalization", {"s", "gamma"}, {"y"})
      .output("y");
  EXPECT_TRUE(c.build(kThisPass).passes_applied().empty());
}

}  // namespace
}  // namespace transmuter
