// com.microsoft SkipLayerNormalization, SkipSimplifiedLayerNormalization,
// SimplifiedLayerNormalization against the composition written out with MLX.
#include <gtest/gtest.h>

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

mx::array layer_norm(const mx::array& s, const mx::array& gamma, const std::optional<mx::array>& beta, float eps) {
  mx::array mean = mx::mean(s, -1, true);
  mx::array y = (s - mean) / mx::sqrt(mx::var(s, -1, true) + eps) * gamma;
  return beta ? y + *beta : y;
}

mx::array rms_norm(const mx::array& s, const mx::array& gamma, float eps) {
  return s / mx::sqrt(mx::mean(s * s, -1, true) + eps) * gamma;
}

std::vector<Value> run_ms(const std::string& op, const std::vector<Value>& inputs, int outputs = 1) {
  return run_domain_op("com.microsoft", op, 1, inputs, {float_attr("epsilon", 1e-6f)}, outputs);
}

// Summation order differs from MLX's reductions: a few ulps of unit-scale outputs.
constexpr float kTolerance = 1e-5f;

TEST(MicrosoftNormalization, SkipLayerNormalizationWithBiasAndSum) {
  mx::array x = random_array({2, 6, 32}, 1, 2.0f), skip = random_array({2, 6, 32}, 2);
  mx::array gamma = random_array({32}, 3), beta = random_array({32}, 4), bias = random_array({32}, 5);
  std::vector<Value> out = run_ms("SkipLayerNormalization", {x, skip, gamma, beta, bias}, 4);
  ASSERT_EQ(out.size(), 4u);
  mx::array sum = x + skip + bias;
  EXPECT_LT(max_abs_diff(out[0].tensor(), layer_norm(sum, gamma, beta, 1e-6f)), kTolerance);
  EXPECT_LT(max_abs_diff(out[1].tensor(), mx::mean(sum, -1, true)), kTolerance);
  EXPECT_LT(max_abs_diff(out[2].tensor(), mx::rsqrt(mx::var(sum, -1, true) + 1e-6f)), 1e-4f);
  EXPECT_LT(max_abs_diff(out[3].tensor(), sum), kTolerance);
  // Without beta and bias; a skip that broadcasts ([S, D]).
  mx::array skip2d = random_array({6, 32}, 6);
  mx::array y = out0(run_ms("SkipLayerNormalization", {x, skip2d, gamma}));
  EXPECT_LT(max_abs_diff(y, layer_norm(x + skip2d, gamma, std::nullopt, 1e-6f)), kTolerance);
}

TEST(MicrosoftNormalization, SkipSimplifiedAndSimplifiedLayerNormalization) {
  mx::array x = random_array({3, 40}, 7, 2.0f), skip = random_array({3, 40}, 8);
  mx::array gamma = random_array({40}, 9), bias = random_array({40}, 10);
  std::vector<Value> out = run_ms("SkipSimplifiedLayerNormalization", {x, skip, gamma, bias}, 4);
  EXPECT_LT(max_abs_diff(out[0].tensor(), rms_norm(x + skip + bias, gamma, 1e-6f)), kTolerance);
  EXPECT_LT(max_abs_diff(out[3].tensor(), x + skip + bias), kTolerance);
  EXPECT_LT(max_abs_diff(out0(run_ms("SimplifiedLayerNormalization", {x, gamma})), rms_norm(x, gamma, 1e-6f)),
            kTolerance);
  mx::array half = out0(run_ms("SimplifiedLayerNormalization", {mx::astype(x, mx::float16), mx::astype(gamma, mx::float16)}));
  EXPECT_EQ(half.dtype(), mx::float16);
  EXPECT_LT(max_abs_diff(half, rms_norm(x, gamma, 1e-6f)), 3e-2f);
}

TEST(MicrosoftNormalization, WrongGammaShapeNamesTheNode) {
  mx::array x = random_array({2, 16}, 11);
  std::string message =
      error_of<OpError>([&] { run_ms("SkipLayerNormalization", {x, x, random_array({8}, 12)}); });
  EXPECT_NE(message.find("test_SkipLayerNormalization"), std::string::npos) << message;
  EXPECT_NE(message.find("gamma must be 1-D of the hidden size 16"), std::string::npos) << message;
  message = error_of<OpError>([&] { run_ms("SkipLayerNormalization", {x, random_array({3, 16}, 13), mx::ones({16})}); });
  EXPECT_NE(message.find("skip"), std::string::npos) << message;
  message = error_of<OpError>([&] { run_ms("SimplifiedLayerNormalization", {x, random_array({5}, 14)}); });
  EXPECT_NE(message.find("test_SimplifiedLayerNormalization"), std::string::npos) << message;
}

// EmbedLayerNormalization's ids address table rows: a bad id is an error
// naming the input, never an out-of-bounds read.
TEST(MicrosoftNormalization, EmbedLayerNormalizationRejectsIdsOutsideTheirTables) {
  auto run_embed = [&](const mx::array& ids, const mx::array& segment_ids) {
    return run_domain_op("com.microsoft", "EmbedLayerNormalization", 1,
                         {ids, segment_ids, random_array({10, 8}, 21), random_array({4, 8}, 22),
                          random_array({2, 8}, 23), random_array({8}, 24), random_array({8}, 25)},
                         {}, 2);
  };
  mx::array good = mx::array({1, 2, 3, 0, 9, 1}, {2, 3}, mx::int32);
  mx::array segments = mx::zeros({2, 3}, mx::int32);
  EXPECT_EQ(run_embed(good, segments)[0].tensor().shape(), (mx::Shape{2, 3, 8}));
  std::string message = error_of<OpError>([&] { run_embed(mx::array({1, 2, 10, 0, 9, 1}, {2, 3}, mx::int32), segments); });
  EXPECT_NE(message.find("input_ids holds 10, outside word_embedding's 10 rows"), std::string::npos) << message;
  message = error_of<OpError>([&] { run_embed(good, mx::array({0, 0, -1, 0, 0, 0}, {2, 3}, mx::int32)); });
  EXPECT_NE(message.find("segment_ids holds -1"), std::string::npos) << message;
  message = error_of<OpError>([&] { run_embed(mx::astype(good, mx::int64), segments); });
  EXPECT_NE(message.find("input_ids must be int32"), std::string::npos) << message;
  // Four positions in the table, five in the sequence.
  message = error_of<OpError>([&] { run_embed(mx::zeros({1, 5}, mx::int32), mx::zeros({1, 5}, mx::int32)); });
  EXPECT_NE(message.find("position_ids holds 4, outside position_embedding's 4 rows"), std::string::npos) << message;
}

}  // namespace
}  // namespace transmuter
