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
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;

// The default passes without qlinear_convs_nhwc, which takes these convolutions first where the CPU has
// the integer kernels (tests/passes/qlinear_convs_nhwc_test.cpp).
LoadOptions float_convolutions() {
  LoadOptions options;
  for (const Pass& pass : default_passes()) {
    if (std::string(pass.name) != "qlinear_convs_nhwc") options.only_passes.emplace_back(pass.name);
  }
  return options;
}

mx::array random_integers(mx::Shape shape, mx::Dtype dtype, uint64_t seed, int lo = -128, int hi = 128) {
  if (dtype == mx::uint8) lo = 0, hi = 256;
  return mx::astype(mx::random::randint(lo, hi, shape, mx::int32, mx::random::key(seed)), dtype);
}

struct Layer {
  int out_channels, kernel, group, stride;
  bool per_channel, bias;
};

// x (uint8 [1, 8, 10, 10]) -> QLinearConv per layer (weights of `weight_type`) -> y.
GraphBuilder qoperator_convs(const std::vector<Layer>& layers, mx::Dtype weight_type) {
  GraphBuilder b(13);
  b.input("x", OnnxType::kUint8, {1, 8, 10, 10})
      .initializer("act_scale", mx::array(0.05f))
      .initializer("act_zero", mx::array(static_cast<uint8_t>(120)))
      .initializer("out_scale", mx::array(0.08f))
      .initializer("out_zero", mx::array(static_cast<uint8_t>(131)));
  std::string x = "x";
  int channels = 8;
  uint64_t seed = 10;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    const std::string p = "l" + std::to_string(i);
    const int per = l.per_channel ? l.out_channels : 1;
    b.initializer(p + "_w", random_integers({l.out_channels, channels / l.group, l.kernel, l.kernel},
                                            weight_type, seed++, -64, 64))
        .initializer(p + "_w_scale",
                     mx::random::uniform(0.002f, 0.01f, l.per_channel ? mx::Shape{per} : mx::Shape{},
                                         mx::float32, mx::random::key(seed++)))
        .initializer(p + "_w_zero", l.per_channel ? random_integers({per}, weight_type, seed++, -5, 5)
                                                  : random_integers({}, weight_type, seed++, -5, 5));
    std::vector<std::string> inputs = {x,
                                       "act_scale",
                                       "act_zero",
                                       p + "_w",
                                       p + "_w_scale",
                                       p + "_w_zero",
                                       i + 1 == layers.size() ? "out_scale" : "act_scale",
                                       i + 1 == layers.size() ? "out_zero" : "act_zero"};
    if (l.bias) {
      b.initializer(p + "_b", random_integers({l.out_channels}, mx::int32, seed++, -2000, 2000));
      inputs.push_back(p + "_b");
    }
    const int pad = l.kernel / 2;
    b.node("QLinearConv", inputs, {p + "_y"},
           {int_attr("group", l.group), ints_attr("strides", {l.stride, l.stride}),
            ints_attr("pads", {pad, pad, pad, pad}), ints_attr("kernel_shape", {l.kernel, l.kernel})});
    x = p + "_y";
    channels = l.out_channels;
  }
  b.output(x);
  return b;
}

TEST(QlinearConvAsConv, FloatConvolutionsGiveTheIntegerOperatorsBytes) {
  // A stem, a depthwise 3x3, a pointwise 1x1 with per-channel weights, a grouped strided conv.
  const std::vector<Layer> layers = {{16, 3, 1, 1, false, true},
                                     {16, 3, 16, 1, true, true},
                                     {24, 1, 1, 1, true, false},
                                     {24, 3, 4, 2, true, true}};
  for (mx::Dtype weight_type : {mx::int8, mx::uint8}) {
    Model converted = qoperator_convs(layers, weight_type).build(float_convolutions());
    Model plain = qoperator_convs(layers, weight_type).build({.run_passes = false});
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
  GraphBuilder b(13);
  b.input("x", OnnxType::kUint8, {1, 8, 10, 10})
      .initializer("act_scale", mx::array(0.05f))
      .initializer("act_zero", mx::array(static_cast<uint8_t>(120)))
      .initializer("conv_scale", mx::array(0.08f))
      .initializer("conv_zero", mx::array(static_cast<uint8_t>(131)))
      .initializer("sum_scale", mx::array(0.1f))
      .initializer("sum_zero", mx::array(static_cast<uint8_t>(125)))
      .initializer("pool_scale", mx::array(0.03f))
      .initializer("pool_zero", mx::array(static_cast<uint8_t>(110)))
      .initializer("w", random_integers({8, 8, 3, 3}, mx::int8, 70, -64, 64))
      .initializer("w_scale", mx::random::uniform(0.002f, 0.01f, {8}, mx::float32, mx::random::key(71)))
      .initializer("w_zero", random_integers({8}, mx::int8, 72, -5, 5))
      .initializer("s", random_integers({8, 8, 1, 1}, mx::int8, 73, -64, 64))
      .initializer("s_scale", mx::array(0.004f))
      .initializer("s_zero", mx::array(static_cast<int8_t>(0)))
      .node("QLinearConv",
            {"x", "act_scale", "act_zero", "w", "w_scale", "w_zero", "conv_scale", "conv_zero"}, {"conv"},
            {ints_attr("pads", {1, 1, 1, 1}), ints_attr("kernel_shape", {3, 3})})
      .node("QLinearConv",
            {"x", "act_scale", "act_zero", "s", "s_scale", "s_zero", "conv_scale", "conv_zero"}, {"shortcut"})
      .domain_node(
          "com.microsoft", 1, "QLinearAdd",
          {"conv", "conv_scale", "conv_zero", "shortcut", "conv_scale", "conv_zero", "sum_scale", "sum_zero"},
          {"sum"})
      .domain_node("com.microsoft", 1, "QLinearGlobalAveragePool",
                   {"sum", "sum_scale", "sum_zero", "pool_scale", "pool_zero"}, {"pooled"})
      .output("pooled");
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
