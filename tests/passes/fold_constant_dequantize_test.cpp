// fold_constant_dequantize: DequantizeLinear of a constant weight becomes a float initializer, bit-equal
// to the operator's result, so that the weight's Conv / MatMul is packed like a float model's; the
// activations' per-tensor QuantizeLinear / DequantizeLinear pairs then let the channels-last layout flow
// through them, and fuse_quantize_dequantize makes each pair one kernel, bit-equal too. Blocked scales
// are left alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;

mx::array random_integers(mx::Shape shape, mx::Dtype dtype, uint64_t seed) {
  const int lo = dtype == mx::int8 ? -128 : 0;
  return mx::astype(mx::random::randint(lo, lo + 256, shape, mx::int32, mx::random::key(seed)), dtype);
}

// x [1, 4, 9, 9] -> QuantizeLinear -> DequantizeLinear (per tensor) -> Conv(DequantizeLinear(w) per output
// channel, int8 with zero points) -> Relu -> QuantizeLinear -> DequantizeLinear -> Conv (uint8 weight, per
// tensor) -> y: quantize_static's QDQ format.
GraphBuilder qdq_convs() {
  GraphBuilder b(17);
  b.input("x", OnnxType::kFloat, {1, 4, 9, 9})
      .initializer("act_scale", mx::array(0.05f))
      .initializer("act_zero", mx::array(static_cast<uint8_t>(128)))
      .initializer("w1", random_integers({8, 4, 3, 3}, mx::int8, 1))
      .initializer("w1_scale", mx::random::uniform(0.005f, 0.02f, {8}, mx::float32, mx::random::key(2)))
      .initializer("w1_zero", random_integers({8}, mx::int8, 3))
      .initializer("w2", random_integers({8, 8, 1, 1}, mx::uint8, 4))
      .initializer("w2_scale", mx::array(0.01f))
      .initializer("w2_zero", mx::array(static_cast<uint8_t>(120)))
      .node("QuantizeLinear", {"x", "act_scale", "act_zero"}, {"xq"})
      .node("DequantizeLinear", {"xq", "act_scale", "act_zero"}, {"xd"})
      .node("DequantizeLinear", {"w1", "w1_scale", "w1_zero"}, {"w1d"}, {int_attr("axis", 0)})
      .node("Conv", {"xd", "w1d"}, {"c1"}, {ints_attr("pads", {1, 1, 1, 1})})
      .node("Relu", {"c1"}, {"r1"})
      .node("QuantizeLinear", {"r1", "act_scale", "act_zero"}, {"rq"})
      .node("DequantizeLinear", {"rq", "act_scale", "act_zero"}, {"rd"})
      .node("DequantizeLinear", {"w2", "w2_scale", "w2_zero"}, {"w2d"})
      .node("Conv", {"rd", "w2d"}, {"y"})
      .output("y");
  return b;
}

TEST(FoldConstantDequantize, WeightsBecomeInitializersWithTheSameOutputs) {
  Model folded = qdq_convs().build();
  Model plain = qdq_convs().build({.run_passes = false});
  const auto& applied = folded.passes_applied();
  ASSERT_NE(std::find(applied.begin(), applied.end(), "fold_constant_dequantize"), applied.end());
  // The two weights' DequantizeLinear are gone, the activations' two pairs are one node each.
  EXPECT_EQ(folded.op_histogram().count("DequantizeLinear"), 0u);
  EXPECT_EQ(folded.op_histogram().count("QuantizeLinear"), 0u);
  EXPECT_EQ(folded.op_histogram().at("ai.transmuter.QuantizeDequantize"), 2u);
  const Inputs in = {{"x", Value(testing::random_array({1, 4, 9, 9}, 5))}};
  mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
  mx::array eager = run(folded, folded.params(), in, {mx::Device::cpu}).tensor("y");
  mx::array compiled = compile(folded, in, {.device = mx::Device::cpu})(in).tensor("y");
  // Folding is bit-equal; the packed convolutions sum in another order than MLX's: 1e-5 of the output.
  const float tolerance = 1e-5f * std::max(1.0f, mx::max(mx::abs(want)).item<float>());
  EXPECT_LT(testing::max_abs_diff(eager, want), tolerance);
  EXPECT_LT(testing::max_abs_diff(compiled, want), tolerance);
  // Folded and fused alone (the convolutions left to MLX), the weights and activations are exactly the
  // operators'.
  for (const char* pass : {"fold_constant_dequantize", "fuse_quantize_dequantize"}) {
    Model only = qdq_convs().build({.only_passes = {pass}});
    ASSERT_EQ(only.passes_applied(), std::vector<std::string>{pass});
    mx::array exact = run(only, only.params(), in, {mx::Device::cpu}).tensor("y");
    EXPECT_TRUE(mx::array_equal(exact, want).item<bool>()) << pass;
    mx::array exact_compiled = compile(only, in, {.device = mx::Device::cpu})(in).tensor("y");
    EXPECT_TRUE(mx::array_equal(exact_compiled, want).item<bool>()) << pass << " compiled";
  }
}

TEST(FoldConstantDequantize, ChannelsLastFlowsThroughPerTensorQuantization) {
  Model folded = qdq_convs().build();
  if (folded.op_histogram().count("ai.transmuter.ConvNhwc") == 0)
    GTEST_SKIP() << "no channels-last convolutions";
  // Only the transposes at the borders of the convolutional region remain.
  EXPECT_LE(folded.op_histogram().count("Transpose") ? folded.op_histogram().at("Transpose") : 0u, 2u);
}

TEST(FoldConstantDequantize, BlockedScalesAreLeftAlone) {
  GraphBuilder b(21);
  b.input("x", OnnxType::kFloat, {2, 64})
      .initializer("w", random_integers({64, 8}, mx::int8, 6))
      .initializer("w_scale", mx::random::uniform(0.005f, 0.02f, {2, 8}, mx::float32, mx::random::key(7)))
      .node("DequantizeLinear", {"w", "w_scale"}, {"wd"}, {int_attr("axis", 0), int_attr("block_size", 32)})
      .node("MatMul", {"x", "wd"}, {"y"})
      .output("y");
  Model model = b.build();
  EXPECT_EQ(model.op_histogram().at("DequantizeLinear"), 1u);
}

}  // namespace
}  // namespace transmuter
