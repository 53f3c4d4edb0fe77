// fuse_depthwise_blocks: a depthwise ConvNhwc with the 1x1 ConvNhwc before
// it (expand) and after it (project, with its shortcut) becomes one
// DepthwiseBlockNhwc; values equal the graph without the pass and the graph
// without any pass. Stages read by anything else stay separate.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "kernels/cpu/conv_nhwc.h"
#include "support/expect_error.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;
using testing::string_attr;

using testing::random_uniform;

// x [1, 3, 96, 96] -> stem Conv 3x3/2 + Relu = s [16, 48, 48];
// block 1 (MobileNetV2's inverted residual): Conv 1x1 16->64 + Clip(0, 6),
//   depthwise 3x3 + Clip(0, 6), Conv 1x1 64->16, + s  = b1;
// block 2 (stride 2): Conv 1x1 16->64 + Clip, depthwise 3x3/2 + Clip, Conv 1x1 64->24 = b2;
// block 3 (PP-LCNet's pair, no expand: MaxPool before it): depthwise 3x3 + HardSwish,
//   Conv 1x1 24->32 + HardSwish = y.
GraphBuilder mobile_cnn() {
  GraphBuilder b(17);
  b.input("x", OnnxType::kFloat, {1, 3, 96, 96})
      .initializer("Ws", random_uniform({16, 3, 3, 3}, 1, 0.5f))
      .initializer("lo", mx::array(0.0f))
      .initializer("hi", mx::array(6.0f))
      .node("Conv", {"x", "Ws"}, {"c"}, {ints_attr("pads", {1, 1, 1, 1}), ints_attr("strides", {2, 2})})
      .node("Relu", {"c"}, {"s"});
  auto block = [&](const std::string& in, const std::string& out, int64_t cin, int64_t cout, int64_t stride,
                   bool shortcut, uint64_t seed) {
    const std::string p = out + "_";
    b.initializer(p + "We", random_uniform({64, cin, 1, 1}, seed, 0.4f))
        .initializer(p + "Be", random_uniform({64}, seed + 1, 0.2f))
        .initializer(p + "Wd", random_uniform({64, 1, 3, 3}, seed + 2, 0.4f))
        .initializer(p + "Bd", random_uniform({64}, seed + 3, 0.2f))
        .initializer(p + "Wp", random_uniform({cout, 64, 1, 1}, seed + 4, 0.3f))
        .node("Conv", {in, p + "We", p + "Be"}, {p + "e"})
        .node("Clip", {p + "e", "lo", "hi"}, {p + "ec"})
        .node(
            "Conv", {p + "ec", p + "Wd", p + "Bd"}, {p + "d"},
            {ints_attr("pads", {1, 1, 1, 1}), ints_attr("strides", {stride, stride}), int_attr("group", 64)})
        .node("Clip", {p + "d", "lo", "hi"}, {p + "dc"})
        .node("Conv", {p + "dc", p + "Wp"}, {shortcut ? p + "p" : out});
    if (shortcut) b.node("Add", {p + "p", in}, {out});
  };
  block("s", "b1", 16, 16, 1, true, 10);
  block("b1", "b2", 16, 24, 2, false, 20);
  b.initializer("Wd3", random_uniform({24, 1, 3, 3}, 30, 0.4f))
      .initializer("Wp3", random_uniform({32, 24, 1, 1}, 31, 0.3f))
      .initializer("Bp3", random_uniform({32}, 32, 0.2f))
      .node("MaxPool", {"b2"}, {"m"}, {ints_attr("kernel_shape", {1, 1})})
      .node("Conv", {"m", "Wd3"}, {"d3"}, {ints_attr("pads", {1, 1, 1, 1}), int_attr("group", 24)})
      .node("HardSwish", {"d3"}, {"h3"})
      .node("Conv", {"h3", "Wp3", "Bp3"}, {"p3"})
      .node("HardSwish", {"p3"}, {"y"});
  return b.output("y");
}

mx::array run_y(const Model& model, const mx::array& x) {
  return run(model, model.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
}

float max_abs_diff(const mx::array& a, const mx::array& b) { return mx::max(mx::abs(a - b)).item<float>(); }

TEST(FuseDepthwiseBlocks, BlocksFuseWithTheSameValues) {
  GraphBuilder b = mobile_cnn();
  Model fused = b.build();
  Model unfused = b.build(testing::passes_except("fuse_depthwise_blocks"));
  Model plain = b.build({.run_passes = false});
  const auto histogram = fused.op_histogram();
  EXPECT_EQ(histogram.at("ai.transmuter.DepthwiseBlockNhwc"), 3u);
  EXPECT_EQ(histogram.at("ai.transmuter.ConvNhwc"), 1u);  // the stem
  EXPECT_EQ(unfused.op_histogram().count("ai.transmuter.DepthwiseBlockNhwc"), 0u);
  EXPECT_EQ(unfused.op_histogram().at("ai.transmuter.ConvNhwc"), 9u);
  mx::array x = random_uniform({1, 3, 96, 96}, 40, 2.0f);
  mx::array want = run_y(plain, x);
  ASSERT_EQ(want.shape(), (mx::Shape{1, 32, 24, 24}));
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.1f);  // not vacuous
  // Sums of at most 64 products per stage in other orders, values below 1: ~1e-6.
  EXPECT_LT(max_abs_diff(run_y(unfused, x), want), 2e-5f);
  EXPECT_LT(max_abs_diff(run_y(fused, x), want), 2e-5f);
}

TEST(FuseDepthwiseBlocks, StagesReadElsewhereStaySeparate) {
  // Block 1's expanded value is also a graph output, and block 2's depthwise output is read twice.
  GraphBuilder b = mobile_cnn();
  b.output("b1_ec").node("Add", {"b2_dc", "b2_dc"}, {"twice"}).output("twice");
  Model model = b.build();
  const auto histogram = model.op_histogram();
  // Block 1: depthwise + project only; block 2: expand + depthwise only; block 3 whole.
  EXPECT_EQ(histogram.at("ai.transmuter.DepthwiseBlockNhwc"), 3u);
  EXPECT_EQ(histogram.at("ai.transmuter.ConvNhwc"), 3u);  // the stem, block 1's expand, block 2's project
  Model plain = b.build({.run_passes = false});
  mx::array x = random_uniform({1, 3, 96, 96}, 41, 2.0f);
  for (const char* name : {"y", "b1_ec", "twice"}) {
    mx::array want = run(plain, plain.params(), {{"x", x}}, {mx::Device::cpu}).tensor(name);
    mx::array got = run(model, model.params(), {{"x", x}}, {mx::Device::cpu}).tensor(name);
    EXPECT_LT(max_abs_diff(got, want), 2e-5f) << name;
  }
}

TEST(FuseDepthwiseBlocks, DepthwiseBlockNhwcRefusesInconsistentArguments) {
  // x [1, 6, 6, 4] -> depthwise 3x3 (Wd) [-> project 4 -> 6 (Wp)] [+ Z].
  auto message_for = [](std::vector<std::string> inputs, std::vector<Attribute> attributes) {
    GraphBuilder b(18);
    b.input("x", OnnxType::kFloat, {1, 6, 6, 4})
        .initializer("Wd", random_uniform({3, 3, 4}, 51))
        .initializer("Wp", kernels::pack_conv_weight_nhwc(random_uniform({6, 4, 1, 1}, 52)))
        .initializer("Z", random_uniform({1, 6, 6, 6}, 53));
    attributes.push_back(ints_attr("kernel_shape", {3, 3}));
    attributes.push_back(ints_attr("pads", {1, 1, 1, 1}));
    b.domain_node("ai.transmuter", 1, "DepthwiseBlockNhwc", inputs, {"y"}, attributes).output("y");
    Model model = b.build({.run_passes = false});
    return testing::error_of<OpError>(
        [&] { run(model, model.params(), {{"x", random_uniform({1, 6, 6, 4}, 54)}}, {mx::Device::cpu}); });
  };
  const std::string no_project = message_for({"x", "", "", "Wd", "", "", "", "Z"}, {});
  EXPECT_NE(no_project.find("DepthwiseBlockNhwc"), std::string::npos) << no_project;
  EXPECT_NE(no_project.find("Z needs the project stage"), std::string::npos) << no_project;
  const std::string activation =
      message_for({"x", "", "", "Wd", "", "Wp"},
                  {int_attr("out_channels", 6), string_attr("project_activation", "Tanh")});
  EXPECT_NE(activation.find("unknown project_activation 'Tanh'"), std::string::npos) << activation;
  const std::string channels = message_for({"x", "", "", "Wd", "", "Wp"}, {int_attr("out_channels", 40)});
  EXPECT_NE(channels.find("does not match 40 output channels"), std::string::npos) << channels;
  const std::string missing = message_for({"x", "", "", "Wd", "", "Wp"}, {});
  EXPECT_NE(missing.find("out_channels"), std::string::npos) << missing;
}

}  // namespace
}  // namespace transmuter
