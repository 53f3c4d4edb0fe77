// pack_integer_matmul_weights: MatMulInteger by a constant 8-bit weight becomes ai.transmuter
// IntegerMatMul (on CPUs with the int8 kernel) with exactly the same int32 results, eager and compiled;
// products it cannot take (a computed weight, per-row zero points of A) stay as they are.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "kernels/cpu/integer_gemm.h"
#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;

constexpr int kRows = 10, kDepth = 64, kColumns = 40;

mx::array random_bytes(mx::Shape shape, mx::Dtype dtype, uint64_t seed) {
  const int lo = dtype == mx::int8 ? -128 : 0;
  return mx::astype(mx::random::randint(lo, lo + 256, shape, mx::int32, mx::random::key(seed)), dtype);
}

// x (float) -> DynamicQuantizeLinear -> MatMulInteger(xq, W, x_zero, [W_zero]) -> y (int32).
GraphBuilder dynamic_product(mx::Dtype weight_type, bool per_column_zero) {
  GraphBuilder b(17);
  b.input("x", OnnxType::kFloat, {kRows, kDepth})
      .initializer("W", random_bytes({kDepth, kColumns}, weight_type, 1))
      .node("DynamicQuantizeLinear", {"x"}, {"xq", "x_scale", "x_zero"});
  if (per_column_zero) {
    b.initializer("W_zero", random_bytes({kColumns}, weight_type, 2))
        .node("MatMulInteger", {"xq", "W", "x_zero", "W_zero"}, {"y"});
  } else {
    b.node("MatMulInteger", {"xq", "W", "x_zero"}, {"y"});
  }
  b.output("y");
  return b;
}

TEST(PackIntegerMatmulWeights, KeepsTheIntegerResults) {
  const Inputs in = {{"x", Value(testing::random_array({kRows, kDepth}, 3))}};
  for (mx::Dtype weight_type : {mx::int8, mx::uint8}) {
    for (bool per_column_zero : {false, true}) {
      Model packed = dynamic_product(weight_type, per_column_zero).build();
      Model plain = dynamic_product(weight_type, per_column_zero).build({.run_passes = false});
      if (kernels::integer_gemm_available()) {
        EXPECT_EQ(packed.op_histogram().count("ai.transmuter.IntegerMatMul"), 1u);
        EXPECT_EQ(packed.op_histogram().count("MatMulInteger"), 0u);
      }
      mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
      mx::array eager = run(packed, packed.params(), in, {mx::Device::cpu}).tensor("y");
      mx::array compiled = compile(packed, in, {.device = mx::Device::cpu})(in).tensor("y");
      EXPECT_EQ(eager.dtype(), mx::int32);
      EXPECT_TRUE(mx::array_equal(eager, want).item<bool>()) << weight_type << " " << per_column_zero;
      EXPECT_TRUE(mx::array_equal(compiled, want).item<bool>()) << weight_type << " " << per_column_zero;
      EXPECT_GT(mx::max(mx::abs(want)).item<int32_t>(), 1000);
    }
  }
}

// quantize_dynamic's epilogue: Cast(to float) -> Mul(x_scale * W_scale) -> Add(bias), fused with the
// scales' product; the same floats as the separate nodes.
TEST(PackIntegerMatmulWeights, TakesTheFloatEpilogue) {
  GraphBuilder b(17);
  b.input("x", OnnxType::kFloat, {kRows, kDepth})
      .initializer("W", random_bytes({kDepth, kColumns}, mx::int8, 6))
      .initializer("W_zero", mx::array(static_cast<int8_t>(0)))
      .initializer("W_scale", mx::array(0.02f))
      .initializer("bias", testing::random_array({kColumns}, 7))
      .node("DynamicQuantizeLinear", {"x"}, {"xq", "x_scale", "x_zero"})
      .node("MatMulInteger", {"xq", "W", "x_zero", "W_zero"}, {"acc"})
      .node("Cast", {"acc"}, {"acc_float"}, {testing::int_attr("to", 1)})
      .node("Mul", {"x_scale", "W_scale"}, {"scale"})
      .node("Mul", {"acc_float", "scale"}, {"scaled"})
      .node("Add", {"bias", "scaled"}, {"y"})
      .output("y");
  const Inputs in = {{"x", Value(testing::random_array({kRows, kDepth}, 8))}};
  Model packed = b.build();
  Model plain = b.build({.run_passes = false});
  if (kernels::integer_gemm_available()) {
    EXPECT_EQ(packed.op_histogram().count("Cast"), 0u);
    EXPECT_EQ(packed.op_histogram().count("Add"), 0u);
    EXPECT_EQ(packed.op_histogram().count("Mul"), 0u);  // the scales' product too
  }
  mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
  mx::array eager = run(packed, packed.params(), in, {mx::Device::cpu}).tensor("y");
  mx::array compiled = compile(packed, in, {.device = mx::Device::cpu})(in).tensor("y");
  EXPECT_TRUE(mx::array_equal(eager, want).item<bool>());
  EXPECT_TRUE(mx::array_equal(compiled, want).item<bool>());
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 1.0f);
}

// ORT's fusions of the pattern: com.microsoft DynamicQuantizeMatMul (a DynamicQuantizeLinear goes in
// before the product) and MatMulIntegerToFloat, per-column B scales and a bias: the same floats.
TEST(PackIntegerMatmulWeights, TakesOrtsFusedQuantizedProducts) {
  for (bool dynamic : {true, false}) {
    GraphBuilder b(17);
    b.initializer("W", random_bytes({kDepth, kColumns}, mx::uint8, 9))
        .initializer("W_zero", random_bytes({kColumns}, mx::uint8, 10))
        .initializer("W_scale", mx::random::uniform(0.01f, 0.02f, {kColumns}, mx::float32, mx::random::key(11)))
        .initializer("bias", testing::random_array({kColumns}, 12));
    Inputs in;
    if (dynamic) {
      b.input("x", OnnxType::kFloat, {kRows, kDepth})
          .domain_node("com.microsoft", 1, "DynamicQuantizeMatMul", {"x", "W", "W_scale", "W_zero", "bias"}, {"y"});
      in = {{"x", Value(testing::random_array({kRows, kDepth}, 13))}};
    } else {
      b.input("a", OnnxType::kUint8, {kRows, kDepth})
          .initializer("a_scale", mx::array(0.05f))
          .initializer("a_zero", mx::array(static_cast<uint8_t>(131)))
          .domain_node("com.microsoft", 1, "MatMulIntegerToFloat", {"a", "W", "a_scale", "W_scale", "a_zero", "W_zero", "bias"},
                       {"y"});
      in = {{"a", Value(random_bytes({kRows, kDepth}, mx::uint8, 14))}};
    }
    b.output("y");
    Model packed = b.build();
    Model plain = b.build({.run_passes = false});
    if (kernels::integer_gemm_available()) EXPECT_EQ(packed.op_histogram().count("ai.transmuter.IntegerMatMul"), 1u);
    mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
    mx::array eager = run(packed, packed.params(), in, {mx::Device::cpu}).tensor("y");
    mx::array compiled = compile(packed, in, {.device = mx::Device::cpu})(in).tensor("y");
    EXPECT_TRUE(mx::array_equal(eager, want).item<bool>()) << (dynamic ? "DynamicQuantizeMatMul" : "MatMulIntegerToFloat");
    EXPECT_TRUE(mx::array_equal(compiled, want).item<bool>()) << (dynamic ? "DynamicQuantizeMatMul" : "MatMulIntegerToFloat");
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);
  }
}

TEST(PackIntegerMatmulWeights, LeavesWhatTheKernelCannotTake) {
  // A weight computed in the graph.
  GraphBuilder computed(17);
  computed.input("a", OnnxType::kUint8, {kRows, kDepth})
      .input("w", OnnxType::kInt8, {kDepth, kColumns})
      .node("Identity", {"w"}, {"w_copy"})
      .node("MatMulInteger", {"a", "w_copy"}, {"y"})
      .output("y");
  EXPECT_EQ(pack_integer_matmul_weights(*computed.graph()), 0u);
  // A's zero point per row (a constant [M]).
  GraphBuilder per_row(17);
  per_row.input("a", OnnxType::kUint8, {kRows, kDepth})
      .initializer("W", random_bytes({kDepth, kColumns}, mx::int8, 4))
      .initializer("a_zero", random_bytes({kRows}, mx::uint8, 5))
      .node("MatMulInteger", {"a", "W", "a_zero"}, {"y"})
      .output("y");
  EXPECT_EQ(pack_integer_matmul_weights(*per_row.graph()), 0u);
}

}  // namespace
}  // namespace transmuter
