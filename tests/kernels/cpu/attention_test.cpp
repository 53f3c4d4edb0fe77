// The attention kernel against an independent composition: head and value
// sizes around the SIMD widths, broadcast masks, causal, grouped-query heads,
// query blocks, gradients, compile, fallbacks.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include "support/simd_targets.h"

#include <limits>
#include <string>
#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// Scores are sums of D products in another order than MLX's matmul (a few
// ulps of values ~10), then exp; outputs are convex combinations of V (|V|
// ~1). 1e-5 leaves room for that and still catches any wrong index.
constexpr float kTolerance = 1e-5f;
const float kInf = std::numeric_limits<float>::infinity();

// Independent of the kernel's reference: K and V repeated per query head, an
// explicit lower triangle, zeros for rows with nothing to attend.
mx::array expected(const mx::array& q, const mx::array& k, const mx::array& v, const std::optional<mx::array>& mask,
                   const SoftmaxOptions& o) {
  const int group = q.shape(1) / k.shape(1);
  mx::array kr = mx::repeat(k, group, 1), vr = mx::repeat(v, group, 1);
  mx::array scores = mx::matmul(q, mx::swapaxes(kr, -1, -2)) * o.scale;
  if (mask) scores = scores + *mask;
  if (o.causal) {
    mx::array allowed = mx::tri(q.shape(2), k.shape(2), static_cast<int>(o.causal_offset), mx::bool_);
    scores = mx::where(allowed, scores, mx::array(-kInf));
  }
  mx::array probs = mx::softmax(scores, -1, /*precise=*/true);
  mx::array empty = mx::isneginf(mx::max(scores, -1, /*keepdims=*/true));
  probs = mx::where(empty, mx::array(0.0f), probs);
  return mx::matmul(probs, vr);
}

struct Case {
  int batch, q_heads, kv_heads, queries, keys, head_dim, value_dim;
  std::optional<mx::Shape> mask;
  bool causal;
  int64_t offset;
};

std::string describe(const Case& c) {
  return "B" + std::to_string(c.batch) + " Hq" + std::to_string(c.q_heads) + " Hkv" + std::to_string(c.kv_heads) +
         " Sq" + std::to_string(c.queries) + " Sk" + std::to_string(c.keys) + " D" + std::to_string(c.head_dim) +
         " Dv" + std::to_string(c.value_dim) + " mask " + std::to_string(c.mask.has_value()) + " causal " +
         std::to_string(c.causal) + " offset " + std::to_string(c.offset);
}

// A case's softmax: scaled by 1 / sqrt(D), its causal limit, empty rows as zeros.
SoftmaxOptions options_of(const Case& c) {
  return {.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
          .causal = c.causal,
          .causal_offset = c.offset,
          .zero_fully_masked_rows = true};
}

TEST(AttentionKernel, MatchesTheComposition) {
  const std::vector<Case> cases = {
      {2, 4, 4, 16, 16, 32, 32, mx::Shape{2, 1, 1, 16}, false, 0},   // BERT-like padding mask
      {1, 12, 12, 128, 128, 32, 32, std::nullopt, false, 0},          // MiniLM shape, no mask
      {2, 3, 3, 7, 9, 5, 3, mx::Shape{2, 1, 7, 9}, false, 0},         // sizes off the SIMD widths
      {1, 6, 2, 10, 10, 16, 24, std::nullopt, true, 0},               // GQA, causal
      {2, 4, 1, 3, 11, 8, 8, mx::Shape{3, 11}, true, 8},              // decoding with a cache: offset
      {1, 1, 1, 100, 37, 64, 64, mx::Shape{1, 1, 100, 37}, false, 0}, // one head: query blocks
      {1, 2, 2, 6, 4, 8, 8, std::nullopt, true, -2},                  // first rows attend nothing: zeros
  };
  // Every SIMD target: AVX-512's register tiles are wider than AVX2's.
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    uint64_t seed = 1;
    for (const Case& c : cases) {
      mx::array q = random_array({c.batch, c.q_heads, c.queries, c.head_dim}, seed++);
      mx::array k = random_array({c.batch, c.kv_heads, c.keys, c.head_dim}, seed++);
      mx::array v = random_array({c.batch, c.kv_heads, c.keys, c.value_dim}, seed++);
      std::optional<mx::array> mask;
      if (c.mask) mask = random_array(*c.mask, seed++, 2.0f);
      const SoftmaxOptions o = options_of(c);
      mx::array got = scaled_dot_product_attention(q, k, v, mask, o, mx::Device::cpu);
      EXPECT_EQ(got.shape(), (mx::Shape{c.batch, c.q_heads, c.queries, c.value_dim}))
          << target << describe(c);
      EXPECT_LT(max_abs_diff(got, expected(q, k, v, mask, o)), kTolerance) << target << describe(c);
    }
  });
  EXPECT_GE(targets, 1);
}

// q, k and v as a graph gives them: views of [B, S, H, D] projections seen as [B, H, S, D], which the
// kernel reads where they lie, a key head broadcast to every query head (stride 0), and keys whose last
// axis is not contiguous (copied first). Decode rows (< 4: keys scored in place) and blocks (transposed
// keys); grouped-query heads.
TEST(AttentionKernel, ViewsOfProjectionsMatchTheComposition) {
  auto heads_of = [](const mx::array& rows) { return mx::transpose(rows, {0, 2, 1, 3}); };
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    uint64_t seed = 301;
    for (const Case& c : std::vector<Case>{{2, 4, 2, 9, 9, 32, 24, mx::Shape{2, 1, 1, 9}, false, 0},
                                           {1, 3, 3, 2, 13, 20, 20, std::nullopt, true, 11},
                                           {1, 6, 6, 40, 40, 64, 64, std::nullopt, false, 0}}) {
      mx::array q = heads_of(random_array({c.batch, c.queries, c.q_heads, c.head_dim}, seed++));
      mx::array k = heads_of(random_array({c.batch, c.keys, c.kv_heads, c.head_dim}, seed++));
      mx::array v = heads_of(random_array({c.batch, c.keys, c.kv_heads, c.value_dim}, seed++));
      mx::eval({q, k, v});
      ASSERT_FALSE(q.flags().row_contiguous || k.flags().row_contiguous || v.flags().row_contiguous);
      std::optional<mx::array> mask;
      if (c.mask) mask = random_array(*c.mask, seed++, 2.0f);
      const SoftmaxOptions o = options_of(c);
      mx::array got = scaled_dot_product_attention(q, k, v, mask, o, mx::Device::cpu);
      EXPECT_LT(max_abs_diff(got, expected(q, k, v, mask, o)), kTolerance) << target << describe(c);
      // Written as [B, S, H, Dv]: the graph's transpose back is row-contiguous, its reshape a view.
      mx::array rows = mx::transpose(got, {0, 2, 1, 3});
      mx::eval(rows);
      EXPECT_TRUE(rows.flags().row_contiguous) << target << describe(c);
    }
    // One key/value head broadcast to four query heads, and keys given as the transpose of [.., D, S].
    mx::array q = random_array({1, 4, 12, 16}, seed++);
    mx::array k = mx::broadcast_to(random_array({1, 1, 12, 16}, seed++), {1, 4, 12, 16});
    mx::array v = mx::broadcast_to(random_array({1, 1, 12, 16}, seed++), {1, 4, 12, 16});
    const SoftmaxOptions o{.scale = 0.25f};
    EXPECT_LT(max_abs_diff(scaled_dot_product_attention(q, k, v, std::nullopt, o, mx::Device::cpu),
                           expected(q, k, v, std::nullopt, o)),
              kTolerance)
        << target << " broadcast heads";
    mx::array kt = mx::swapaxes(random_array({1, 4, 16, 12}, seed++), -1, -2);
    EXPECT_LT(max_abs_diff(scaled_dot_product_attention(q, kt, v, std::nullopt, o, mx::Device::cpu),
                           expected(q, kt, v, std::nullopt, o)),
              kTolerance)
        << target << " keys with a strided last axis";
  });
  EXPECT_GE(targets, 1);
}

// Keys and values in two runs (a cache, then a step's new rows): the same as
// over their concatenation. Decode rows (fewer than 4 queries) score the runs
// in place, longer blocks transpose both; causal limits that end in either run;
// an empty first run (a prefill with no past); a value size off the vectors.
TEST(AttentionKernel, TwoRunsOfKeysEqualTheirConcatenation) {
  struct Split {
    Case c;
    int appended;  // keys of the second run (c.keys counts both)
  };
  const std::vector<Split> cases = {
      {{1, 8, 4, 1, 321, 64, 64, mx::Shape{1, 1, 1, 321}, false, 0}, 1},  // a static cache's decode step
      {{2, 4, 2, 3, 40, 16, 16, mx::Shape{2, 1, 3, 40}, true, 37}, 3},     // rows < 4, causal into run 2
      {{1, 4, 4, 9, 20, 32, 24, std::nullopt, true, 11}, 9},               // blocks of 4: transposed keys
      {{1, 2, 1, 6, 6, 8, 5, std::nullopt, true, 0}, 6},                   // no first run (prefill)
      {{1, 2, 2, 8, 30, 8, 8, std::nullopt, true, 0}, 5},                  // causal ends in run 1
  };
  uint64_t seed = 101;
  for (const Split& split : cases) {
    const Case& c = split.c;
    const int own = c.keys - split.appended;
    mx::array q = random_array({c.batch, c.q_heads, c.queries, c.head_dim}, seed++);
    mx::array k = random_array({c.batch, c.kv_heads, own, c.head_dim}, seed++);
    mx::array v = random_array({c.batch, c.kv_heads, own, c.value_dim}, seed++);
    mx::array k_new = random_array({c.batch, c.kv_heads, split.appended, c.head_dim}, seed++);
    mx::array v_new = random_array({c.batch, c.kv_heads, split.appended, c.value_dim}, seed++);
    std::optional<mx::array> mask;
    if (c.mask) mask = random_array(*c.mask, seed++, 2.0f);
    const SoftmaxOptions o = options_of(c);
    mx::array got = scaled_dot_product_attention(q, {k, v}, {k_new, v_new}, mask, o, mx::Device::cpu);
    mx::array want = expected(q, mx::concatenate({k, k_new}, 2), mx::concatenate({v, v_new}, 2), mask, o);
    EXPECT_EQ(got.shape(), (mx::Shape{c.batch, c.q_heads, c.queries, c.value_dim})) << describe(c);
    EXPECT_LT(max_abs_diff(got, want), kTolerance) << describe(c) << " appended " << split.appended;
  }
  // A static cache's step: filled slots, empty slots ruled out by the lowest float (transformers' mask) or
  // -inf, the new row let through; per-row masks for rows < 4 (one row ruling out everything: the
  // composition's uniform weights, the kernel must not skip its keys).
  const float lowest = std::numeric_limits<float>::lowest();
  for (float ruled_out : {lowest, -kInf}) {
    const int own = 12, queries = 3;
    std::vector<float> m(queries * (own + 1), 0.0f);
    for (int j = 5; j < own; ++j) m[j] = ruled_out;                         // row 0: 5 filled slots
    for (int j = 9; j < own; ++j) m[(own + 1) + j] = ruled_out;             // row 1: 9 filled
    for (int j = 0; j <= own; ++j) m[2 * (own + 1) + j] = lowest;           // row 2: nothing let through
    mx::array mask(m.data(), {1, 1, queries, own + 1}, mx::float32);
    mx::array q = random_array({1, 4, queries, 16}, seed++);
    mx::array k = random_array({1, 2, own, 16}, seed++), v = random_array({1, 2, own, 16}, seed++);
    mx::array k_new = random_array({1, 2, 1, 16}, seed++), v_new = random_array({1, 2, 1, 16}, seed++);
    const SoftmaxOptions o{.scale = 0.25f, .zero_fully_masked_rows = true};
    mx::array got = scaled_dot_product_attention(q, {k, v}, {k_new, v_new}, mask, o, mx::Device::cpu);
    mx::array want = expected(q, mx::concatenate({k, k_new}, 2), mx::concatenate({v, v_new}, 2), mask, o);
    EXPECT_LT(max_abs_diff(got, want), kTolerance) << "ruled out by " << ruled_out;
  }
  // A second run that does not fit (other heads) runs the composition, which refuses it like concatenate.
  mx::array q = random_array({1, 2, 1, 8}, 150), k = random_array({1, 2, 5, 8}, 151);
  EXPECT_ANY_THROW(mx::eval(scaled_dot_product_attention(q, {k, k}, {random_array({1, 1, 1, 8}, 152), k}, std::nullopt,
                                                         {}, mx::Device::cpu)));
}

// Gradients come from the reference composition: equal to those of the
// independent composition above, for Q, K, V and the mask.
TEST(AttentionKernel, GradientsEqualThoseOfTheComposition) {
  mx::array q = random_array({2, 4, 5, 8}, 11);
  mx::array k = random_array({2, 2, 6, 8}, 12);
  mx::array v = random_array({2, 2, 6, 8}, 13);
  mx::array mask = random_array({2, 1, 1, 6}, 14);
  mx::array weights = random_array({2, 4, 5, 8}, 15);
  const SoftmaxOptions o{.scale = 0.35f, .causal = true, .causal_offset = 1, .zero_fully_masked_rows = true};
  auto loss_of = [&](bool kernel) {
    return [&, kernel](const std::vector<mx::array>& p) {
      mx::array y = kernel ? scaled_dot_product_attention(p[0], p[1], p[2], p[3], o, mx::Device::cpu)
                           : expected(p[0], p[1], p[2], p[3], o);
      return std::vector<mx::array>{mx::sum(y * weights)};
    };
  };
  std::vector<mx::array> primals = {q, k, v, mask};
  auto [_, got] = mx::vjp(loss_of(true), primals, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss_of(false), primals, {mx::array(1.0f)});
  for (size_t i = 0; i < primals.size(); ++i) EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-4f) << "input " << i;
}

TEST(AttentionKernel, RunsInsideCompile) {
  mx::array q = random_array({1, 2, 8, 16}, 21);
  mx::array k = random_array({1, 2, 8, 16}, 22);
  mx::array v = random_array({1, 2, 8, 16}, 23);
  const SoftmaxOptions o{.scale = 0.25f};
  auto f = mx::compile([o](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        scaled_dot_product_attention(mx::multiply(in[0], mx::array(2.0f)), in[1], in[2], std::nullopt, o,
                                     mx::Device::cpu)};
  });
  EXPECT_LT(max_abs_diff(f({q, k, v})[0], expected(q * 2.0f, k, v, std::nullopt, o)), kTolerance);
}

// Inputs the kernel does not take run the composition: same values.
TEST(AttentionKernel, OtherDtypesAndMasksUseTheComposition) {
  mx::array q = random_array({1, 2, 4, 8}, 31);
  mx::array k = random_array({1, 2, 5, 8}, 32);
  mx::array v = random_array({1, 2, 5, 8}, 33);
  mx::array column_mask = random_array({1, 2, 4, 1}, 34);  // last axis 1
  const SoftmaxOptions o{.scale = 0.5f};
  EXPECT_LT(max_abs_diff(scaled_dot_product_attention(q, k, v, column_mask, o, mx::Device::cpu),
                         expected(q, k, v, column_mask, o)),
            kTolerance);
  auto half = [](const mx::array& a) { return mx::astype(a, mx::float16); };
  mx::array yh = scaled_dot_product_attention(half(q), half(k), half(v), std::nullopt, o, mx::Device::cpu);
  EXPECT_EQ(yh.dtype(), mx::float16);
  EXPECT_LT(max_abs_diff(mx::astype(yh, mx::float32), expected(q, k, v, std::nullopt, o)), 1e-2f);
}

TEST(AttentionKernel, NoKeysGivesZeros) {
  mx::array q = random_array({1, 2, 3, 4}, 41);
  mx::array k = mx::zeros({1, 2, 0, 4});
  mx::array v = mx::zeros({1, 2, 0, 6});
  mx::array y = scaled_dot_product_attention(q, k, v, std::nullopt, {.zero_fully_masked_rows = true}, mx::Device::cpu);
  EXPECT_EQ(y.shape(), (mx::Shape{1, 2, 3, 6}));
  EXPECT_EQ(mx::max(mx::abs(y)).item<float>(), 0.0f);
}

}  // namespace
}  // namespace transmuter::kernels
