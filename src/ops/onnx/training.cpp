// The optimizer steps of ai.onnx.preview.training: Adagrad, Momentum, Adam.
// https://onnx.ai/onnx/operators/#ai-onnx-preview-training
//
// Each takes the learning rate R and step count T (scalars), then n tensors to
// update with their gradients and optimizer states, and returns the new
// tensors and states. They are elementwise MLX ops: T is data (mx::where on
// T > 0), so a training step traced under compile needs no graph break.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

constexpr std::string_view kTraining = "ai.onnx.preview.training";

/** Number of tensors updated: inputs are R, T, then `groups` lists of n. */
size_t tensor_count(const NodeContext& ctx, size_t groups) {
  const size_t rest = ctx.num_inputs() < 2 ? 0 : ctx.num_inputs() - 2;
  if (rest == 0 || rest % groups != 0) {
    throw ctx.error("expects R, T and ", groups, " equal lists of tensors, got ", ctx.num_inputs(), " inputs");
  }
  return rest / groups;
}

mx::array scalar(const mx::array& like, double v, mx::StreamOrDevice s) {
  return mx::astype(mx::array(v), like.dtype(), s);
}

/** R and T as scalars in the dtype of the tensor they update. */
std::pair<mx::array, mx::array> rate_and_step(const NodeContext& ctx, const mx::array& like) {
  auto s = ctx.stream();
  if (ctx.input(0).size() != 1 || ctx.input(1).size() != 1) throw ctx.error("R and T must be scalars");
  return {mx::astype(mx::reshape(ctx.input(0), {}, s), like.dtype(), s),
          mx::astype(mx::reshape(ctx.input(1), {}, s), like.dtype(), s)};
}

// r = R / (1 + T * decay); g = norm * X + G; H' = H + g^2; X' = X - r * g / (sqrt(H') + eps)
OpOutputs adagrad(NodeContext& ctx) {
  const size_t n = tensor_count(ctx, 3);
  const double decay = ctx.attr_float("decay_factor", 0.0f), epsilon = ctx.attr_float("epsilon", 0.0f),
               norm = ctx.attr_float("norm_coefficient", 0.0f);
  auto s = ctx.stream();
  OpOutputs xs, hs;
  for (size_t i = 0; i < n; ++i) {
    const mx::array &x = ctx.input(2 + i), &g = ctx.input(2 + n + i), &h = ctx.input(2 + 2 * n + i);
    auto [r, t] = rate_and_step(ctx, x);
    mx::array rate = mx::divide(r, mx::add(scalar(x, 1, s), mx::multiply(t, scalar(x, decay, s), s), s), s);
    mx::array reg = mx::add(mx::multiply(scalar(x, norm, s), x, s), g, s);
    mx::array h_new = mx::add(h, mx::square(reg, s), s);
    mx::array denom = mx::add(mx::sqrt(h_new, s), scalar(x, epsilon, s), s);
    xs.push_back(mx::subtract(x, mx::divide(mx::multiply(rate, reg, s), denom, s), s));
    hs.push_back(h_new);
  }
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

// g = norm * X + G; V' = alpha * V + (T > 0 ? beta : 1) * g;
// standard: X' = X - R * V'; nesterov: X' = X - R * (g + alpha * V')
OpOutputs momentum(NodeContext& ctx) {
  const size_t n = tensor_count(ctx, 3);
  const double alpha = ctx.attr_float("alpha", 0.0f), beta = ctx.attr_float("beta", 0.0f),
               norm = ctx.attr_float("norm_coefficient", 0.0f);
  const std::string mode = ctx.attr_string("mode", "");
  if (mode != "standard" && mode != "nesterov") throw ctx.error("mode must be standard or nesterov, got '", mode, "'");
  auto s = ctx.stream();
  OpOutputs xs, vs;
  for (size_t i = 0; i < n; ++i) {
    const mx::array &x = ctx.input(2 + i), &g = ctx.input(2 + n + i), &v = ctx.input(2 + 2 * n + i);
    auto [r, t] = rate_and_step(ctx, x);
    mx::array reg = mx::add(mx::multiply(scalar(x, norm, s), x, s), g, s);
    mx::array beta_t = mx::where(mx::greater(t, scalar(x, 0, s), s), scalar(x, beta, s), scalar(x, 1, s), s);
    mx::array v_new = mx::add(mx::multiply(scalar(x, alpha, s), v, s), mx::multiply(beta_t, reg, s), s);
    mx::array step = mode == "standard" ? v_new : mx::add(reg, mx::multiply(scalar(x, alpha, s), v_new, s), s);
    xs.push_back(mx::subtract(x, mx::multiply(r, step, s), s));
    vs.push_back(v_new);
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  return xs;
}

// g = norm * X + G; V' = alpha V + (1 - alpha) g; H' = beta H + (1 - beta) g^2;
// r = T > 0 ? R sqrt(1 - beta^T) / (1 - alpha^T) : R;
// X' = (1 - norm_post) (X - r V' / (sqrt(H') + eps))
OpOutputs adam(NodeContext& ctx) {
  const size_t n = tensor_count(ctx, 4);
  const double alpha = ctx.attr_float("alpha", 0.9f), beta = ctx.attr_float("beta", 0.999f),
               epsilon = ctx.attr_float("epsilon", 1e-6f), norm = ctx.attr_float("norm_coefficient", 0.0f),
               norm_post = ctx.attr_float("norm_coefficient_post", 0.0f);
  auto s = ctx.stream();
  OpOutputs xs, vs, hs;
  for (size_t i = 0; i < n; ++i) {
    const mx::array &x = ctx.input(2 + i), &g = ctx.input(2 + n + i), &v = ctx.input(2 + 2 * n + i),
                    &h = ctx.input(2 + 3 * n + i);
    auto [r, t] = rate_and_step(ctx, x);
    auto one = scalar(x, 1, s);
    mx::array reg = mx::add(mx::multiply(scalar(x, norm, s), x, s), g, s);
    mx::array v_new = mx::add(mx::multiply(scalar(x, alpha, s), v, s), mx::multiply(scalar(x, 1 - alpha, s), reg, s), s);
    mx::array h_new =
        mx::add(mx::multiply(scalar(x, beta, s), h, s), mx::multiply(scalar(x, 1 - beta, s), mx::square(reg, s), s), s);
    // The bias correction is 0/0 at T = 0, where the spec uses R as is. The
    // correction is evaluated at T = 1 there, so no NaN reaches the gradient
    // through the branch where() discards (its cotangent is 0, and 0 * NaN is NaN).
    mx::array started = mx::greater(t, scalar(x, 0, s), s);
    mx::array t_safe = mx::where(started, t, one, s);
    mx::array bias = mx::divide(mx::sqrt(mx::subtract(one, mx::power(scalar(x, beta, s), t_safe, s), s), s),
                                mx::subtract(one, mx::power(scalar(x, alpha, s), t_safe, s), s), s);
    mx::array rate = mx::multiply(r, mx::where(started, bias, one, s), s);
    mx::array denom = mx::add(mx::sqrt(h_new, s), scalar(x, epsilon, s), s);
    mx::array x_new = mx::subtract(x, mx::multiply(rate, mx::divide(v_new, denom, s), s), s);
    xs.push_back(mx::multiply(scalar(x, 1 - norm_post, s), x_new, s));
    vs.push_back(v_new);
    hs.push_back(h_new);
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

}  // namespace

void register_training(OpRegistry& r) {
  r.add({
      {"Adagrad", kTraining, 1, kOpen, adagrad},
      {"Momentum", kTraining, 1, kOpen, momentum},
      {"Adam", kTraining, 1, kOpen, adam},
  });
}

}  // namespace transmuter
