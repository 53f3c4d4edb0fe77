// Normalizations: LayerNormalization, BatchNormalization,
// InstanceNormalization, GroupNormalization, LpNormalization.
// https://onnx.ai/onnx/operators/onnx__LayerNormalization.html (and the others)
#include <numeric>
#include <optional>

#include <mlx/fast.h>
#include <mlx/mlx.h>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/layer_norm.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

std::vector<int> axes_from(int first, int rank) {
  std::vector<int> axes(std::max(rank - first, 0));
  std::iota(axes.begin(), axes.end(), first);
  return axes;
}

// The dtype statistics are computed in: float32 for half-precision inputs
// when stash_type is 1 (the default), the input's own dtype otherwise.
mx::Dtype stash_dtype(const NodeContext& ctx, mx::Dtype input) {
  bool half = input == mx::float16 || input == mx::bfloat16;
  return half && ctx.attr_int("stash_type", 1) == 1 ? mx::float32 : input;
}

// Mean and 1/sqrt(var + eps) of `x` over `axes` (kept as size-1 axes),
// variance being the population variance as ONNX defines it.
struct Moments {
  mx::array mean;
  mx::array inv_std;
};

Moments moments(const mx::array& x, const std::vector<int>& axes, float epsilon, mx::StreamOrDevice s) {
  mx::array mean = mx::mean(x, axes, true, s);
  mx::array variance = mx::mean(mx::square(mx::subtract(x, mean, s), s), axes, true, s);
  mx::array inv_std = mx::rsqrt(mx::add(variance, mx::array(epsilon, x.dtype()), s), s);
  return {mean, inv_std};
}

// A per-channel parameter of shape [C] reshaped to [C, 1, ..., 1] so that it
// broadcasts against an [N, C, D1, ...] input.
mx::array per_channel(const mx::array& p, int input_rank, mx::StreamOrDevice s) {
  if (p.ndim() != 1) return p;
  mx::Shape shape(std::max(input_rank - 1, 1), 1);
  shape[0] = p.shape(0);
  return mx::reshape(p, shape, s);
}

// --- LayerNormalization (v17) ---------------------------------------------------

// Normalizes over axes [axis, rank); outputs Y and optionally Mean and
// InvStdDev (shape X.shape[:axis] + [1] * (rank - axis)). Uses
// mx::fast::layer_norm for the common case: last-axis normalization with a
// 1-D scale/bias and no statistics requested.
OpOutputs layer_normalization(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& scale = ctx.input(1);
  std::optional<mx::array> bias = ctx.optional_input(2);
  const int rank = static_cast<int>(x.ndim());
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", -1), rank);
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);
  const bool wants_stats = ctx.output_requested(1) || ctx.output_requested(2);

  // fast::layer_norm accumulates in float32, which is what stash_type=1 asks.
  const bool float32_stats = x.dtype() == mx::float32 || stash_dtype(ctx, x.dtype()) == mx::float32;
  const bool one_d_params = scale.ndim() == 1 && (!bias || bias->ndim() == 1);
  if (axis == rank - 1 && !wants_stats && float32_stats && one_d_params) {
    // On CPU, MLX's fast::layer_norm is its composition of ops; the kernel is one pass.
    if (kernels::is_cpu_stream(s) && x.dtype() == mx::float32) {
      return {kernels::normalize_last_axis(x, std::nullopt, std::nullopt, scale, bias, {.epsilon = epsilon}, s)[0]};
    }
    return {mx::fast::layer_norm(x, scale, bias, epsilon, s)};
  }

  const mx::Dtype compute = stash_dtype(ctx, x.dtype());
  mx::array xc = mx::astype(x, compute, s);
  Moments m = moments(xc, axes_from(axis, rank), epsilon, s);
  mx::array normalized = mx::astype(mx::multiply(mx::subtract(xc, m.mean, s), m.inv_std, s), x.dtype(), s);
  mx::array y = mx::multiply(normalized, scale, s);
  if (bias) y = mx::add(y, *bias, s);
  return {mx::astype(y, x.dtype(), s), m.mean, m.inv_std};
}

// --- BatchNormalization ------------------------------------------------------------

// Inference: y = scale * (x - mean) / sqrt(var + eps) + B per channel (axis 1).
// Before v9, spatial=0 gives parameters of shape [C, D1, ...] that apply per
// activation; they broadcast against x as they are.
mx::array batch_norm_inference(const mx::array& x, const mx::array& scale, const mx::array& bias,
                               const mx::array& mean, const mx::array& var, float epsilon,
                               mx::StreamOrDevice s) {
  const int rank = static_cast<int>(x.ndim());
  mx::array inv_std = mx::rsqrt(mx::add(per_channel(var, rank, s), mx::array(epsilon, var.dtype()), s), s);
  mx::array factor = mx::multiply(per_channel(scale, rank, s), inv_std, s);
  mx::array centered = mx::subtract(x, per_channel(mean, rank, s), s);
  mx::array y = mx::add(mx::multiply(centered, factor, s), per_channel(bias, rank, s), s);
  return mx::astype(y, x.dtype(), s);
}

// v1-v13: inference only. (v1-v6 `is_test`, v1-v8 `spatial` and the training
// outputs of those versions are for training frameworks; like ONNX Runtime we
// run the inference form and reject requests for the extra outputs.)
OpOutputs batch_normalization_legacy(NodeContext& ctx) {
  if (ctx.output_requested(1)) throw ctx.error("training outputs (mean, var, saved_*) are not supported");
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);
  return {batch_norm_inference(ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3), ctx.input(4), epsilon,
                               ctx.stream())};
}

// v14+: training_mode=1 normalizes with the batch statistics and also returns
// the updated running statistics: running = input * momentum + batch * (1 - momentum).
OpOutputs batch_normalization(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);
  if (ctx.attr_int("training_mode", 0) == 0) {
    return {batch_norm_inference(x, ctx.input(1), ctx.input(2), ctx.input(3), ctx.input(4), epsilon, s)};
  }
  const float momentum = ctx.attr_float("momentum", 0.9f);
  std::vector<int> axes = axes_from(2, static_cast<int>(x.ndim()));
  axes.insert(axes.begin(), 0);
  mx::array batch_mean = mx::mean(x, axes, false, s);
  mx::array batch_var = mx::var(x, axes, false, 0, s);
  mx::array y = batch_norm_inference(x, ctx.input(1), ctx.input(2), batch_mean, batch_var, epsilon, s);

  auto running = [&](const mx::array& old_stat, const mx::array& batch_stat) {
    mx::array kept = mx::multiply(old_stat, mx::array(momentum, old_stat.dtype()), s);
    mx::array added = mx::multiply(batch_stat, mx::array(1.0f - momentum, batch_stat.dtype()), s);
    return mx::astype(mx::add(kept, added, s), old_stat.dtype(), s);
  };
  return {y, running(ctx.input(3), batch_mean), running(ctx.input(4), batch_var)};
}

// --- InstanceNormalization ------------------------------------------------------------

// Normalizes each (n, c) slice over the spatial axes; per-channel scale and B.
OpOutputs instance_normalization(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 3) throw ctx.error("input must have rank >= 3 ([N, C, D1, ...]), got ", rank);
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);
  const mx::Dtype compute = stash_dtype(ctx, x.dtype());
  mx::array xc = mx::astype(x, compute, s);
  Moments m = moments(xc, axes_from(2, rank), epsilon, s);
  mx::array normalized = mx::astype(mx::multiply(mx::subtract(xc, m.mean, s), m.inv_std, s), x.dtype(), s);
  mx::array y = mx::add(mx::multiply(normalized, per_channel(ctx.input(1), rank, s), s),
                        per_channel(ctx.input(2), rank, s), s);
  return {mx::astype(y, x.dtype(), s)};
}

// --- GroupNormalization --------------------------------------------------------------

// Normalizes each group of C / num_groups channels of each sample. v18 takes
// scale and bias per group ([num_groups]); v21 per channel ([C]) and adds
// stash_type.
template <bool kPerChannelParams>
OpOutputs group_normalization(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 2) throw ctx.error("input must have rank >= 2 ([N, C, ...]), got ", rank);
  const int64_t groups = ctx.required_int("num_groups");
  const int channels = x.shape(1);
  if (groups <= 0 || groups > std::max(channels, 1) || channels % groups != 0) {
    throw ctx.error("num_groups ", groups, " does not divide the ", channels, " channels");
  }
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);

  // [N, C, D...] -> [N, G, C/G * prod(D)], normalize the last axis.
  mx::Dtype compute = kPerChannelParams ? stash_dtype(ctx, x.dtype()) : x.dtype();
  mx::array grouped = mx::reshape(mx::astype(x, compute, s), {x.shape(0), static_cast<int>(groups), -1}, s);
  Moments m = moments(grouped, {2}, epsilon, s);
  mx::array normalized = mx::multiply(mx::subtract(grouped, m.mean, s), m.inv_std, s);
  normalized = mx::astype(mx::reshape(normalized, x.shape(), s), x.dtype(), s);

  mx::array scale = ctx.input(1);
  mx::array bias = ctx.input(2);
  if (!kPerChannelParams) {
    // One value per group, repeated for each channel of the group.
    scale = mx::repeat(scale, channels / static_cast<int>(groups), 0, s);
    bias = mx::repeat(bias, channels / static_cast<int>(groups), 0, s);
  }
  mx::array y =
      mx::add(mx::multiply(normalized, per_channel(scale, rank, s), s), per_channel(bias, rank, s), s);
  return {mx::astype(y, x.dtype(), s)};
}

// --- LpNormalization ---------------------------------------------------------------------

// x / ||x||_p along `axis`, p in {1, 2}. Where the norm is 0 the result is 0
// (not 0 / 0), as in the ONNX reference and node tests.
OpOutputs lp_normalization(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", -1), static_cast<int>(x.ndim()));
  const int64_t p = ctx.attr_int("p", 2);
  mx::array norm = [&] {
    if (p == 1) return mx::sum(mx::abs(x, s), axis, true, s);
    if (p == 2) return mx::sqrt(mx::sum(mx::square(x, s), axis, true, s), s);
    throw ctx.error("p must be 1 or 2, got ", p);
  }();
  mx::array zero = mx::zeros_like(x, s);
  mx::array y = mx::where(mx::equal(norm, zero, s), zero, mx::divide(x, norm, s), s);
  return {mx::astype(y, x.dtype(), s)};
}

}  // namespace

void register_normalization(OpRegistry& r) {
  r.add({
      // ONNX added LayerNormalization in opset 17; ONNX Runtime has had it in the
      // default domain from version 1 as a contrib op with the same attributes and
      // outputs, and its optimizer writes it into exports of any opset.
      onnxruntime_default_domain({"LayerNormalization", kOnnx, 1, 16, layer_normalization, {}, false,
                                  "ONNX Runtime's contrib op (ONNX has it from opset 17)"}),
      {"LayerNormalization", kOnnx, 17, kOpen, layer_normalization},
      // v1-v5 is_test/spatial/consumed_inputs, v6 is_test/spatial, v7 spatial,
      // v9 no mode attributes: all inference here. v14 training_mode, v15 dtypes.
      {"BatchNormalization",
       kOnnx,
       1,
       13,
       batch_normalization_legacy,
       {},
       false,
       "inference only: training outputs (mean, var, saved_mean, saved_var) are rejected"},
      {"BatchNormalization", kOnnx, 14, kOpen, batch_normalization},
      // v6 drops consumed_inputs; v22 bfloat16.
      {"InstanceNormalization", kOnnx, 1, kOpen, instance_normalization},
      {"GroupNormalization", kOnnx, 18, 20, group_normalization<false>},
      {"GroupNormalization", kOnnx, 21, kOpen, group_normalization<true>},
      {"LpNormalization", kOnnx, 1, kOpen, lp_normalization},  // v22: bfloat16
  });
}

}  // namespace transmuter
