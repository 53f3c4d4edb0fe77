// qdq_as_qlinear: the QDQ format's DequantizeLinear -> Conv -> QuantizeLinear and DequantizeLinear x 2 ->
// Add -> QuantizeLinear become QLinearConv and QLinearAdd (and a classifier's GlobalAveragePool and Gemm,
// QLinearGlobalAveragePool and QGemm). The rewritten graph computes exactly what the
// same network written with the integer operators (quantize_static's QOperator format) computes, and
// stays within one quantization step of the QDQ graph (which rounds once more, in float32, between the
// operators). Bias scales that are not x_scale * w_scale, int8 activations and float values read by
// more than their QuantizeLinear are left alone. Applies only where the CPU has AVX512-VNNI.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/integer_gemm.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;

mx::array random_integers(mx::Shape shape, mx::Dtype dtype, uint64_t seed, int lo, int hi) {
  return mx::astype(mx::random::randint(lo, hi, shape, mx::int32, mx::random::key(seed)), dtype);
}

// The parameters both forms share: x [1, 8, 9, 9] uint8; conv (3x3, 12 out, per-channel int8 weights, int32
// bias of scale x_scale * w_scale) -> c; a 1x1 shortcut of x (per-tensor weight) -> s; c + s -> sum.
void parameters(GraphBuilder& b, float bias_scale_factor = 1.0f) {
  const mx::array w_scale = mx::random::uniform(0.002f, 0.01f, {12}, mx::float32, mx::random::key(5));
  b.initializer("x_scale", mx::array(0.05f))
      .initializer("x_zero", mx::array(static_cast<uint8_t>(120)))
      .initializer("w", random_integers({12, 8, 3, 3}, mx::int8, 6, -100, 100))
      .initializer("w_scale", w_scale)
      .initializer("w_zero", mx::zeros({12}, mx::int8))
      .initializer("b", random_integers({12}, mx::int32, 7, -3000, 3000))
      .initializer("b_scale",
                   mx::multiply(mx::multiply(mx::array(0.05f), w_scale), mx::array(bias_scale_factor)))
      .initializer("s_w", random_integers({12, 8, 1, 1}, mx::int8, 8, -100, 100))
      .initializer("s_w_scale", mx::array(0.004f))
      .initializer("s_w_zero", mx::array(static_cast<int8_t>(0)))
      .initializer("c_scale", mx::array(0.08f))
      .initializer("c_zero", mx::array(static_cast<uint8_t>(131)))
      .initializer("sum_scale", mx::array(0.1f))
      .initializer("sum_zero", mx::array(static_cast<uint8_t>(125)));
}

GraphBuilder qdq_block(float bias_scale_factor = 1.0f) {
  GraphBuilder b(17);
  b.input("x", OnnxType::kUint8, {1, 8, 9, 9});
  parameters(b, bias_scale_factor);
  b.node("DequantizeLinear", {"x", "x_scale", "x_zero"}, {"xf"})
      .node("DequantizeLinear", {"w", "w_scale", "w_zero"}, {"wf"}, {int_attr("axis", 0)})
      .node("DequantizeLinear", {"b", "b_scale"}, {"bf"}, {int_attr("axis", 0)})
      .node("Conv", {"xf", "wf", "bf"}, {"cf"},
            {ints_attr("pads", {1, 1, 1, 1}), ints_attr("kernel_shape", {3, 3})})
      .node("QuantizeLinear", {"cf", "c_scale", "c_zero"}, {"c"})
      .node("DequantizeLinear", {"s_w", "s_w_scale", "s_w_zero"}, {"s_wf"})
      .node("Conv", {"xf", "s_wf"}, {"sf"})
      .node("QuantizeLinear", {"sf", "c_scale", "c_zero"}, {"s"})
      .node("DequantizeLinear", {"c", "c_scale", "c_zero"}, {"cd"})
      .node("DequantizeLinear", {"s", "c_scale", "c_zero"}, {"sd"})
      .node("Add", {"cd", "sd"}, {"sumf"})
      .node("QuantizeLinear", {"sumf", "sum_scale", "sum_zero"}, {"sum"})
      .output("sum");
  return b;
}

GraphBuilder qoperator_block() {
  GraphBuilder b(17);
  b.input("x", OnnxType::kUint8, {1, 8, 9, 9});
  parameters(b);
  b.node("QLinearConv", {"x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "c_scale", "c_zero", "b"}, {"c"},
         {ints_attr("pads", {1, 1, 1, 1}), ints_attr("kernel_shape", {3, 3})})
      .node("QLinearConv", {"x", "x_scale", "x_zero", "s_w", "s_w_scale", "s_w_zero", "c_scale", "c_zero"},
            {"s"})
      .domain_node("com.microsoft", 1, "QLinearAdd",
                   {"c", "c_scale", "c_zero", "s", "c_scale", "c_zero", "sum_scale", "sum_zero"}, {"sum"})
      .output("sum");
  return b;
}

TEST(QdqAsQlinear, EqualsTheIntegerOperatorsAndStaysWithinAStepOfTheQdqGraph) {
  Model rewritten = qdq_block().build();
  Model qdq = qdq_block().build({.run_passes = false});
  Model qoperator = qoperator_block().build({.run_passes = false});
  if (kernels::integer_gemm_available()) {
    EXPECT_EQ(testing::op_count(rewritten, "Conv"), 0u);
    EXPECT_EQ(testing::op_count(rewritten, "Add"), 0u);
    EXPECT_EQ(testing::op_count(rewritten, "QuantizeLinear"), 0u);
    EXPECT_EQ(testing::op_count(rewritten, "DequantizeLinear"), 0u);
    EXPECT_EQ(testing::op_count(rewritten, "ai.transmuter.QLinearConvNhwc"), 2u);
  }
  for (uint64_t seed : {1, 2, 3}) {
    const Inputs in = {{"x", Value(random_integers({1, 8, 9, 9}, mx::uint8, seed, 0, 256))}};
    mx::array integer = run(qoperator, qoperator.params(), in, {mx::Device::cpu}).tensor("sum");
    mx::array eager = run(rewritten, rewritten.params(), in, {mx::Device::cpu}).tensor("sum");
    mx::array compiled = compile(rewritten, in, {.device = mx::Device::cpu})(in).tensor("sum");
    mx::array float_between = run(qdq, qdq.params(), in, {mx::Device::cpu}).tensor("sum");
    ASSERT_EQ(eager.dtype(), mx::uint8);
    EXPECT_TRUE(mx::array_equal(eager, integer).item<bool>()) << "seed " << seed;
    EXPECT_TRUE(mx::array_equal(compiled, integer).item<bool>()) << "seed " << seed;
    const int step =
        mx::max(mx::abs(mx::subtract(mx::astype(eager, mx::int32), mx::astype(float_between, mx::int32))))
            .item<int32_t>();
    EXPECT_LE(step, 1) << "seed " << seed;
    EXPECT_GT(mx::max(mx::astype(integer, mx::int32)).item<int32_t>() -
                  mx::min(mx::astype(integer, mx::int32)).item<int32_t>(),
              20);
  }
}

// A QDQ CNN's classifier: DequantizeLinear -> GlobalAveragePool -> QuantizeLinear, then Gemm by a
// per-channel int8 weight with an int32 bias -> QuantizeLinear. The rewrite (QLinearGlobalAveragePool,
// QGemm) computes what those integer operators compute.
GraphBuilder classifier(bool qdq) {
  GraphBuilder b(17);
  const mx::array w_scale = mx::random::uniform(0.002f, 0.01f, {10}, mx::float32, mx::random::key(15));
  b.input("x", OnnxType::kUint8, {2, 16, 4, 4})
      .initializer("x_scale", mx::array(0.05f))
      .initializer("x_zero", mx::array(static_cast<uint8_t>(120)))
      .initializer("p_scale", mx::array(0.02f))
      .initializer("p_zero", mx::array(static_cast<uint8_t>(100)))
      .initializer("w", random_integers({10, 16}, mx::int8, 16, -100, 100))
      .initializer("w_scale", w_scale)
      .initializer("w_zero", mx::zeros({10}, mx::int8))
      .initializer("b", random_integers({10}, mx::int32, 17, -3000, 3000))
      .initializer("b_scale", mx::multiply(mx::array(0.02f), w_scale))
      .initializer("y_scale", mx::array(0.1f))
      .initializer("y_zero", mx::array(static_cast<uint8_t>(128)));
  if (qdq) {
    b.node("DequantizeLinear", {"x", "x_scale", "x_zero"}, {"xf"})
        .node("GlobalAveragePool", {"xf"}, {"pf"})
        .node("QuantizeLinear", {"pf", "p_scale", "p_zero"}, {"p"})
        .node("DequantizeLinear", {"p", "p_scale", "p_zero"}, {"pd"})
        .node("Flatten", {"pd"}, {"ff"})
        .node("QuantizeLinear", {"ff", "p_scale", "p_zero"}, {"f"})
        .node("DequantizeLinear", {"f", "p_scale", "p_zero"}, {"fd"})
        .node("DequantizeLinear", {"w", "w_scale", "w_zero"}, {"wf"}, {int_attr("axis", 0)})
        .node("DequantizeLinear", {"b", "b_scale"}, {"bf"}, {int_attr("axis", 0)})
        .node("Gemm", {"fd", "wf", "bf"}, {"yf"}, {int_attr("transB", 1)})
        .node("QuantizeLinear", {"yf", "y_scale", "y_zero"}, {"y"});
  } else {
    b.domain_node("com.microsoft", 1, "QLinearGlobalAveragePool",
                  {"x", "x_scale", "x_zero", "p_scale", "p_zero"}, {"p"}, {int_attr("channels_last", 0)})
        .node("Flatten", {"p"}, {"f"})
        .domain_node("com.microsoft", 1, "QGemm",
                     {"f", "p_scale", "p_zero", "w", "w_scale", "w_zero", "b", "y_scale", "y_zero"}, {"y"},
                     {int_attr("transB", 1)});
  }
  b.output("y");
  return b;
}

TEST(QdqAsQlinear, ClassifierBecomesQLinearGlobalAveragePoolAndQGemm) {
  Model rewritten = classifier(true).build();
  Model qoperator = classifier(false).build({.run_passes = false});
  if (kernels::integer_gemm_available()) {
    EXPECT_EQ(testing::op_count(rewritten, "Gemm"), 0u);
    EXPECT_EQ(testing::op_count(rewritten, "GlobalAveragePool"), 0u);
    EXPECT_EQ(testing::op_count(rewritten, "com.microsoft.QLinearGlobalAveragePool"), 1u);
    EXPECT_EQ(testing::op_count(rewritten, "ai.transmuter.QLinearConvNhwc"),
              1u);  // the QGemm, as a 1x1 convolution
  }
  for (uint64_t seed : {1, 2}) {
    const Inputs in = {{"x", Value(random_integers({2, 16, 4, 4}, mx::uint8, seed, 0, 256))}};
    mx::array want = run(qoperator, qoperator.params(), in, {mx::Device::cpu}).tensor("y");
    mx::array got = run(rewritten, rewritten.params(), in, {mx::Device::cpu}).tensor("y");
    EXPECT_TRUE(mx::array_equal(got, want).item<bool>()) << "seed " << seed;
    EXPECT_GT(mx::max(mx::astype(want, mx::int32)).item<int32_t>() -
                  mx::min(mx::astype(want, mx::int32)).item<int32_t>(),
              5);
  }
}

// A bias quantized with another scale than x_scale * w_scale is no QLinearConv bias: the Conv stays (the
// Add, whose operands are plain per-tensor DequantizeLinears, still becomes QLinearAdd).
TEST(QdqAsQlinear, LeavesConvolutionsWhoseBiasScaleIsNotTheProduct) {
  Model model = qdq_block(1.5f).build();
  EXPECT_EQ(
      testing::op_count(model, "ai.transmuter.QLinearConvNhwc") + testing::op_count(model, "QLinearConv"),
      kernels::integer_gemm_available() ? 1u : 0u);
}

}  // namespace
}  // namespace transmuter
