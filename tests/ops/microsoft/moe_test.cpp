// com.microsoft MoE and QMoE: the routing and expert network against the
// formula written out with MLX, compiled against eager, and the errors for
// shapes, dtypes and attributes that the operators refuse. The cases against
// ONNX Runtime are in scripts/contrib_cases/moe.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::int_attr;
using testing::max_abs_diff;
using testing::out0;
using testing::random_array;
using testing::run_domain_op;
using testing::string_attr;

constexpr int kTokens = 5, kExperts = 4, kHidden = 8, kInter = 16;

std::vector<Value> run_moe(const std::vector<Value>& inputs, const std::vector<Attribute>& attributes = {}) {
  return run_domain_op("com.microsoft", "MoE", 1, inputs, attributes);
}

std::vector<Value> run_qmoe(const std::vector<Value>& inputs, const std::vector<Attribute>& attributes = {}) {
  return run_domain_op("com.microsoft", "QMoE", 1, inputs, attributes);
}

struct MoeInputs {
  mx::array x = random_array({kTokens, kHidden}, 1);
  mx::array router = random_array({kTokens, kExperts}, 2);
  mx::array fc1 = random_array({kExperts, kInter, kHidden}, 3, 0.3f);
  mx::array fc1_bias = random_array({kExperts, kInter}, 4, 0.1f);
  mx::array fc2 = random_array({kExperts, kHidden, kInter}, 5, 0.3f);
  mx::array fc2_bias = random_array({kExperts, kHidden}, 6, 0.1f);
  std::vector<Value> values() const { return {x, router, fc1, fc1_bias, fc2, fc2_bias}; }
};

// Float32 results of small products in a different order: a few ulps.
constexpr float kTolerance = 1e-5f;

// With k = num_experts every expert contributes: output = sum_e p_e y_e(x),
// p = softmax(router_probs), without any top-k selection to mirror.
TEST(MicrosoftMoe, AllExpertsMatchTheFormula) {
  MoeInputs in;
  mx::array y = out0(run_moe(in.values(), {int_attr("k", kExperts), string_attr("activation_type", "silu")}));
  mx::array p = mx::softmax(in.router, -1);
  mx::array want = mx::zeros({kTokens, kHidden});
  for (int e = 0; e < kExperts; ++e) {
    auto expert = [&](const mx::array& w) {
      return mx::squeeze(mx::slice(w, {e, 0, 0}, {e + 1, w.shape(1), w.shape(2)}), 0);
    };
    auto row = [&](const mx::array& b) { return mx::slice(b, {e, 0}, {e + 1, b.shape(1)}); };
    mx::array h = mx::matmul(in.x, mx::transpose(expert(in.fc1))) + row(in.fc1_bias);
    h = h * mx::sigmoid(h);
    mx::array ye = mx::matmul(h, mx::transpose(expert(in.fc2))) + row(in.fc2_bias);
    want = want + mx::slice(p, {0, e}, {kTokens, e + 1}) * ye;
  }
  EXPECT_LT(max_abs_diff(y, want), kTolerance);
}

// k = 1 with normalization: each token gets exactly its argmax expert's output.
TEST(MicrosoftMoe, TopOneNormalizedIsTheArgmaxExpert) {
  MoeInputs in;
  // Token t prefers expert t % 4.
  std::vector<float> logits(kTokens * kExperts, 0.0f);
  for (int t = 0; t < kTokens; ++t) logits[t * kExperts + t % kExperts] = 3.0f;
  in.router = mx::array(logits.data(), {kTokens, kExperts});
  mx::array y = out0(run_moe(in.values(), {int_attr("k", 1), int_attr("normalize_routing_weights", 1),
                                           string_attr("activation_type", "identity")}));
  for (int t = 0; t < kTokens; ++t) {
    const int e = t % kExperts;
    mx::array xt = mx::slice(in.x, {t, 0}, {t + 1, kHidden});
    mx::array w1 = mx::squeeze(mx::slice(in.fc1, {e, 0, 0}, {e + 1, kInter, kHidden}), 0);
    mx::array w2 = mx::squeeze(mx::slice(in.fc2, {e, 0, 0}, {e + 1, kHidden, kInter}), 0);
    mx::array h = mx::matmul(xt, mx::transpose(w1)) + mx::slice(in.fc1_bias, {e, 0}, {e + 1, kInter});
    mx::array want = mx::matmul(h, mx::transpose(w2)) + mx::slice(in.fc2_bias, {e, 0}, {e + 1, kHidden});
    EXPECT_LT(max_abs_diff(mx::slice(y, {t, 0}, {t + 1, kHidden}), want), kTolerance) << "token " << t;
  }
}

// float16 inputs are widened, computed in float32 and rounded once. (The
// compiled modes run in the contrib conformance cases.)
TEST(MicrosoftMoe, HalfIsComputedInFloat32) {
  MoeInputs in;
  std::vector<Attribute> attrs = {int_attr("k", 2), string_attr("activation_type", "gelu")};
  std::vector<Value> half, widened;
  for (const Value& v : in.values()) {
    half.push_back(mx::astype(v.tensor(), mx::float16));
    widened.push_back(mx::astype(half.back().tensor(), mx::float32));
  }
  mx::array y16 = out0(run_moe(half, attrs));
  EXPECT_EQ(y16.dtype(), mx::float16);
  // One float16 rounding of outputs of size ~1: 2^-11 relative.
  EXPECT_LT(max_abs_diff(y16, out0(run_moe(widened, attrs))), 2e-3f);
}

TEST(MicrosoftMoe, ErrorsNameTheInputAndShapes) {
  MoeInputs in;
  auto message_of = [&](std::vector<Value> inputs, const std::vector<Attribute>& attrs = {}) {
    return error_of<OpError>([&] { run_moe(inputs, attrs); });
  };
  std::vector<Value> v = in.values();
  v[1] = random_array({kTokens + 1, kExperts}, 7);
  std::string m = message_of(v);
  EXPECT_NE(m.find("test_MoE"), std::string::npos) << m;
  EXPECT_NE(m.find("router_probs must have shape [tokens=5, num_experts], got (6,4)"), std::string::npos)
      << m;
  v = in.values();
  v[2] = random_array({kExperts, kInter, kHidden + 1}, 8);
  m = message_of(v);
  EXPECT_NE(m.find("fc1_experts_weights must have shape (4,16,8) [num_experts, inter_size, hidden_size], got "
                   "(4,16,9)"),
            std::string::npos)
      << m;
  v = in.values();
  v[4] = random_array({kExperts - 1, kHidden, kInter}, 9);
  m = message_of(v);
  EXPECT_NE(m.find("fc2_experts_weights must have shape (4,8,16)"), std::string::npos) << m;
  v = in.values();
  v[5] = random_array({kExperts, kInter}, 10);
  m = message_of(v);
  EXPECT_NE(m.find("fc2_experts_bias must have shape (4,8)"), std::string::npos) << m;
  v = in.values();
  v[0] = mx::astype(in.x, mx::float16);
  m = message_of(v);
  EXPECT_NE(m.find("router_probs must have the input's dtype float16"), std::string::npos) << m;
  m = message_of(in.values(), {int_attr("k", 5)});
  EXPECT_NE(m.find("k must be in [1, num_experts=4]"), std::string::npos) << m;
  m = message_of(in.values(), {string_attr("activation_type", "tanh")});
  EXPECT_NE(m.find("activation_type must be relu, gelu, silu, identity or swiglu, got 'tanh'"),
            std::string::npos)
      << m;
  m = message_of(in.values(), {int_attr("k", 1), int_attr("use_sparse_mixer", 1)});
  EXPECT_NE(m.find("use_sparse_mixer=1 needs k=2 and at least 2 experts, got k=1"), std::string::npos) << m;
  // swiglu: fc1 holds 2 * inter_size rows, interleaved only.
  v = in.values();
  v[2] = random_array({kExperts, 2 * kInter, kHidden}, 11);
  v[3] = random_array({kExperts, 2 * kInter}, 12);
  EXPECT_EQ(
      out0(run_moe(v, {string_attr("activation_type", "swiglu"), int_attr("swiglu_fusion", 1)})).shape(),
      (mx::Shape{kTokens, kHidden}));
  m = message_of(in.values(), {string_attr("activation_type", "swiglu"), int_attr("swiglu_fusion", 1)});
  EXPECT_NE(m.find("[num_experts, 2 * inter_size, hidden_size], got (4,16,8)"), std::string::npos) << m;
  m = message_of(in.values(), {string_attr("activation_type", "swiglu"), int_attr("swiglu_fusion", 3)});
  EXPECT_NE(m.find("swiglu_fusion must be 0, 1 or 2, got 3"), std::string::npos) << m;
  m = message_of(in.values(), {string_attr("activation_type", "swiglu")});
  EXPECT_NE(m.find("swiglu with swiglu_fusion=0 needs fc3_experts_weights"), std::string::npos) << m;
  v.push_back(random_array({kExperts, kInter, kHidden}, 13));
  m = message_of(v, {string_attr("activation_type", "swiglu"), int_attr("swiglu_fusion", 1)});
  EXPECT_NE(m.find("fc3_experts_weights must be absent with swiglu_fusion=1"), std::string::npos) << m;
  v = in.values();
  v.push_back(random_array({kExperts, kInter, kHidden + 1}, 14));
  m = message_of(v);
  EXPECT_NE(m.find("fc3_experts_weights must have shape (4,16,8) [num_experts, inter_size, hidden_size]"),
            std::string::npos)
      << m;
}

// The gate and linear rows of fc1, laid out interleaved (swiglu_fusion=1),
// concatenated (2) or split into fc1 and fc3 (0), give the same output.
TEST(MicrosoftMoe, SwiGluLayoutsAgree) {
  MoeInputs in;
  mx::array gate = random_array({kExperts, kInter, kHidden}, 15, 0.3f),
            linear = random_array({kExperts, kInter, kHidden}, 16, 0.3f);
  mx::array gate_bias = random_array({kExperts, kInter}, 17, 0.1f),
            linear_bias = random_array({kExperts, kInter}, 18, 0.1f);
  auto interleave = [](const mx::array& a, const mx::array& b) {
    return mx::flatten(mx::stack({a, b}, 2), 1, 2);
  };
  std::vector<Attribute> attrs = {int_attr("k", 2), string_attr("activation_type", "swiglu"),
                                  float_attr("activation_alpha", 1.702f), float_attr("activation_beta", 1.0f),
                                  float_attr("swiglu_limit", 0.5f)};
  auto with_fusion = [&](int fusion) {
    std::vector<Attribute> a = attrs;
    a.push_back(int_attr("swiglu_fusion", fusion));
    return a;
  };
  mx::array interleaved = out0(run_moe(
      {in.x, in.router, interleave(gate, linear), interleave(gate_bias, linear_bias), in.fc2, in.fc2_bias},
      with_fusion(1)));
  mx::array concatenated = out0(run_moe({in.x, in.router, mx::concatenate({gate, linear}, 1),
                                         mx::concatenate({gate_bias, linear_bias}, 1), in.fc2, in.fc2_bias},
                                        with_fusion(2)));
  mx::array split = out0(
      run_moe({in.x, in.router, gate, gate_bias, in.fc2, in.fc2_bias, linear, linear_bias}, with_fusion(0)));
  EXPECT_LT(max_abs_diff(concatenated, interleaved), kTolerance);
  EXPECT_LT(max_abs_diff(split, interleaved), kTolerance);
}

// The sparse mixer (ORT's CUDA kernel) on two tokens worked by hand, eps = 0.01:
// token 0, logits [2, 1.99, 0.5, -1]: choice 1 is expert 0 with experts 0 and
// 1 inside the band (2 - 1.99 <= 2 eps 2), w = 1 / (1 + e^-0.01); choice 2 is
// expert 1 alone, w = 1. Token 1, [-1, 3, 2.95, 0]: experts 1 (w = 1 / (1 +
// e^-0.05)) and 2 (w = 1).
TEST(MicrosoftMoe, SparseMixerRoutesLikeOrtsCudaKernel) {
  MoeInputs in;
  in.x = random_array({2, kHidden}, 19);
  in.router = mx::array({2.0f, 1.99f, 0.5f, -1.0f, -1.0f, 3.0f, 2.95f, 0.0f}, {2, kExperts});
  mx::array y = out0(run_moe(in.values(), {int_attr("k", 2), int_attr("use_sparse_mixer", 1),
                                           string_attr("activation_type", "identity")}));
  auto expert = [&](int e) {
    mx::array w1 = mx::squeeze(mx::slice(in.fc1, {e, 0, 0}, {e + 1, kInter, kHidden}), 0);
    mx::array w2 = mx::squeeze(mx::slice(in.fc2, {e, 0, 0}, {e + 1, kHidden, kInter}), 0);
    mx::array h = mx::matmul(in.x, mx::transpose(w1)) + mx::slice(in.fc1_bias, {e, 0}, {e + 1, kInter});
    return mx::matmul(h, mx::transpose(w2)) + mx::slice(in.fc2_bias, {e, 0}, {e + 1, kHidden});
  };
  auto row = [](const mx::array& a, int t) { return mx::slice(a, {t, 0}, {t + 1, kHidden}); };
  mx::array want0 = row(expert(0), 0) / (1.0f + std::exp(-0.01f)) + row(expert(1), 0);
  mx::array want1 = row(expert(1), 1) / (1.0f + std::exp(-0.05f)) + row(expert(2), 1);
  EXPECT_LT(max_abs_diff(row(y, 0), want0), kTolerance);
  EXPECT_LT(max_abs_diff(row(y, 1), want1), kTolerance);
}

// --- QMoE ---------------------------------------------------------------------------

// 4-bit row-wise weights whose every field is `q` (two per byte), scales `scale`.
mx::array packed_constant(int e, int n, int k, uint8_t q) {
  return mx::full({e, n, k / 2}, mx::array(static_cast<uint8_t>(q | (q << 4)), mx::uint8));
}

// QMoE with every weight (q - 8) * scale = 1 is MoE with all-ones weights.
TEST(MicrosoftMoe, QMoEDequantizesLikeTheSpec) {
  MoeInputs in;
  std::vector<Value> q = {in.x,
                          in.router,
                          packed_constant(kExperts, kInter, kHidden, 10),
                          mx::full({kExperts, kInter}, 0.5f),
                          in.fc1_bias,
                          packed_constant(kExperts, kHidden, kInter, 12),
                          mx::full({kExperts, kHidden}, 0.25f),
                          in.fc2_bias};
  std::vector<Attribute> attrs = {int_attr("k", 2), string_attr("activation_type", "relu"),
                                  int_attr("expert_weight_bits", 4)};
  mx::array y = out0(run_qmoe(q, attrs));
  std::vector<Value> f = {in.x,
                          in.router,
                          mx::ones({kExperts, kInter, kHidden}),
                          in.fc1_bias,
                          mx::ones({kExperts, kHidden, kInter}),
                          in.fc2_bias};
  // QMoE's routing: softmax over the top-k logits, i.e. MoE's normalized weights.
  mx::array want = out0(run_moe(f, {int_attr("k", 2), int_attr("normalize_routing_weights", 1)}));
  EXPECT_LT(max_abs_diff(y, want), 1e-4f);  // outputs of size ~50
  // Explicit zero points 9 and 11 (packed along the features): weights 0.5 and 0.25.
  q.resize(14);
  q[8] = q[9] = q[10] = Value();
  q[11] = mx::full({kExperts, kInter / 2}, mx::array(static_cast<uint8_t>(9 | (9 << 4)), mx::uint8));
  q[12] = mx::full({kExperts, kHidden / 2}, mx::array(static_cast<uint8_t>(11 | (11 << 4)), mx::uint8));
  f[2] = mx::full({kExperts, kInter, kHidden}, 0.5f);
  f[4] = mx::full({kExperts, kHidden, kInter}, 0.25f);
  want = out0(run_moe(f, {int_attr("k", 2), int_attr("normalize_routing_weights", 1)}));
  EXPECT_LT(max_abs_diff(out0(run_qmoe(q, attrs)), want), 1e-4f);
}

// Random packed QMoE weights of one projection [E, N, K]: bytes, scales and (optionally) zero points,
// column-wise or in blocks.
struct PackedProjection {
  mx::array weights, scales;
  std::optional<mx::array> zero_points;
};

PackedProjection random_projection(int n, int k, int bits, int block_size, bool zero_points, uint64_t seed) {
  auto bytes = [&](mx::Shape shape, uint64_t salt) {
    return mx::astype(mx::random::randint(0, 256, shape, mx::int32, mx::random::key(seed * 7 + salt)), mx::uint8);
  };
  const int blocks = block_size > 0 ? k / block_size : 1;
  PackedProjection p{bytes({kExperts * 2, n, k * bits / 8}, 1),
                     mx::random::uniform(0.01f, 0.05f, block_size > 0 ? mx::Shape{kExperts * 2, n, blocks}
                                                                      : mx::Shape{kExperts * 2, n},
                                         mx::float32, mx::random::key(seed * 7 + 2)),
                     std::nullopt};
  if (zero_points) {
    p.zero_points = block_size > 0 ? bytes({kExperts * 2, n, (blocks * bits + 7) / 8}, 3)
                                   : bytes({kExperts * 2, (n * bits + 7) / 8}, 3);
  }
  return p;
}

// A call that routes fewer (token, expert) pairs than there are experts dequantizes only the routed
// experts' weights, per pair; a larger call dequantizes every expert. The two paths give the same rows:
// 3 tokens (6 pairs of 8 experts) alone, and the same 3 tokens among 8 (16 pairs).
TEST(MicrosoftMoe, QMoEOfFewTokensDequantizesTheRoutedExpertsAlike) {
  constexpr int kExpertsHere = 2 * kExperts, kFew = 3, kMany = 8;
  for (int bits : {2, 4, 8}) {
    for (int block_size : {0, 16}) {
      for (bool zero_points : {false, true}) {
        for (bool fc3 : {false, true}) {
          const uint64_t seed = 100 + bits * 8 + block_size + zero_points * 2 + fc3;
          PackedProjection p1 = random_projection(kInter, kHidden * 2, bits, block_size, zero_points, seed);
          PackedProjection p2 = random_projection(kHidden * 2, kInter, bits, block_size, zero_points, seed + 1);
          PackedProjection p3 = random_projection(kInter, kHidden * 2, bits, block_size, zero_points, seed + 2);
          mx::array x = random_array({kMany, kHidden * 2}, seed + 3);
          mx::array router = random_array({kMany, kExpertsHere}, seed + 4, 2.0f);
          auto inputs = [&](int tokens) {
            auto rows = [&](const mx::array& a) { return mx::slice(a, {0, 0}, {tokens, a.shape(1)}); };
            std::vector<Value> in = {rows(x), rows(router), p1.weights, p1.scales, Value(),
                                     p2.weights, p2.scales, Value(), Value(), Value(), Value(), Value(), Value(),
                                     Value()};
            if (fc3) {
              in[8] = p3.weights;
              in[9] = p3.scales;
            }
            if (zero_points) {
              in[11] = *p1.zero_points;
              in[12] = *p2.zero_points;
              if (fc3) in[13] = *p3.zero_points;
            }
            return in;
          };
          std::vector<Attribute> attrs = {int_attr("k", 2), string_attr("activation_type", fc3 ? "silu" : "relu"),
                                          int_attr("expert_weight_bits", bits)};
          if (block_size > 0) attrs.push_back(int_attr("block_size", block_size));
          mx::array few = out0(run_qmoe(inputs(kFew), attrs));
          mx::array many = out0(run_qmoe(inputs(kMany), attrs));
          mx::array want = mx::slice(many, {0, 0}, {kFew, many.shape(1)});
          const float scale = mx::max(mx::abs(want)).item<float>();
          EXPECT_GT(scale, 0.0f);
          EXPECT_LT(max_abs_diff(few, want), 1e-5f * std::max(scale, 1.0f))
              << "bits " << bits << " block " << block_size << " zero points " << zero_points << " fc3 " << fc3;
        }
      }
    }
  }
}

TEST(MicrosoftMoe, QMoEErrorsNameTheInputAndShapes) {
  MoeInputs in;
  std::vector<Value> q = {in.x,
                          in.router,
                          packed_constant(kExperts, kInter, kHidden, 9),
                          mx::full({kExperts, kInter}, 0.5f),
                          in.fc1_bias,
                          packed_constant(kExperts, kHidden, kInter, 9),
                          mx::full({kExperts, kHidden}, 0.5f),
                          in.fc2_bias};
  auto message_of = [&](const std::vector<Value>& inputs, const std::vector<Attribute>& attrs) {
    return error_of<OpError>([&] { run_qmoe(inputs, attrs); });
  };
  const std::vector<Attribute> bits4 = {int_attr("expert_weight_bits", 4)};
  EXPECT_EQ(out0(run_qmoe(q, bits4)).shape(), (mx::Shape{kTokens, kHidden}));
  std::vector<Value> v = q;
  v[3] = mx::full({kExperts, kInter, 2}, 0.5f);
  std::string m = message_of(v, bits4);
  EXPECT_NE(m.find("test_QMoE"), std::string::npos) << m;
  EXPECT_NE(m.find("fc1_scales must have shape (4,16) [num_experts, features] (no block_size), got (4,16,2)"),
            std::string::npos)
      << m;
  m = message_of(q, {int_attr("expert_weight_bits", 8)});
  EXPECT_NE(m.find("fc1_experts_weights must have shape (4,8,8)"), std::string::npos) << m;
  m = message_of(q, {int_attr("expert_weight_bits", 3)});
  EXPECT_NE(m.find("fc1_expert_weight_bits must be 2, 4 or 8, got 3"), std::string::npos) << m;
  m = message_of(q, {int_attr("expert_weight_bits", 4), int_attr("block_size", 24)});
  EXPECT_NE(m.find("block_size must be a power of 2 and >= 16, got 24"), std::string::npos) << m;
  v = q;
  v[6] = mx::full({kExperts, kHidden, 1}, 0.5f);  // fc2's 16 input features make one block
  m = message_of(v, {int_attr("expert_weight_bits", 4), int_attr("block_size", 16)});
  EXPECT_NE(m.find("fc1_experts_weights: its 8 input features are not a multiple of block_size 16"),
            std::string::npos)
      << m;
  m = message_of(q, {int_attr("expert_weight_bits", 4), string_attr("quant_type", "fp4")});
  EXPECT_NE(m.find("quant_type 'fp4' is not supported"), std::string::npos) << m;
  m = message_of(q, {int_attr("expert_weight_bits", 4), int_attr("weights_prepacked", 1)});
  EXPECT_NE(m.find("weights_prepacked=1"), std::string::npos) << m;
  v = q;
  v[2] = mx::astype(v[2].tensor(), mx::int32);
  m = message_of(v, bits4);
  EXPECT_NE(m.find("fc1_experts_weights must be uint8, got int32"), std::string::npos) << m;
  v = q;
  v[3] = Value();
  m = message_of(v, bits4);
  EXPECT_NE(m.find("fc1_scales is required for quant_type 'int'"), std::string::npos) << m;
  v = q;
  v.resize(13);
  v[12] = mx::zeros({kExperts, kHidden}, mx::uint8);  // packed 4-bit: [E, 4]
  m = message_of(v, bits4);
  EXPECT_NE(
      m.find("fc2_zero_points must have shape (4,4) [num_experts, ceil(features * bits / 8)], got (4,8)"),
      std::string::npos)
      << m;
  v = q;
  v.resize(15);
  v[14] = random_array({kTokens, kExperts + 1}, 14);
  m = message_of(v, bits4);
  EXPECT_NE(m.find("router_weights must have shape (5,4) [tokens, num_experts], got (5,5)"),
            std::string::npos)
      << m;
  v = q;
  v.resize(9);
  v[8] = packed_constant(kExperts, kInter, kHidden, 9);
  m = message_of(v, bits4);
  EXPECT_NE(m.find("fc3_scales is required for quant_type 'int'"), std::string::npos) << m;
  v.push_back(mx::full({kExperts, kInter}, 0.5f));
  EXPECT_EQ(out0(run_qmoe(v, bits4)).shape(), (mx::Shape{kTokens, kHidden}));
}

}  // namespace
}  // namespace transmuter
