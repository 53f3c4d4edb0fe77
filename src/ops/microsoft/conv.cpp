// ONNX Runtime's FusedConv contrib operator (domain com.microsoft, version 1):
// a Conv followed by an activation, what ONNX Runtime's optimizer and
// src/passes/fuse_conv_activation.cpp fuse Conv -> activation into.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//   FusedConv(X, W[, B[, Z]]) = act(Conv(X, W, B) [+ Z])
// Attributes: Conv's, plus `activation` (a string) and `activation_params`:
//   Relu                            max(v, 0)
//   Clip         [min, max]         min(max(v, min), max)
//   HardSwish                       v * clip(v / 6 + 1/2, 0, 1)   (a Transmuter extension)
//   LeakyRelu    [alpha]            v >= 0 ? v : alpha v
//   Sigmoid                         1 / (1 + exp(-v))
//   Tanh                            tanh(v)
//   HardSigmoid  [alpha, beta]      clip(alpha v + beta, 0, 1)
// Relu, Clip and HardSwish without Z run inside the CPU convolution kernels
// (src/ops/onnx/conv.h); the others are MLX ops on the convolution's output.
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/onnx/conv.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

using kernels::ConvActivation;

std::vector<float> checked_params(const NodeContext& ctx, const std::string& activation, size_t count) {
  std::vector<float> params = ctx.attr_floats("activation_params");
  if (params.size() != count) {
    throw ctx.error("activation ", activation, " needs ", count, " activation_params, got ", params.size());
  }
  return params;
}

// The activations the convolution kernels apply themselves, or nullopt.
std::optional<ConvEpilogue> kernel_epilogue(const NodeContext& ctx, const std::string& activation) {
  if (activation == "Relu") return ConvEpilogue{ConvActivation::kRelu};
  if (activation == "HardSwish") return ConvEpilogue{ConvActivation::kHardSwish};
  if (activation == "Clip") {
    std::vector<float> p = checked_params(ctx, activation, 2);
    return ConvEpilogue{ConvActivation::kClip, p[0], p[1]};
  }
  return std::nullopt;
}

// The other activations as MLX ops on v (conv + bias [+ Z]).
mx::array activate(const NodeContext& ctx, const std::string& activation, const mx::array& v, mx::StreamOrDevice s) {
  auto scalar = [&](float x) { return mx::array(x, v.dtype()); };
  if (auto e = kernel_epilogue(ctx, activation)) return apply_conv_activation(v, *e, s);
  if (activation == "Sigmoid") return mx::sigmoid(v, s);
  if (activation == "Tanh") return mx::tanh(v, s);
  if (activation == "LeakyRelu") {
    const float alpha = checked_params(ctx, activation, 1)[0];
    return mx::where(mx::greater_equal(v, scalar(0), s), v, mx::multiply(v, scalar(alpha), s), s);
  }
  if (activation == "HardSigmoid") {
    std::vector<float> p = checked_params(ctx, activation, 2);
    return mx::clip(mx::add(mx::multiply(v, scalar(p[0]), s), scalar(p[1]), s), scalar(0), scalar(1), s);
  }
  throw ctx.error("unsupported activation '", activation,
                  "' (supported: Relu, Clip, HardSwish, LeakyRelu, Sigmoid, Tanh, HardSigmoid)");
}

OpOutputs fused_conv(NodeContext& ctx) {
  const std::string activation = ctx.attr_string("activation", "");
  if (activation.empty()) throw ctx.error("attribute 'activation' is required");
  auto z = ctx.optional_input(3);
  if (!z) {
    if (auto e = kernel_epilogue(ctx, activation)) return {convolution(ctx, *e)};
  }
  // Check the activation before the convolution does any work.
  activate(ctx, activation, mx::array(0.0f), ctx.stream());
  mx::array y = convolution(ctx, {});
  if (z) {
    if (z->shape() != y.shape()) throw ctx.error("Z must have the output's shape");
    y = mx::add(y, *z, ctx.stream());
  }
  return {activate(ctx, activation, y, ctx.stream())};
}

}  // namespace

void register_microsoft_conv(OpRegistry& r) {
  r.add({
      {"FusedConv", kMicrosoft, 1, kOpen, fused_conv, {}, false,
       "activations Relu, Clip, HardSwish, LeakyRelu, Sigmoid, Tanh, HardSigmoid; Z of the output's shape"},
  });
}

}  // namespace transmuter
