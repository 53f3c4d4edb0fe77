// pack_matmul_weights: MatMul/Gemm with a constant float32 weight become one
// ai.transmuter PackedMatMul (weight packed once, bias and GELU in its
// epilogue) and give the values of the unrewritten graph; near misses stay.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "kernels/cpu/gemm.h"
#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::float_attr;
using testing::GraphBuilder;
using testing::int_attr;
using testing::max_abs_diff;
using testing::random_array;
using testing::string_attr;
using testing::tensor_attr;

void constant(GraphBuilder& b, const std::string& name, float v) {
  b.node("Constant", {}, {name}, {tensor_attr("value", Value(mx::array(v)))});
}

// x[2,5,8] -> MatMul(W[8,40]) -> Add(bias[40]) -> GELU (erf form, as PyTorch
// exports it) -> y.
GraphBuilder dense_gelu() {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {2, 5, 8})
      .initializer("W", random_array({8, 40}, 1))
      .initializer("bias", random_array({40}, 2))
      .node("MatMul", {"x", "W"}, {"mm"})
      .node("Add", {"mm", "bias"}, {"h"});
  constant(b, "sqrt2", 1.4142135f);
  constant(b, "one", 1.0f);
  constant(b, "half", 0.5f);
  b.node("Div", {"h", "sqrt2"}, {"s"})
      .node("Erf", {"s"}, {"e"})
      .node("Add", {"e", "one"}, {"a"})
      .node("Mul", {"h", "a"}, {"m"})
      .node("Mul", {"m", "half"}, {"y"});
  return b.output("y");
}

mx::array run_output(const Model& model, const std::string& input, const mx::array& x, const std::string& output) {
  return run(model, model.params(), {{input, x}}, {mx::Device::cpu}).tensor(output);
}

// The rewritten and the stored graph agree within float rounding: both sum
// K <= 8 products of O(1) values in float32, a few ulps of outputs up to ~10.
void expect_same_outputs(const GraphBuilder& b, const std::string& input, const mx::array& x,
                         const std::string& output = "y") {
  Model packed = b.build();
  Model plain = b.build({.run_passes = false});
  mx::array want = run_output(plain, input, x, output);
  EXPECT_LT(max_abs_diff(run_output(packed, input, x, output), want), 1e-5f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 1.0f);  // not vacuous
}

TEST(PackMatmulWeights, MatMulBiasAndGeluBecomeOnePackedMatMul) {
  GraphBuilder b = dense_gelu();
  Model model = b.build();
  EXPECT_EQ(model.passes_applied(), (std::vector<std::string>{"fuse_gelu", "pack_matmul_weights"}));
  EXPECT_EQ(model.op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.PackedMatMul", 1}}));
  // The weight is held packed, under a new name; the stored one is gone.
  EXPECT_FALSE(model.params().contains("W"));
  ASSERT_TRUE(model.params().contains("W/packed"));
  EXPECT_EQ(model.params().at("W/packed").shape(1), 8);
  expect_same_outputs(b, "x", random_array({2, 5, 8}, 3));
}

TEST(PackMatmulWeights, OnnxGeluTanhWithoutBias) {
  GraphBuilder b(20);
  b.input("x", OnnxType::kFloat, {3, 8})
      .initializer("W", random_array({8, 20}, 4))
      .node("MatMul", {"x", "W"}, {"mm"})
      .node("Gelu", {"mm"}, {"y"}, {string_attr("approximate", "tanh")})
      .output("y");
  EXPECT_EQ(b.build().op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.PackedMatMul", 1}}));
  expect_same_outputs(b, "x", random_array({3, 8}, 5));
}

TEST(PackMatmulWeights, GemmWithTransposedWeightAndRowBias) {
  GraphBuilder b;
  b.input("a", OnnxType::kFloat, {3, 8})
      .initializer("B", random_array({40, 8}, 6))  // [N, K]: transB
      .initializer("C", random_array({1, 40}, 7))
      .node("Gemm", {"a", "B", "C"}, {"y"}, {int_attr("transB", 1)})
      .output("y");
  EXPECT_EQ(b.build().op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.PackedMatMul", 1}}));
  expect_same_outputs(b, "a", random_array({3, 8}, 8));
}

TEST(PackMatmulWeights, OneWeightReadTwiceIsPackedOnce) {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {4, 8})
      .initializer("W", random_array({8, 8}, 9))
      .node("MatMul", {"x", "W"}, {"h"})
      .node("MatMul", {"h", "W"}, {"y"})
      .output("y");
  Model model = b.build();
  EXPECT_EQ(model.op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.PackedMatMul", 2}}));
  EXPECT_EQ(model.params().size(), 1u);
  expect_same_outputs(b, "x", random_array({4, 8}, 10));
}

TEST(PackMatmulWeights, AWeightAlsoReadAsTheLeftOperandStays) {
  // MatMul(W, W): W is packed for the right side and still read as the left.
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {8, 8})
      .initializer("W", random_array({8, 8}, 21))
      .node("MatMul", {"W", "W"}, {"ww"})
      .node("Add", {"ww", "x"}, {"y"})
      .output("y");
  Model model = b.build();
  EXPECT_TRUE(model.params().contains("W"));
  EXPECT_TRUE(model.params().contains("W/packed"));
  expect_same_outputs(b, "x", random_array({8, 8}, 22));
}

// Large weights misaligned in their file reach the passes uncopied
// (mlx_bridge deferred_copy): the pass packs them from their bytes in place;
// a weight that no pass takes is copied out at the end of the load.
TEST(PackMatmulWeights, WeightsStillInTheirFilePackInPlace) {
  const mx::array w = random_array({8, 8}, 31), w_t = random_array({8, 8}, 32),
                  shift = random_array({4, 8}, 33);
  auto graph = [&](bool deferred) {
    auto source = [&](const mx::array& a) { return deferred ? testing::misaligned_deferred(a) : a; };
    GraphBuilder b;
    b.input("x", OnnxType::kFloat, {4, 8})
        .initializer("W", source(w))
        .initializer("Wt", source(w_t))
        .initializer("shift", source(shift))
        .node("MatMul", {"x", "W"}, {"h"})
        .node("Add", {"h", "shift"}, {"s"})
        .node("Gemm", {"s", "Wt"}, {"y"}, {int_attr("transB", 1)})
        .output("y");
    return b;
  };
  const GraphBuilder deferred = graph(true);
  EXPECT_TRUE(deferred_bytes(deferred.graph()->initializers.at("W").tensor()).has_value());
  Model packed = deferred.build();
  EXPECT_EQ(packed.op_histogram().at("ai.transmuter.PackedMatMul"), 2u);
  for (const auto& [name, param] : packed.params()) {
    EXPECT_FALSE(deferred_bytes(param).has_value()) << name << " must be evaluated once loaded";
  }
  EXPECT_TRUE(packed.params().contains("shift"));
  const mx::array x = random_array({4, 8}, 34);
  mx::array want = run_output(graph(false).build({.run_passes = false}), "x", x, "y");
  EXPECT_LT(max_abs_diff(run_output(packed, "x", x, "y"), want), 1e-5f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 1.0f);  // not vacuous
}

TEST(PackMatmulWeights, ValuesReadElsewhereKeepTheirNodes) {
  // mm is a graph output too: the MatMul is packed, the bias Add stays.
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {4, 8})
      .initializer("W", random_array({8, 24}, 11))
      .initializer("bias", random_array({24}, 12))
      .node("MatMul", {"x", "W"}, {"mm"})
      .node("Add", {"mm", "bias"}, {"y"})
      .output("y")
      .output("mm");
  EXPECT_EQ(b.build().op_histogram(),
            (std::map<std::string, size_t>{{"Add", 1}, {"ai.transmuter.PackedMatMul", 1}}));
  expect_same_outputs(b, "x", random_array({4, 8}, 13));
  expect_same_outputs(b, "x", random_array({4, 8}, 13), "mm");
}

TEST(PackMatmulWeights, NearMissesStay) {
  // A weight that is an input, an integer product, a scaled Gemm, a per-row
  // Gemm C, and a bias that is not [N]: no packing, or no bias fusion.
  GraphBuilder dynamic;
  dynamic.input("x", OnnxType::kFloat, {4, 8}).input("w", OnnxType::kFloat, {8, 3});
  dynamic.node("MatMul", {"x", "w"}, {"y"}).output("y");
  EXPECT_TRUE(dynamic.build().passes_applied().empty());

  GraphBuilder integer;
  integer.input("x", OnnxType::kInt32, {4, 8}).initializer("W", mx::ones({8, 3}, mx::int32));
  integer.node("MatMul", {"x", "W"}, {"y"}).output("y");
  EXPECT_TRUE(integer.build().passes_applied().empty());

  GraphBuilder scaled;
  scaled.input("a", OnnxType::kFloat, {3, 8}).initializer("B", random_array({8, 5}, 14));
  scaled.node("Gemm", {"a", "B"}, {"y"}, {float_attr("alpha", 2.0f)}).output("y");
  EXPECT_TRUE(scaled.build().passes_applied().empty());

  GraphBuilder per_row;
  per_row.input("a", OnnxType::kFloat, {3, 8})
      .initializer("B", random_array({8, 5}, 15))
      .initializer("C", random_array({3, 5}, 16));
  per_row.node("Gemm", {"a", "B", "C"}, {"y"}).output("y");
  EXPECT_TRUE(per_row.build().passes_applied().empty());

  GraphBuilder row_bias;
  row_bias.input("x", OnnxType::kFloat, {4, 8})
      .initializer("W", random_array({8, 5}, 17))
      .initializer("bias", random_array({1, 5}, 18))
      .node("MatMul", {"x", "W"}, {"mm"})
      .node("Add", {"mm", "bias"}, {"y"})
      .output("y");
  EXPECT_EQ(row_bias.build().op_histogram(),
            (std::map<std::string, size_t>{{"Add", 1}, {"ai.transmuter.PackedMatMul", 1}}));
  expect_same_outputs(row_bias, "x", random_array({4, 8}, 19));
}

TEST(PackMatmulWeights, GradientsReachThePackedWeight) {
  // Fine-tuning a model loaded with the default passes: the gradient of the
  // packed weight is the stored weight's gradient in the packed layout.
  GraphBuilder b = dense_gelu();
  Model packed = b.build();
  Model plain = b.build({.run_passes = false});
  mx::array x = random_array({2, 5, 8}, 20);
  auto loss_of = [&](const Model& model, const std::string& name) {
    return [&model, name, &x](const std::vector<mx::array>& w) {
      Params params = model.params();
      params.insert_or_assign(name, w[0]);
      mx::array y = run(model, params, {{"x", x}}, {mx::Device::cpu}).tensor("y");
      return std::vector<mx::array>{mx::sum(mx::square(y))};
    };
  };
  auto [_, got] = mx::value_and_grad(loss_of(packed, "W/packed"))({packed.params().at("W/packed")});
  auto [__, want] = mx::value_and_grad(loss_of(plain, "W"))({plain.params().at("W")});
  EXPECT_LT(max_abs_diff(kernels::unpack_gemm_rhs(got[0], 40), want[0]), 1e-3f);
  EXPECT_GT(mx::max(mx::abs(want[0])).item<float>(), 1.0f);
}

TEST(PackMatmulWeights, PassesByName) {
  GraphBuilder b = dense_gelu();
  EXPECT_EQ(b.build({.only_passes = {"pack_matmul_weights"}}).op_histogram().count("ai.transmuter.PackedMatMul"),
            1u);
  EXPECT_EQ(b.build({.only_passes = {"fuse_gelu"}}).op_histogram().count("com.microsoft.BiasGelu"), 1u);
  try {
    b.build({.only_passes = {"pack_weights"}});
    FAIL() << "an unknown pass name loads";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown load-time pass 'pack_weights'"), std::string::npos) << e.what();
  }
}

// ConvNeXt's block end: MatMul -> bias -> Mul(gamma [N]) -> Add(shortcut).
// The layer scale folds into the packed weight and bias, the shortcut becomes
// the epilogue's residual; with a shortcut that broadcasts, MLX adds it.
TEST(PackMatmulWeights, LayerScaleAndShortcutJoinTheProduct) {
  for (const mx::Shape& z_shape : {mx::Shape{2, 5, 6}, mx::Shape{1, 1, 6}}) {
    GraphBuilder b;
    b.input("x", OnnxType::kFloat, {2, 5, 8})
        .input("z", OnnxType::kFloat, std::vector<int64_t>(z_shape.begin(), z_shape.end()))
        .initializer("W", random_array({8, 6}, 31))
        .initializer("bias", random_array({6}, 32))
        .initializer("gamma", random_array({6}, 33))
        .node("MatMul", {"x", "W"}, {"mm"})
        .node("Add", {"bias", "mm"}, {"h"})
        .node("Mul", {"h", "gamma"}, {"scaled"})
        .node("Add", {"z", "scaled"}, {"y"})
        .output("y");
    Model packed = b.build();
    Model plain = b.build({.run_passes = false});
    EXPECT_EQ(packed.op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.PackedMatMul", 1}}));
    Inputs in = {{"x", random_array({2, 5, 8}, 34)}, {"z", random_array(z_shape, 35)}};
    mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
    EXPECT_LT(max_abs_diff(run(packed, packed.params(), in, {mx::Device::cpu}).tensor("y"), want), 1e-5f);
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 1.0f);
  }
  // After a GELU the Mul and Add stay (the residual would go after the activation).
  GraphBuilder g = dense_gelu();
  g.initializer("gamma", random_array({40}, 36)).node("Mul", {"y", "gamma"}, {"ys"}).output("ys");
  Model model = g.build();
  EXPECT_EQ(model.op_histogram().at("Mul"), 1u);
  expect_same_outputs(g, "x", random_array({2, 5, 8}, 37), "ys");
}

// A parallel block (GPT-J, Phi, Falcon, GPT-NeoX): attn(x) + mlp(x) meet in one
// Add, which both products could take as their residual; one does, and the
// other product's packed node feeds it. (Both taking it left a node reading a
// value no node made: "input ... has no value", found by bench/coverage.)
TEST(PackMatmulWeights, TwoProductsMeetingInOneAddShareIt) {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {2, 5, 8})
      .initializer("W_attn", random_array({8, 8}, 41))
      .initializer("W_mlp", random_array({8, 8}, 42))
      .initializer("b_mlp", random_array({8}, 43))
      .node("MatMul", {"x", "W_attn"}, {"attn"})
      .node("MatMul", {"x", "W_mlp"}, {"mm"})
      .node("Add", {"mm", "b_mlp"}, {"mlp"})
      .node("Add", {"attn", "mlp"}, {"both"})
      .node("Add", {"both", "x"}, {"y"})
      .output("y");
  Model packed = b.build();
  EXPECT_EQ(packed.op_histogram(),
            (std::map<std::string, size_t>{{"Add", 1}, {"ai.transmuter.PackedMatMul", 2}}));
  expect_same_outputs(b, "x", random_array({2, 5, 8}, 44));
}

}  // namespace
}  // namespace transmuter
