// qlinear_convs_nhwc: QLinearConv with constant weights over uint8 activations runs on the channels-last
// integer kernels (QLinearConvNhwc) with exactly the operator's bytes, eager and compiled: a stem over
// RGB read in NCHW, depthwise, pointwise per channel, int8 and uint8 weights, chained without transposes
// between them, over uint8 or int8 activations; a grouped convolution (no integer kernel) stays on
// qlinear_conv_as_conv's float path; QLinearAdd and QLinearGlobalAveragePool follow the layout; QGemm with a
// constant B runs as a 1x1 QLinearConvNhwc; computed weights and int8 activations are left alone. Applies
// only where the CPU has AVX512-VNNI (kernels::integer_gemm_available), so the checks of what it rewrote are
// skipped elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/integer_gemm.h"
#include "kernels/cpu/qlinear_conv.h"
#include "support/expect_error.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/qoperator_convs.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::float_attr;
using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;
using testing::random_integers;

bool applied(const Model& model, const std::string& pass) {
  const auto& passes = model.passes_applied();
  return std::find(passes.begin(), passes.end(), pass) != passes.end();
}

// The bytes of `output` with the passes and without, eager and compiled, over two random inputs of x.
void expect_same_bytes(const GraphBuilder& b, const mx::Shape& x_shape, mx::Dtype x_type,
                       const std::string& output) {
  Model converted = b.build();
  Model plain = b.build({.run_passes = false});
  for (uint64_t seed : {1, 2}) {
    const Inputs in = {
        {"x", Value(random_integers(x_shape, x_type, seed, x_type == mx::int8 ? -128 : 0, 256))}};
    mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor(output);
    mx::array eager = run(converted, converted.params(), in, {mx::Device::cpu}).tensor(output);
    mx::array compiled = compile(converted, in, {.device = mx::Device::cpu})(in).tensor(output);
    ASSERT_EQ(eager.dtype(), want.dtype());
    EXPECT_TRUE(mx::array_equal(eager, want).item<bool>()) << "seed " << seed;
    EXPECT_TRUE(mx::array_equal(compiled, want).item<bool>()) << "seed " << seed;
    EXPECT_GT(mx::max(mx::astype(want, mx::int32)).item<int32_t>() -
                  mx::min(mx::astype(want, mx::int32)).item<int32_t>(),
              5)
        << "a constant output checks little";
  }
}

TEST(QlinearConvsNhwc, IntegerKernelsGiveTheOperatorsBytes) {
  // A stem over RGB (stride 2), a depthwise 3x3, a pointwise 1x1 per channel, a grouped strided conv (float
  // path), a last pointwise with a per-tensor weight scale.
  const std::vector<testing::QConvLayer> layers = {{16, 3, 1, 2, false, true},
                                                   {16, 3, 16, 1, true, true},
                                                   {24, 1, 1, 1, true, false},
                                                   {24, 3, 4, 2, true, true},
                                                   {12, 1, 1, 1, false, true}};
  for (auto [weight_type, activation_type] :
       {std::pair{mx::int8, mx::uint8}, std::pair{mx::uint8, mx::uint8}, std::pair{mx::int8, mx::int8}}) {
    SCOPED_TRACE(std::string(weight_type == mx::int8 ? "int8" : "uint8") + " weights, " +
                 (activation_type == mx::int8 ? "int8" : "uint8") + " activations");
    const GraphBuilder b = testing::qoperator_convs(layers, weight_type, 3, 12, activation_type);
    expect_same_bytes(b, {1, 3, 12, 12}, activation_type, "l4_y");
    if (!kernels::integer_gemm_available()) continue;
    Model converted = b.build();
    EXPECT_TRUE(applied(converted, "qlinear_convs_nhwc"));
    EXPECT_EQ(testing::op_count(converted, "ai.transmuter.QLinearConvNhwc"), 4u);
    EXPECT_EQ(testing::op_count(converted, "QLinearConv"),
              0u);  // the grouped one: a float Conv (qlinear_conv_as_conv)
    // The stem reads x in NCHW (no transpose in); the two first layers hand bytes over without a transpose.
    EXPECT_LE(testing::op_count(converted, "Transpose"), 3u);
  }
}

// A shortcut QLinearAdd of two convolutions' outputs, then QLinearGlobalAveragePool: the transposes left
// are x's into the two convolutions (one copy, shared) and the pooled [1, 1, 1, C] back to [1, C, 1, 1].
TEST(QlinearConvsNhwc, QLinearAddAndGlobalPoolStayChannelsLast) {
  const GraphBuilder b = testing::qoperator_shortcut_and_pool();
  expect_same_bytes(b, {1, 8, 10, 10}, mx::uint8, "pooled");
  if (!kernels::integer_gemm_available()) return;
  Model converted = b.build();
  EXPECT_EQ(testing::op_count(converted, "ai.transmuter.QLinearConvNhwc"), 2u);
  EXPECT_EQ(testing::op_count(converted, "Transpose"), 2u);
}

// QGemm(A, ..., B constant, ..., C, y_scale, y_zero) -> Reshape -> QLinearConvNhwc (1x1) -> Reshape, both
// layouts of B, C per column and one value, per-column and per-tensor b_scale.
TEST(QlinearConvsNhwc, QGemmRunsAsAPointwiseConvolution) {
  for (bool trans_b : {true, false}) {
    SCOPED_TRACE(trans_b ? "transB 1" : "transB 0");
    GraphBuilder b(13);
    const int k = 40, n = 37;
    b.input("x", OnnxType::kUint8, {3, k})
        .initializer("a_scale", mx::array(0.05f))
        .initializer("a_zero", mx::array(static_cast<uint8_t>(121)))
        .initializer("b",
                     random_integers(trans_b ? mx::Shape{n, k} : mx::Shape{k, n}, mx::int8, 80, -100, 100))
        .initializer("b_scale",
                     trans_b ? mx::random::uniform(0.002f, 0.01f, {n}, mx::float32, mx::random::key(81))
                             : mx::array(0.006f))
        .initializer("b_zero",
                     trans_b ? mx::array(static_cast<int8_t>(0)) : random_integers({n}, mx::int8, 82, -3, 3))
        .initializer("c", trans_b ? random_integers({n}, mx::int32, 83, -3000, 3000) : mx::array({1500}))
        .initializer("y_scale", mx::array(0.2f))
        .initializer("y_zero", mx::array(static_cast<uint8_t>(128)))
        .domain_node("com.microsoft", 1, "QGemm",
                     {"x", "a_scale", "a_zero", "b", "b_scale", "b_zero", "c", "y_scale", "y_zero"}, {"y"},
                     {int_attr("transB", trans_b ? 1 : 0), float_attr("alpha", 1.0f)})
        .output("y");
    expect_same_bytes(b, {3, k}, mx::uint8, "y");
    if (!kernels::integer_gemm_available()) continue;
    Model converted = b.build();
    EXPECT_EQ(testing::op_count(converted, "com.microsoft.QGemm"), 0u);
    EXPECT_EQ(testing::op_count(converted, "ai.transmuter.QLinearConvNhwc"), 1u);
  }
}

// Weights computed at run time have no integer kernel here: that convolution stays QLinearConv (the next
// one, over its int8 output, is converted).
TEST(QlinearConvsNhwc, LeavesWhatTheKernelsDoNotTake) {
  GraphBuilder b(13);
  b.input("x", OnnxType::kInt8, {1, 4, 6, 6})
      .input("w", OnnxType::kInt8, {4, 4, 1, 1})
      .initializer("s", mx::array(0.1f))
      .initializer("z", mx::array(static_cast<int8_t>(3)))
      .initializer("wz", mx::array(static_cast<int8_t>(0)))
      .initializer("w2", random_integers({4, 4, 1, 1}, mx::int8, 90, -50, 50))
      .node("QLinearConv", {"x", "s", "z", "w", "s", "wz", "s", "z"}, {"y"})
      .node("QLinearConv", {"y", "s", "z", "w2", "s", "wz", "s", "z"}, {"y2"})
      .output("y2");
  Model model = b.build();
  EXPECT_EQ(testing::op_count(model, "QLinearConv"), 1u);
  EXPECT_EQ(testing::op_count(model, "ai.transmuter.QLinearConvNhwc"),
            kernels::integer_gemm_available() ? 1u : 0u);
}

// The op the pass writes refuses operands that do not agree, naming its node and what is wrong: a float X,
// and a packed weight made for another channel count.
TEST(QlinearConvsNhwc, QLinearConvNhwcNamesBadOperands) {
  mx::array rows =
      mx::contiguous(kernels::qlinear_conv_weight_rows(random_integers({16, 8, 1, 1}, mx::int8, 5)));
  rows.eval();
  const kernels::PackedIntegerRhs packed = kernels::pack_integer_gemm_rhs(rows, std::nullopt);
  auto model = [&](OnnxType x_type, int channels) {
    GraphBuilder b(13);
    b.input("x", x_type, {1, 4, 4, channels})
        .initializer("x_zero", mx::array(static_cast<uint8_t>(128)))
        .initializer("w", packed.packed)
        .initializer("sums", packed.column_sums)
        .initializer("zeros", packed.column_zeros)
        .initializer("m", mx::array({0.01f}))
        .initializer("y_zero", mx::array(static_cast<uint8_t>(0)))
        .domain_node("ai.transmuter", 1, "QLinearConvNhwc",
                     {"x", "x_zero", "w", "sums", "zeros", "m", "y_zero"}, {"y"},
                     {ints_attr("kernel_shape", {1, 1}), int_attr("out_channels", 16)})
        .output("y");
    return b.build({.run_passes = false});
  };
  Model float_input = model(OnnxType::kFloat, 8);
  const Inputs floats = {{"x", Value(mx::zeros({1, 4, 4, 8}))}};
  std::string message = testing::error_of<OpError>([&] { run(float_input, float_input.params(), floats); });
  EXPECT_NE(message.find("QLinearConvNhwc"), std::string::npos) << message;
  EXPECT_NE(message.find("X must be uint8 or int8"), std::string::npos) << message;
  Model wider = model(OnnxType::kUint8, 12);
  const Inputs bytes = {{"x", Value(mx::zeros({1, 4, 4, 12}, mx::uint8))}};
  message = testing::error_of<OpError>([&] { run(wider, wider.params(), bytes); });
  EXPECT_NE(message.find("packed QLinearConv weight does not match 16 output channels over a window of 12"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace transmuter
