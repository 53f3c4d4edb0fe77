#include "support/qoperator_convs.h"

#include <algorithm>
#include <string>

#include "support/op_test_support.h"

namespace transmuter::testing {

mx::array random_integers(mx::Shape shape, mx::Dtype dtype, uint64_t seed, int lo, int hi) {
  if (dtype == mx::uint8) lo = std::max(lo, 0), hi = std::min(hi, 256);
  return mx::astype(mx::random::randint(lo, hi, shape, mx::int32, mx::random::key(seed)), dtype);
}

GraphBuilder qoperator_convs(const std::vector<QConvLayer>& layers, mx::Dtype weight_type, int channels,
                             int size, mx::Dtype activation_type) {
  const bool signed_activations = activation_type == mx::int8;
  auto zero_point = [&](int value) {  // the uint8 value, or value - 128 as int8
    return signed_activations ? mx::array(static_cast<int8_t>(value - 128))
                              : mx::array(static_cast<uint8_t>(value));
  };
  GraphBuilder b(13);
  b.input("x", signed_activations ? OnnxType::kInt8 : OnnxType::kUint8, {1, channels, size, size})
      .initializer("act_scale", mx::array(0.05f))
      .initializer("act_zero", zero_point(120))
      .initializer("out_scale", mx::array(0.08f))
      .initializer("out_zero", zero_point(131));
  const bool unsigned_weights = weight_type == mx::uint8;
  std::string x = "x";
  uint64_t seed = 10;
  for (size_t i = 0; i < layers.size(); ++i) {
    const QConvLayer& l = layers[i];
    const std::string p = "l" + std::to_string(i);
    const mx::Shape per = l.per_channel ? mx::Shape{l.out_channels} : mx::Shape{};
    b.initializer(p + "_w",
                  random_integers({l.out_channels, channels / l.group, l.kernel, l.kernel}, weight_type,
                                  seed++, unsigned_weights ? 64 : -64, unsigned_weights ? 192 : 64))
        .initializer(p + "_w_scale",
                     mx::random::uniform(0.002f, 0.01f, per, mx::float32, mx::random::key(seed++)))
        .initializer(p + "_w_zero", random_integers(per, weight_type, seed++, unsigned_weights ? 123 : -5,
                                                    unsigned_weights ? 133 : 5));
    const bool last = i + 1 == layers.size();
    std::vector<std::string> inputs = {x,
                                       "act_scale",
                                       "act_zero",
                                       p + "_w",
                                       p + "_w_scale",
                                       p + "_w_zero",
                                       last ? "out_scale" : "act_scale",
                                       last ? "out_zero" : "act_zero"};
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

GraphBuilder qoperator_shortcut_and_pool() {
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
  return b;
}

}  // namespace transmuter::testing
