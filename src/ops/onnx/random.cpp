// Dropout.
// https://onnx.ai/onnx/operators/onnx__Dropout.html
#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

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
// with probability 1 - ratio and scaled by 1 / (1 - ratio); `seed` makes the
// draw reproducible (MLX's generator, so not numpy's numbers).
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

}  // namespace

void register_random(OpRegistry& r) {
  r.add({
      {"Dropout", kOnnx, 1, 9, dropout_v1},
      {"Dropout", kOnnx, 10, 11, dropout_v10},
      {"Dropout", kOnnx, 12, kOpen, dropout_v12, {1, 2}},
  });
}

}  // namespace transmuter
