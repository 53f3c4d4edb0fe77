// com.microsoft Gelu, BiasGelu, FastGelu against the formulas of ONNX
// Runtime's ContribOperators.md, written with MLX's precise erf and tanh.
#include <gtest/gtest.h>

#include <cmath>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"

namespace transmuter {
namespace {

using testing::max_abs_diff;
using testing::random_array;

using testing::error_of;
using testing::float_attr;
using testing::out0;
using testing::run_domain_op;

mx::array gelu_erf(const mx::array& z) { return 0.5f * z * (1.0f + mx::erf(z / std::sqrt(2.0f))); }
mx::array gelu_tanh(const mx::array& z) {
  return 0.5f * z * (1.0f + mx::tanh(0.7978845608f * (z + 0.044715f * z * z * z)));
}

std::vector<Value> run_ms(const std::string& op, const std::vector<Value>& inputs) {
  return run_domain_op("com.microsoft", op, 1, inputs);
}

// Kernel erf within 3.8e-7 (abs), Tanh 4 ulp: 1e-5 on outputs up to ~15.
constexpr float kTolerance = 1e-5f;

TEST(MicrosoftGelu, GeluBiasGeluFastGeluMatchTheirFormulas) {
  mx::array x = random_array({2, 5, 24}, 1, 3.0f);
  mx::array b = random_array({24}, 2);
  EXPECT_LT(max_abs_diff(out0(run_ms("Gelu", {x})), gelu_erf(x)), kTolerance);
  EXPECT_LT(max_abs_diff(out0(run_ms("BiasGelu", {x, b})), gelu_erf(x + b)), kTolerance);
  EXPECT_LT(max_abs_diff(out0(run_ms("FastGelu", {x})), gelu_tanh(x)), kTolerance);
  EXPECT_LT(max_abs_diff(out0(run_ms("FastGelu", {x, b})), gelu_tanh(x + b)), kTolerance);
}

TEST(MicrosoftGelu, HalfPrecisionIsComputedInFloat32) {
  mx::array x = random_array({4, 16}, 3, 2.0f);
  mx::array b = random_array({16}, 4);
  mx::array y = out0(run_ms("BiasGelu", {mx::astype(x, mx::float16), mx::astype(b, mx::float16)}));
  EXPECT_EQ(y.dtype(), mx::float16);
  // One float16 rounding of the inputs and of the result: ~3 ulps of values below 8.
  EXPECT_LT(max_abs_diff(y, gelu_erf(x + b)), 2e-2f);
}

TEST(MicrosoftGelu, BiasOfTheWrongShapeNamesTheNode) {
  mx::array x = random_array({2, 8}, 5);
  std::string message = error_of<OpError>([&] { run_ms("BiasGelu", {x, random_array({7}, 6)}); });
  EXPECT_NE(message.find("test_BiasGelu"), std::string::npos) << message;
  EXPECT_NE(message.find("bias must be 1-D"), std::string::npos) << message;
  message = error_of<OpError>([&] { run_ms("FastGelu", {x, random_array({2, 8}, 7)}); });
  EXPECT_NE(message.find("test_FastGelu"), std::string::npos) << message;
}

TEST(MicrosoftBiasOps, BadShapesNameTheNodeAndTheInput) {
  mx::array x = random_array({2, 3, 6}, 8);
  std::string message = error_of<OpError>([&] { run_ms("BiasSplitGelu", {random_array({2, 3, 5}, 9), random_array({5}, 10)}); });
  EXPECT_NE(message.find("test_BiasSplitGelu"), std::string::npos) << message;
  EXPECT_NE(message.find("must be even"), std::string::npos) << message;
  message = error_of<OpError>([&] { run_ms("BiasAdd", {x, random_array({6}, 11), random_array({2, 3, 5}, 12)}); });
  EXPECT_NE(message.find("skip must match X"), std::string::npos) << message;
  message = error_of<OpError>([&] { run_ms("BiasAdd", {random_array({3, 6}, 13), random_array({6}, 14), random_array({3, 6}, 15)}); });
  EXPECT_NE(message.find("X must be 3-D"), std::string::npos) << message;
  message = error_of<OpError>([&] { run_ms("BiasSoftmax", {x, random_array({4, 6}, 16)}); });
  EXPECT_NE(message.find("test_BiasSoftmax"), std::string::npos) << message;
  EXPECT_NE(message.find("does not broadcast"), std::string::npos) << message;
}

TEST(MicrosoftBiasOps, FusedMatMulInnerDimensionMismatchIsAnError) {
  std::string message = error_of<OpError>([&] {
    run_ms("FusedMatMul", {random_array({3, 4}, 17), random_array({5, 6}, 18)});
  });
  EXPECT_NE(message.find("test_FusedMatMul"), std::string::npos) << message;
  EXPECT_NE(message.find("inner dimensions differ: 4 and 5"), std::string::npos) << message;
}

}  // namespace
}  // namespace transmuter
