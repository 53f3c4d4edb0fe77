// com.microsoft FusedConv against ONNX Conv followed by the activation,
// written with MLX ops; bad attributes and inputs.
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/op_test_support.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::floats_attr;
using testing::int_attr;
using testing::ints_attr;
using testing::out0;
using testing::run_domain_op;
using testing::run_op;
using testing::string_attr;

mx::array random_array(const mx::Shape& shape, uint64_t seed) {
  return mx::random::normal(shape, mx::float32, 0, 1, mx::random::key(seed));
}

float max_abs_diff(const mx::array& a, const mx::array& b) { return mx::max(mx::abs(a - b)).item<float>(); }

// Sums of 27 unit-scale products in another order than MLX's: ~1e-6.
constexpr float kTolerance = 1e-5f;

std::vector<Attribute> conv_attributes(std::vector<Attribute> extra, int64_t group = 1) {
  std::vector<Attribute> a = {ints_attr("pads", {1, 0, 0, 1}), ints_attr("strides", {1, 2}), int_attr("group", group)};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

mx::array fused(const std::vector<Value>& inputs, const std::string& activation, std::vector<float> params = {},
                int64_t group = 1) {
  std::vector<Attribute> extra = {string_attr("activation", activation)};
  if (!params.empty()) extra.push_back(floats_attr("activation_params", params));
  return out0(run_domain_op("com.microsoft", "FusedConv", 1, inputs, conv_attributes(extra, group)));
}

TEST(MicrosoftFusedConv, EqualsConvThenTheActivation) {
  mx::array x = random_array({2, 3, 8, 9}, 1);
  mx::array w = random_array({4, 3, 3, 3}, 2);
  mx::array b = random_array({4}, 3);
  mx::array y = out0(run_op("Conv", 18, {x, w, b}, conv_attributes({})));
  auto clip = [](const mx::array& v, float lo, float hi) { return mx::clip(v, mx::array(lo), mx::array(hi)); };
  EXPECT_LT(max_abs_diff(fused({x, w, b}, "Relu"), mx::maximum(y, mx::array(0.0f))), kTolerance);
  EXPECT_LT(max_abs_diff(fused({x, w, b}, "Clip", {-1.0f, 2.0f}), clip(y, -1, 2)), kTolerance);
  EXPECT_LT(max_abs_diff(fused({x, w, b}, "HardSwish"), y * clip(y / 6.0f + 0.5f, 0, 1)), kTolerance);
  EXPECT_LT(max_abs_diff(fused({x, w, b}, "LeakyRelu", {0.1f}), mx::where(y >= 0.0f, y, 0.1f * y)), kTolerance);
  EXPECT_LT(max_abs_diff(fused({x, w, b}, "Sigmoid"), mx::sigmoid(y)), kTolerance);
  EXPECT_LT(max_abs_diff(fused({x, w, b}, "Tanh"), mx::tanh(y)), kTolerance);
  EXPECT_LT(max_abs_diff(fused({x, w, b}, "HardSigmoid", {0.2f, 0.5f}), clip(0.2f * y + 0.5f, 0, 1)), kTolerance);
  // Z is added before the activation.
  mx::array z = random_array(y.shape(), 4);
  EXPECT_LT(max_abs_diff(fused({x, w, b, z}, "Relu"), mx::maximum(y + z, mx::array(0.0f))), kTolerance);
}

TEST(MicrosoftFusedConv, DepthwiseAppliesTheActivationToo) {
  mx::array x = random_array({1, 4, 7, 9}, 5);
  mx::array w = random_array({4, 1, 3, 3}, 6);
  mx::array y = out0(run_op("Conv", 18, {x, w}, conv_attributes({}, 4)));
  mx::array got = fused({x, w}, "Clip", {0.0f, 6.0f}, 4);
  EXPECT_LT(max_abs_diff(got, mx::clip(y, mx::array(0.0f), mx::array(6.0f))), kTolerance);
}

TEST(MicrosoftFusedConv, BadAttributesAndInputsAreNamed) {
  mx::array x = random_array({1, 3, 5, 5}, 7);
  mx::array w = random_array({2, 3, 3, 3}, 8);
  auto message = [&](const std::vector<Value>& inputs, std::vector<Attribute> attributes) {
    return error_of<OpError>([&] { run_domain_op("com.microsoft", "FusedConv", 1, inputs, attributes); });
  };
  EXPECT_NE(message({x, w}, {}).find("'activation' is required"), std::string::npos);
  EXPECT_NE(message({x, w}, {string_attr("activation", "Swish")}).find("unsupported activation 'Swish'"),
            std::string::npos);
  EXPECT_NE(message({x, w}, {string_attr("activation", "Clip")}).find("needs 2 activation_params"),
            std::string::npos);
  EXPECT_NE(message({x, w}, {string_attr("activation", "LeakyRelu"), floats_attr("activation_params", {1, 2})})
                .find("needs 1 activation_params"),
            std::string::npos);
  mx::array z = random_array({1, 2, 4, 4}, 9);  // output is [1, 2, 3, 3]
  EXPECT_NE(message({x, w, Value(), z}, {string_attr("activation", "Relu")}).find("Z must have the output's shape"),
            std::string::npos);
  mx::array w_bad = random_array({2, 4, 3, 3}, 10);
  EXPECT_NE(message({x, w_bad}, {string_attr("activation", "Relu")}).find("channels do not match"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter
