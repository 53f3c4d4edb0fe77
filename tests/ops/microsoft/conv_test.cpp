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

// --- CausalConvWithState (com.microsoft): its values are checked against ORT in
// scripts/contrib_cases/causal_conv.py; here what ORT's CPU kernel refuses, and bad shapes.

std::string causal_conv_error(const std::vector<Value>& inputs, std::vector<Attribute> attributes) {
  return error_of<OpError>(
      [&] { run_domain_op("com.microsoft", "CausalConvWithState", 1, inputs, attributes, 2); });
}

TEST(MicrosoftCausalConvWithState, NamesWhatItDoesNotTake) {
  mx::array x = random_array({1, 4, 5}, 1), w = random_array({4, 1, 3}, 2);
  EXPECT_NE(causal_conv_error({x, w}, {int_attr("ndim", 2)}).find("ndim 2"), std::string::npos);
  EXPECT_NE(causal_conv_error({x, w}, {int_attr("state_window", 2)}).find("state_window 2"),
            std::string::npos);
  EXPECT_NE(causal_conv_error({x, w}, {int_attr("dilation", 0)}).find("dilation"), std::string::npos);
  EXPECT_NE(causal_conv_error({x, w}, {string_attr("activation", "gelu")}).find("activation"),
            std::string::npos);
  // The state holds (k - 1) * dilation columns: [1, 4, 4] for k 3, dilation 2.
  const std::string past =
      causal_conv_error({x, w, Value(), mx::zeros({1, 4, 2})}, {int_attr("dilation", 2)});
  EXPECT_NE(past.find("past_state must be (1,4,4)"), std::string::npos) << past;
  // Channels last: the state is [batch, (k - 1) * dilation, d1...].
  mx::array last = random_array({1, 5, 2, 2}, 3);
  const std::string last_past =
      causal_conv_error({last, w, Value(), mx::zeros({1, 4, 2, 2})}, {int_attr("channels_last", 1)});
  EXPECT_NE(last_past.find("past_state must be (1,2,2,2)"), std::string::npos) << last_past;
  EXPECT_NE(causal_conv_error({x, random_array({3, 1, 3}, 4)}, {}).find("weight"), std::string::npos);
}

TEST(MicrosoftCausalConvWithState, ChannelsLastEqualsChannelsFirst) {
  // [B, L, 2, 3] channels-last against the same data channels-first, with a past state and dilation 2.
  mx::array last = random_array({2, 6, 2, 3}, 5), w = random_array({6, 1, 3}, 6), b = random_array({6}, 7);
  mx::array past_last = random_array({2, 4, 2, 3}, 8);
  auto first_of = [](const mx::array& a) {
    return mx::transpose(mx::reshape(a, {a.shape(0), a.shape(1), 6}), {0, 2, 1});
  };
  std::vector<Attribute> dilated = {int_attr("dilation", 2), string_attr("activation", "silu")};
  std::vector<Attribute> dilated_last = dilated;
  dilated_last.push_back(int_attr("channels_last", 1));
  auto by_last =
      run_domain_op("com.microsoft", "CausalConvWithState", 1, {last, w, b, past_last}, dilated_last, 2);
  auto by_first = run_domain_op("com.microsoft", "CausalConvWithState", 1,
                                {first_of(last), w, b, first_of(past_last)}, dilated, 2);
  EXPECT_EQ(by_last[0].tensor().shape(), last.shape());
  EXPECT_EQ(by_last[1].tensor().shape(), past_last.shape());
  EXPECT_LT(max_abs_diff(first_of(by_last[0].tensor()), by_first[0].tensor()), kTolerance);
  EXPECT_LT(max_abs_diff(first_of(by_last[1].tensor()), by_first[1].tensor()), 0.0f + 1e-12f);
}

}  // namespace
}  // namespace transmuter
