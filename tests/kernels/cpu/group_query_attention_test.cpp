// The GroupQueryAttention step kernel against a plain loop implementation of ONNX Runtime's
// contract written here: packed and separate QKV, first prompts with and without a buffer,
// decode steps with ragged batches, rotary halves and interleaved pairs (partial), local window,
// softcap, sinks, head sizes off the SIMD width, lengths past the buffer, compile.
// (The operator against ONNX Runtime itself: the contrib cases, scripts/contrib_cases/attention.py.)
#include "kernels/cpu/group_query_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "support/random_arrays.h"
#include "support/simd_targets.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// Scores sum H products in another order than the loops below (a few ulps of values ~10), then
// exp; outputs are convex combinations of V (|V| ~ 1). Presents are copies and one rotation.
constexpr float kTolerance = 2e-5f;

std::vector<float> host(const mx::array& a) {
  mx::array dense = mx::astype(mx::contiguous(a), mx::float32);
  mx::eval(dense);
  return {dense.data<float>(), dense.data<float>() + dense.size()};
}

struct Inputs {
  mx::array q, k, v, past_key, past_value, seqlens, cos, sin, sink;
};

// ORT's contract, one value at a time.
std::vector<mx::array> expected(const Inputs& in, const GroupQueryAttentionSpec& spec) {
  const int batch = in.q.shape(0), sequence = in.q.shape(1), dim = spec.head_size;
  const int kv = spec.kv_heads, heads = spec.heads, rows = spec.capacity, past_rows = in.past_key.shape(2);
  const std::vector<float> q = host(in.q), k = host(in.k), v = host(in.v), pk = host(in.past_key),
                           pv = host(in.past_value), cos = host(in.cos), sin = host(in.sin),
                           sink = host(in.sink);
  const std::vector<float> lengths = host(in.seqlens);
  const int half = spec.rotary ? in.cos.shape(1) : 0, cache = spec.rotary ? in.cos.shape(0) : 1;
  auto rotate = [&](const float* x, int64_t position) {
    std::vector<float> y(x, x + dim);
    const int64_t row = std::clamp<int64_t>(position, 0, cache - 1);
    for (int t = 0; t < half; ++t) {
      const int a = spec.interleaved ? 2 * t : t, b = spec.interleaved ? 2 * t + 1 : t + half;
      y[a] = x[a] * cos[row * half + t] - x[b] * sin[row * half + t];
      y[b] = x[a] * sin[row * half + t] + x[b] * cos[row * half + t];
    }
    return y;
  };
  std::vector<float> present_key(static_cast<size_t>(batch) * kv * rows * dim, 0.0f),
      present_value = present_key;
  std::vector<float> out(static_cast<size_t>(batch) * sequence * heads * dim, 0.0f);
  for (int b = 0; b < batch; ++b) {
    const int64_t valid = static_cast<int64_t>(lengths[b]) + 1;
    const int64_t start = spec.first_prompt ? 0 : valid - sequence;
    for (int g = 0; g < kv; ++g) {
      float* key = present_key.data() + (int64_t{b} * kv + g) * rows * dim;
      float* value = present_value.data() + (int64_t{b} * kv + g) * rows * dim;
      for (int64_t j = 0; j < std::min<int64_t>(start, rows); ++j) {
        for (int d = 0; d < dim && j < past_rows; ++d) {
          key[j * dim + d] = pk[((int64_t{b} * kv + g) * past_rows + j) * dim + d];
          value[j * dim + d] = pv[((int64_t{b} * kv + g) * past_rows + j) * dim + d];
        }
      }
      for (int i = 0; i < sequence; ++i) {
        const int64_t position = start + i;
        if (position < 0 || position >= rows) continue;
        const int64_t token = int64_t{b} * sequence + i;
        std::vector<float> rotated = rotate(&k[token * in.k.shape(2) + spec.k_column + g * dim], position);
        for (int d = 0; d < dim; ++d) {
          key[position * dim + d] = rotated[d];
          value[position * dim + d] = v[token * in.v.shape(2) + spec.v_column + g * dim + d];
        }
      }
    }
    for (int i = 0; i < sequence; ++i) {
      const int64_t position = start + i, token = int64_t{b} * sequence + i;
      for (int h = 0; h < heads; ++h) {
        std::vector<float> query = rotate(&q[token * in.q.shape(2) + spec.q_column + h * dim], position);
        const int g = h / (heads / kv);
        const float* key = present_key.data() + (int64_t{b} * kv + g) * rows * dim;
        const float* value = present_value.data() + (int64_t{b} * kv + g) * rows * dim;
        std::vector<double> weight(rows, 0.0);
        double top = spec.sink ? sink[h] : -INFINITY;
        for (int j = 0; j < rows; ++j) {
          const bool seen = j < valid && (!spec.causal || j <= position) &&
                            (spec.window <= 0 || j > position - spec.window);
          if (!seen) continue;
          double score = 0;
          for (int d = 0; d < dim; ++d) score += double{query[d]} * key[j * dim + d];
          score *= spec.scale;
          if (spec.softcap > 0) score = spec.softcap * std::tanh(score / spec.softcap);
          weight[j] = score;
          top = std::max(top, score);
        }
        double total = spec.sink ? std::exp(sink[h] - top) : 0.0;
        std::vector<bool> seen_any(rows, false);
        for (int j = 0; j < rows; ++j) {
          const bool seen = j < valid && (!spec.causal || j <= position) &&
                            (spec.window <= 0 || j > position - spec.window);
          seen_any[j] = seen;
          weight[j] = seen ? std::exp(weight[j] - top) : 0.0;
          total += weight[j];
        }
        if (total == 0) continue;  // nothing to attend: zeros
        float* o = out.data() + (token * heads + h) * dim;
        for (int j = 0; j < rows; ++j) {
          if (!seen_any[j]) continue;
          for (int d = 0; d < dim; ++d) o[d] += static_cast<float>(weight[j] / total * value[j * dim + d]);
        }
      }
    }
  }
  auto array = [](const std::vector<float>& data, mx::Shape shape) { return mx::array(data.begin(), shape); };
  return {array(out, {batch, sequence, heads * dim}), array(present_key, {batch, kv, rows, dim}),
          array(present_value, {batch, kv, rows, dim})};
}

struct Case {
  std::string name;
  int batch, sequence, heads, kv_heads, head_size, past_rows, capacity;
  std::vector<int> seqlens;
  bool first_prompt, packed, causal = true;
  int rotary_half = 0;
  bool interleaved = false;
  int64_t window = -1;
  float softcap = 0.0f;
  bool sink = false;
};

Inputs make_inputs(const Case& c, GroupQueryAttentionSpec& spec, uint64_t seed) {
  const int h = c.head_size, qw = c.heads * h, kw = c.kv_heads * h;
  Inputs in{.q = random_array({c.batch, c.sequence, c.packed ? qw + 2 * kw : qw}, seed),
            .k = random_array({c.batch, c.sequence, kw}, seed + 1),
            .v = random_array({c.batch, c.sequence, kw}, seed + 2),
            .past_key = random_array({c.batch, c.kv_heads, c.past_rows, h}, seed + 3),
            .past_value = random_array({c.batch, c.kv_heads, c.past_rows, h}, seed + 4),
            .seqlens = mx::array(c.seqlens.data(), {c.batch}, mx::int32),
            .cos = mx::array(0.0f),
            .sin = mx::array(0.0f),
            .sink = c.sink ? random_array({c.heads}, seed + 5) : mx::array(0.0f)};
  if (c.packed) {
    in.k = in.q;
    in.v = in.q;
  }
  if (c.rotary_half > 0) {
    mx::array angle = mx::multiply(mx::reshape(mx::arange(64, mx::float32), {64, 1}),
                                   mx::reshape(mx::arange(c.rotary_half, mx::float32), {1, c.rotary_half}));
    in.cos = mx::cos(mx::multiply(angle, mx::array(0.1f)));
    in.sin = mx::sin(mx::multiply(angle, mx::array(0.1f)));
  }
  spec = {.heads = c.heads,
          .kv_heads = c.kv_heads,
          .head_size = h,
          .q_column = 0,
          .k_column = c.packed ? qw : 0,
          .v_column = c.packed ? qw + kw : 0,
          .capacity = c.capacity,
          .first_prompt = c.first_prompt,
          .causal = c.causal,
          .window = c.window,
          .scale = 1.0f / std::sqrt(static_cast<float>(h)),
          .softcap = c.softcap,
          .rotary = c.rotary_half > 0,
          .interleaved = c.interleaved,
          .sink = c.sink};
  return in;
}

// The step as the operator runs it: both cache writes, then the attention; `reference` stands in for
// each kernel's reference (returning its first input, or recording that it ran).
std::vector<mx::array> step(const Inputs& in, const GroupQueryAttentionSpec& spec,
                            const Reference& reference) {
  mx::array key = kv_cache_write({in.past_key, in.k, in.seqlens, in.cos, in.sin},
                                 kv_write_spec(spec, spec.k_column, spec.rotary), reference, mx::Device::cpu);
  mx::array value = kv_cache_write({in.past_value, in.v, in.seqlens, in.cos, in.sin},
                                   kv_write_spec(spec, spec.v_column, false), reference, mx::Device::cpu);
  mx::array y = group_query_attention({in.q, key, value, in.seqlens, in.cos, in.sin, in.sink}, spec,
                                      reference, mx::Device::cpu);
  return {y, key, value};
}

TEST(GroupQueryAttentionKernel, MatchesOrtsContract) {
  const std::vector<Case> cases = {
      // SmolLM2-135M's decode step: 9 heads on 3, packed, rotary halves.
      {"decode_smollm", 1, 1, 9, 3, 64, 40, 40, {25}, false, true, true, 32},
      {"decode_ragged_window_softcap_sink",
       3,
       1,
       4,
       2,
       16,
       8,
       8,
       {7, 2, 5},
       false,
       false,
       true,
       4,
       true,
       3,
       2.0f,
       true},
      {"first_prompt_padded_no_past", 2, 5, 4, 2, 16, 0, 5, {4, 2}, true, false, true, 8},
      {"first_prompt_into_buffer", 2, 5, 4, 1, 16, 8, 8, {4, 3}, true, true, true, 8, true},
      {"subsequent_prompt_noncausal", 1, 5, 8, 2, 16, 3, 8, {7}, false, false, false},
      {"head_size_off_simd", 2, 2, 2, 1, 20, 6, 6, {5, 3}, false, false, true, 6},
      {"decode_past_shorter_than_total",
       1,
       1,
       2,
       2,
       8,
       4,
       6,
       {5},
       false,
       true,
       true,
       0,
       false,
       -1,
       0.0f,
       true},
      // A long cache: the keys split into several blocks per kv head (ragged rows: some blocks of the
      // shorter row see no keys).
      {"decode_long_ragged", 2, 1, 9, 3, 64, 400, 400, {390, 250}, false, true, true, 32},
      // Qwen2.5-0.5B's groups of 7 query heads (scored 4 + 2 + 1 at a time), a head size off the lanes.
      {"decode_groups_of_seven", 1, 1, 14, 2, 20, 150, 150, {149}, false, false, true, 8},
      // Several steps' queries over a long cache, a window that starts inside a block, softcap, sink.
      {"steps_long_window_softcap_sink",
       1,
       4,
       4,
       2,
       16,
       300,
       300,
       {280},
       false,
       false,
       true,
       8,
       false,
       100,
       2.0f,
       true},
      // A length past the buffer (a traced bad seqlens_k): nothing is written outside.
      {"length_past_buffer", 1, 1, 2, 1, 8, 4, 4, {9}, false, false, true, 4},
  };
  // Every SIMD target's code: the rows scored four, two or one at a time, vectors of 16, 8 or 4 lanes.
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    uint64_t seed = 100;
    for (const Case& c : cases) {
      GroupQueryAttentionSpec spec;
      const Inputs in = make_inputs(c, spec, seed += 10);
      bool reference_ran = false;
      Reference reference = [&](const std::vector<mx::array>& x) {
        reference_ran = true;
        return std::vector<mx::array>{x[0]};
      };
      std::vector<mx::array> got = step(in, spec, reference);
      ASSERT_FALSE(reference_ran) << c.name << ": the kernel did not take these inputs";
      std::vector<mx::array> want = expected(in, spec);
      ASSERT_EQ(got.size(), 3u) << c.name;
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(got[i].shape(), want[i].shape()) << target << " " << c.name << " output " << i;
        EXPECT_LT(max_abs_diff(got[i], want[i]), kTolerance) << target << " " << c.name << " output " << i;
      }
    }
  });
  EXPECT_GE(targets, 1);
}

// Views (a transposed source) are copied dense before the kernel reads them.
TEST(GroupQueryAttentionKernel, ReadsViews) {
  const Case c{"view", 1, 3, 2, 1, 8, 0, 3, {2}, true, false, true, 4};
  GroupQueryAttentionSpec spec;
  Inputs in = make_inputs(c, spec, 7);
  // The same values as a transposed view of a dense array (not row-contiguous once evaluated).
  in.q = mx::transpose(mx::contiguous(mx::transpose(in.q, {2, 1, 0})), {2, 1, 0});
  Reference unused = [](const std::vector<mx::array>& x) { return x; };
  std::vector<mx::array> got = step(in, spec, unused);
  EXPECT_LT(max_abs_diff(got[0], expected(in, spec)[0]), kTolerance);
}

TEST(GroupQueryAttentionKernel, RunsInsideCompile) {
  const Case c{"compiled", 2, 1, 4, 2, 16, 6, 6, {5, 3}, false, true, true, 8};
  GroupQueryAttentionSpec spec;
  const Inputs in = make_inputs(c, spec, 3);
  Reference unused = [](const std::vector<mx::array>& x) { return x; };
  auto compiled = mx::compile([spec, unused](const std::vector<mx::array>& x) {
    return step({x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8]}, spec, unused);
  });
  std::vector<mx::array> got = compiled({in.q, in.k, in.v, in.past_key, in.past_value, in.seqlens, in.cos,
                                         in.sin, in.sink}),
                         want = expected(in, spec);
  for (int i = 0; i < 3; ++i) EXPECT_LT(max_abs_diff(got[i], want[i]), kTolerance) << "output " << i;
}

// Inputs the kernel does not read (here float16) go to the reference.
TEST(GroupQueryAttentionKernel, OtherInputsRunTheReference) {
  const Case c{"half", 1, 1, 2, 1, 8, 4, 4, {3}, false, false};
  GroupQueryAttentionSpec spec;
  Inputs in = make_inputs(c, spec, 5);
  in.q = mx::astype(in.q, mx::float16);
  bool reference_ran = false;
  Reference reference = [&](const std::vector<mx::array>& x) {
    reference_ran = true;
    return std::vector<mx::array>{x[0]};
  };
  group_query_attention({in.q, in.past_key, in.past_value, in.seqlens, in.cos, in.sin, in.sink}, spec,
                        reference, mx::Device::cpu);
  EXPECT_TRUE(reference_ran);
}

// A static cache's decode step: when the graph holds the past's last reference, the present takes its
// buffer (no copy of the cache): its rows before the new token are the past's, the new one is written,
// and the rows after keep the past's values (ONNX Runtime's shared buffer; no query reads them).
TEST(GroupQueryAttentionKernel, PresentTakesOverAPastNothingElseHolds) {
  const Case c{"static_cache", 2, 1, 4, 2, 16, 12, 12, {6, 3}, false, true, true, 8};
  GroupQueryAttentionSpec spec;
  Inputs in = make_inputs(c, spec, 11);  // random past rows everywhere, also after the new token
  const std::vector<mx::array> want = expected(in, spec);
  mx::eval(in.past_key);
  const float* past_buffer = in.past_key.data<float>();
  // Expected: ORT's contract up to the new token, the past's rows after it.
  const std::vector<float> past = host(in.past_key), written = host(want[1]);
  std::vector<float> shared = past;
  for (int b = 0; b < c.batch; ++b) {
    const int64_t through = c.seqlens[b] + 1;  // rows [0, T_b) hold the past's and the new token
    for (int g = 0; g < c.kv_heads; ++g) {
      const int64_t head = (int64_t{b} * c.kv_heads + g) * c.capacity * c.head_size;
      std::copy_n(written.begin() + head, through * c.head_size, shared.begin() + head);
    }
  }
  const mx::array want_shared(shared.begin(), want[1].shape());
  Reference unused = [](const std::vector<mx::array>& x) { return std::vector<mx::array>{x[0]}; };
  const KvCacheWriteSpec key_spec = kv_write_spec(spec, spec.k_column, spec.rotary);
  mx::array present = kv_cache_write({std::move(in.past_key), in.k, in.seqlens, in.cos, in.sin}, key_spec,
                                     unused, mx::Device::cpu);
  mx::eval(present);
  EXPECT_EQ(present.data<float>(), past_buffer) << "the present should reuse the past's buffer";
  EXPECT_LT(max_abs_diff(present, want_shared), kTolerance);

  // A past the caller still holds is copied, never written.
  mx::eval(in.past_value);
  const std::vector<float> before = host(in.past_value);
  mx::array copied = kv_cache_write({in.past_value, in.v, in.seqlens, in.cos, in.sin},
                                    kv_write_spec(spec, spec.v_column, false), unused, mx::Device::cpu);
  mx::eval(copied);
  EXPECT_NE(copied.data<float>(), in.past_value.data<float>());
  EXPECT_EQ(host(in.past_value), before);
  EXPECT_LT(max_abs_diff(copied, want[2]), kTolerance);
}

}  // namespace
}  // namespace transmuter::kernels
