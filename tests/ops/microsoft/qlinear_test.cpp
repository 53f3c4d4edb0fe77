// com.microsoft quantized operators (src/ops/microsoft/qlinear*.cpp): a few
// values worked out by hand, and the errors for bad shapes and dtypes, which
// must name the node and the offending input. Values against ONNX Runtime are
// checked by the contrib conformance cases (scripts/contrib_cases/qlinear.py).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/op_test_support.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::int_attr;
using testing::ints_attr;
using testing::out0;
using testing::run_domain_op;
using testing::to_ints;

std::vector<Value> run_ms(const std::string& op, const std::vector<Value>& inputs,
                          const std::vector<Attribute>& attributes = {}, int outputs = 1) {
  return run_domain_op("com.microsoft", op, 1, inputs, attributes, outputs);
}

mx::array u8(std::vector<int> v, mx::Shape shape) {
  return mx::astype(mx::array(v.begin(), shape, mx::int32), mx::uint8);
}
mx::array s8(std::vector<int> v, mx::Shape shape) {
  return mx::astype(mx::array(v.begin(), shape, mx::int32), mx::int8);
}
mx::array f32(float v) { return mx::array(v); }

/** The message of the OpError `fn` throws; fails unless it names `node`
 * and contains `text`. */
template <typename Fn>
void expect_error(Fn&& fn, const std::string& node, const std::string& text) {
  std::string message = error_of<OpError>(fn);
  EXPECT_NE(message.find("node 'test_" + node + "'"), std::string::npos) << message;
  EXPECT_NE(message.find(text), std::string::npos) << message;
}

TEST(MicrosoftQLinear, AddAndMulRoundHalfToEven) {
  // real(a) = 0.5 * (a - 10), real(b) = 0.25 * b, C_scale 1, C_zero_point 100.
  mx::array a = u8({11, 13, 10, 0}, {4});
  mx::array b = u8({2, 6, 255, 4}, {4});
  std::vector<Value> inputs{a, f32(0.5f), u8({10}, {}), b, f32(0.25f), u8({0}, {}), f32(1.0f), u8({100}, {})};
  // 0.5 + 0.5 = 1 -> 101; 1.5 + 1.5 = 3 -> 103; 0 + 63.75 -> 164; -5 + 1 = -4 -> 96.
  EXPECT_EQ(to_ints(out0(run_ms("QLinearAdd", inputs))), (std::vector<int64_t>{101, 103, 164, 96}));
  // 0.25 -> 0 (half to even: 0.25 rounds to 0); 2.25 -> 2; 0; -5.
  EXPECT_EQ(to_ints(out0(run_ms("QLinearMul", inputs))), (std::vector<int64_t>{100, 102, 100, 95}));
}

TEST(MicrosoftQLinear, AddRejectsMixedTypesPerChannelScalesAndBadShapes) {
  mx::array a = u8({1, 2, 3}, {3});
  std::vector<Value> inputs{a, f32(0.1f), u8({0}, {}), s8({1, 2, 3}, {3}), f32(0.1f), s8({0}, {}), f32(0.1f)};
  expect_error([&] { run_ms("QLinearAdd", inputs); }, "QLinearAdd", "B must have A's type");
  inputs = {a, mx::array({0.1f, 0.2f, 0.3f}), u8({0}, {}), a, f32(0.1f), u8({0}, {}), f32(0.1f)};
  expect_error([&] { run_ms("QLinearAdd", inputs); }, "QLinearAdd",
               "A_scale must be a scalar or a 1-D tensor of one element");
  inputs = {a, f32(0.1f), u8({0}, {}), u8({1, 2}, {2}), f32(0.1f), u8({0}, {}), f32(0.1f)};
  expect_error([&] { run_ms("QLinearMul", inputs); }, "QLinearMul", "do not broadcast");
  inputs = {mx::array({1.0f, 2.0f}), f32(0.1f), u8({0}, {}), a, f32(0.1f), u8({0}, {}), f32(0.1f)};
  expect_error([&] { run_ms("QLinearAdd", inputs); }, "QLinearAdd", "A must be int8 or uint8");
  inputs = {a, f32(0.1f), s8({0}, {}), a, f32(0.1f), u8({0}, {}), f32(0.1f)};
  expect_error([&] { run_ms("QLinearAdd", inputs); }, "QLinearAdd",
               "A_zero_point must have its tensor's type");
}

TEST(MicrosoftQLinear, LeakyReluTableAndSoftmaxNeedsOpset) {
  // real(x) = 0.5 * (x - 128); alpha 0.5; Y_scale 0.25, Y_zero_point 128.
  mx::array x = u8({124, 128, 130, 255}, {4});
  std::vector<Value> inputs{x, f32(0.5f), u8({128}, {}), f32(0.25f), u8({128}, {})};
  // -2 * 0.5 = -1 -> 124; 0 -> 128; 1 -> 132; 63.5 -> 254 + 128 saturates at 255.
  EXPECT_EQ(to_ints(out0(run_ms("QLinearLeakyRelu", inputs, {float_attr("alpha", 0.5f)}))),
            (std::vector<int64_t>{124, 128, 132, 255}));
  std::vector<Value> softmax{u8({1, 2, 3, 4}, {2, 2}), f32(0.1f), u8({0}, {}), f32(1.0f / 256), u8({0}, {})};
  expect_error([&] { run_ms("QLinearSoftmax", softmax); }, "QLinearSoftmax", "attribute 'opset'");
  // Equal inputs share the probability: 1/2 of 256 steps each.
  std::vector<Value> even{u8({7, 7}, {1, 2}), f32(0.1f), u8({0}, {}), f32(1.0f / 256), u8({0}, {})};
  EXPECT_EQ(to_ints(out0(run_ms("QLinearSoftmax", even, {int_attr("opset", 13)}))),
            (std::vector<int64_t>{128, 128}));
}

TEST(MicrosoftQLinear, ConcatChecksTuplesAndShapes) {
  mx::array a = u8({1, 2, 3, 4}, {2, 2}), b = u8({5, 6}, {1, 2});
  std::vector<Value> inputs{f32(0.1f), u8({0}, {}), a, f32(0.1f), u8({0}, {}), b, f32(0.2f), u8({0}, {})};
  EXPECT_EQ(to_ints(out0(run_ms("QLinearConcat", inputs, {int_attr("axis", 0)}))),
            (std::vector<int64_t>{1, 2, 3, 4, 10, 12}));
  expect_error([&] { run_ms("QLinearConcat", inputs, {int_attr("axis", 1)}); }, "QLinearConcat",
               "does not concatenate with input 0");
  inputs.pop_back();
  expect_error([&] { run_ms("QLinearConcat", inputs, {int_attr("axis", 0)}); }, "QLinearConcat",
               "(X, X_scale, X_zero_point) per input");
  inputs = {f32(0.1f), u8({0}, {}), s8({1, 2}, {2}), f32(0.1f), s8({0}, {})};
  expect_error([&] { run_ms("QLinearConcat", inputs, {int_attr("axis", 0)}); }, "QLinearConcat",
               "input 0 must have Y_zero_point's type");
}

TEST(MicrosoftQLinear, PoolsRejectBadRanksDilationsAndScales) {
  mx::array x = u8(std::vector<int>(2 * 3 * 4 * 4, 100), {2, 3, 4, 4});
  std::vector<Value> inputs{x, f32(0.1f), u8({0}, {}), f32(0.1f), u8({0}, {})};
  // 100 * 0.1 / 0.1 = 100 everywhere.
  mx::array y = out0(run_ms("QLinearGlobalAveragePool", inputs));
  EXPECT_EQ(y.shape(), (mx::Shape{2, 3, 1, 1}));
  EXPECT_EQ(to_ints(y)[0], 100);
  inputs[0] = u8({1, 2, 3, 4}, {2, 2});
  expect_error([&] { run_ms("QLinearGlobalAveragePool", inputs); }, "QLinearGlobalAveragePool",
               "X must have rank >= 3");
  inputs[0] = x;
  inputs[3] = f32(1e-6f);
  expect_error([&] { run_ms("QLinearGlobalAveragePool", inputs); }, "QLinearGlobalAveragePool",
               "outside [2^-32, 256)");
  inputs[3] = f32(0.1f);
  expect_error(
      [&] {
        run_ms("QLinearAveragePool", inputs,
               {ints_attr("kernel_shape", {2, 2}), ints_attr("dilations", {2, 2})});
      },
      "QLinearAveragePool", "dilations are not supported");
  expect_error([&] { run_ms("QLinearAveragePool", inputs); }, "QLinearAveragePool", "kernel_shape");
  inputs[0] = mx::astype(x, mx::float32);
  expect_error(
      [&] {
        run_ms("QLinearAveragePool", inputs, {ints_attr("kernel_shape", {2, 2})});
      },
      "QLinearAveragePool", "X must be int8 or uint8");
}

TEST(MicrosoftQLinear, MatMulsCheckShapesAndTypes) {
  mx::array a = mx::array({1.0f, -2.0f, 0.5f, 4.0f, 3.0f, -1.0f}, {2, 3});
  mx::array b = s8({1, 2, 3, 4, 5, 6}, {3, 2});
  std::vector<Value> inputs{a, b, f32(0.5f)};
  mx::array y = out0(run_ms("DynamicQuantizeMatMul", inputs));
  EXPECT_EQ(y.shape(), (mx::Shape{2, 2}));
  // A rounds to steps of 6 / 255: the product is within a few such steps of the float one.
  std::vector<double> got = testing::to_doubles(y),
                      want{(1 - 6 + 2.5) * 0.5, (2 - 8 + 3) * 0.5, (4 + 9 - 5) * 0.5, (8 + 12 - 6) * 0.5};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.1) << i;
  expect_error(
      [&] {
        run_ms("DynamicQuantizeMatMul", {b, b, f32(0.5f)});
      },
      "DynamicQuantizeMatMul", "A must be float32");
  expect_error(
      [&] {
        run_ms("DynamicQuantizeMatMul", {a, b, mx::array({0.1f, 0.2f, 0.3f})});
      },
      "DynamicQuantizeMatMul", "b_scale must be a scalar or 1-D of B's column count 2");
  expect_error(
      [&] {
        run_ms("DynamicQuantizeMatMul", {a, b, f32(0.5f), Value(), mx::array({1.0f})});
      },
      "DynamicQuantizeMatMul", "bias must be 1-D of B's column count 2");
  expect_error(
      [&] {
        run_ms("DynamicQuantizeMatMul", {a, s8({1, 2}, {2, 1}), f32(0.5f)});
      },
      "DynamicQuantizeMatMul", "do not multiply");
  mx::array qa = u8({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_error(
      [&] {
        run_ms("MatMulIntegerToFloat", {qa, b, mx::array({0.1f, 0.2f}), f32(0.5f)});
      },
      "MatMulIntegerToFloat", "a_scale must be a scalar or a 1-D tensor of one element");
  expect_error(
      [&] {
        run_ms("MatMulIntegerToFloat", {qa, b, f32(0.1f), f32(0.5f), Value(), u8({0}, {})});
      },
      "MatMulIntegerToFloat", "b_zero_point must have its tensor's type");
}

// QGemm's values are checked against ORT (scripts/contrib_cases/qlinear.py); here its bad inputs, and the
// zero points that may be left out (0).
TEST(MicrosoftQLinear, QGemmChecksShapesTypesAndBroadcasts) {
  mx::array a = u8({130, 120, 128, 140, 110, 128}, {2, 3});
  mx::array b = s8({1, -2, 3, 4, -5, 6}, {3, 2});
  auto qgemm = [&](std::vector<Value> inputs, std::vector<Attribute> attributes = {}) {
    return out0(run_ms("QGemm", inputs, attributes));
  };
  // a_zero_point and b_zero_point left out: 0; float output.
  mx::array y = qgemm({a, f32(1.0f), Value(), b, f32(1.0f)});
  EXPECT_EQ(to_ints(mx::astype(y, mx::int32)),
            (std::vector<int64_t>{130 + 120 * 3 - 128 * 5, -130 * 2 + 120 * 4 + 128 * 6,
                                  140 + 110 * 3 - 128 * 5, -140 * 2 + 110 * 4 + 128 * 6}));
  expect_error([&] { qgemm({mx::astype(a, mx::float32), f32(1.0f), Value(), b, f32(1.0f)}); }, "QGemm",
               "A must be int8 or uint8");
  expect_error([&] { qgemm({u8({1, 2, 3}, {3}), f32(1.0f), Value(), b, f32(1.0f)}); }, "QGemm",
               "A must be 2-D");
  expect_error([&] { qgemm({a, f32(1.0f), Value(), s8({1, 2}, {2, 1}), f32(1.0f)}); }, "QGemm",
               "do not multiply");
  expect_error([&] { qgemm({a, f32(1.0f), Value(), b, f32(1.0f)}, {int_attr("transA", 1)}); }, "QGemm",
               "do not multiply");
  expect_error([&] { qgemm({a, mx::array({1.0f, 2.0f}), Value(), b, f32(1.0f)}); }, "QGemm",
               "a_scale must be a scalar");
  expect_error([&] { qgemm({a, f32(1.0f), s8({0}, {}), b, f32(1.0f)}); }, "QGemm",
               "a_zero_point must have its tensor's type");
  expect_error([&] { qgemm({a, f32(1.0f), Value(), b, mx::array({1.0f, 2.0f, 3.0f})}); }, "QGemm",
               "b_scale must be a scalar or 1-D of B's column count 2");
  expect_error([&] { qgemm({a, f32(1.0f), Value(), b, f32(1.0f), Value(), mx::array({1, 2, 3}, {3})}); },
               "QGemm", "does not broadcast to [2, 2]");
  expect_error([&] { qgemm({a, f32(1.0f), Value(), b, f32(1.0f), Value(), mx::array({1.0f, 2.0f})}); },
               "QGemm", "C must be int32");
  expect_error(
      [&] { qgemm({a, f32(1.0f), Value(), b, f32(1.0f), Value(), Value(), f32(0.1f), mx::array({1.0f})}); },
      "QGemm", "y_zero_point must be int8 or uint8");
}

TEST(MicrosoftQLinear, QuantizeLinearIsOnnxsForFloat32) {
  mx::array x = mx::array({0.5f, 1.5f, -2.5f, 300.0f}, {4});
  EXPECT_EQ(to_ints(out0(run_ms("QuantizeLinear", {x, f32(1.0f), u8({10}, {})}))),
            (std::vector<int64_t>{10, 12, 8, 255}));
  expect_error(
      [&] {
        run_ms("QuantizeLinear", {mx::astype(x, mx::float16), f32(1.0f)});
      },
      "QuantizeLinear", "x must be float32");
  expect_error(
      [&] {
        run_ms("DequantizeLinear", {x, f32(1.0f)});
      },
      "DequantizeLinear", "x must be int8, uint8");
}

TEST(MicrosoftQLinear, DynamicQuantizeLstmChecksWeightsAndParameters) {
  const int T = 2, B = 1, I = 3, H = 2;
  mx::array x = mx::ones({T, B, I});
  mx::array w = s8(std::vector<int>(I * 4 * H, 1), {1, I, 4 * H});
  mx::array r = s8(std::vector<int>(H * 4 * H, 1), {1, H, 4 * H});
  mx::array scale = mx::array({0.01f}), zp = s8({0}, {1});
  auto inputs = [&](const mx::array& w_in, const Value& w_zp, const mx::array& r_scale) {
    return std::vector<Value>{x,       w_in,    r,     Value(), Value(), Value(),
                              Value(), Value(), scale, w_zp,    r_scale, zp};
  };
  std::vector<Attribute> attrs{int_attr("hidden_size", H)};
  std::vector<Value> out = run_ms("DynamicQuantizeLSTM", inputs(w, zp, scale), attrs, 3);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{T, 1, B, H}));
  expect_error(
      [&] {
        run_ms("DynamicQuantizeLSTM", inputs(s8(std::vector<int>(4 * H * I, 1), {1, 4 * H, I}), zp, scale),
               attrs, 3);
      },
      "DynamicQuantizeLSTM", "W must have shape [1, 3, 8]");
  expect_error([&] { run_ms("DynamicQuantizeLSTM", inputs(w, Value(), scale), attrs, 3); },
               "DynamicQuantizeLSTM", "W_zero_point is required");
  expect_error(
      [&] {
        run_ms("DynamicQuantizeLSTM", inputs(w, zp, mx::array({0.1f, 0.2f, 0.3f})), attrs, 3);
      },
      "DynamicQuantizeLSTM", "R_scale must have shape [1] (per direction) or [1, 8]");
  expect_error([&] { run_ms("DynamicQuantizeLSTM", inputs(w, zp, scale), {}, 3); }, "DynamicQuantizeLSTM",
               "hidden_size");
}

}  // namespace
}  // namespace transmuter
