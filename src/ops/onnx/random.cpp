// Dropout and the random generators (RandomNormal/Uniform[Like], Bernoulli,
// Multinomial).
// https://onnx.ai/onnx/operators/ (Dropout, RandomNormal, Bernoulli, ...)
//
// Draws come from MLX's generator, so they never reproduce numpy's numbers
// (the ONNX reference); a `seed` makes them reproducible run to run. The
// generators are eager-only: inside mx::compile an unseeded draw would be
// traced once and replayed as a constant.
#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"
#include "transmuter/dtype.h"

namespace transmuter {
namespace {

// --- Dropout ------------------------------------------------------------------------

/** The identity result of Dropout at inference, with an all-kept mask of
 * `mask_dtype` when the node asks for it. */
OpOutputs keep_everything(NodeContext& ctx, mx::Dtype mask_dtype) {
  const mx::array& x = ctx.input(0);
  OpOutputs out{x};
  if (ctx.output_requested(1)) out.emplace_back(mx::ones(x.shape(), mask_dtype, ctx.stream()));
  return out;
}

// Dropout 1-6 (`is_test`) and 7-9 apply no dropout at inference; their mask
// has the data's type. Transmuter is an inference runtime, so `is_test=0`
// (training) of opsets 1-6 is read as inference as well.
OpOutputs dropout_v1(NodeContext& ctx) { return keep_everything(ctx, ctx.input(0).dtype()); }

// Dropout 10-11: the mask became bool.
OpOutputs dropout_v10(NodeContext& ctx) { return keep_everything(ctx, mx::bool_); }

// Dropout 12+: `ratio` (default 0.5) and `training_mode` (default false) are
// optional inputs, read on the host. In training mode each element is kept
// with probability 1 - ratio and scaled by 1 / (1 - ratio); the int `seed`
// makes the draw reproducible.
OpOutputs dropout_v12(NodeContext& ctx) {
  bool training = ctx.has_input(2) && ctx.host_int(2) != 0;
  double ratio = ctx.has_input(1) ? ctx.host_double(1) : 0.5;
  if (!training || ratio == 0) return keep_everything(ctx, mx::bool_);
  if (ratio < 0 || ratio >= 1) throw ctx.error("ratio must be in [0, 1), got ", ratio);

  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  std::optional<mx::array> key;
  if (ctx.has_attr("seed")) key = mx::random::key(static_cast<uint64_t>(ctx.attr_int("seed", 0)));
  mx::array mask = mx::random::bernoulli(mx::array(1.0 - ratio), x.shape(), key, s);
  mx::array scale = mx::array(1.0 / (1.0 - ratio), x.dtype());
  mx::array y = mx::multiply(mx::multiply(x, mx::astype(mask, x.dtype(), s), s), scale, s);
  OpOutputs out{y};
  if (ctx.output_requested(1)) out.emplace_back(mask);
  return out;
}

// --- generators ----------------------------------------------------------------------

/** The key for the generators' float `seed` attribute; none draws from MLX's
 * global generator. */
std::optional<mx::array> seed_key(const NodeContext& ctx) {
  if (!ctx.has_attr("seed")) return std::nullopt;
  return mx::random::key(static_cast<uint64_t>(static_cast<int64_t>(ctx.attr_float("seed", 0))));
}

/** The `dtype` attribute as an MLX float type, or `fallback` when absent. */
mx::Dtype dtype_attr(const NodeContext& ctx, mx::Dtype fallback) {
  if (!ctx.has_attr("dtype")) return fallback;
  auto type = static_cast<OnnxType>(ctx.attr_int("dtype", 0));
  std::optional<mx::Dtype> dtype = to_mlx_dtype(type);
  if (!dtype) throw ctx.error("unsupported dtype ", onnx_type_name(type));
  return *dtype;
}

/** mean + scale * N(0, 1), drawn in float32 and converted to `dtype`. */
mx::array normal(const NodeContext& ctx, const mx::Shape& shape, mx::Dtype dtype) {
  mx::array z = mx::random::normal(shape, mx::float32, mx::array(ctx.attr_float("mean", 0)),
                                   mx::array(ctx.attr_float("scale", 1)), seed_key(ctx), ctx.stream());
  return mx::astype(z, dtype, ctx.stream());
}

/** U[low, high), drawn in float32 and converted to `dtype`. */
mx::array uniform(const NodeContext& ctx, const mx::Shape& shape, mx::Dtype dtype) {
  mx::array u = mx::random::uniform(mx::array(ctx.attr_float("low", 0)), mx::array(ctx.attr_float("high", 1)),
                                    shape, mx::float32, seed_key(ctx), ctx.stream());
  return mx::astype(u, dtype, ctx.stream());
}

mx::Shape shape_attr(const NodeContext& ctx) {
  if (!ctx.has_attr("shape")) throw ctx.error("required attribute 'shape' is missing");
  return to_shape(ctx, ctx.attr_ints("shape"));
}

OpOutputs random_normal(NodeContext& ctx) {
  return {normal(ctx, shape_attr(ctx), dtype_attr(ctx, mx::float32))};
}
OpOutputs random_uniform(NodeContext& ctx) {
  return {uniform(ctx, shape_attr(ctx), dtype_attr(ctx, mx::float32))};
}

OpOutputs random_normal_like(NodeContext& ctx) {
  const mx::array& like = ctx.input(0);
  return {normal(ctx, like.shape(), dtype_attr(ctx, like.dtype()))};
}

OpOutputs random_uniform_like(NodeContext& ctx) {
  const mx::array& like = ctx.input(0);
  return {uniform(ctx, like.shape(), dtype_attr(ctx, like.dtype()))};
}

// Bernoulli: 1 with the probability given by each input element, as the
// `dtype` attribute's type (default: the input's).
OpOutputs bernoulli(NodeContext& ctx) {
  const mx::array& p = ctx.input(0);
  mx::array draw =
      mx::random::bernoulli(mx::astype(p, mx::float32, ctx.stream()), p.shape(), seed_key(ctx), ctx.stream());
  return {mx::astype(draw, dtype_attr(ctx, p.dtype()), ctx.stream())};
}

// Multinomial: input [batch, classes] holds unnormalized log-probabilities;
// output [batch, sample_size] class indices (int32 by default, or int64).
OpOutputs multinomial(NodeContext& ctx) {
  const mx::array& logits = ctx.input(0);
  if (logits.ndim() != 2) throw ctx.error("input must be [batch, classes], got rank ", logits.ndim());
  const int samples = to_int32(ctx, ctx.attr_int("sample_size", 1), "sample_size");
  if (samples < 1) throw ctx.error("sample_size must be positive, got ", samples);
  mx::Dtype dtype = dtype_attr(ctx, mx::int32);
  if (dtype != mx::int32 && dtype != mx::int64) throw ctx.error("dtype must be int32 or int64");
  mx::array drawn = mx::random::categorical(mx::astype(logits, mx::float32, ctx.stream()), -1, samples,
                                            seed_key(ctx), ctx.stream());
  return {mx::astype(drawn, dtype, ctx.stream())};
}

}  // namespace

void register_random(OpRegistry& r) {
  constexpr std::string_view kRandom = "random samples";
  r.add({
      {"Dropout", kOnnx, 1, 9, dropout_v1},
      {"Dropout", kOnnx, 10, 11, dropout_v10},
      {"Dropout", kOnnx, 12, kOpen, dropout_v12, {1, 2}},
      // Version 22 of each generator only adds bfloat16.
      {"RandomNormal", kOnnx, 1, kOpen, random_normal, {}, true, {}, kRandom},
      {"RandomUniform", kOnnx, 1, kOpen, random_uniform, {}, true, {}, kRandom},
      {"RandomNormalLike", kOnnx, 1, kOpen, random_normal_like, {}, true, {}, kRandom},
      {"RandomUniformLike", kOnnx, 1, kOpen, random_uniform_like, {}, true, {}, kRandom},
      {"Bernoulli", kOnnx, 15, kOpen, bernoulli, {}, true, {}, kRandom},
      {"Multinomial", kOnnx, 7, kOpen, multinomial, {}, true, {}, "random samples, integer output"},
  });
}

}  // namespace transmuter
