// ONNX Runtime's GELU contrib operators (domain com.microsoft, version 1):
// Gelu, BiasGelu, FastGelu, QuickGelu. They are what ONNX Runtime's optimizer
// fuses BERT's and CLIP's GELU subgraphs into, and what src/passes/fuse_gelu.cpp
// produces.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//   Gelu(X)          = 0.5 X (1 + erf(X / sqrt 2))
//   BiasGelu(A, B)   = Gelu(A + B), B: [D] with D = A's last dimension
//   FastGelu(X[, B]) = 0.5 Z (1 + tanh(sqrt(2/pi) (Z + 0.044715 Z^3))), Z = X + B
//   QuickGelu(X)     = X sigmoid(alpha X), alpha = 1.702 by default (CLIP's GELU)
// and the bias fusions of ORT's CUDA provider (ORT has no CPU kernel for them;
// exports optimized for CUDA carry them, diffusion UNets above all):
//   BiasAdd(X, bias, skip)  = X + bias + skip, X/skip: [N, S, C], bias: [C]
//   BiasSplitGelu(X, bias)  = L * Gelu(R), [L, R] = halves of X + bias along
//                             the last axis, X: [N, S, D], bias: [D]
//   BiasSoftmax(data, bias) = softmax(data + bias) over the axes [axis, rank)
//                             flattened (opset-1 Softmax); bias broadcasts to
//                             data (is_inner_broadcast only says along which
//                             axes ORT's kernel expects it to)
// float32 runs the kernel of src/kernels/cpu/activation.h on CPU streams;
// float16/bfloat16 are computed in float32 and rounded once.
#include <cmath>
#include <optional>
#include <vector>

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

// The bias must be 1-D of x's last dimension and of x's dtype.
void check_bias(const NodeContext& ctx, const mx::array& x, const mx::array& bias, const char* x_name) {
  if (bias.ndim() != 1 || bias.shape(0) != x.shape().back()) {
    throw ctx.error("bias must be 1-D of ", x_name, "'s last dimension ", x.shape().back(), ", got shape ",
                    bias.shape());
  }
  if (bias.dtype() != x.dtype()) throw ctx.error("bias dtype ", bias.dtype(), " differs from ", x_name, "'s ", x.dtype());
}

void check_rank3_float(const NodeContext& ctx, const mx::array& x, const char* name) {
  if (!mx::issubdtype(x.dtype(), mx::floating)) throw ctx.error(name, " must be a float tensor, got ", x.dtype());
  if (x.ndim() != 3) throw ctx.error(name, " must be 3-D [N, S, C], got shape ", x.shape());
}

OpOutputs bias_add(NodeContext& ctx) {
  const auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& bias = ctx.input(1);
  const mx::array& skip = ctx.input(2);
  check_rank3_float(ctx, x, "X");
  check_bias(ctx, x, bias, "X");
  if (skip.shape() != x.shape() || skip.dtype() != x.dtype()) {
    throw ctx.error("skip must match X (", x.shape(), " ", x.dtype(), "), got ", skip.shape(), " ", skip.dtype());
  }
  return {mx::add(mx::add(x, bias, s), skip, s)};
}

OpOutputs bias_split_gelu(NodeContext& ctx) {
  const auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& bias = ctx.input(1);
  check_rank3_float(ctx, x, "X");
  check_bias(ctx, x, bias, "X");
  const int d = x.shape(2);
  if (d % 2 != 0) throw ctx.error("X's last dimension must be even to split in halves, got ", d);
  std::vector<mx::array> halves = mx::split(mx::add(x, bias, s), 2, -1, s);
  mx::array gelu = bias_gelu(ctx, halves[1], std::nullopt, Activation::kGeluErf);
  return {mx::multiply(halves[0], gelu, s)};
}

OpOutputs bias_softmax(NodeContext& ctx) {
  const auto s = ctx.stream();
  const mx::array& data = ctx.input(0);
  const mx::array& bias = ctx.input(1);
  if (!mx::issubdtype(data.dtype(), mx::floating)) throw ctx.error("data must be a float tensor, got ", data.dtype());
  if (bias.dtype() != data.dtype()) throw ctx.error("bias dtype ", bias.dtype(), " differs from data's ", data.dtype());
  const int rank = static_cast<int>(data.ndim());
  if (rank < 1) throw ctx.error("data must have at least one dimension");
  mx::Shape broadcast;
  try {
    broadcast = mx::broadcast_shapes(bias.shape(), data.shape());
  } catch (const std::exception&) {
    throw ctx.error("bias ", bias.shape(), " does not broadcast to data's shape ", data.shape());
  }
  if (broadcast != data.shape()) throw ctx.error("bias ", bias.shape(), " does not broadcast to data's shape ", data.shape());
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", 1), rank);
  const bool widen = data.dtype() == mx::float16 || data.dtype() == mx::bfloat16;
  mx::array sum = mx::add(data, bias, s);
  if (widen) sum = mx::astype(sum, mx::float32, s);
  int64_t inner = 1;
  for (int i = axis; i < rank; ++i) inner *= data.shape(i);
  mx::array rows = mx::reshape(sum, {-1, static_cast<int>(inner)}, s);
  mx::array y = mx::reshape(mx::softmax(rows, -1, /*precise=*/true, s), data.shape(), s);
  return {widen ? mx::astype(y, data.dtype(), s) : y};
}

}  // namespace

void register_microsoft_activation(OpRegistry& r) {
  r.add({
      {"Gelu", kMicrosoft, 1, kOpen, gelu},
      {"BiasGelu", kMicrosoft, 1, kOpen, bias_gelu_op, {}, false, "B must be 1-D of A's last dimension"},
      {"FastGelu", kMicrosoft, 1, kOpen, fast_gelu, {}, false, "bias must be 1-D of X's last dimension"},
      {"QuickGelu", kMicrosoft, 1, kOpen, quick_gelu},
      {"BiasAdd", kMicrosoft, 1, kOpen, bias_add, {}, false, "X and skip 3-D [N, S, C], bias [C] (any C)"},
      {"BiasSplitGelu", kMicrosoft, 1, kOpen, bias_split_gelu, {}, false, "X 3-D [N, S, D] with D even"},
      {"BiasSoftmax", kMicrosoft, 1, kOpen, bias_softmax, {}, false, "bias broadcasts to data (numpy rules)"},
  });
}

}  // namespace transmuter
