// winograd_convs: channels_last_convs' 3x3 stride-1 convolutions run as
// ai.transmuter ConvWinogradNhwc with their weight transformed at load; strided,
// 1x1 and stem convolutions stay ConvNhwc; the values equal the unrewritten
// graph's and the graph's with the pass off.
#include <gtest/gtest.h>

#include <algorithm>

#include <mlx/mlx.h>

#include "kernels/cpu/gemm.h"
#include "support/expect_error.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::ints_attr;

using testing::random_uniform;

// x [2, 3, 13, 11] -> stem 3x3 (3 channels: the direct kernel) -> Relu -> 3x3 (16 -> 24) + Relu = a
// -> 3x3 stride 2 = s -> 3x3 = b -> Add s (a basic block's shortcut, fused as the conv's residual)
// -> Relu -> 1x1 = y.
// The weights are evaluated, as a model file's are: channels_last_convs then leaves the packing of
// W1 and W3 to winograd_convs (deferred_repack).
mx::array evaluated(mx::array a) {
  a.eval();
  return a;
}

GraphBuilder basic_blocks() {
  GraphBuilder b(18);
  b.input("x", OnnxType::kFloat, {2, 3, 13, 11})
      .initializer("Wstem", evaluated(random_uniform({16, 3, 3, 3}, 1, 0.5f)))
      .initializer("W1", evaluated(random_uniform({24, 16, 3, 3}, 2, 0.2f)))
      .initializer("B1", evaluated(random_uniform({24}, 3)))
      .initializer("W2", evaluated(random_uniform({24, 24, 3, 3}, 4, 0.2f)))
      .initializer("W3", evaluated(random_uniform({24, 24, 3, 3}, 5, 0.2f)))
      .initializer("B3", evaluated(random_uniform({24}, 6)))
      .initializer("W4", evaluated(random_uniform({10, 24, 1, 1}, 7, 0.3f)))
      .node("Conv", {"x", "Wstem"}, {"c0"}, {ints_attr("pads", {1, 1, 1, 1})})
      .node("Relu", {"c0"}, {"r0"})
      .node("Conv", {"r0", "W1", "B1"}, {"c1"}, {ints_attr("pads", {1, 1, 1, 1})})
      .node("Relu", {"c1"}, {"a"})
      .node("Conv", {"a", "W2"}, {"s"}, {ints_attr("pads", {1, 1, 1, 1}), ints_attr("strides", {2, 2})})
      .node("Conv", {"s", "W3", "B3"}, {"c3"}, {ints_attr("pads", {1, 1, 1, 1})})
      .node("Add", {"c3", "s"}, {"sum"})
      .node("Relu", {"sum"}, {"r3"})
      .node("Conv", {"r3", "W4"}, {"y"});
  return b.output("y");
}

mx::array run_y(const Model& model, const mx::array& x) {
  return run(model, model.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
}

float max_abs_diff(const mx::array& a, const mx::array& b) { return mx::max(mx::abs(a - b)).item<float>(); }

TEST(WinogradConvs, StrideOne3x3ConvsRunOnTransformedWeightsWithTheSameValues) {
  GraphBuilder b = basic_blocks();
  Model model = b.build();
  const auto& applied = model.passes_applied();
  EXPECT_NE(std::find(applied.begin(), applied.end(), "winograd_convs"), applied.end());
  const auto histogram = model.op_histogram();
  EXPECT_EQ(histogram.at("ai.transmuter.ConvWinogradNhwc"), 2u);  // W1 and W3
  EXPECT_EQ(histogram.at("ai.transmuter.ConvNhwc"), 3u);          // the stem, the strided conv, the 1x1
  EXPECT_EQ(histogram.count("Add"), 0u);                          // the shortcut is W3's residual
  // The packed 3x3 weights were replaced, not kept beside the transformed ones: 16 / 9 of their size.
  size_t transformed = 0;
  for (const auto& [name, param] : model.params()) {
    if (name.find("/winograd") != std::string::npos) {
      ++transformed;
      EXPECT_EQ(param.shape(0), 16) << name;
    }
    EXPECT_TRUE(name.find("W1/packed_hwc") == std::string::npos ||
                name.find("/winograd") != std::string::npos)
        << name;
  }
  EXPECT_EQ(transformed, 2u);

  mx::array x = random_uniform({2, 3, 13, 11}, 9, 2.0f);
  mx::array want = run_y(b.build({.run_passes = false}), x);
  mx::array without = run_y(b.build(testing::passes_except("winograd_convs")), x);
  mx::array got = run_y(model, x);
  ASSERT_EQ(got.shape(), (mx::Shape{2, 10, 7, 6}));
  // Outputs ~1-3; the transforms add a few float32 roundings per output (~1e-6 each).
  EXPECT_LT(max_abs_diff(got, want), 1e-5f);
  EXPECT_LT(max_abs_diff(got, without), 1e-5f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);  // not vacuous
}

TEST(WinogradConvs, TurnedOffTheConvsStayConvNhwc) {
  GraphBuilder b = basic_blocks();
  Model model = b.build(testing::passes_except("winograd_convs"));
  EXPECT_EQ(model.op_histogram().count("ai.transmuter.ConvWinogradNhwc"), 0u);
  EXPECT_EQ(model.op_histogram().at("ai.transmuter.ConvNhwc"), 5u);
  // channels_last_convs left the packing of W1 and W3 for winograd_convs (deferred_repack); with
  // that pass off the load packs them.
  for (const auto& [name, param] : model.params()) EXPECT_TRUE(param.is_available()) << name;
  mx::array x = random_uniform({2, 3, 13, 11}, 9, 2.0f);
  mx::array want = run_y(b.build({.run_passes = false}), x);
  EXPECT_LT(max_abs_diff(run_y(model, x), want), 1e-5f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);
}

// A weight two convolutions read is transformed once for both and dropped once neither reads it packed.
TEST(WinogradConvs, AWeightSharedByTwoConvsServesBoth) {
  GraphBuilder b(18);
  b.input("x", OnnxType::kFloat, {1, 8, 6, 6})
      .initializer("W", random_uniform({8, 8, 3, 3}, 11, 0.3f))
      .node("Conv", {"x", "W"}, {"c1"}, {ints_attr("pads", {1, 1, 1, 1})})
      .node("Conv", {"c1", "W"}, {"y"}, {ints_attr("pads", {1, 1, 1, 1})})
      .output("y");
  Model model = b.build();
  EXPECT_EQ(model.op_histogram().at("ai.transmuter.ConvWinogradNhwc"), 2u);
  EXPECT_EQ(model.params().size(), 1u);  // one transform serves both; the packed weight went
  mx::array x = random_uniform({1, 8, 6, 6}, 12);
  mx::array want = run_y(b.build({.run_passes = false}), x);
  EXPECT_LT(max_abs_diff(run_y(model, x), want), 1e-5f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.1f);
}

TEST(WinogradConvs, ConvWinogradNhwcRefusesInconsistentArguments) {
  auto message_for = [](std::vector<int64_t> strides, mx::array u) {
    GraphBuilder b(18);
    b.input("x", OnnxType::kFloat, {1, 6, 6, 4})
        .initializer("U", u)
        .domain_node("ai.transmuter", 1, "ConvWinogradNhwc", {"x", "U"}, {"y"},
                     {ints_attr("kernel_shape", {3, 3}), ints_attr("strides", strides),
                      testing::int_attr("out_channels", 4)})
        .output("y");
    Model model = b.build({.run_passes = false});
    return testing::error_of<OpError>(
        [&] { run(model, model.params(), {{"x", random_uniform({1, 6, 6, 4}, 22)}}, {mx::Device::cpu}); });
  };
  const int width = static_cast<int>(kernels::gemm_panel_width());
  std::string strided = message_for({2, 2}, random_uniform({16, 1, 4, width}, 21));
  EXPECT_NE(strided.find("ConvWinogradNhwc"), std::string::npos) << strided;
  EXPECT_NE(strided.find("needs kernel_shape [3, 3], strides 1"), std::string::npos) << strided;
  std::string weight = message_for({1, 1}, random_uniform({9, 1, 4, width}, 23));
  EXPECT_NE(weight.find("Winograd weight does not match 4 output channels over 4 input channels"),
            std::string::npos)
      << weight;
}

}  // namespace
}  // namespace transmuter
