// ONNX Runtime's GELU contrib operators (domain com.microsoft, version 1):
// Gelu, BiasGelu, FastGelu, QuickGelu. They are what ONNX Runtime's optimizer
// fuses BERT's and CLIP's GELU subgraphs into, and what src/passes/fuse_gelu.cpp
// produces.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//   Gelu(X)          = 0.5 X (1 + erf(X / sqrt 2))
//   BiasGelu(A, B)   = Gelu(A + B), B: [D] with D = A's last dimension
//   FastGelu(X[, B]) = 0.5 Z (1 + tanh(sqrt(2/pi) (Z + 0.044715 Z^3))), Z = X + B
//   QuickGelu(X)     = X sigmoid(alpha X), alpha = 1.702 by default (CLIP's GELU)
// float32 runs the kernel of src/kernels/cpu/activation.h on CPU streams;
// float16/bfloat16 are computed in float32 and rounded once.
#include <cmath>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/cpu_kernel.h"
#include "ops/node_context.h"
#include "ops/rational_erf.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

using kernels::Activation;

mx::array gelu_composed(const mx::array& z, Activation activation, mx::StreamOrDevice s) {
  auto scalar = [&](double v) { return mx::array(v, z.dtype()); };
  mx::array half_z = mx::multiply(scalar(0.5), z, s);
  if (activation == Activation::kGeluErf) {
    return mx::multiply(half_z, mx::add(scalar(1), rational_erf(mx::multiply(z, scalar(M_SQRT1_2), s), s), s), s);
  }
  mx::array cube = mx::multiply(mx::multiply(z, z, s), z, s);
  mx::array inner = mx::add(z, mx::multiply(scalar(0.044715), cube, s), s);
  mx::array t = mx::tanh(mx::multiply(scalar(std::sqrt(2.0 / M_PI)), inner, s), s);
  return mx::multiply(half_z, mx::add(scalar(1), t, s), s);
}

// GELU(x + bias) in float32 (half precision widened), rounded to x's dtype.
mx::array bias_gelu(const NodeContext& ctx, const mx::array& x, std::optional<mx::array> bias, Activation activation) {
  const auto s = ctx.stream();
  if (!mx::issubdtype(x.dtype(), mx::floating)) throw ctx.error("input must be a float tensor, got ", x.dtype());
  if (x.ndim() == 0) throw ctx.error("input must have at least one dimension");
  if (bias) {
    if (bias->ndim() != 1 || bias->shape(0) != x.shape().back()) {
      throw ctx.error("bias must be 1-D of the input's last dimension ", x.shape().back(), ", got shape ",
                      bias->shape());
    }
    if (bias->dtype() != x.dtype()) throw ctx.error("bias dtype ", bias->dtype(), " differs from the input's ", x.dtype());
  }
  const bool widen = x.dtype() == mx::float16 || x.dtype() == mx::bfloat16;
  mx::array xf = widen ? mx::astype(x, mx::float32, s) : x;
  if (widen && bias) bias = mx::astype(*bias, mx::float32, s);
  mx::array y = kernels::is_cpu_stream(s) && kernels::bias_activation_fits(xf, bias)
                    ? kernels::bias_activation(xf, bias, activation, s)
                    : gelu_composed(bias ? mx::add(xf, *bias, s) : xf, activation, s);
  return widen ? mx::astype(y, x.dtype(), s) : y;
}

OpOutputs gelu(NodeContext& ctx) { return {bias_gelu(ctx, ctx.input(0), std::nullopt, Activation::kGeluErf)}; }

OpOutputs bias_gelu_op(NodeContext& ctx) { return {bias_gelu(ctx, ctx.input(0), ctx.input(1), Activation::kGeluErf)}; }

OpOutputs fast_gelu(NodeContext& ctx) {
  return {bias_gelu(ctx, ctx.input(0), ctx.optional_input(1), Activation::kGeluTanh)};
}

OpOutputs quick_gelu(NodeContext& ctx) {
  const auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  if (!mx::issubdtype(x.dtype(), mx::floating)) throw ctx.error("input must be a float tensor, got ", x.dtype());
  const float alpha = ctx.attr_float("alpha", 1.702f);
  const bool widen = x.dtype() == mx::float16 || x.dtype() == mx::bfloat16;
  mx::array xf = widen ? mx::astype(x, mx::float32, s) : x;
  mx::array y = mx::multiply(xf, mx::sigmoid(mx::multiply(xf, mx::array(alpha, xf.dtype()), s), s), s);
  return {widen ? mx::astype(y, x.dtype(), s) : y};
}

}  // namespace

void register_microsoft_activation(OpRegistry& r) {
  r.add({
      {"Gelu", kMicrosoft, 1, kOpen, gelu},
      {"BiasGelu", kMicrosoft, 1, kOpen, bias_gelu_op, {}, false, "B must be 1-D of A's last dimension"},
      {"FastGelu", kMicrosoft, 1, kOpen, fast_gelu, {}, false, "bias must be 1-D of X's last dimension"},
      {"QuickGelu", kMicrosoft, 1, kOpen, quick_gelu},
  });
}

}  // namespace transmuter
