// Loss operators: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
// https://onnx.ai/onnx/operators/onnx__NegativeLogLikelihoodLoss.html
// https://onnx.ai/onnx/operators/onnx__SoftmaxCrossEntropyLoss.html
//
// Both pick, for every position (n, d1, ..., dk), the input value of the
// target class: loss = -input[n, target, d...] * weight[target]. The pick is
// a comparison of the target with every class index and a sum over the class
// axis, not a gather: a target outside [0, C) (ignore_index may be -1 or 10
// with 5 classes) then picks nothing instead of reading out of bounds, traced
// targets need no host check, and the vjp is a plain select.
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

enum class Reduction { kNone, kSum, kMean };

Reduction reduction_of(const NodeContext& ctx) {
  const std::string reduction = ctx.attr_string("reduction", "mean");
  if (reduction == "none") return Reduction::kNone;
  if (reduction == "sum") return Reduction::kSum;
  if (reduction == "mean") return Reduction::kMean;
  throw ctx.error("reduction must be 'none', 'sum' or 'mean', got '", reduction, "'");
}

// input: [N, C, D1, ..., Dk] float; target: [N, D1, ..., Dk] integer;
// weight: [C] of the input's dtype.
void check_shapes(const NodeContext& ctx, const mx::array& input, const mx::array& target,
                  const std::optional<mx::array>& weight) {
  if (input.ndim() < 2) throw ctx.error("input must have rank >= 2 ([N, C, ...]), got ", input.ndim());
  if (!mx::issubdtype(input.dtype(), mx::floating))
    throw ctx.error("input must be a float tensor, got ", input.dtype());
  if (!mx::issubdtype(target.dtype(), mx::integer)) {
    throw ctx.error("target must be int32 or int64, got ", target.dtype());
  }
  mx::Shape expected = input.shape();
  expected.erase(expected.begin() + 1);
  if (target.shape() != expected) {
    throw ctx.error("target shape ", target.shape(), " does not match input shape ", input.shape(),
                    " without its class axis");
  }
  if (weight && (weight->ndim() != 1 || weight->shape(0) != input.shape(1))) {
    throw ctx.error("weight must have shape [", input.shape(1), "], got ", weight->shape());
  }
}

// Per-position loss and the weight it counts with in a mean: weight[target],
// or 1 without weights; 0 where the target is ignore_index or no class.
struct PickedLoss {
  mx::array loss;
  mx::array weight;
};

PickedLoss pick_target_class(const NodeContext& ctx, const mx::array& input, const mx::array& target,
                             const std::optional<mx::array>& weight) {
  auto s = ctx.stream();
  const int rank = static_cast<int>(input.ndim());
  const int classes = input.shape(1);
  // [1, C, 1, ..., 1]: the class index of every input element.
  mx::Shape class_shape(rank, 1);
  class_shape[1] = classes;
  mx::array class_index = mx::reshape(mx::arange(classes, target.dtype(), s), class_shape, s);
  mx::array is_target = mx::equal(mx::expand_dims(target, 1, s), class_index, s);
  if (ctx.has_attr("ignore_index")) {
    mx::array ignored = mx::equal(target, mx::array(ctx.attr_int("ignore_index", 0), target.dtype()), s);
    is_target = mx::logical_and(is_target, mx::logical_not(mx::expand_dims(ignored, 1, s), s), s);
  }
  mx::array zero = mx::array(0, input.dtype());
  mx::array picked = mx::sum(mx::where(is_target, input, zero, s), 1, false, s);
  if (!weight)
    return {mx::negative(picked, s), mx::astype(mx::any(is_target, 1, false, s), input.dtype(), s)};
  mx::array class_weight = mx::reshape(mx::astype(*weight, input.dtype(), s), class_shape, s);
  mx::array picked_weight = mx::sum(mx::where(is_target, class_weight, zero, s), 1, false, s);
  return {mx::negative(mx::multiply(picked, picked_weight, s), s), picked_weight};
}

// 'mean' divides by the summed weights (the count of positions not ignored
// when there are no weights), as the spec's function body does.
mx::array reduce(const NodeContext& ctx, const PickedLoss& picked, Reduction reduction) {
  auto s = ctx.stream();
  switch (reduction) {
    case Reduction::kNone:
      return picked.loss;
    case Reduction::kSum:
      return mx::sum(picked.loss, s);
    case Reduction::kMean:
      return mx::divide(mx::sum(picked.loss, s), mx::sum(picked.weight, s), s);
  }
  return picked.loss;
}

// Half-precision inputs are computed in float32 and rounded once.
mx::Dtype compute_dtype(mx::Dtype dtype) {
  return dtype == mx::float16 || dtype == mx::bfloat16 ? mx::float32 : dtype;
}

// --- NegativeLogLikelihoodLoss (v12; v22 adds bfloat16) --------------

OpOutputs negative_log_likelihood_loss(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& input = ctx.input(0);
  const mx::array& target = ctx.input(1);
  std::optional<mx::array> weight = ctx.optional_input(2);
  check_shapes(ctx, input, target, weight);
  const Reduction reduction = reduction_of(ctx);
  mx::array wide = mx::astype(input, compute_dtype(input.dtype()), s);
  return {mx::astype(reduce(ctx, pick_target_class(ctx, wide, target, weight), reduction), input.dtype(), s)};
}

// --- SoftmaxCrossEntropyLoss (v12; v13 adds bfloat16) -------------------------

// NegativeLogLikelihoodLoss of LogSoftmax(scores) over the class axis; the
// second output is that log-probability.
OpOutputs softmax_cross_entropy_loss(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& scores = ctx.input(0);
  const mx::array& labels = ctx.input(1);
  std::optional<mx::array> weights = ctx.optional_input(2);
  check_shapes(ctx, scores, labels, weights);
  const Reduction reduction = reduction_of(ctx);
  mx::array wide = mx::astype(scores, compute_dtype(scores.dtype()), s);
  mx::array log_prob = mx::subtract(wide, mx::logsumexp(wide, 1, /*keepdims=*/true, s), s);
  mx::array loss = reduce(ctx, pick_target_class(ctx, log_prob, labels, weights), reduction);
  return {mx::astype(loss, scores.dtype(), s), mx::astype(log_prob, scores.dtype(), s)};
}

}  // namespace

void register_loss(OpRegistry& r) {
  r.add({
      // v13 changes the spec's function body only; v22 adds bfloat16.
      {"NegativeLogLikelihoodLoss", kOnnx, 12, kOpen, negative_log_likelihood_loss},
      // v13: bfloat16 scores.
      {"SoftmaxCrossEntropyLoss", kOnnx, 12, kOpen, softmax_cross_entropy_loss},
  });
}

}  // namespace transmuter
