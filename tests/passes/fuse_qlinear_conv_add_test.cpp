// fuse_qlinear_conv_add: a com.microsoft QLinearAdd reading a group-1 QLinearConvNhwc's output runs inside
// the convolution's kernel with the two operators' bytes exactly, eager and compiled: a 3x3 convolution (the
// unfolded rows' path) added as A, a 1x1 one (the pointwise product's blocks, 40 channels over two panels)
// added as B, uint8 and int8 activations; a broadcast operand takes the add after the convolution; a
// convolution whose output is also read elsewhere, or is a graph output, keeps its add. Applies only where
// the CPU has AVX512-VNNI (qlinear_convs_nhwc makes the QLinearConvNhwc nodes there), so the counts are
// checked there.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/integer_gemm.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/qoperator_convs.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;
using testing::random_integers;

constexpr int kChannels = 40;

mx::array zero_point(bool is_signed, int value) {  // the uint8 value, or value - 128 as int8
  return is_signed ? mx::array(static_cast<int8_t>(value - 128)) : mx::array(static_cast<uint8_t>(value));
}

// x [1, 40, 10, 10] -> 1x1 QLinearConv "c0" (read twice: not fused) -> 3x3 QLinearConv "c1" ->
// QLinearAdd(c1, c0) = "s1" -> 1x1 QLinearConv "c2" -> QLinearAdd(residual, c2) = "s2", residual = s1, or
// (broadcast_residual) a constant [1, 40, 1, 1]. Scales and zero points differ on every operand, so that the
// ratios are not symmetric. (c0 makes the adds' operands channels-last: channels_last_convs moves the layout
// through an add of two convolutions' outputs, not through one of a graph input.)
GraphBuilder residual_blocks(bool is_signed, bool broadcast_residual, bool c1_is_output = false) {
  GraphBuilder b(13);
  b.input("x", is_signed ? OnnxType::kInt8 : OnnxType::kUint8, {1, kChannels, 10, 10})
      .initializer("x_scale", mx::array(0.05f))
      .initializer("x_zero", zero_point(is_signed, 120))
      .initializer("c_scale", mx::array(0.08f))
      .initializer("c_zero", zero_point(is_signed, 131))
      .initializer("s_scale", mx::array(0.1f))
      .initializer("s_zero", zero_point(is_signed, 125))
      .initializer("w1", random_integers({kChannels, kChannels, 3, 3}, mx::int8, 1, -64, 64))
      .initializer("w1_scale",
                   mx::random::uniform(0.001f, 0.004f, {kChannels}, mx::float32, mx::random::key(2)))
      .initializer("w1_zero", mx::zeros({kChannels}, mx::int8))
      .initializer("w2", random_integers({kChannels, kChannels, 1, 1}, mx::int8, 3, -64, 64))
      .initializer("w2_scale", mx::array(0.006f))
      .initializer("w2_zero", mx::array(static_cast<int8_t>(0)))
      .initializer("b2", random_integers({kChannels}, mx::int32, 4, -2000, 2000))
      .initializer("w0", random_integers({kChannels, kChannels, 1, 1}, mx::int8, 6, -64, 64))
      .initializer("w0_scale", mx::array(0.004f))
      .initializer("w0_zero", mx::array(static_cast<int8_t>(0)))
      .initializer("r", random_integers({1, kChannels, 1, 1}, is_signed ? mx::int8 : mx::uint8, 5, -128, 256))
      .node("QLinearConv", {"x", "x_scale", "x_zero", "w0", "w0_scale", "w0_zero", "x_scale", "x_zero"},
            {"c0"}, {ints_attr("kernel_shape", {1, 1})})
      .node("QLinearConv", {"c0", "x_scale", "x_zero", "w1", "w1_scale", "w1_zero", "c_scale", "c_zero"},
            {"c1"}, {ints_attr("pads", {1, 1, 1, 1}), ints_attr("kernel_shape", {3, 3})})
      .domain_node("com.microsoft", 1, "QLinearAdd",
                   {"c1", "c_scale", "c_zero", "c0", "x_scale", "x_zero", "s_scale", "s_zero"}, {"s1"})
      .node("QLinearConv",
            {"s1", "s_scale", "s_zero", "w2", "w2_scale", "w2_zero", "c_scale", "c_zero", "b2"}, {"c2"},
            {ints_attr("kernel_shape", {1, 1})});
  const std::string residual = broadcast_residual ? "r" : "s1";
  b.domain_node("com.microsoft", 1, "QLinearAdd",
                {residual, "s_scale", "s_zero", "c2", "c_scale", "c_zero", "x_scale", "x_zero"}, {"s2"});
  b.output("s2");
  if (c1_is_output) b.output("c1");
  return b;
}

// The bytes of s2 with the passes and without, eager and compiled, over two random inputs.
void expect_same_bytes(const GraphBuilder& b, bool is_signed) {
  Model converted = b.build();
  Model plain = b.build({.run_passes = false});
  for (uint64_t seed : {1, 2}) {
    const Inputs in = {{"x", Value(random_integers({1, kChannels, 10, 10}, is_signed ? mx::int8 : mx::uint8,
                                                   seed, -128, 256))}};
    mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("s2");
    mx::array eager = run(converted, converted.params(), in, {mx::Device::cpu}).tensor("s2");
    mx::array compiled = compile(converted, in, {.device = mx::Device::cpu})(in).tensor("s2");
    ASSERT_EQ(eager.dtype(), want.dtype());
    EXPECT_TRUE(mx::array_equal(eager, want).item<bool>()) << "seed " << seed;
    EXPECT_TRUE(mx::array_equal(compiled, want).item<bool>()) << "seed " << seed;
    mx::array wide = mx::astype(want, mx::int32);
    EXPECT_GT(mx::max(wide).item<int32_t>() - mx::min(wide).item<int32_t>(), 20)
        << "a constant output checks little";
  }
}

TEST(FuseQLinearConvAdd, AddsRunInTheConvolutionsWithTheOperatorsBytes) {
  for (bool is_signed : {false, true}) {
    SCOPED_TRACE(is_signed ? "int8 activations" : "uint8 activations");
    const GraphBuilder b = residual_blocks(is_signed, false);
    expect_same_bytes(b, is_signed);
    if (!kernels::integer_gemm_available()) continue;
    Model converted = b.build();
    EXPECT_EQ(testing::op_count(converted, "ai.transmuter.QLinearConvNhwc"), 3u);
    EXPECT_EQ(testing::op_count(converted, "com.microsoft.QLinearAdd"), 0u);
    Model unfused = b.build(testing::passes_except("fuse_qlinear_conv_add"));
    EXPECT_EQ(testing::op_count(unfused, "com.microsoft.QLinearAdd"), 2u);
  }
}

TEST(FuseQLinearConvAdd, ABroadcastOperandIsAddedAfterTheConvolution) {
  for (bool is_signed : {false, true}) {
    SCOPED_TRACE(is_signed ? "int8 activations" : "uint8 activations");
    const GraphBuilder b = residual_blocks(is_signed, true);
    expect_same_bytes(b, is_signed);
    if (kernels::integer_gemm_available())
      EXPECT_EQ(testing::op_count(b.build(), "com.microsoft.QLinearAdd"), 0u);
  }
}

TEST(FuseQLinearConvAdd, AConvolutionReadElsewhereKeepsItsAdd) {
  const GraphBuilder b = residual_blocks(false, false, true);
  expect_same_bytes(b, false);
  if (!kernels::integer_gemm_available()) return;
  Model converted = b.build();
  EXPECT_EQ(testing::op_count(converted, "com.microsoft.QLinearAdd"),
            1u);  // c1's (a graph output); c2's fused
}

}  // namespace
}  // namespace transmuter
