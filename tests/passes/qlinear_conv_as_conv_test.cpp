// qlinear_conv_as_conv: a QLinearConv with constant weights runs as DequantizeLinear -> float Conv ->
// Mul -> QuantizeLinear (then channels-last and fused into Requantize) with exactly the integer
// operator's bytes: per tensor and per channel, uint8 and int8, with bias, strides, padding, groups and
// depthwise, chained as quantize_static's QOperator format chains them; eager and compiled.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/qoperator_convs.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;
using testing::random_integers;

// The default passes without qlinear_convs_nhwc, which takes these convolutions first where the CPU has
// the integer kernels (tests/passes/qlinear_convs_nhwc_test.cpp).
LoadOptions float_convolutions() {
  LoadOptions options;
  for (const Pass& pass : default_passes()) {
    if (std::string(pass.name) != "qlinear_convs_nhwc") options.only_passes.emplace_back(pass.name);
  }
  return options;
}

TEST(QlinearConvAsConv, FloatConvolutionsGiveTheIntegerOperatorsBytes) {
  // A stem, a depthwise 3x3, a pointwise 1x1 with per-channel weights, a grouped strided conv.
  const std::vector<testing::QConvLayer> layers = {{16, 3, 1, 1, false, true},
                                                   {16, 3, 16, 1, true, true},
                                                   {24, 1, 1, 1, true, false},
                                                   {24, 3, 4, 2, true, true}};
  for (mx::Dtype weight_type : {mx::int8, mx::uint8}) {
    Model converted = testing::qoperator_convs(layers, weight_type, 8, 10).build(float_convolutions());
    Model plain = testing::qoperator_convs(layers, weight_type, 8, 10).build({.run_passes = false});
    const auto& applied = converted.passes_applied();
    ASSERT_NE(std::find(applied.begin(), applied.end(), "qlinear_conv_as_conv"), applied.end());
    EXPECT_EQ(converted.op_histogram().count("QLinearConv"), 0u);
    // Each layer's requantization returns the next layer's dequantized input (fuse_quantize_dequantize):
    // x's DequantizeLinear is the only one left.
    EXPECT_EQ(converted.op_histogram().at("DequantizeLinear"), 1u);
    for (uint64_t seed : {1, 2}) {
      const Inputs in = {{"x", Value(random_integers({1, 8, 10, 10}, mx::uint8, seed))}};
      const std::string out = "l" + std::to_string(layers.size() - 1) + "_y";
      mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor(out);
      mx::array eager = run(converted, converted.params(), in, {mx::Device::cpu}).tensor(out);
      mx::array compiled = compile(converted, in, {.device = mx::Device::cpu})(in).tensor(out);
      ASSERT_EQ(eager.dtype(), mx::uint8);
      EXPECT_TRUE(mx::array_equal(eager, want).item<bool>()) << weight_type << " seed " << seed;
      EXPECT_TRUE(mx::array_equal(compiled, want).item<bool>()) << weight_type << " seed " << seed;
      // Not a constant output: the layers keep the input's variation.
      EXPECT_GT(mx::max(mx::astype(want, mx::int32)).item<int32_t>() -
                    mx::min(mx::astype(want, mx::int32)).item<int32_t>(),
                20);
    }
  }
}

// quantize_static's QOperator block ends: a shortcut QLinearAdd of two convolutions' outputs, then
// QLinearGlobalAveragePool. Both follow the channels-last layout (channels_last_convs), so the transposes
// left are x's into each convolution and the pooled [1, 1, 1, C] back to [1, C, 1, 1] (without the move, the
// two convolutions' outputs went back to channels-first: 4); the bytes equal the unrewritten graph's.
TEST(QlinearConvAsConv, QLinearAddAndGlobalPoolStayChannelsLast) {
  const GraphBuilder b = testing::qoperator_shortcut_and_pool();
  Model converted = b.build(float_convolutions());
  Model plain = b.build({.run_passes = false});
  EXPECT_EQ(converted.op_histogram().at("Transpose"), 3u);
  for (uint64_t seed : {1, 2}) {
    const Inputs in = {{"x", Value(random_integers({1, 8, 10, 10}, mx::uint8, seed))}};
    mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("pooled");
    mx::array eager = run(converted, converted.params(), in, {mx::Device::cpu}).tensor("pooled");
    mx::array compiled = compile(converted, in, {.device = mx::Device::cpu})(in).tensor("pooled");
    ASSERT_EQ(eager.shape(), (mx::Shape{1, 8, 1, 1}));
    EXPECT_TRUE(mx::array_equal(eager, want).item<bool>()) << "seed " << seed;
    EXPECT_TRUE(mx::array_equal(compiled, want).item<bool>()) << "seed " << seed;
    EXPECT_GT(mx::max(mx::astype(want, mx::int32)).item<int32_t>() -
                  mx::min(mx::astype(want, mx::int32)).item<int32_t>(),
              2);
  }
}

TEST(QlinearConvAsConv, ComputedWeightsStayQLinearConv) {
  GraphBuilder b(13);
  b.input("x", OnnxType::kUint8, {1, 2, 4, 4})
      .input("w", OnnxType::kInt8, {2, 2, 1, 1})
      .initializer("s", mx::array(0.1f))
      .initializer("z", mx::array(static_cast<uint8_t>(128)))
      .initializer("wz", mx::array(static_cast<int8_t>(0)))
      .node("QLinearConv", {"x", "s", "z", "w", "s", "wz", "s", "z"}, {"y"})
      .output("y");
  EXPECT_EQ(b.build().op_histogram().at("QLinearConv"), 1u);
}

}  // namespace
}  // namespace transmuter
