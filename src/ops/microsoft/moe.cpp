// ONNX Runtime's mixture-of-experts contrib operators (domain com.microsoft,
// version 1): MoE, and QMoE with integer-quantized expert weights, as ONNX
// Runtime 1.31's CPU kernels compute them.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//
// MoE(input [T, H] or [B, S, H], router_probs [T, E], fc1 [E, F1, H], fc1_bias? [E, F1],
//     fc2 [E, H, I], fc2_bias? [E, H], fc3? [E, I, H], fc3_bias? [E, I]) -> output, input's shape
//   F1 = 2 I for fused swiglu, I otherwise; T = B * S tokens, each routed on its own.
//   Routing per token t:  p = softmax(router_probs[t]); top = the k experts of
//   largest p (ties: the larger expert index first, as ORT's partial sort);
//   w_j = p[top_j], divided by sum_j p[top_j] when normalize_routing_weights=1.
//   Expert e:  h = fc1[e] x + fc1_bias[e];  a = act(h) [* (fc3[e] x + fc3_bias[e])];
//              y_e = fc2[e] a + fc2_bias[e]
//   output[t] = sum_j w_j y_top_j(input[t])
// act: relu; gelu = 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))) (ORT's CPU
// kernel uses the tanh form); silu = h sigmoid(h); identity; swiglu of a gate
// g and a linear part l: swiglu_fusion=1: interleaved in h (g = h[0::2],
// l = h[1::2]); 2: concatenated (g = h[:I], l = h[I:]); 0: g = h, l = fc3 x + fc3_bias:
//   G = min(g, limit), L = clip(l, -limit, limit), a = G sigmoid(alpha G) (L + beta)
//   alpha = activation_alpha (1), beta = activation_beta (0), limit =
//   swiglu_limit (no clamp when absent).
// ORT 1.31's CPU kernels implement only fc3-less experts and swiglu_fusion=1;
// the fc3 gating (Mixtral's act(fc1 x) * fc3 x) and the other SwiGLU layouts
// follow the spec and ORT's CUDA kernel.
//
// QMoE(input, router_probs, fc1 [E, F1, H * b1 / 8] uint8, fc1_scales, fc1_bias?,
//      fc2 [E, H, I * b2 / 8] uint8, fc2_scales, fc2_bias?, fc3..., fc1_zero_points?,
//      fc2_zero_points?, fc3_zero_points?, router_weights? [T, E])
//   The same network on dequantized weights. Row n of an expert's matrix packs
//   its K values q, `bits` (2, 4 or 8) per field, low bits first:
//   W[e, n, k] = (q[e, n, k] - zp) * scale,
//   column-wise (no block_size): scale = scales[e, n] ([E, N]), zp from
//   zero_points [E, ceil(N bits / 8)] (packed along N); block-wise: scale =
//   scales[e, n, k / block_size] ([E, N, K / block_size]), zp from zero_points
//   [E, N, ceil(K / block_size * bits / 8)]; zp = 2^(bits - 1) without zero points.
//   b1, b2, b3 = fc1/fc2/fc3_expert_weight_bits, each defaulting to
//   expert_weight_bits (4). fc3 [E, I, H * b3 / 8] with fc3_scales and
//   fc3_zero_points like fc1's.
//   Routing (ORT's QMoE CPU kernel): top = the k largest router_probs (logits);
//   w = softmax over those k (whatever normalize_routing_weights says); with
//   router_weights, w_j = router_weights[t, top_j], divided by their sum when
//   normalize_routing_weights=1. Routes with w <= 1e-8 are dropped, as in ORT.
//
// Computation: each (token, selected expert) pair runs its expert on that
// token alone through mx::gather_mm (a matrix product whose right operand is
// gathered per row by expert index), so the work is k T (F1 H + H I, plus I H
// with fc3) multiply-adds, not E T (...) as a dense all-experts evaluation
// would be, and no shape depends on the routing (the node compiles). The cost:
// every pair is a matrix-vector product that reads its expert's weights again;
// ORT instead groups the tokens of each expert into one GEMM. QMoE keeps the
// weights packed and dequantizes to float32, per call, only what the call
// uses: when it routes fewer (token, expert) pairs than there are experts (a
// decode step: k of E), the routed experts' packed rows are gathered first and
// each pair gets its own dequantized copy (transient k T (F1 H + H I [+ I H])
// floats); otherwise every expert is dequantized once (E (...) floats). Both
// shapes are known when the node is traced, so the choice needs no host read.
// Everything is computed in float32; float16/bfloat16 inputs are widened and
// the output rounded once (ORT's fp16 MoE rounds each intermediate to fp16).
//
// use_sparse_mixer=1 (k=2): PhiMoE's sparse mixer routing (see
// sparse_mixer_routing), as ORT's CUDA kernel computes it; ORT's CPU kernels
// accept the attribute and ignore it (plain top-2), against the spec.
//
// Not supported, each with an error naming the node: QMoE's quant_type other
// than "int" (fp4, nvfp4, fp8, wfp4afp8, with their global and activation
// scales) and weights_prepacked=1.
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/quantized_matmul.h"
#include "mlx_bridge/bit_fields.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

enum class MoeActivation { kRelu, kGelu, kSilu, kIdentity, kSwiGlu };

struct MoeAttributes {
  int k;
  MoeActivation activation;
  // swiglu's layout: 0 gate in fc1, linear in fc3; 1 interleaved in fc1; 2 concatenated in fc1.
  int fusion;
  bool normalize;
  bool sparse_mixer;
  float alpha, beta, limit;
  bool fused() const { return activation == MoeActivation::kSwiGlu && fusion != 0; }
};

bool is_float_dtype(mx::Dtype t) { return t == mx::float32 || t == mx::float16 || t == mx::bfloat16; }

MoeAttributes moe_attributes(const NodeContext& ctx, int num_experts) {
  MoeAttributes a{};
  const int64_t k = ctx.attr_int("k", 1);
  if (k < 1 || k > num_experts) {
    throw ctx.error("k must be in [1, num_experts=", num_experts, "] (router_probs' last dimension), got ",
                    k);
  }
  a.k = static_cast<int>(k);
  const std::string activation = ctx.attr_string("activation_type", "relu");
  if (activation == "relu") {
    a.activation = MoeActivation::kRelu;
  } else if (activation == "gelu") {
    a.activation = MoeActivation::kGelu;
  } else if (activation == "silu") {
    a.activation = MoeActivation::kSilu;
  } else if (activation == "identity") {
    a.activation = MoeActivation::kIdentity;
  } else if (activation == "swiglu") {
    a.activation = MoeActivation::kSwiGlu;
  } else {
    throw ctx.error("activation_type must be relu, gelu, silu, identity or swiglu, got '", activation, "'");
  }
  const int64_t fusion = ctx.attr_int("swiglu_fusion", 0);
  if (fusion < 0 || fusion > 2) throw ctx.error("swiglu_fusion must be 0, 1 or 2, got ", fusion);
  a.fusion = static_cast<int>(fusion);
  const int64_t normalize = ctx.attr_int("normalize_routing_weights", 0);
  if (normalize != 0 && normalize != 1)
    throw ctx.error("normalize_routing_weights must be 0 or 1, got ", normalize);
  a.normalize = normalize == 1;
  const int64_t sparse = ctx.attr_int("use_sparse_mixer", 0);
  if (sparse != 0 && sparse != 1) throw ctx.error("use_sparse_mixer must be 0 or 1, got ", sparse);
  a.sparse_mixer = sparse == 1;
  if (a.sparse_mixer && (a.k != 2 || num_experts < 2)) {
    throw ctx.error("use_sparse_mixer=1 needs k=2 and at least 2 experts, got k=", a.k, " and ", num_experts,
                    " experts");
  }
  a.alpha = ctx.attr_float("activation_alpha", 1.0f);
  a.beta = ctx.attr_float("activation_beta", 0.0f);
  a.limit = ctx.has_attr("swiglu_limit") ? ctx.attr_float("swiglu_limit", 0.0f)
                                         : std::numeric_limits<float>::infinity();
  return a;
}

// The checked shape of a MoE/QMoE node: T tokens, hidden size H, E experts,
// inter size I, fc1 output features F1.
struct MoeShape {
  int tokens, hidden, experts, inter, fc1_features;
};

void require_shape(const NodeContext& ctx, const char* name, const mx::array& t, const mx::Shape& want,
                   const char* layout) {
  if (t.shape() != want) throw ctx.error(name, " must have shape ", want, " ", layout, ", got ", t.shape());
}

// input [T, H] or [B, S, H] and router_probs [T, E].
void check_input_and_router(const NodeContext& ctx, MoeShape& d) {
  const mx::array& input = ctx.input(0);
  if (!is_float_dtype(input.dtype())) {
    throw ctx.error("input must be float32, float16 or bfloat16, got ", input.dtype());
  }
  if (input.ndim() != 2 && input.ndim() != 3) {
    throw ctx.error("input must be 2-D [tokens, hidden] or 3-D [batch, sequence, hidden], got shape ",
                    input.shape());
  }
  d.hidden = input.shape(-1);
  d.tokens = input.ndim() == 2
                 ? input.shape(0)
                 : to_int32(ctx, checked_mul(ctx, input.shape(0), input.shape(1), "tokens"), "tokens");
  const mx::array& router = ctx.input(1);
  if (router.dtype() != input.dtype()) {
    throw ctx.error("router_probs must have the input's dtype ", input.dtype(), ", got ", router.dtype());
  }
  if (router.ndim() != 2 || router.shape(0) != d.tokens || router.shape(1) < 1) {
    throw ctx.error("router_probs must have shape [tokens=", d.tokens, ", num_experts], got ",
                    router.shape());
  }
  d.experts = router.shape(1);
}

std::optional<mx::array> float_input(const NodeContext& ctx, size_t index, const char* name, mx::Dtype t,
                                     const mx::Shape& want, const char* layout) {
  std::optional<mx::array> v = ctx.optional_input(index);
  if (!v) return v;
  if (v->dtype() != t) throw ctx.error(name, " must have the input's dtype ", t, ", got ", v->dtype());
  require_shape(ctx, name, *v, want, layout);
  return mx::astype(*v, mx::float32, ctx.stream());
}

// Expert indices [T, k] (uint32) and weights [T, k] (float32).
struct Routing {
  mx::array experts, weights;
};

// The k columns of `scores` [T, E] with the largest values, ties to the larger
// index (MLX's argsort is stable: ascending order puts them last).
mx::array top_k_experts(const mx::array& scores, int k, mx::StreamOrDevice s) {
  mx::array order = mx::argsort(scores, -1, s);
  const int t = scores.shape(0), e = scores.shape(1);
  return mx::slice(order, {0, e - k}, {t, e}, s);
}

// PhiMoE's sparse mixer (ORT's CUDA kernel sparse_mixer_top2, jitter_eps 0.01)
// on logits x [T, E]: top1 = argmax x (ties: the lowest index), m1 = x[top1];
// top2 = argmax of x without top1, m2 = x[top2]. Expert e is masked for choice
// j when m_j - x_e > 2 eps max(|x_e|, m_j) (and top1 always for choice 2);
// w_j = 1 / sum over unmasked e of exp(x_e - m_j). normalize_routing_weights
// does not apply (the kernel ignores it).
Routing sparse_mixer_routing(const mx::array& x, mx::StreamOrDevice s) {
  const float jitter_eps = 0.01f;
  const int t = x.shape(0), e = x.shape(1);
  mx::array columns = mx::reshape(mx::arange(e, mx::uint32, s), {1, e}, s);
  auto choice = [&](const mx::array& scores, const std::optional<mx::array>& excluded) {
    mx::array top = mx::argmax(scores, -1, true, s);  // [T, 1]
    mx::array m = mx::take_along_axis(x, top, -1, s);
    mx::array factor = mx::maximum(mx::abs(x, s), m, s);
    mx::array masked =
        mx::greater(mx::subtract(m, x, s), mx::multiply(mx::array(2 * jitter_eps), factor, s), s);
    if (excluded) masked = mx::logical_or(masked, mx::equal(columns, *excluded, s), s);
    mx::array sum =
        mx::sum(mx::where(masked, mx::array(0.0f), mx::exp(mx::subtract(x, m, s), s), s), -1, true, s);
    return std::pair{top, mx::divide(mx::array(1.0f), sum, s)};
  };
  auto [top1, w1] = choice(x, std::nullopt);
  mx::array without_top1 =
      mx::where(mx::equal(columns, top1, s), mx::array(-std::numeric_limits<float>::infinity()), x, s);
  auto [top2, w2] = choice(without_top1, top1);
  return {mx::reshape(mx::concatenate({top1, top2}, 1, s), {t, 2}, s), mx::concatenate({w1, w2}, 1, s)};
}

Routing moe_routing(const mx::array& logits, const MoeAttributes& a, mx::StreamOrDevice s) {
  if (a.sparse_mixer) return sparse_mixer_routing(logits, s);
  mx::array probs = mx::softmax(logits, -1, true, s);
  mx::array experts = top_k_experts(probs, a.k, s);
  mx::array w = mx::take_along_axis(probs, experts, -1, s);
  if (a.normalize) w = mx::divide(w, mx::sum(w, -1, true, s), s);
  return {experts, w};
}

Routing qmoe_routing(const mx::array& logits, const std::optional<mx::array>& router_weights,
                     const MoeAttributes& a, mx::StreamOrDevice s) {
  if (a.sparse_mixer) return sparse_mixer_routing(logits, s);
  mx::array experts = top_k_experts(logits, a.k, s);
  mx::array w = mx::array(0.0f);
  if (router_weights) {
    w = mx::take_along_axis(*router_weights, experts, -1, s);
    if (a.normalize) {
      mx::array sum = mx::sum(w, -1, true, s);
      mx::array zero = mx::array(0.0f);
      w = mx::where(mx::equal(sum, zero, s), zero, mx::divide(w, sum, s), s);
    }
  } else {
    w = mx::softmax(mx::take_along_axis(logits, experts, -1, s), -1, true, s);
  }
  return {experts, mx::where(mx::greater(w, mx::array(1e-8f), s), w, mx::array(0.0f), s)};
}

mx::array activate(const mx::array& h, const MoeAttributes& a, mx::StreamOrDevice s) {
  auto scalar = [](double v) { return mx::array(static_cast<float>(v)); };
  switch (a.activation) {
    case MoeActivation::kRelu:
      return mx::maximum(h, scalar(0), s);
    case MoeActivation::kGelu: {
      mx::array cube = mx::multiply(mx::multiply(h, h, s), h, s);
      mx::array inner = mx::add(h, mx::multiply(scalar(0.044715), cube, s), s);
      mx::array t = mx::tanh(mx::multiply(scalar(std::sqrt(2.0 / M_PI)), inner, s), s);
      return mx::multiply(mx::multiply(scalar(0.5), h, s), mx::add(scalar(1), t, s), s);
    }
    case MoeActivation::kSilu:
      return mx::multiply(h, mx::sigmoid(h, s), s);
    case MoeActivation::kIdentity:
      return h;
    case MoeActivation::kSwiGlu:
      break;
  }
  return h;
}

// SwiGLU of gate g and linear l.
mx::array swiglu(mx::array g, mx::array l, const MoeAttributes& a, mx::StreamOrDevice s) {
  if (std::isfinite(a.limit)) {
    g = mx::minimum(g, mx::array(a.limit), s);
    l = mx::clip(l, mx::array(-a.limit), mx::array(a.limit), s);
  }
  mx::array swish = mx::multiply(g, mx::sigmoid(mx::multiply(mx::array(a.alpha), g, s), s), s);
  return mx::multiply(swish, mx::add(l, mx::array(a.beta), s), s);
}

// The expert's hidden activation [..., I] from h1 = fc1 x + b1 [..., F1] and,
// with fc3, h3 = fc3 x + b3 [..., I].
mx::array expert_activation(const mx::array& h1, const std::optional<mx::array>& h3, const MoeAttributes& a,
                            int inter, mx::StreamOrDevice s) {
  if (a.activation != MoeActivation::kSwiGlu) {
    mx::array act = activate(h1, a, s);
    return h3 ? mx::multiply(act, *h3, s) : act;
  }
  if (a.fusion == 0) return swiglu(h1, *h3, a, s);
  mx::Shape start(h1.ndim(), 0), stop = h1.shape();
  if (a.fusion == 2) {  // [g | l]
    stop.back() = inter;
    mx::array g = mx::slice(h1, start, stop, s);
    start.back() = inter;
    stop.back() = 2 * inter;
    return swiglu(g, mx::slice(h1, start, stop, s), a, s);
  }
  mx::Shape pairs = h1.shape();  // [g0, l0, g1, l1, ...]
  pairs.back() = inter;
  pairs.push_back(2);
  mx::array gl = mx::reshape(h1, pairs, s);
  mx::Shape pair_start(pairs.size(), 0), pair_stop = pairs;
  pair_stop.back() = 1;
  mx::array g = mx::squeeze(mx::slice(gl, pair_start, pair_stop, s), -1, s);
  pair_start.back() = 1;
  pair_stop.back() = 2;
  return swiglu(g, mx::squeeze(mx::slice(gl, pair_start, pair_stop, s), -1, s), a, s);
}

// Float32 expert weights: fc1 [E, F1, H], fc2 [E, H, I], fc3 [E, I, H] and
// their biases [E, F1], [E, H], [E, I]. per_pair: the weights are instead one
// copy per routed (token, choice) pair, [T * k, ...] in the routing's order
// (the biases stay per expert).
struct ExpertWeights {
  mx::array fc1, fc2;
  std::optional<mx::array> fc3 = std::nullopt, b1 = std::nullopt, b2 = std::nullopt, b3 = std::nullopt;
  bool per_pair = false;
};

// sum_j w_j y_top_j(x) for x [T, H] float32.
mx::array mix_experts(const mx::array& x, const Routing& r, const ExpertWeights& w, const MoeAttributes& a,
                      const MoeShape& d, mx::StreamOrDevice s) {
  const int t = d.tokens, k = a.k;
  auto gathered_bias = [&](const mx::array& bias, int features) {
    return mx::reshape(mx::take(bias, r.experts, 0, s), {t, k, 1, features}, s);
  };
  const mx::array rows = mx::reshape(x, {t, 1, 1, d.hidden}, s);
  // lhs [T, 1 or k, 1, K] times the routed experts' weights [.., N, K] transposed -> [T, k, 1, N]: gathered by
  // expert index from [E, N, K], or per pair from [T * k, N, K].
  auto routed_product = [&](const mx::array& lhs, const mx::array& weights) {
    if (!w.per_pair)
      return mx::gather_mm(lhs, mx::transpose(weights, {0, 2, 1}, s), std::nullopt, r.experts, false, s);
    mx::array pairs = mx::reshape(weights, {t, k, weights.shape(1), weights.shape(2)}, s);
    return mx::matmul(lhs, mx::transpose(pairs, {0, 1, 3, 2}, s), s);
  };
  auto project = [&](const mx::array& weights, const std::optional<mx::array>& bias, int features) {
    mx::array h = routed_product(rows, weights);
    return bias ? mx::add(h, gathered_bias(*bias, features), s) : h;
  };
  mx::array h1 = project(w.fc1, w.b1, d.fc1_features);
  std::optional<mx::array> h3;
  if (w.fc3) h3 = project(*w.fc3, w.b3, d.inter);
  mx::array y = routed_product(expert_activation(h1, h3, a, d.inter, s), w.fc2);  // [T, k, 1, H]
  if (w.b2) y = mx::add(y, gathered_bias(*w.b2, d.hidden), s);
  y = mx::reshape(y, {t, k, d.hidden}, s);
  return mx::sum(mx::multiply(y, mx::expand_dims(r.weights, -1, s), s), 1, false, s);
}

// fc3 is required by swiglu_fusion=0 and absent with fused swiglu; optional
// (gating: act(fc1 x) * fc3 x) for the other activations.
void check_fc3_presence(const NodeContext& ctx, const MoeAttributes& a, size_t fc3) {
  if (a.activation == MoeActivation::kSwiGlu && a.fusion == 0 && !ctx.has_input(fc3)) {
    throw ctx.error("swiglu with swiglu_fusion=0 needs fc3_experts_weights (the linear half)");
  }
  if (a.fused() && ctx.has_input(fc3)) {
    throw ctx.error("fc3_experts_weights must be absent with swiglu_fusion=", a.fusion,
                    " (fc1 holds both halves)");
  }
}

OpOutputs finish(const NodeContext& ctx, const mx::array& mixed) {
  const mx::array& input = ctx.input(0);
  return {mx::astype(mx::reshape(mixed, input.shape(), ctx.stream()), input.dtype(), ctx.stream())};
}

// --- MoE ---------------------------------------------------------------------------

OpOutputs moe(NodeContext& ctx) {
  const auto s = ctx.stream();
  MoeShape d{};
  check_input_and_router(ctx, d);
  const MoeAttributes a = moe_attributes(ctx, d.experts);
  check_fc3_presence(ctx, a, 6);
  const mx::Dtype t = ctx.input(0).dtype();
  const mx::array& fc2 = ctx.input(4);
  if (fc2.ndim() != 3) {
    throw ctx.error("fc2_experts_weights must be 3-D [num_experts, hidden_size, inter_size], got shape ",
                    fc2.shape());
  }
  d.inter = fc2.shape(2);
  d.fc1_features = a.fused() ? 2 * d.inter : d.inter;
  auto weights = [&](size_t index, const char* name, const mx::Shape& want, const char* layout) {
    const mx::array& w = ctx.input(index);
    if (w.dtype() != t) throw ctx.error(name, " must have the input's dtype ", t, ", got ", w.dtype());
    require_shape(ctx, name, w, want, layout);
    return mx::astype(w, mx::float32, s);
  };
  ExpertWeights w{.fc1 = weights(2, "fc1_experts_weights", {d.experts, d.fc1_features, d.hidden},
                                 a.fused() ? "[num_experts, 2 * inter_size, hidden_size]"
                                           : "[num_experts, inter_size, hidden_size]"),
                  .fc2 = weights(4, "fc2_experts_weights", {d.experts, d.hidden, d.inter},
                                 "[num_experts, hidden_size, inter_size]")};
  if (ctx.has_input(6)) {
    w.fc3 = weights(6, "fc3_experts_weights", {d.experts, d.inter, d.hidden},
                    "[num_experts, inter_size, hidden_size]");
  }
  w.b1 =
      float_input(ctx, 3, "fc1_experts_bias", t, {d.experts, d.fc1_features}, "[num_experts, fc1 features]");
  w.b2 = float_input(ctx, 5, "fc2_experts_bias", t, {d.experts, d.hidden}, "[num_experts, hidden_size]");
  w.b3 = float_input(ctx, 7, "fc3_experts_bias", t, {d.experts, d.inter}, "[num_experts, inter_size]");
  if (w.b3 && !w.fc3) throw ctx.error("fc3_experts_bias is given without fc3_experts_weights");
  if (d.tokens == 0) return {mx::zeros(ctx.input(0).shape(), t, s)};

  mx::array x = mx::reshape(mx::astype(ctx.input(0), mx::float32, s), {d.tokens, d.hidden}, s);
  const Routing r = moe_routing(mx::astype(ctx.input(1), mx::float32, s), a, s);
  return finish(ctx, mix_experts(x, r, w, a, d, s));
}

// --- QMoE --------------------------------------------------------------------------

constexpr size_t kFc1Weights = 2, kFc1Scales = 3, kFc1Bias = 4, kFc2Weights = 5, kFc2Scales = 6, kFc2Bias = 7,
                 kFc3Weights = 8, kFc3Scales = 9, kFc3Bias = 10, kFc1ZeroPoints = 11, kFc2ZeroPoints = 12,
                 kFc3ZeroPoints = 13, kRouterWeights = 14;

int weight_bits(const NodeContext& ctx, const char* name) {
  const int64_t bits = ctx.attr_int(name, ctx.attr_int("expert_weight_bits", 4));
  if (bits != 2 && bits != 4 && bits != 8) throw ctx.error(name, " must be 2, 4 or 8, got ", bits);
  return static_cast<int>(bits);
}

// The dequantized float32 weights [E, N, K] of one projection, or with `selected` (expert indices [P])
// those of the selected experts only, [P, N, K], gathered while still packed.
mx::array dequantized_experts(const NodeContext& ctx, const char* prefix, size_t weights, size_t scales,
                              size_t zero_points, int bits, int block_size, int e, int n, int k, mx::Dtype t,
                              const std::optional<mx::array>& selected) {
  const auto s = ctx.stream();
  const std::string w_name = std::string(prefix) + "_experts_weights";
  const std::string s_name = std::string(prefix) + "_scales";
  const std::string zp_name = std::string(prefix) + "_zero_points";
  if (int64_t{k} * bits % 8 != 0) {
    throw ctx.error(w_name, ": rows of ", k, " values of ", bits, " bits are not whole bytes");
  }
  const int packed = k * bits / 8;
  const mx::array& w = ctx.input(weights);
  if (w.dtype() != mx::uint8) throw ctx.error(w_name, " must be uint8, got ", w.dtype());
  require_shape(ctx, w_name.c_str(), w, {e, n, packed}, "[num_experts, features, in_features * bits / 8]");
  to_int32(ctx, checked_mul(ctx, int64_t{e} * n, k, "dequantized expert weights"),
           "dequantized expert weights");
  if (block_size > 0 && k % block_size != 0) {
    throw ctx.error(w_name, ": its ", k, " input features are not a multiple of block_size ", block_size);
  }
  const int blocks = block_size > 0 ? k / block_size : 1;
  if (!ctx.has_input(scales)) throw ctx.error(s_name, " is required for quant_type 'int'");
  const mx::array& scale_in = ctx.input(scales);
  if (scale_in.dtype() != t)
    throw ctx.error(s_name, " must have the input's dtype ", t, ", got ", scale_in.dtype());
  if (block_size > 0) {
    require_shape(ctx, s_name.c_str(), scale_in, {e, n, blocks},
                  "[num_experts, features, in_features / block_size]");
  } else {
    require_shape(ctx, s_name.c_str(), scale_in, {e, n}, "[num_experts, features] (no block_size)");
  }
  std::optional<mx::array> z = ctx.optional_input(zero_points);
  if (z) {
    if (z->dtype() != mx::uint8) throw ctx.error(zp_name, " must be uint8, got ", z->dtype());
    if (block_size > 0) {
      require_shape(ctx, zp_name.c_str(), *z, {e, n, (blocks * bits + 7) / 8},
                    "[num_experts, features, ceil(blocks * bits / 8)]");
    } else {
      require_shape(ctx, zp_name.c_str(), *z, {e, (n * bits + 7) / 8}, "[num_experts, ceil(features * bits / 8)]");
    }
  }
  // From here on, the experts are the selected ones (checked shapes above are the node's).
  auto experts_of = [&](const mx::array& per_expert) {
    return selected ? mx::take(per_expert, *selected, 0, s) : per_expert;
  };
  const int kept = selected ? selected->shape(0) : e;  // the experts (or pairs) dequantized
  mx::array scale = mx::reshape(mx::astype(experts_of(scale_in), mx::float32, s), {kept, n, blocks, 1}, s);
  mx::array zp = mx::array(static_cast<float>(1 << (bits - 1)));
  if (z) {
    mx::array fields = unpack_bit_fields(experts_of(*z), bits, s);
    zp = block_size > 0 ? mx::slice(fields, {0, 0, 0}, {kept, n, blocks}, s) : mx::slice(fields, {0, 0}, {kept, n}, s);
    zp = mx::reshape(mx::astype(zp, mx::float32, s), {kept, n, blocks, 1}, s);
  }
  mx::array q = mx::astype(unpack_bit_fields(experts_of(w), bits, s), mx::float32, s);
  q = mx::reshape(q, {kept, n, blocks, k / blocks}, s);
  return mx::reshape(mx::multiply(mx::subtract(q, zp, s), scale, s), {kept, n, k}, s);
}

OpOutputs qmoe(NodeContext& ctx) {
  const auto s = ctx.stream();
  MoeShape d{};
  check_input_and_router(ctx, d);
  const MoeAttributes a = moe_attributes(ctx, d.experts);
  check_fc3_presence(ctx, a, kFc3Weights);
  for (size_t i = 15; i < ctx.num_inputs(); ++i) {
    if (ctx.has_input(i))
      throw ctx.error("input ", i, " (a global or activation scale of the fp4/fp8 modes) is not supported");
  }
  if (const std::string quant = ctx.attr_string("quant_type", "int"); quant != "int") {
    throw ctx.error("quant_type '", quant, "' is not supported; only 'int' (2/4/8-bit integer weights)");
  }
  if (const int64_t prepacked = ctx.attr_int("weights_prepacked", -1); prepacked == 1) {
    throw ctx.error(
        "weights_prepacked=1 (an execution provider's own layout) is not supported; only raw weights");
  }
  const int64_t block_attr = ctx.attr_int("block_size", 0);
  if (block_attr != 0 &&
      (block_attr < 16 || (block_attr & (block_attr - 1)) != 0 || block_attr > (1 << 30))) {
    throw ctx.error("block_size must be a power of 2 and >= 16, got ", block_attr);
  }
  const int block_size = static_cast<int>(block_attr);
  const int bits1 = weight_bits(ctx, "fc1_expert_weight_bits"),
            bits2 = weight_bits(ctx, "fc2_expert_weight_bits");
  const mx::Dtype t = ctx.input(0).dtype();
  const mx::array& fc2 = ctx.input(kFc2Weights);
  if (fc2.ndim() != 3)
    throw ctx.error("fc2_experts_weights must be 3-D [num_experts, ...], got shape ", fc2.shape());
  d.inter = to_int32(ctx, int64_t{fc2.shape(2)} * 8 / bits2, "inter_size");
  d.fc1_features = a.fused() ? 2 * d.inter : d.inter;
  std::optional<mx::array> router_weights =
      float_input(ctx, kRouterWeights, "router_weights", t, {d.tokens, d.experts}, "[tokens, num_experts]");
  if (router_weights && a.sparse_mixer) {
    throw ctx.error(
        "router_weights with use_sparse_mixer=1 is not supported (the sparse mixer makes the weights)");
  }
  // Fewer routed pairs than experts (a decode step): dequantize the routed experts' weights alone.
  const Routing r = qmoe_routing(mx::astype(ctx.input(1), mx::float32, s), router_weights, a, s);
  const int64_t pairs = int64_t{d.tokens} * a.k;
  std::optional<mx::array> selected;
  if (pairs > 0 && pairs < d.experts) selected = mx::reshape(r.experts, {static_cast<int>(pairs)}, s);
  ExpertWeights w{.fc1 = mx::array(0.0f),
                  .fc2 = dequantized_experts(ctx, "fc2", kFc2Weights, kFc2Scales, kFc2ZeroPoints, bits2,
                                             block_size, d.experts, d.hidden, d.inter, t, selected),
                  .per_pair = selected.has_value()};
  w.fc1 = dequantized_experts(ctx, "fc1", kFc1Weights, kFc1Scales, kFc1ZeroPoints, bits1, block_size,
                              d.experts, d.fc1_features, d.hidden, t, selected);
  if (ctx.has_input(kFc3Weights)) {
    w.fc3 = dequantized_experts(ctx, "fc3", kFc3Weights, kFc3Scales, kFc3ZeroPoints,
                                weight_bits(ctx, "fc3_expert_weight_bits"), block_size, d.experts, d.inter,
                                d.hidden, t, selected);
  } else if (ctx.has_input(kFc3Scales) || ctx.has_input(kFc3ZeroPoints)) {
    throw ctx.error("fc3_scales or fc3_zero_points are given without fc3_experts_weights");
  }
  w.b1 = float_input(ctx, kFc1Bias, "fc1_experts_bias", t, {d.experts, d.fc1_features},
                     "[num_experts, fc1 features]");
  w.b2 =
      float_input(ctx, kFc2Bias, "fc2_experts_bias", t, {d.experts, d.hidden}, "[num_experts, hidden_size]");
  w.b3 = float_input(ctx, kFc3Bias, "fc3_experts_bias", t, {d.experts, d.inter}, "[num_experts, inter_size]");
  if (w.b3 && !w.fc3) throw ctx.error("fc3_experts_bias is given without fc3_experts_weights");
  if (d.tokens == 0) return {mx::zeros(ctx.input(0).shape(), t, s)};

  mx::array x = mx::reshape(mx::astype(ctx.input(0), mx::float32, s), {d.tokens, d.hidden}, s);
  return finish(ctx, mix_experts(x, r, w, a, d, s));
}

// --- ai.transmuter PackedQMoE (src/passes/pack_qmoe_weights.cpp) ------------------------------

// PackedQMoE's inputs: input, router_probs, then per projection fcJ (J = 1, 2, 3) its packed weight,
// scales, biases (absent: symmetric) and its experts' float bias; router_weights last.
constexpr size_t kPackedFirst = 2, kPackedPerProjection = 4, kPackedRouterWeights = 14;

// One projection's packed experts: w uint32 [E, N, K * bits / 32], scales and biases float32
// [E, N, K / group_size].
struct PackedExperts {
  mx::array w, scales;
  std::optional<mx::array> biases;
  int bits, group_size;
};

// Projection j's packed inputs, checked against E experts of [n, k] (k: 0 takes it from the weight).
std::optional<PackedExperts> packed_experts(const NodeContext& ctx, int j, int e, int n, int k) {
  const std::string prefix = "fc" + std::to_string(j + 1);
  const size_t base = kPackedFirst + kPackedPerProjection * static_cast<size_t>(j);
  if (!ctx.has_input(base)) return std::nullopt;
  const int bits = static_cast<int>(ctx.attr_int(prefix + "_bits", 4));
  const int group = static_cast<int>(ctx.attr_int(prefix + "_group_size", 0));
  if ((bits != 4 && bits != 8) || (group != 32 && group != 64 && group != 128)) {
    throw ctx.error(prefix, "_bits must be 4 or 8 and ", prefix, "_group_size 32, 64 or 128, got ", bits,
                    " and ", group);
  }
  const mx::array& w = ctx.input(base);
  if (w.dtype() != mx::uint32 || w.ndim() != 3 || w.shape(0) != e || w.shape(1) != n ||
      (k > 0 && int64_t{w.shape(2)} * 32 != int64_t{k} * bits)) {
    throw ctx.error(prefix, " weights must be uint32 [", e, ", ", n, ", in_features * ", bits, " / 32], got ",
                    w.dtype(), " ", w.shape());
  }
  const int in_features = to_int32(ctx, int64_t{w.shape(2)} * 32 / bits, "in_features");
  if (in_features % group != 0) throw ctx.error(prefix, ": ", in_features, " inputs are not whole groups");
  const mx::Shape groups = {e, n, in_features / group};
  auto float_groups = [&](size_t i, const char* what) {
    const mx::array& t = ctx.input(i);
    if (t.dtype() != mx::float32 || t.shape() != groups)
      throw ctx.error(prefix, " ", what, " must be float32 ", groups, ", got ", t.dtype(), " ", t.shape());
    return t;
  };
  PackedExperts p{w, float_groups(base + 1, "scales"), std::nullopt, bits, group};
  if (ctx.has_input(base + 2)) p.biases = float_groups(base + 2, "biases");
  return p;
}

// Each routed pair's product with its expert: x [R, K] (a row per pair, or per token) -> [P, N].
mx::array routed_product(const mx::array& x, const mx::array& experts, const PackedExperts& p,
                         mx::StreamOrDevice s) {
  return kernels::routed_quantized_matmul(x, experts, p.w, p.scales, p.biases, p.group_size, p.bits, s);
}

// QMoE whose experts' weights pack_qmoe_weights converted into MLX's affine layout: each (token, expert)
// pair runs its expert's packed weight (kernels::routed_quantized_matmul: the pairs of an expert as one
// quantized GEMV or GEMM), nothing is dequantized to float32 in memory. Routing, activation and mixing
// are QMoE's.
OpOutputs packed_qmoe(NodeContext& ctx) {
  const auto s = ctx.stream();
  MoeShape d{};
  check_input_and_router(ctx, d);
  const MoeAttributes a = moe_attributes(ctx, d.experts);
  check_fc3_presence(ctx, a, kPackedFirst + 2 * kPackedPerProjection);
  std::optional<PackedExperts> fc2 = packed_experts(ctx, 1, d.experts, d.hidden, 0);
  if (!fc2) throw ctx.error("fc2's packed weights are required");
  d.inter = fc2->w.shape(2) * 32 / fc2->bits;
  d.fc1_features = a.fused() ? 2 * d.inter : d.inter;
  std::optional<PackedExperts> fc1 = packed_experts(ctx, 0, d.experts, d.fc1_features, d.hidden);
  if (!fc1) throw ctx.error("fc1's packed weights are required");
  std::optional<PackedExperts> fc3 = packed_experts(ctx, 2, d.experts, d.inter, d.hidden);
  const mx::Dtype t = ctx.input(0).dtype();
  auto bias = [&](int j, int features) {
    return float_input(ctx, kPackedFirst + kPackedPerProjection * static_cast<size_t>(j) + 3,
                       ("fc" + std::to_string(j + 1) + "_experts_bias").c_str(), t, {d.experts, features},
                       "[num_experts, features]");
  };
  const std::optional<mx::array> b1 = bias(0, d.fc1_features), b2 = bias(1, d.hidden), b3 = bias(2, d.inter);
  if (b3 && !fc3) throw ctx.error("fc3_experts_bias is given without fc3's weights");
  std::optional<mx::array> router_weights = float_input(ctx, kPackedRouterWeights, "router_weights", t,
                                                        {d.tokens, d.experts}, "[tokens, num_experts]");
  if (router_weights && a.sparse_mixer)
    throw ctx.error(
        "router_weights with use_sparse_mixer=1 is not supported (the sparse mixer makes the weights)");
  if (d.tokens == 0) return {mx::zeros(ctx.input(0).shape(), t, s)};

  const Routing r = qmoe_routing(mx::astype(ctx.input(1), mx::float32, s), router_weights, a, s);
  const int pairs = d.tokens * a.k;
  const mx::array experts = mx::reshape(mx::astype(r.experts, mx::uint32, s), {pairs}, s);
  auto plus_bias = [&](const mx::array& h, const std::optional<mx::array>& b) {
    return b ? mx::add(h, mx::take(*b, experts, 0, s), s) : h;
  };
  mx::array x = mx::reshape(mx::astype(ctx.input(0), mx::float32, s), {d.tokens, d.hidden}, s);
  mx::array h1 =
      plus_bias(routed_product(x, experts, *fc1, s), b1);  // [P, F1]: a token's k pairs share its row
  std::optional<mx::array> h3;
  if (fc3) h3 = plus_bias(routed_product(x, experts, *fc3, s), b3);
  mx::array y = plus_bias(routed_product(expert_activation(h1, h3, a, d.inter, s), experts, *fc2, s), b2);
  y = mx::reshape(y, {d.tokens, a.k, d.hidden}, s);
  return finish(ctx, mx::sum(mx::multiply(y, mx::expand_dims(r.weights, -1, s), s), 1, false, s));
}

}  // namespace

void register_microsoft_moe(OpRegistry& r) {
  r.add({
      {.op_type = "MoE",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = moe,
       .restrictions = "use_sparse_mixer routes like ORT's CUDA kernel (ORT's CPU kernel ignores it)"},
      {.op_type = "QMoE",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = qmoe,
       .restrictions =
           "quant_type 'int' only (2/4/8 bits, column-wise or a block_size dividing the input features); "
           "weights_prepacked -1/0; use_sparse_mixer routes like ORT's CUDA kernel, without router_weights"},
      // Made by src/passes/pack_qmoe_weights.cpp from QMoE.
      {.op_type = "PackedQMoE",
       .domain = kTransmuter,
       .since = 1,
       .until = kOpen,
       .fn = packed_qmoe,
       .restrictions = "bits 4/8, group_size 32/64/128 (what the pass produces)"},
  });
}

}  // namespace transmuter
