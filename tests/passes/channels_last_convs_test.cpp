// channels_last_convs: convolutions run channels-last (ai.transmuter ConvNhwc),
// the layout flows through activations, residual adds, constant broadcasts,
// MaxPool and GlobalAveragePool, so that only the transposes at the borders
// remain; values equal the unrewritten graph's. Near misses stay NCHW.
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

// x [2, 3, 12, 14] -> Conv 3x3 -> Relu -> MaxPool 3x3/2 = p -> depthwise 3x3 ->
// HardSwish -> Conv 1x1 -> Add p (residual) -> Mul K [8, 1, 1] -> Relu ->
// GlobalAveragePool -> Flatten = y; then z = Relu(Conv 1x1 (y's Mul input m)
// + m), a shortcut with the Relu fused too.
// `deferred`: every weight as the loader gives one misaligned in its file
// (not yet copied out of it).
GraphBuilder small_cnn(int64_t opset, bool deferred = false) {
  auto weight = [&](const mx::Shape& shape, uint64_t seed) {
    return deferred ? testing::misaligned_deferred(random_uniform(shape, seed)) : random_uniform(shape, seed);
  };
  GraphBuilder b(opset);
  b.input("x", OnnxType::kFloat, {2, 3, 12, 14})
      .initializer("W1", weight({8, 3, 3, 3}, 1))
      .initializer("B1", weight({8}, 2))
      .initializer("Wd", weight({8, 1, 3, 3}, 3))
      .initializer("Bd", weight({8}, 4))
      .initializer("W2", weight({8, 8, 1, 1}, 5))
      .initializer("K", weight({8, 1, 1}, 6))
      .node("Conv", {"x", "W1", "B1"}, {"c1"}, {ints_attr("pads", {1, 1, 1, 1})})
      .node("Relu", {"c1"}, {"r1"})
      .node("MaxPool", {"r1"}, {"p"},
            {ints_attr("kernel_shape", {3, 3}), ints_attr("strides", {2, 2}), ints_attr("pads", {1, 1, 1, 1})})
      .node("Conv", {"p", "Wd", "Bd"}, {"d"}, {ints_attr("pads", {1, 1, 1, 1}), int_attr("group", 8)})
      .node("HardSwish", {"d"}, {"h"})
      .node("Conv", {"h", "W2"}, {"e"})
      .node("Add", {"e", "p"}, {"a"})
      .node("Mul", {"a", "K"}, {"m"})
      .node("Relu", {"m"}, {"r2"})
      .node("GlobalAveragePool", {"r2"}, {"g"})
      .node("Flatten", {"g"}, {"y"})
      .initializer("W3", weight({8, 8, 1, 1}, 8))
      .node("Conv", {"m", "W3"}, {"f"})
      .node("Add", {"f", "m"}, {"fm"})
      .node("Relu", {"fm"}, {"z"});
  return b.output("y").output("z");
}

mx::array run_output(const Model& model, const std::string& input, const mx::array& x, const std::string& output) {
  return run(model, model.params(), {{input, x}}, {mx::Device::cpu}).tensor(output);
}

float max_abs_diff(const mx::array& a, const mx::array& b) { return mx::max(mx::abs(a - b)).item<float>(); }

TEST(ChannelsLastConvs, ACnnRunsChannelsLastWithTheSameValues) {
  for (int64_t opset : {14, 18}) {
    GraphBuilder b = small_cnn(opset);
    Model nhwc = b.build();
    Model plain = b.build({.run_passes = false});
    const auto& applied = nhwc.passes_applied();
    EXPECT_NE(std::find(applied.begin(), applied.end(), "channels_last_convs"), applied.end());
    const auto histogram = nhwc.op_histogram();
    // Four convs: the depthwise one and the 1x1 after it run as one block (fuse_depthwise_blocks).
    EXPECT_EQ(histogram.at("ai.transmuter.ConvNhwc"), 2u) << opset;
    EXPECT_EQ(histogram.at("ai.transmuter.DepthwiseBlockNhwc"), 1u) << opset;
    EXPECT_EQ(histogram.at("Relu"), 1u) << opset;  // the one before the mean; the shortcut's is fused
    EXPECT_EQ(histogram.at("ai.transmuter.MaxPoolNhwc"), 1u) << opset;
    EXPECT_EQ(histogram.at("ai.transmuter.GlobalAveragePoolNhwc"), 1u) << opset;
    // Only the borders: back after the mean and at z. The stem (3 input
    // channels) reads x as it lies, channels-first, so x needs no transpose.
    EXPECT_EQ(histogram.at("Transpose"), 2u) << opset;
    EXPECT_EQ(histogram.count("Identity"), 0u) << opset;
    EXPECT_EQ(histogram.count("Add"), 0u) << opset;  // the shortcut runs in the 1x1 conv's epilogue
    mx::array x = random_uniform({2, 3, 12, 14}, 7) * 2.0f;
    mx::array want = run_output(plain, "x", x, "y");
    ASSERT_EQ(want.shape(), (mx::Shape{2, 8}));
    // Sums of at most 27 products in another order: ~1e-6 on values ~1.
    EXPECT_LT(max_abs_diff(run_output(nhwc, "x", x, "y"), want), 1e-5f) << opset;
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.05f);  // not vacuous
    mx::array want_z = run_output(plain, "x", x, "z");
    EXPECT_LT(max_abs_diff(run_output(nhwc, "x", x, "z"), want_z), 1e-5f) << opset;
    EXPECT_GT(mx::max(want_z).item<float>(), 0.05f);
  }
}

TEST(ChannelsLastConvs, WeightsStillInTheirFileGiveTheSameValues) {
  Model nhwc = small_cnn(18, /*deferred=*/true).build();
  Model plain = small_cnn(18).build({.run_passes = false});
  EXPECT_EQ(nhwc.op_histogram().at("ai.transmuter.ConvNhwc"), 2u);
  for (const auto& [name, param] : nhwc.params()) {
    EXPECT_FALSE(deferred_bytes(param).has_value()) << name << " must be evaluated once loaded";
  }
  mx::array x = random_uniform({2, 3, 12, 14}, 7) * 2.0f;
  for (const char* output : {"y", "z"}) {
    mx::array want = run_output(plain, "x", x, output);
    // As above: sums of at most 27 products in another order.
    EXPECT_LT(max_abs_diff(run_output(nhwc, "x", x, output), want), 1e-5f) << output;
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.05f);  // not vacuous
  }
}

// Two convolutions reading one weight share its packed copy (the file's weight goes after the passes).
TEST(ChannelsLastConvs, AWeightSharedByTwoConvsIsPackedOnce) {
  GraphBuilder b(18);
  b.input("x", OnnxType::kFloat, {1, 8, 5, 6})
      .initializer("W", random_uniform({8, 8, 1, 1}, 41))
      .node("Conv", {"x", "W"}, {"c1"})
      .node("Relu", {"c1"}, {"r1"})
      .node("Conv", {"r1", "W"}, {"y"})
      .output("y");
  Model model = b.build();
  EXPECT_EQ(model.op_histogram().at("ai.transmuter.ConvNhwc"), 2u);
  ASSERT_EQ(model.params().size(), 1u);
  EXPECT_NE(model.params().begin()->first.find("packed_hwc"), std::string::npos);
  mx::array x = random_uniform({1, 8, 5, 6}, 42);
  mx::array want = run_output(b.build({.run_passes = false}), "x", x, "y");
  // Sums of 8 products in another order: ~1e-7.
  EXPECT_LT(max_abs_diff(run_output(model, "x", x, "y"), want), 1e-5f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.1f);  // not vacuous
}

TEST(ChannelsLastConvs, TurnedOffItLeavesTheConvs) {
  Model model = small_cnn(18).build(testing::passes_except("channels_last_convs"));
  EXPECT_EQ(model.op_histogram().count("ai.transmuter.ConvNhwc"), 0u);
}

// Convolutions the pass does not take stay as they are, and the graph's
// values with them.
TEST(ChannelsLastConvs, NearMissesStay) {
  GraphBuilder b(18);
  b.input("x", OnnxType::kFloat, {1, 4, 9, 9})
      .input("Wi", OnnxType::kFloat, {4, 4, 3, 3})
      .initializer("W", random_uniform({4, 4, 3, 3}, 11))
      .initializer("Wg", random_uniform({4, 2, 3, 3}, 12))
      .node("Conv", {"x", "W"}, {"same"},
            {string_attr("auto_pad", "SAME_UPPER")})                      // pads depend on the input
      .node("Conv", {"same", "Wg"}, {"grouped"}, {int_attr("group", 2)})  // 2 channels per group
      .node("Conv", {"grouped", "Wi"}, {"y"})                             // weight not constant
      .output("y");
  Model model = b.build();
  EXPECT_EQ(model.op_histogram().at("Conv"), 3u);
  EXPECT_EQ(model.op_histogram().count("ai.transmuter.ConvNhwc"), 0u);
}

// A conv output that is also a graph output keeps its channels-first value;
// an add with an operand of unknown layout stays channels-first.
TEST(ChannelsLastConvs, ValuesReadOutsideTheRegionStayChannelsFirst) {
  GraphBuilder b(18);
  b.input("x", OnnxType::kFloat, {1, 5, 6, 7})
      .input("z", OnnxType::kFloat, {1, 6, 6, 7})
      .initializer("W", random_uniform({6, 5, 1, 1}, 21))
      .node("Conv", {"x", "W"}, {"c"})
      .node("Add", {"c", "z"}, {"a"})
      .node("Sigmoid", {"a"}, {"s"})
      .output("c")
      .output("s");
  GraphBuilder plain_b = b;
  Model nhwc = b.build();
  Model plain = plain_b.build({.run_passes = false});
  EXPECT_EQ(nhwc.op_histogram().at("ai.transmuter.ConvNhwc"), 1u);
  mx::array x = random_uniform({1, 5, 6, 7}, 22);
  mx::array z = random_uniform({1, 6, 6, 7}, 23);
  Inputs in = {{"x", x}, {"z", z}};
  Outputs got = run(nhwc, nhwc.params(), in, {mx::Device::cpu});
  Outputs want = run(plain, plain.params(), in, {mx::Device::cpu});
  for (const char* name : {"c", "s"}) {
    ASSERT_EQ(got.tensor(name).shape(), want.tensor(name).shape()) << name;
    EXPECT_LT(max_abs_diff(got.tensor(name), want.tensor(name)), 1e-5f) << name;
  }
}

// Concat along channels of channels-last values stays channels-last; along
// another axis it gets the channels-first inputs. Same values either way.
TEST(ChannelsLastConvs, ConcatAlongChannelsStaysChannelsLast) {
  for (int64_t axis : {1, -3, 2}) {
    GraphBuilder b(18);
    b.input("x", OnnxType::kFloat, {1, 3, 6, 6})
        .initializer("Wa", random_uniform({4, 3, 3, 3}, 41))
        .initializer("Wb", random_uniform({3, 3, 1, 1}, 42))
        .initializer("Wc", random_uniform({5, 7, 1, 1}, 43))
        .node("Conv", {"x", "Wa"}, {"a"}, {ints_attr("pads", {1, 1, 1, 1})})
        .node("Conv", {"x", "Wb"}, {"b"});
    if (axis == 2) {
      b.node("Concat", {"a", "a"}, {"c"}, {int_attr("axis", axis)}).node("Relu", {"c"}, {"y"}).output("y");
    } else {
      b.node("Concat", {"a", "b"}, {"c"}, {int_attr("axis", axis)}).node("Conv", {"c", "Wc"}, {"y"}).output("y");
    }
    Model nhwc = b.build();
    Model plain = b.build({.run_passes = false});
    // y out only: both convs read x (3 channels) channels-first, in place
    if (axis != 2) EXPECT_EQ(nhwc.op_histogram().at("Transpose"), 1u) << axis;
    mx::array x = random_uniform({1, 3, 6, 6}, 44);
    mx::array want = run_output(plain, "x", x, "y");
    EXPECT_LT(max_abs_diff(run_output(nhwc, "x", x, "y"), want), 1e-5f) << axis;
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);
  }
}

// A reduction that keeps its axes runs channels-last with them renumbered
// (axes an attribute before opset 18, an input from 18); one that drops
// them stays channels-first. Same values.
TEST(ChannelsLastConvs, ReductionsKeepingTheirAxesFollowTheLayout) {
  for (int64_t opset : {17, 18}) {
    for (int64_t keepdims : {1, 0}) {
      GraphBuilder b(opset);
      b.input("x", OnnxType::kFloat, {2, 3, 5, 6}).initializer("W", random_uniform({4, 3, 1, 1}, 51));
      b.node("Conv", {"x", "W"}, {"c"});
      if (opset >= 18) {
        b.initializer("axes", mx::array({int64_t{2}, int64_t{-1}}));
        b.node("ReduceMean", {"c", "axes"}, {"m"}, {int_attr("keepdims", keepdims)});
      } else {
        b.node("ReduceMean", {"c"}, {"m"}, {ints_attr("axes", {2, -1}), int_attr("keepdims", keepdims)});
      }
      if (keepdims == 1) {  // [2, 4, 1, 1] into another conv
        b.initializer("W2", random_uniform({5, 4, 1, 1}, 53)).node("Conv", {"m", "W2"}, {"y"});
      } else {
        b.node("Identity", {"m"}, {"y"});
      }
      b.output("y");
      Model nhwc = b.build();
      Model plain = b.build({.run_passes = false});
      // Kept: the mean and the second conv run channels-last, one transpose out (the
      // first conv reads x, 3 channels, channels-first).
      if (keepdims == 1) EXPECT_EQ(nhwc.op_histogram().at("Transpose"), 1u) << opset;
      mx::array x = random_uniform({2, 3, 5, 6}, 52);
      mx::array want = run_output(plain, "x", x, "y");
      mx::array got = run_output(nhwc, "x", x, "y");
      ASSERT_EQ(got.shape(), want.shape()) << opset << " keepdims " << keepdims;
      EXPECT_LT(max_abs_diff(got, want), 1e-5f) << opset << " keepdims " << keepdims;
      EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.05f);
    }
  }
}

// A conv over at most kConvDirectMaxChannels (4) channels reads its NCHW
// input in place (no transpose into channels-last); one over 5 channels keeps
// its transpose. Values equal the unrewritten graph's, with a bias, a fused
// activation, stride 2 and padding (border columns) on the stem.
TEST(ChannelsLastConvs, StemsReadChannelsFirstInputInPlace) {
  GraphBuilder b(18);
  b.input("x", OnnxType::kFloat, {2, 4, 11, 13})
      .input("x5", OnnxType::kFloat, {1, 5, 8, 9})
      .initializer("W", random_uniform({12, 4, 3, 3}, 61))
      .initializer("B", random_uniform({12}, 62))
      .initializer("W5", random_uniform({7, 5, 3, 3}, 63))
      .node("Conv", {"x", "W", "B"}, {"c"}, {ints_attr("pads", {1, 1, 1, 1}), ints_attr("strides", {2, 2})})
      .node("HardSwish", {"c"}, {"y"})
      .node("Conv", {"x5", "W5"}, {"y5"})
      .output("y")
      .output("y5");
  GraphBuilder plain_b = b;
  // (winograd_convs would take the 5-channel 3x3 conv: this test is about the layouts.)
  Model nhwc = b.build(testing::passes_except("winograd_convs"));
  Model plain = plain_b.build({.run_passes = false});
  EXPECT_EQ(nhwc.op_histogram().at("ai.transmuter.ConvNhwc"), 2u);
  // x5 into channels-last, y and y5 back; none at x.
  EXPECT_EQ(nhwc.op_histogram().at("Transpose"), 3u);
  Inputs in = {{"x", random_uniform({2, 4, 11, 13}, 64) * 2.0f}, {"x5", random_uniform({1, 5, 8, 9}, 65)}};
  Outputs want = run(plain, plain.params(), in, {mx::Device::cpu});
  CompiledModel compiled_model = compile(nhwc, in);
  for (bool compiled : {false, true}) {
    Outputs got = compiled ? compiled_model(in) : run(nhwc, nhwc.params(), in, {mx::Device::cpu});
    for (const char* name : {"y", "y5"}) {
      ASSERT_EQ(got.tensor(name).shape(), want.tensor(name).shape()) << name;
      EXPECT_LT(max_abs_diff(got.tensor(name), want.tensor(name)), 1e-5f) << name << " compiled " << compiled;
      EXPECT_GT(mx::max(mx::abs(want.tensor(name))).item<float>(), 0.5f) << name;
    }
  }
}

// A long chain (a Conv, then 60 blocks of Relu -> Conv 1x1 -> Add of the
// Relu): each block's transposes cancel only after several rewrites, made in
// sweeps over the graph; every one happens (only the borders' two transposes
// remain) and the values are the unrewritten graph's.
TEST(ChannelsLastConvs, LongChainsCancelEveryInnerTranspose) {
  constexpr int kBlocks = 60;
  GraphBuilder b(18);
  b.input("x", OnnxType::kFloat, {1, 6, 3, 4})
      .initializer("W", random_uniform({6, 6, 1, 1}, 99))
      .node("Conv", {"x", "W"}, {"c"});
  std::string x = "c";
  for (int i = 0; i < kBlocks; ++i) {
    const std::string n = std::to_string(i);
    b.initializer("W" + n, random_uniform({6, 6, 1, 1}, 100 + i) * 0.3f)
        .node("Relu", {x}, {"r" + n})
        .node("Conv", {"r" + n, "W" + n}, {"c" + n})
        .node("Add", {"c" + n, "r" + n}, {"a" + n});
    x = "a" + n;
  }
  b.output(x);
  GraphBuilder plain_b = b;
  Model nhwc = b.build();
  Model plain = plain_b.build({.run_passes = false});
  EXPECT_EQ(nhwc.op_histogram().at("ai.transmuter.ConvNhwc"), static_cast<size_t>(kBlocks + 1));
  EXPECT_EQ(nhwc.op_histogram().at("Transpose"), 2u);  // into channels-last at x, back at the output
  mx::array input = random_uniform({1, 6, 3, 4}, 99);
  mx::array want = run_output(plain, "x", input, x);
  EXPECT_LT(max_abs_diff(run_output(nhwc, "x", input, x), want),
            1e-5f * std::max(1.0f, mx::max(mx::abs(want)).item<float>()));
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);
}

// The node the pass makes, fed what it does not accept: an error naming it.
TEST(ChannelsLastConvs, ConvNhwcRefusesInconsistentArguments) {
  auto message_for = [](int64_t group, int64_t out_channels, mx::array w, std::string layout = "NHWC") {
    GraphBuilder b(18);
    b.input("x", OnnxType::kFloat, {1, 5, 5, 4})
        .initializer("W", w)
        .domain_node("ai.transmuter", 1, "ConvNhwc", {"x", "W"}, {"y"},
                     {ints_attr("kernel_shape", {3, 3}), int_attr("group", group),
                      int_attr("out_channels", out_channels), string_attr("input_layout", layout)})
        .output("y");
    Model model = b.build({.run_passes = false});
    return testing::error_of<OpError>(
        [&] { run(model, model.params(), {{"x", random_uniform({1, 5, 5, 4}, 31)}}, {mx::Device::cpu}); });
  };
  std::string grouped = message_for(2, 4, random_uniform({3, 3, 4}, 32));
  EXPECT_NE(grouped.find("ConvNhwc"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("group must be 1 or the channel count 4"), std::string::npos) << grouped;
  std::string depthwise = message_for(4, 4, random_uniform({3, 3, 5}, 33));
  EXPECT_NE(depthwise.find("depthwise weight must be float32 [3, 3, 4]"), std::string::npos) << depthwise;
  std::string packed = message_for(1, 6, random_uniform({3, 3, 4}, 34));
  EXPECT_NE(packed.find("packed convolution weight does not match 6 output channels"), std::string::npos)
      << packed;
  std::string layout = message_for(1, 4, random_uniform({3, 3, 4}, 35), "NWHC");
  EXPECT_NE(layout.find("unknown input_layout 'NWHC'"), std::string::npos) << layout;
  std::string depthwise_nchw = message_for(4, 4, random_uniform({3, 3, 4}, 36), "NCHW");
  EXPECT_NE(depthwise_nchw.find("input_layout NCHW goes with group 1 only"), std::string::npos)
      << depthwise_nchw;
  // x [1, 5, 5, 4] read as NCHW has 5 channels: the packed weight (4 channels) does not fit.
  std::string channels =
      message_for(1, 4, kernels::pack_conv_weight_nhwc(random_uniform({4, 4, 3, 3}, 37)), "NCHW");
  EXPECT_NE(channels.find("over a window of 45 values"), std::string::npos) << channels;
}

}  // namespace
}  // namespace transmuter
