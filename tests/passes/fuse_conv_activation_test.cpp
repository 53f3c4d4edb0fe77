// fuse_conv_activation: Conv -> Relu | Clip | HardSwish | LeakyRelu | Sigmoid
// becomes one com.microsoft FusedConv and gives the values of the unfused
// graph; near misses stay as they are.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

// channels_last_convs would turn the Convs this test counts into ConvNhwc.
const LoadOptions kWithoutLayout = testing::passes_except("channels_last_convs");

using testing::float_attr;
using testing::GraphBuilder;
using testing::ints_attr;
using testing::tensor_attr;

mx::array uniform(mx::Shape shape, float low, float high, uint64_t seed) {
  return mx::random::uniform(low, high, shape, mx::float32, mx::random::key(seed));
}

void constant(GraphBuilder& b, const std::string& name, float v) {
  b.node("Constant", {}, {name}, {tensor_attr("value", Value(mx::array(v)))});
}

// x[2,3,9,10] -> Conv(3x3, pads 1, W[4,3,3,3], B[4]) = c -> `activation` -> y,
// then a depthwise Conv (group 4) -> activation -> z, so that both kernels
// apply the fused activation.
GraphBuilder conv_graph(const std::string& activation, int64_t opset = 18) {
  GraphBuilder b(opset);
  b.input("x", OnnxType::kFloat, {2, 3, 9, 10})
      .initializer("W", uniform({4, 3, 3, 3}, -1, 1, 1))
      .initializer("B", uniform({4}, -1, 1, 2))
      .initializer("Wd", uniform({4, 1, 3, 3}, -1, 1, 3))
      .node("Conv", {"x", "W", "B"}, {"c"}, {ints_attr("pads", {1, 1, 1, 1})});
  auto act = [&](const std::string& in, const std::string& out) {
    if (activation == "Clip") {
      if (opset >= 11) {
        constant(b, out + "_lo", -0.5f);
        constant(b, out + "_hi", 1.5f);
        b.node("Clip", {in, out + "_lo", out + "_hi"}, {out});
      } else {
        b.node("Clip", {in}, {out}, {float_attr("min", -0.5f), float_attr("max", 1.5f)});
      }
    } else if (activation == "LeakyRelu") {
      b.node("LeakyRelu", {in}, {out}, {float_attr("alpha", 0.2f)});
    } else {
      b.node(activation, {in}, {out});
    }
  };
  act("c", "y");
  b.node("Conv", {"y", "Wd"}, {"d"}, {ints_attr("pads", {1, 1, 1, 1}), testing::int_attr("group", 4)});
  act("d", "z");
  return b.output("z");
}

mx::array run_z(const Model& model, const mx::array& x) {
  return run(model, model.params(), {{"x", x}}, {mx::Device::cpu}).tensor("z");
}

float max_abs_diff(const mx::array& a, const mx::array& b) { return mx::max(mx::abs(a - b)).item<float>(); }

TEST(FuseConvActivation, ActivationsBecomeFusedConvWithTheSameValues) {
  for (const std::string activation : {"Relu", "Clip", "HardSwish", "LeakyRelu", "Sigmoid"}) {
    for (int64_t opset : {10, 18}) {
      if (activation == "HardSwish" && opset < 14) continue;  // HardSwish exists from opset 14
      GraphBuilder b = conv_graph(activation, opset);
      Model fused = b.build(kWithoutLayout);
      Model plain = b.build({.run_passes = false});
      EXPECT_EQ(fused.passes_applied(), std::vector<std::string>{"fuse_conv_activation"}) << activation;
      auto histogram = fused.op_histogram();
      EXPECT_EQ(histogram.count("com.microsoft.FusedConv"), 1u) << activation;
      EXPECT_EQ(histogram.at("com.microsoft.FusedConv"), 2u) << activation;
      EXPECT_EQ(histogram.size(), 1u) << activation;  // Conv, the activations and Clip's Constants gone
      mx::array x = uniform({2, 3, 9, 10}, -2, 2, 7);
      mx::array want = run_z(plain, x);
      // The same products summed in another order (bias first in the kernel):
      // ~1e-6 on outputs up to ~10.
      EXPECT_LT(max_abs_diff(run_z(fused, x), want), 1e-5f) << activation << " opset " << opset;
      EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);  // not vacuous
    }
  }
}

TEST(FuseConvActivation, NearMissesStay) {
  // The Conv's output also read elsewhere (a graph output here, a Relu there).
  GraphBuilder b = conv_graph("Relu");
  b.output("c");
  Model model = b.build(kWithoutLayout);
  EXPECT_EQ(model.op_histogram().at("com.microsoft.FusedConv"), 1u);  // only the depthwise one
  EXPECT_EQ(model.op_histogram().at("Conv"), 1u);
  EXPECT_EQ(model.op_histogram().at("Relu"), 1u);

  GraphBuilder c = conv_graph("Sigmoid");
  c.node("Relu", {"d"}, {"r"}).output("r");
  Model other = c.build(kWithoutLayout);
  EXPECT_EQ(other.op_histogram().at("com.microsoft.FusedConv"), 1u);
  EXPECT_EQ(other.op_histogram().at("Sigmoid"), 1u);
  Model plain = c.build({.run_passes = false});
  mx::array x = uniform({2, 3, 9, 10}, -2, 2, 8);
  EXPECT_LT(max_abs_diff(run_z(other, x), run_z(plain, x)), 1e-5f);

  // A Clip whose bound is computed, not constant.
  GraphBuilder d;
  d.input("x", OnnxType::kFloat, {1, 2, 5, 5})
      .input("hi", OnnxType::kFloat, {})
      .initializer("W", uniform({2, 2, 1, 1}, -1, 1, 9))
      .node("Conv", {"x", "W"}, {"c"})
      .node("Clip", {"c", "", "hi"}, {"y"})
      .output("y");
  EXPECT_TRUE(d.build(kWithoutLayout).passes_applied().empty());

  // An activation not fused (Tanh).
  EXPECT_TRUE(conv_graph("Tanh").build(kWithoutLayout).passes_applied().empty());
}

}  // namespace
}  // namespace transmuter
