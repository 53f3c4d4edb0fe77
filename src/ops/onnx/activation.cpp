// Activation functions and (Log)Softmax.
// https://onnx.ai/onnx/operators/ (Relu, Gelu, Softmax, ...)
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/softmax.h"
#include "ops/node_context.h"
#include "ops/rational_erf.h"
#include "ops/registry.h"
#include "ops/vectorized_exp.h"

namespace transmuter {
namespace {

/** A 0-d array holding `v` in the dtype of `like` (no float16 -> float32
 * promotion when mixed in). */
mx::array scalar_like(const mx::array& like, double v) { return mx::array(v, like.dtype()); }

/** Applies a multi-step formula to input 0. float16 and bfloat16 inputs are
 * computed in float32 and rounded once at the end, instead of at every step
 * (which costs several bfloat16 ulps in Gelu or Mish). */
template <typename Formula>
OpOutputs widened(NodeContext& ctx, Formula formula) {
  const mx::array& x = ctx.input(0);
  if (x.dtype() != mx::float16 && x.dtype() != mx::bfloat16) return {formula(x, ctx.stream())};
  mx::array wide = formula(mx::astype(x, mx::float32, ctx.stream()), ctx.stream());
  return {mx::astype(wide, x.dtype(), ctx.stream())};
}

OpOutputs relu(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  return {kernels::binary(kernels::BinaryOp::kMaximum, x, scalar_like(x, 0), ctx.stream())};
}

OpOutputs sigmoid(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (kernels::is_cpu_stream(ctx.stream()) && kernels::bias_activation_fits(x, std::nullopt)) {
    // MLX's CPU sigmoid evaluates exp one element at a time; the kernel is SIMD across threads.
    return {kernels::bias_activation(x, std::nullopt, kernels::Activation::kSigmoid, ctx.stream())};
  }
  return {mx::sigmoid(x, ctx.stream())};
}

OpOutputs leaky_relu(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  mx::array alpha = scalar_like(x, ctx.attr_float("alpha", 0.01f));
  return {mx::where(mx::less(x, scalar_like(x, 0), s), mx::multiply(alpha, x, s), x, s)};
}

// alpha * (exp(x) - 1) for x < 0, else x.
OpOutputs elu(NodeContext& ctx) {
  float alpha = ctx.attr_float("alpha", 1.0f);
  return widened(ctx, [&](const mx::array& x, mx::StreamOrDevice s) {
    mx::array negative = mx::multiply(scalar_like(x, alpha), mx::expm1(x, s), s);
    return mx::where(mx::less(x, scalar_like(x, 0), s), negative, x, s);
  });
}

// gamma * (x > 0 ? x : alpha * (exp(x) - 1)); the defaults are the spec's
// float32 spellings of the SELU paper's constants.
OpOutputs selu(NodeContext& ctx) {
  float alpha = ctx.attr_float("alpha", 1.67326319217681884765625f);
  float gamma = ctx.attr_float("gamma", 1.05070102214813232421875f);
  return widened(ctx, [&](const mx::array& x, mx::StreamOrDevice s) {
    mx::array negative = mx::multiply(scalar_like(x, alpha), mx::expm1(x, s), s);
    mx::array inner = mx::where(mx::greater(x, scalar_like(x, 0), s), x, negative, s);
    return mx::multiply(scalar_like(x, gamma), inner, s);
  });
}

/** max(0, min(1, alpha * x + beta)). */
mx::array hard_sigmoid(const mx::array& x, float alpha, float beta, mx::StreamOrDevice s) {
  using kernels::BinaryOp;
  // mx::clip's steps (maximum, then minimum) through the float32 CPU kernels (kernels/cpu/elementwise.h).
  mx::array linear =
      kernels::binary(BinaryOp::kAdd, kernels::binary(BinaryOp::kMultiply, scalar_like(x, alpha), x, s),
                      scalar_like(x, beta), s);
  return kernels::binary(BinaryOp::kMinimum,
                         kernels::binary(BinaryOp::kMaximum, linear, scalar_like(x, 0), s), scalar_like(x, 1),
                         s);
}

OpOutputs hard_sigmoid_op(NodeContext& ctx) {
  float alpha = ctx.attr_float("alpha", 0.2f);
  float beta = ctx.attr_float("beta", 0.5f);
  return widened(ctx,
                 [&](const mx::array& x, mx::StreamOrDevice s) { return hard_sigmoid(x, alpha, beta, s); });
}

// x * HardSigmoid(x) with alpha = 1/6, beta = 0.5.
OpOutputs hard_swish(NodeContext& ctx) {
  return widened(ctx, [](const mx::array& x, mx::StreamOrDevice s) {
    return kernels::binary(kernels::BinaryOp::kMultiply, x, hard_sigmoid(x, 1.0f / 6.0f, 0.5f, s), s);
  });
}

/** log(1 + exp(x)), computed without overflow for large x. */
mx::array softplus(const mx::array& x, mx::StreamOrDevice s) {
  return mx::logaddexp(x, scalar_like(x, 0), s);
}

OpOutputs softplus_op(NodeContext& ctx) { return widened(ctx, softplus); }

// x / (1 + |x|)
OpOutputs softsign(NodeContext& ctx) {
  return widened(ctx, [](const mx::array& x, mx::StreamOrDevice s) {
    return mx::divide(x, mx::add(scalar_like(x, 1), mx::abs(x, s), s), s);
  });
}

// x * tanh(softplus(x))
OpOutputs mish(NodeContext& ctx) {
  return widened(ctx, [](const mx::array& x, mx::StreamOrDevice s) {
    return mx::multiply(x, mx::tanh(softplus(x, s), s), s);
  });
}

OpOutputs thresholded_relu(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  mx::array alpha = scalar_like(x, ctx.attr_float("alpha", 1.0f));
  return {mx::where(mx::greater(x, alpha, s), x, scalar_like(x, 0), s)};
}

// max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
// x + bias below -lambd, x - bias above lambd, 0 between (any numeric type).
OpOutputs shrink(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  mx::array lambd = scalar_like(x, ctx.attr_float("lambd", 0.5f));
  mx::array bias = scalar_like(x, ctx.attr_float("bias", 0.0f));
  mx::array below = mx::less(x, mx::negative(lambd, s), s);
  mx::array above = mx::greater(x, lambd, s);
  mx::array zero = scalar_like(x, 0);
  return {mx::where(below, mx::add(x, bias, s), mx::where(above, mx::subtract(x, bias, s), zero, s), s)};
}

// x * sigmoid(alpha * x).
OpOutputs swish(NodeContext& ctx) {
  float alpha = ctx.attr_float("alpha", 1.0f);
  return widened(ctx, [&](const mx::array& x, mx::StreamOrDevice s) {
    return mx::multiply(x, mx::sigmoid(mx::multiply(scalar_like(x, alpha), x, s), s), s);
  });
}

OpOutputs celu(NodeContext& ctx) {
  float alpha_value = ctx.attr_float("alpha", 1.0f);
  return widened(ctx, [&](const mx::array& x, mx::StreamOrDevice s) {
    mx::array alpha = scalar_like(x, alpha_value);
    mx::array zero = scalar_like(x, 0);
    mx::array negative = mx::multiply(alpha, mx::expm1(mx::divide(x, alpha, s), s), s);
    return mx::add(mx::maximum(zero, x, s), mx::minimum(zero, negative, s), s);
  });
}

// PRelu before opset 7 predates multidirectional broadcasting; exports of that
// era give the slope per channel as a 1-D [C] tensor for an [N, C, ...] input,
// which numpy rules would align with the last axis instead of the channel.
mx::array align_legacy_slope(const NodeContext& ctx, const mx::array& x, const mx::array& slope) {
  if (ctx.opset() >= 7 || slope.ndim() != 1 || x.ndim() < 3 || slope.shape(0) != x.shape(1) ||
      slope.shape(0) == 1) {
    return slope;
  }
  mx::Shape shape(x.ndim() - 1, 1);
  shape[0] = slope.shape(0);
  return mx::reshape(slope, shape, ctx.stream());
}

OpOutputs prelu(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  mx::array slope = align_legacy_slope(ctx, x, ctx.input(1));
  return {mx::where(mx::less(x, scalar_like(x, 0), s), mx::multiply(slope, x, s), x, s)};
}

// Gelu-20: approximate="none" is x * Phi(x) with the exact normal CDF;
// "tanh" is the tanh approximation of Hendrycks & Gimpel.
mx::array gelu_exact(const mx::array& x, mx::StreamOrDevice s) {
  mx::array cdf = rational_erf(mx::multiply(x, scalar_like(x, M_SQRT1_2), s), s);
  return mx::multiply(mx::multiply(scalar_like(x, 0.5), x, s), mx::add(scalar_like(x, 1), cdf, s), s);
}

mx::array gelu_tanh(const mx::array& x, mx::StreamOrDevice s) {
  mx::array cube = mx::multiply(mx::multiply(x, x, s), x, s);
  mx::array inner = mx::add(x, mx::multiply(scalar_like(x, 0.044715), cube, s), s);
  mx::array t = mx::tanh(mx::multiply(scalar_like(x, std::sqrt(2.0 / M_PI)), inner, s), s);
  return mx::multiply(mx::multiply(scalar_like(x, 0.5), x, s), mx::add(scalar_like(x, 1), t, s), s);
}

OpOutputs gelu(NodeContext& ctx) {
  std::string approximate = ctx.attr_string("approximate", "none");
  const mx::array& x = ctx.input(0);
  if ((approximate == "none" || approximate == "tanh") && kernels::is_cpu_stream(ctx.stream()) &&
      kernels::bias_activation_fits(x, std::nullopt)) {
    // One threaded SIMD pass instead of MLX's scalar elementwise kernels.
    const auto activation = approximate == "none" ? kernels::Activation::kGeluErf : kernels::Activation::kGeluTanh;
    return {kernels::bias_activation(x, std::nullopt, activation, ctx.stream())};
  }
  if (approximate == "none") return widened(ctx, gelu_exact);
  if (approximate == "tanh") return widened(ctx, gelu_tanh);
  throw ctx.error("attribute 'approximate' must be \"none\" or \"tanh\", got \"", approximate, "\"");
}

// Softmax/LogSoftmax 1-12 coerce the input to 2-D at `axis` (default 1) and
// normalize over the flattened trailing block; 13+ normalize over the one
// `axis` (default -1).
std::vector<int> normalized_axes(const NodeContext& ctx, const mx::array& x) {
  int rank = static_cast<int>(x.ndim());
  if (ctx.opset() >= 13) return {ctx.normalize_axis(ctx.attr_int("axis", -1), rank)};
  int first = ctx.normalize_axis(ctx.attr_int("axis", 1), rank);
  std::vector<int> axes(rank - first);
  std::iota(axes.begin(), axes.end(), first);
  return axes;
}

// Half precision as the spec's formula evaluated in the input's dtype: exp,
// sum and divide each rounded to it (the ONNX reference's NumPy steps). A
// float32 softmax rounded once is an ulp off in some rows, beyond the node
// tests' rtol (test_attention_4d_causal_fp16_expanded).
mx::array softmax_half_steps(const mx::array& x, const std::vector<int>& axes, mx::StreamOrDevice s) {
  mx::array wide = mx::astype(x, mx::float32, s);
  mx::array row_max = mx::stop_gradient(mx::max(wide, axes, /*keepdims=*/true, s), s);
  mx::array e = mx::astype(exp_upto_88(mx::subtract(wide, row_max, s), s), x.dtype(), s);
  mx::array sum = mx::astype(mx::sum(mx::astype(e, mx::float32, s), axes, /*keepdims=*/true, s), x.dtype(), s);
  return mx::divide(e, sum, s);
}

// On the CPU, float32 over the last axis uses the softmax kernel, float32
// over other axes the vectorized composition, and half precision the stepwise
// one above; float64, and every dtype on a GPU stream, keep MLX's.
OpOutputs softmax(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  std::vector<int> axes = normalized_axes(ctx, x);
  if (x.dtype() == mx::float64 || !on_cpu_stream(ctx.stream())) {
    return {mx::softmax(x, axes, /*precise=*/true, ctx.stream())};
  }
  if (x.dtype() == mx::float32 && axes == std::vector<int>{static_cast<int>(x.ndim()) - 1}) {
    return {kernels::softmax_last_axis(x, std::nullopt, {}, ctx.stream())};
  }
  if (x.dtype() == mx::float16 || x.dtype() == mx::bfloat16) return {softmax_half_steps(x, axes, ctx.stream())};
  return widened(ctx, [&](const mx::array& v, mx::StreamOrDevice s) { return softmax_float32(v, axes, s); });
}

// One-hot of the first maximum over the softmax axes (the same 1-12 / 13+
// split as Softmax).
OpOutputs hardmax(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  std::vector<int> axes = normalized_axes(ctx, x);
  auto s = ctx.stream();
  // Axes are trailing or single: bring them into one last axis.
  mx::Shape outer(x.shape().begin(), x.shape().begin() + axes.front());
  int inner = 1;
  for (int a : axes) inner *= x.shape(a);
  mx::array moved = axes.size() == 1 ? mx::moveaxis(x, axes.front(), -1, s) : x;
  mx::Shape rows = axes.size() == 1 ? moved.shape() : outer;
  if (axes.size() != 1) rows.push_back(inner);
  mx::array flat = mx::reshape(moved, rows, s);
  mx::array first_max = mx::argmax(flat, -1, /*keepdims=*/true, s);
  mx::array positions = mx::arange(inner, mx::uint32, s);
  mx::array one_hot = mx::astype(mx::equal(positions, first_max, s), x.dtype(), s);
  if (axes.size() != 1) return {mx::reshape(one_hot, x.shape(), s)};
  return {mx::moveaxis(one_hot, -1, axes.front(), s)};
}

OpOutputs log_softmax(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  std::vector<int> axes = normalized_axes(ctx, x);
  auto s = ctx.stream();
  return {mx::subtract(x, mx::logsumexp(x, axes, /*keepdims=*/true, s), s)};
}

}  // namespace

void register_activation(OpRegistry& r) {
  r.add({
      // Relu 14 adds integer types; same formula.
      {"Relu", kOnnx, 1, kOpen, relu},
      {"Sigmoid", kOnnx, 1, kOpen, sigmoid},
      {"LeakyRelu", kOnnx, 1, kOpen, leaky_relu},
      {"Elu", kOnnx, 1, kOpen, elu},
      {"Selu", kOnnx, 1, kOpen, selu},
      {"HardSigmoid", kOnnx, 1, kOpen, hard_sigmoid_op},
      {"HardSwish", kOnnx, 14, kOpen, hard_swish},
      {"Softplus", kOnnx, 1, kOpen, softplus_op},
      {"Softsign", kOnnx, 1, kOpen, softsign},
      {"Mish", kOnnx, 18, kOpen, mish},
      {"ThresholdedRelu", kOnnx, 10, kOpen, thresholded_relu},
      {"Celu", kOnnx, 12, kOpen, celu},
      // PRelu 7 switched to numpy-style (unidirectional) broadcasting.
      {"PRelu", kOnnx, 1, 6, prelu},
      {"PRelu", kOnnx, 7, kOpen, prelu},
      {"Gelu", kOnnx, 20, kOpen, gelu},
      {"Softmax", kOnnx, 1, 12, softmax},
      {"Softmax", kOnnx, 13, kOpen, softmax},
      {"Hardmax", kOnnx, 1, 12, hardmax, {}, false, {}, "piecewise constant: a one-hot of the argmax"},
      {"Hardmax", kOnnx, 13, kOpen, hardmax, {}, false, {}, "piecewise constant: a one-hot of the argmax"},
      {"Shrink", kOnnx, 9, kOpen, shrink},
      {"Swish", kOnnx, 24, kOpen, swish},
      {"LogSoftmax", kOnnx, 1, 12, log_softmax},
      {"LogSoftmax", kOnnx, 13, kOpen, log_softmax},
  });
}

}  // namespace transmuter
