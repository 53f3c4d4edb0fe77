#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::i64;
using testing::int_attr;
using testing::iota;
using testing::out0;
using testing::run_compiled;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;

// float32 results of a few operations on values of order 1.
constexpr double kTol = 1e-5;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = kTol) {
  testing::expect_all_near(actual, expected, tol);
}

template <typename Fn>
std::string op_error(Fn&& fn) {
  return error_of<OpError>(std::forward<Fn>(fn));
}

// --- Attention ---------------------------------------------------------------------

TEST(Attention, EqualScoresAverageTheValues) {
  // Q is zero, so every key scores 0 and the output is the mean of V's rows.
  mx::array q = mx::zeros({1, 1, 1, 2});
  mx::array k = iota({1, 1, 3, 2});
  mx::array v = mx::array({1.f, 10.f, 2.f, 20.f, 3.f, 30.f}, {1, 1, 3, 2});
  auto out = run_op("Attention", 23, {q, k, v});
  expect_near(to_doubles(out0(out)), {2, 20});
}

TEST(Attention, CausalWithPastIsBottomRightAligned) {
  // One new query after two cached keys sees all three keys (offset = past
  // length), not just the first one as a top-left causal mask would.
  mx::array q = mx::zeros({1, 1, 1, 1});
  mx::array past_key = mx::zeros({1, 1, 2, 1}), past_value = mx::array({3.f, 6.f}, {1, 1, 2, 1});
  mx::array k = mx::zeros({1, 1, 1, 1}), v = mx::array({9.f}, {1, 1, 1, 1});
  auto out = run_op("Attention", 23, {q, k, v, Value(), past_key, past_value}, {int_attr("is_causal", 1)}, 3);
  expect_near(to_doubles(out[0].tensor()), {6});
  EXPECT_EQ(out[1].tensor().shape(), (mx::Shape{1, 1, 3, 1}));
  expect_near(to_doubles(out[2].tensor()), {3, 6, 9});
}

TEST(Attention, FullyMaskedRowIsZeroNotNaN) {
  mx::array q = iota({1, 1, 2, 2}), k = iota({1, 1, 2, 2}), v = mx::ones({1, 1, 2, 2});
  mx::array mask = mx::array({false, false, true, false}, {2, 2});
  auto out = run_op("Attention", 23, {q, k, v, mask}, {int_attr("qk_matmul_output_mode", 3)}, 4);
  expect_near(to_doubles(out[0].tensor()), {0, 0, 1, 1});
  expect_near(to_doubles(out[3].tensor()), {0, 0, 1, 0});
}

TEST(Attention, GroupedQueryHeadsShareKeyValueHeads) {
  // Four query heads over two kv heads equal the same attention with each kv
  // head repeated for its two query heads.
  mx::array q = mx::sin(iota({1, 4, 3, 2}));
  mx::array k = mx::cos(iota({1, 2, 3, 2})), v = iota({1, 2, 3, 2});
  auto grouped = run_op("Attention", 23, {q, k, v});
  auto repeated = run_op("Attention", 23, {q, mx::repeat(k, 2, 1), mx::repeat(v, 2, 1)});
  expect_near(to_doubles(out0(grouped)), to_doubles(out0(repeated)));
}

TEST(Attention, ThreeDimensionalInputsSplitHeads) {
  // [B, S, H * D] with 2 heads equals the 4-D op on the split heads.
  mx::array q = mx::sin(iota({1, 3, 4})), k = mx::cos(iota({1, 3, 4})), v = iota({1, 3, 4});
  auto split = [](const mx::array& x) { return mx::transpose(mx::reshape(x, {1, 3, 2, 2}), {0, 2, 1, 3}); };
  auto three_d =
      run_op("Attention", 23, {q, k, v}, {int_attr("q_num_heads", 2), int_attr("kv_num_heads", 2)});
  auto four_d = run_op("Attention", 23, {split(q), split(k), split(v)});
  EXPECT_EQ(out0(three_d).shape(), (mx::Shape{1, 3, 4}));
  mx::array merged = mx::reshape(mx::transpose(out0(four_d), {0, 2, 1, 3}), {1, 3, 4});
  expect_near(to_doubles(out0(three_d)), to_doubles(merged));
}

TEST(Attention, ShortMaskPadsWithMaskedKeys) {
  // A float mask for the first key only: the second key is masked out.
  mx::array q = mx::zeros({1, 1, 1, 1}), k = mx::zeros({1, 1, 2, 1});
  mx::array v = mx::array({4.f, 8.f}, {1, 1, 2, 1});
  auto out = run_op("Attention", 24, {q, k, v, mx::zeros({1, 1})});
  expect_near(to_doubles(out0(out)), {4});
}

TEST(Attention, TracedNonpadLengthMatchesEager) {
  mx::array q = mx::sin(iota({2, 1, 2, 2})), k = mx::cos(iota({2, 1, 4, 2})), v = iota({2, 1, 4, 2});
  mx::array nonpad = i64({3, 4});
  std::vector<Value> inputs = {q, k, v, Value(), Value(), Value(), nonpad};
  auto eager = run_op("Attention", 24, inputs, {int_attr("is_causal", 1)});
  auto compiled = run_compiled("Attention", 24, inputs, {0, 1, 2, 6}, {int_attr("is_causal", 1)});
  expect_near(to_doubles(compiled[0]), to_doubles(out0(eager)));
  // Batch 0 holds 3 valid keys: its last query (offset 3 - 2 = 1) attends
  // keys 0..2 and never the padding key 3.
  mx::array only_valid = mx::slice(k, {0, 0, 0, 0}, {1, 1, 3, 2});
  auto trimmed = run_op(
      "Attention", 23,
      {mx::slice(q, {0, 0, 1, 0}, {1, 1, 2, 2}), only_valid, mx::slice(v, {0, 0, 0, 0}, {1, 1, 3, 2})});
  std::vector<double> row = to_doubles(mx::slice(out0(eager), {0, 0, 1, 0}, {1, 1, 2, 2}));
  expect_near(row, to_doubles(out0(trimmed)));
}

TEST(Attention, SlidingWindowLimitsKeys) {
  // v25: left_window_size 0 with is_causal lets each query see only itself.
  mx::array q = mx::zeros({1, 1, 3, 1}), k = mx::zeros({1, 1, 3, 1});
  mx::array v = mx::array({1.f, 2.f, 3.f}, {1, 1, 3, 1});
  auto out = run_op("Attention", 25, {q, k, v}, {int_attr("is_causal", 1), int_attr("left_window_size", 0)});
  expect_near(to_doubles(out0(out)), {1, 2, 3});
}

TEST(Attention, BadInputsNameTheNode) {
  mx::array x4 = mx::zeros({1, 1, 2, 2}), x3 = mx::zeros({1, 2, 2});
  EXPECT_NE(op_error([&] { run_op("Attention", 23, {x3, x3, x3}); }).find("q_num_heads"), std::string::npos);
  EXPECT_NE(op_error([&] { run_op("Attention", 23, {x4, x3, x3}); }).find("3-D or all 4-D"),
            std::string::npos);
  EXPECT_NE(op_error([&] { run_op("Attention", 23, {x4, x4, x4, Value(), x4}); }).find("together"),
            std::string::npos);
  EXPECT_NE(op_error([&] {
              run_op("Attention", 24, {x4, x4, x4, Value(), x4, x4, i64({2})});
            }).find("nonpad_kv_seqlen"),
            std::string::npos);
  EXPECT_NE(op_error([&] {
              run_op("Attention", 23, {x4, x4, x4}, {int_attr("qk_matmul_output_mode", 4)});
            }).find("qk_matmul_output_mode"),
            std::string::npos);
  EXPECT_NE(op_error([&] {
              run_op("Attention", 23, {x4, x4, x4}, {int_attr("softmax_precision", 7)});
            }).find("softmax_precision"),
            std::string::npos);
  EXPECT_NE(op_error([&] { run_op("Attention", 23, {x4, x4, x4, mx::zeros({2, 3})}); }).find("attn_mask"),
            std::string::npos);
  mx::array three_heads = mx::zeros({1, 3, 2, 2}), two_heads = mx::zeros({1, 2, 2, 2});
  EXPECT_NE(op_error([&] { run_op("Attention", 23, {three_heads, two_heads, two_heads}); }).find("multiple"),
            std::string::npos);
  mx::array ints = mx::zeros({1, 1, 2, 2}, mx::int32);
  EXPECT_NE(op_error([&] { run_op("Attention", 23, {ints, ints, ints}); }).find("floating-point"),
            std::string::npos);
  std::string message =
      op_error([&] { run_op("Attention", 25, {x4, x4, x4}, {int_attr("q_num_heads", 1)}); });
  EXPECT_NE(message.find("[Attention v25]"), std::string::npos) << message;
}

// --- RMSNormalization ----------------------------------------------------------------

TEST(RMSNormalization, LastAxisMatchesHandComputed) {
  // Row [3, 4]: mean square 12.5.
  mx::array x = mx::array({3.f, 4.f, 0.f, 2.f}, {2, 2});
  auto out = run_op("RMSNormalization", 23, {x, mx::array({1.f, 2.f})}, {float_attr("epsilon", 0.f)});
  const double r = 1 / std::sqrt(12.5);
  expect_near(to_doubles(out0(out)), {3 * r, 8 * r, 0, 2 * std::sqrt(2.0)});
}

TEST(RMSNormalization, InnerAxisAndHalfInput) {
  // axis 0 of [2, 2]: one group {1, 1, 1, 1} -> 1 each; float16 stays float16.
  mx::array x = mx::ones({2, 2}, mx::float16);
  auto out = run_op("RMSNormalization", 23, {x, mx::full({2, 2}, 3.f, mx::float16)},
                    {int_attr("axis", 0), float_attr("epsilon", 0.f)});
  EXPECT_EQ(out0(out).dtype(), mx::float16);
  expect_near(to_doubles(out0(out)), {3, 3, 3, 3});
}

TEST(RMSNormalization, BadAxisNamesTheNode) {
  std::string message = op_error(
      [] { run_op("RMSNormalization", 23, {mx::ones({2, 2}), mx::ones({2})}, {int_attr("axis", 2)}); });
  EXPECT_NE(message.find("[RMSNormalization v23]"), std::string::npos) << message;
  EXPECT_NE(op_error([] {
              run_op("RMSNormalization", 23, {mx::ones({2}, mx::int32), mx::ones({2})});
            }).find("floating-point"),
            std::string::npos);
}

// --- RotaryEmbedding ----------------------------------------------------------------

// A cos or sin cache of `positions` rows of `half` entries, all `value`.
mx::array cache_of(double value, int positions, int half) {
  return mx::full({positions, half}, static_cast<float>(value));
}

TEST(RotaryEmbedding, QuarterTurnRotatesHalves) {
  // cos 0, sin 1: (x1, x2) -> (-x2, x1) for the halves [x1 | x2].
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f}, {1, 1, 1, 4});
  auto out = run_op("RotaryEmbedding", 23, {x, cache_of(0, 2, 2), cache_of(1, 2, 2), i64({1}, {1, 1})});
  expect_near(to_doubles(out0(out)), {-3, -4, 1, 2});
}

TEST(RotaryEmbedding, InterleavedAndPartial) {
  // Interleaved pairs (1, 2) rotate to (-2, 1); features past rotary_embedding_dim stay.
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f}, {1, 1, 1, 4});
  auto out = run_op("RotaryEmbedding", 23, {x, cache_of(0, 1, 1), cache_of(1, 1, 1), i64({0}, {1, 1})},
                    {int_attr("interleaved", 1), int_attr("rotary_embedding_dim", 2)});
  expect_near(to_doubles(out0(out)), {-2, 1, 3, 4});
}

TEST(RotaryEmbedding, ThreeDimensionalInputUsesNumHeads) {
  // [B, S, H * D] with 2 heads of 2 features; per-token caches (no position_ids).
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f}, {1, 1, 4});
  mx::array cos = mx::zeros({1, 1, 1}), sin = mx::ones({1, 1, 1});
  auto out = run_op("RotaryEmbedding", 23, {x, cos, sin}, {int_attr("num_heads", 2)});
  expect_near(to_doubles(out0(out)), {-2, 1, -4, 3});
}

TEST(RotaryEmbedding, PositionIdsAreCheckedOrClamped) {
  mx::array x = mx::ones({1, 1, 1, 2});
  std::vector<Value> inputs = {x, cache_of(0, 2, 1), cache_of(1, 2, 1), i64({5}, {1, 1})};
  EXPECT_NE(op_error([&] { run_op("RotaryEmbedding", 23, inputs); }).find("position id 5"),
            std::string::npos);
  // Traced ids cannot be checked: they are clamped to the last position.
  auto out = run_compiled("RotaryEmbedding", 23, inputs, {0, 3});
  expect_near(to_doubles(out[0]), {-1, 1});
}

TEST(RotaryEmbedding, BadAttributesNameTheNode) {
  mx::array x = mx::ones({1, 1, 1, 4});
  std::vector<Value> inputs = {x, cache_of(0, 1, 2), cache_of(1, 1, 2), i64({0}, {1, 1})};
  EXPECT_NE(op_error([&] {
              run_op("RotaryEmbedding", 23, inputs, {int_attr("rotary_embedding_dim", 3)});
            }).find("rotary_embedding_dim 3"),
            std::string::npos);
  EXPECT_NE(op_error([&] {
              run_op("RotaryEmbedding", 23,
                     {mx::ones({1, 1, 4}), mx::zeros({1, 1, 2}), mx::zeros({1, 1, 2})});
            }).find("num_heads"),
            std::string::npos);
  EXPECT_NE(op_error([&] {
              run_op("RotaryEmbedding", 23, {x, cache_of(0, 1, 1), cache_of(1, 1, 1), i64({0}, {1, 1})});
            }).find("cos/sin rows"),
            std::string::npos);
}

// --- TensorScatter ------------------------------------------------------------------

TEST(TensorScatter, LinearWritesAtEachBatchIndex) {
  // Cache [2, 4, 1], update [2, 2, 1] along axis 1, written at 1 and 2.
  mx::array cache = mx::zeros({2, 4, 1}), update = mx::array({1.f, 2.f, 3.f, 4.f}, {2, 2, 1});
  auto out = run_op("TensorScatter", 24, {cache, update, i64({1, 2})}, {int_attr("axis", 1)});
  expect_near(to_doubles(out0(out)), {0, 1, 2, 0, 0, 0, 3, 4});
}

TEST(TensorScatter, CircularWrapsAndTracedIndicesWork) {
  mx::array cache = mx::zeros({1, 3}), update = mx::array({1.f, 2.f}, {1, 2});
  std::vector<Value> inputs = {cache, update, i64({2})};
  std::vector<Attribute> attrs = {int_attr("axis", 1), string_attr("mode", "circular")};
  expect_near(to_doubles(out0(run_op("TensorScatter", 24, inputs, attrs))), {2, 0, 1});
  expect_near(to_doubles(run_compiled("TensorScatter", 24, inputs, {0, 1, 2}, attrs)[0]), {2, 0, 1});
  // Linear mode drops what would land past the end.
  expect_near(to_doubles(out0(run_op("TensorScatter", 24, inputs, {int_attr("axis", 1)}))), {0, 0, 1});
}

TEST(TensorScatter, BadInputsNameTheNode) {
  mx::array cache = mx::zeros({1, 3}), update = mx::zeros({1, 2});
  EXPECT_NE(
      op_error([&] { run_op("TensorScatter", 24, {cache, update}, {int_attr("axis", 0)}); }).find("axis"),
      std::string::npos);
  EXPECT_NE(op_error([&] {
              run_op("TensorScatter", 24, {cache, mx::zeros({1, 4})}, {int_attr("axis", 1)});
            }).find("does not fit"),
            std::string::npos);
  EXPECT_NE(op_error([&] {
              run_op("TensorScatter", 24, {cache, update},
                     {int_attr("axis", 1), string_attr("mode", "ring")});
            }).find("mode"),
            std::string::npos);
}

// --- SwiGLU ---------------------------------------------------------------------------

TEST(SwiGLU, GatesTheValueWithSwish) {
  mx::array a = mx::array({0.f, 2.f}), b = mx::array({5.f, 3.f});
  auto out = run_op("SwiGLU", 28, {a, b}, {float_attr("alpha", 0.5f)});
  expect_near(to_doubles(out0(out)), {0, 2 / (1 + std::exp(-1.0)) * 3});
  EXPECT_NE(op_error([&] { run_op("SwiGLU", 28, {a, mx::zeros({3})}); }).find("same shape"),
            std::string::npos);
}

// --- LinearAttention --------------------------------------------------------------------

TEST(LinearAttention, LinearRuleAccumulatesOuterProducts) {
  // One head, d_k = d_v = 1, scale 1: o_t = q_t * sum_{s <= t} k_s v_s.
  mx::array q = mx::array({1.f, 2.f}, {1, 2, 1}), k = mx::array({3.f, 4.f}, {1, 2, 1});
  mx::array v = mx::array({5.f, 6.f}, {1, 2, 1});
  auto out = run_op("LinearAttention", 27, {q, k, v},
                    {int_attr("q_num_heads", 1), int_attr("kv_num_heads", 1),
                     string_attr("update_rule", "linear"), float_attr("scale", 1.f)},
                    2);
  expect_near(to_doubles(out[0].tensor()), {15, 2 * (15 + 24)});
  expect_near(to_doubles(out[1].tensor()), {39});
}

TEST(LinearAttention, RuleInputsAreChecked) {
  mx::array x = mx::ones({1, 1, 1});
  std::vector<Attribute> heads = {int_attr("q_num_heads", 1), int_attr("kv_num_heads", 1)};
  EXPECT_NE(op_error([&] { run_op("LinearAttention", 27, {x, x, x}, heads, 2); }).find("decay"),
            std::string::npos);
  EXPECT_NE(op_error([&] {
              run_op("LinearAttention", 27, {x, x, x},
                     {int_attr("q_num_heads", 3), int_attr("kv_num_heads", 2)}, 2);
            }).find("multiple"),
            std::string::npos);
}

// --- CausalConvWithState ------------------------------------------------------------------

TEST(CausalConvWithState, ConvolvesAfterThePastState) {
  // One channel, kernel [1, 10], past [7]: y_t = x_{t-1} + 10 x_t.
  mx::array x = mx::array({1.f, 2.f}, {1, 1, 2}), w = mx::array({1.f, 10.f}, {1, 1, 2});
  auto out = run_op("CausalConvWithState", 27, {x, w, mx::array({0.5f}), mx::array({7.f}, {1, 1, 1})}, {}, 2);
  expect_near(to_doubles(out[0].tensor()), {17.5, 21.5});
  expect_near(to_doubles(out[1].tensor()), {2});
  EXPECT_NE(
      op_error([&] { run_op("CausalConvWithState", 27, {x, mx::ones({1, 2, 2})}, {}, 2); }).find("weight"),
      std::string::npos);
}

}  // namespace
}  // namespace transmuter
