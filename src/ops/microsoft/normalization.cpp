// ONNX Runtime's normalization contrib operators (domain com.microsoft,
// version 1): SkipLayerNormalization, SkipSimplifiedLayerNormalization,
// SimplifiedLayerNormalization. ONNX Runtime's optimizer fuses transformer
// blocks into them, and src/passes/fuse_skip_layer_norm.cpp produces them.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//
//   sum  = input + skip [+ bias]
//   Skip(LayerNormalization):        output = (sum - mean) / sqrt(var + eps) * gamma [+ beta]
//   Skip(Simplified)LayerNormalization: output = sum / sqrt(mean(sum^2) + eps) * gamma
//   outputs: output, mean, inv_std_var (statistics over the last axis, kept
//   as a size-1 axis), input_skip_bias_sum
//
// float32 runs kernels::normalize_last_axis (one pass per row, residual and
// bias included) on CPU streams; float16/bfloat16 are computed in float32 and
// rounded once, as ONNX Runtime does.
#include <numeric>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/layer_norm.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// Input positions of one operator; -1: the operator has no such input.
struct SkipNormLayout {
  int skip, gamma, beta, bias;
};

void check_float(const NodeContext& ctx, const char* name, const mx::array& a) {
  if (!mx::issubdtype(a.dtype(), mx::floating)) throw ctx.error(name, " must be a float tensor, got ", a.dtype());
}

// gamma/beta/bias: 1-D of the hidden size D (the input's last dimension).
std::optional<mx::array> hidden_vector(const NodeContext& ctx, int index, const char* name, int64_t d) {
  if (index < 0 || !ctx.has_input(index)) return std::nullopt;
  const mx::array& v = ctx.input(index);
  check_float(ctx, name, v);
  if (v.ndim() != 1 || v.shape(0) != d) {
    throw ctx.error(name, " must be 1-D of the hidden size ", d, " (the input's last dimension), got shape ",
                    v.shape());
  }
  return v;
}

// True when `from` broadcasts to exactly `to` (numpy rules, `to` unchanged).
bool broadcasts_to(const mx::Shape& from, const mx::Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 1; i <= from.size(); ++i) {
    const int f = from[from.size() - i];
    if (f != 1 && f != to[to.size() - i]) return false;
  }
  return true;
}

mx::array widened(const mx::array& a, mx::StreamOrDevice s) {
  return a.dtype() == mx::float16 || a.dtype() == mx::bfloat16 ? mx::astype(a, mx::float32, s) : a;
}

// Mean and 1/sqrt(var + eps) of `sum` over its last axis (var = mean(sum^2)
// for RMS), for the optional statistics outputs.
std::pair<mx::array, mx::array> last_axis_statistics(const mx::array& sum, bool rms, float epsilon,
                                                     mx::StreamOrDevice s) {
  mx::array mean = mx::mean(sum, -1, true, s);
  mx::array centered = rms ? sum : mx::subtract(sum, mean, s);
  mx::array variance = mx::mean(mx::square(centered, s), -1, true, s);
  return {mean, mx::rsqrt(mx::add(variance, mx::array(epsilon, sum.dtype()), s), s)};
}

OpOutputs skip_normalization(NodeContext& ctx, SkipNormLayout layout, bool rms) {
  const auto s = ctx.stream();
  const mx::array& input = ctx.input(0);
  check_float(ctx, "input", input);
  if (input.ndim() < 1) throw ctx.error("input must have at least one dimension");
  const int64_t d = input.shape().back();
  std::optional<mx::array> skip;
  if (layout.skip >= 0) {
    skip = ctx.input(layout.skip);
    check_float(ctx, "skip", *skip);
    // ONNX Runtime also takes a skip that broadcasts to the input ([1, S, D], [S, D]).
    if (skip->shape() != input.shape()) {
      if (!broadcasts_to(skip->shape(), input.shape())) {
        throw ctx.error("skip ", skip->shape(), " does not broadcast to the input's shape ", input.shape());
      }
      skip = mx::broadcast_to(*skip, input.shape(), s);
    }
  }
  std::optional<mx::array> gamma = hidden_vector(ctx, layout.gamma, "gamma", d);
  if (!gamma) throw ctx.error("gamma is required");
  std::optional<mx::array> beta = hidden_vector(ctx, layout.beta, "beta", d);
  std::optional<mx::array> bias = hidden_vector(ctx, layout.bias, "bias", d);
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);

  auto wide = [&](const std::optional<mx::array>& a) -> std::optional<mx::array> {
    if (!a) return a;
    return widened(*a, s);
  };
  const bool want_sum = ctx.output_requested(3);
  const bool want_stats = ctx.output_requested(1) || ctx.output_requested(2);
  std::vector<mx::array> out = kernels::normalize_last_axis(
      widened(input, s), wide(skip), wide(bias), *wide(gamma), wide(beta),
      {.epsilon = epsilon, .rms = rms, .return_sum = want_sum || want_stats}, s);
  OpOutputs outputs(want_sum ? 4 : want_stats ? 3 : 1);
  outputs[0] = mx::astype(out[0], input.dtype(), s);
  if (want_stats) {
    auto [mean, inv_std] = last_axis_statistics(out[1], rms, epsilon, s);
    outputs[1] = mean;
    outputs[2] = inv_std;
  }
  if (want_sum) outputs[3] = mx::astype(out[1], input.dtype(), s);
  return outputs;
}

OpOutputs skip_layer_normalization(NodeContext& ctx) {
  return skip_normalization(ctx, {.skip = 1, .gamma = 2, .beta = 3, .bias = 4}, false);
}

OpOutputs skip_simplified_layer_normalization(NodeContext& ctx) {
  return skip_normalization(ctx, {.skip = 1, .gamma = 2, .beta = -1, .bias = 3}, true);
}

// SimplifiedLayerNormalization(X, scale): RMS normalization over axes
// [axis, rank); outputs Y and, optionally, inv_std_var.
OpOutputs simplified_layer_normalization(NodeContext& ctx) {
  const auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  check_float(ctx, "X", x);
  const mx::array& scale = ctx.input(1);
  check_float(ctx, "scale", scale);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 1) throw ctx.error("X must have at least one dimension");
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", -1), rank);
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);
  const mx::Shape normalized(x.shape().begin() + axis, x.shape().end());
  if (!broadcasts_to(scale.shape(), normalized)) {
    throw ctx.error("scale ", scale.shape(), " does not broadcast to the normalized dimensions ", normalized);
  }
  if (axis == rank - 1 && scale.ndim() == 1 && !ctx.output_requested(1)) {
    mx::array y = kernels::normalize_last_axis(widened(x, s), std::nullopt, std::nullopt, widened(scale, s),
                                               std::nullopt, {.epsilon = epsilon, .rms = true}, s)[0];
    return {mx::astype(y, x.dtype(), s)};
  }
  std::vector<int> axes(rank - axis);
  std::iota(axes.begin(), axes.end(), axis);
  mx::array xf = widened(x, s);
  mx::array inv_std = mx::rsqrt(
      mx::add(mx::mean(mx::square(xf, s), axes, true, s), mx::array(epsilon, xf.dtype()), s), s);
  mx::array y = mx::multiply(mx::multiply(xf, inv_std, s), widened(scale, s), s);
  return {mx::astype(y, x.dtype(), s), inv_std};
}

}  // namespace

void register_microsoft_normalization(OpRegistry& r) {
  r.add({
      {"SkipLayerNormalization", kMicrosoft, 1, kOpen, skip_layer_normalization, {}, false,
       "gamma, beta, bias 1-D of the hidden size; statistics outputs float32"},
      {"SkipSimplifiedLayerNormalization", kMicrosoft, 1, kOpen, skip_simplified_layer_normalization, {}, false,
       "gamma, bias 1-D of the hidden size; statistics outputs float32"},
      {"SimplifiedLayerNormalization", kMicrosoft, 1, kOpen, simplified_layer_normalization, {}, false,
       "registered in com.microsoft only (ONNX Runtime also accepts the default domain)"},
  });
}

}  // namespace transmuter
