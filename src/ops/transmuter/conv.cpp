// ConvNhwc (ai.transmuter, since 1), made by src/passes/channels_last_convs.cpp:
// a 2-D convolution in the channels-last layout with its weights prepared at
// load for the CPU kernels of src/kernels/cpu/conv_nhwc.h.
//
//   Y = activation(conv(X, W) + B)
//
//   X float32 [N, H, W, C], or [N, C, H, W] with input_layout "NCHW" (group
//   1 only: a stem reading the graph's input without a transpose); Y float32
//   [N, oH, oW, out_channels].
//   group 1:  W is the weight packed by pack_conv_weight_nhwc
//             (float32 [panels, kH * kW * C, P]);
//   group C:  (depthwise, out_channels == C) W is float32 [kH, kW, C].
//   B (optional) float32 [out_channels].
//   Z (optional, group 1) float32, added to conv + B before the activation
//   (a residual; in the kernel's epilogue when it has Y's shape).
//   Attributes: kernel_shape [kH, kW], strides, pads [top, left, bottom,
//   right], dilations (as ONNX Conv's, defaults 1 / 0), group, out_channels,
//   activation ("" | "Relu" | "Clip" | "HardSwish") and activation_params
//   (Clip: [min, max]), input_layout ("NHWC", the default, | "NCHW").
//
// QLinearConvNhwc (ai.transmuter, since 1), made by src/passes/qlinear_convs_nhwc.cpp: ONNX QLinearConv in
// the channels-last layout on the integer kernels of src/kernels/cpu/qlinear_conv.h, its constant
// operands prepared at load.
//
//   X uint8 or int8 [N, H, W, C]; x_zero_point of X's type (one value); Y [N, oH, oW, out_channels] of
//   y_zero_point's type (uint8 or int8, one value): saturate(round(float(conv(X - x_zero_point, W) + B) *
//   multiplier) + y_zero_point), rounded half to even. group 1:  W is the weight's rows packed by
//   pack_integer_gemm_rhs (int8 [panels, ceil(K / 4), 128]),
//             W_column_sums and W_column_zeros (int32) as it returns them;
//   group C:  (depthwise, out_channels == C) W is int16 [kH, kW, C], the weight minus its zero point;
//             W_column_sums and W_column_zeros are absent ("").
//   multiplier float32, one value or [out_channels] (x_scale * w_scale / y_scale); B (optional) int32
//   [out_channels]. Inputs in that order: X, x_zero_point, W, W_column_sums, W_column_zeros, multiplier,
//   y_zero_point, B. Attributes: kernel_shape, strides, pads, dilations, group, out_channels, input_layout
//   (group 1: "NCHW" reads X [N, C, H, W] in place; as ConvNhwc's).
//   Group 1 may go on with a com.microsoft QLinearAdd of Y (made by src/passes/fuse_qlinear_conv_add.cpp):
//   inputs 8..15 are that add's A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point
//   with Y's own slot (A or B) empty, and the output is the add's C (QLinearAdd's arithmetic, on the
//   kernel's blocks of Y when the other operand has Y's shape, else after the convolution).
#include <array>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/conv_nhwc.h"
#include "kernels/cpu/depthwise_block.h"
#include "kernels/cpu/qlinear_conv.h"
#include "kernels/cpu/winograd_conv.h"
#include "ops/microsoft/qlinear_add.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

using kernels::ConvActivation;

std::array<int, 2> pair_attribute(const NodeContext& ctx, std::string_view name, int64_t fallback) {
  std::vector<int64_t> v = ctx.attr_ints(name, {fallback, fallback});
  if (v.size() != 2) throw ctx.error("attribute '", name, "' must hold 2 values");
  return {to_int32(ctx, v[0], name), to_int32(ctx, v[1], name)};
}

// The activation attributes `<prefix>activation` and `<prefix>activation_params` into o.
void read_activation(const NodeContext& ctx, const std::string& prefix, kernels::NhwcConvOptions& o) {
  const std::string activation = ctx.attr_string(prefix + "activation", "");
  if (activation == "Relu") {
    o.activation = ConvActivation::kRelu;
  } else if (activation == "HardSwish") {
    o.activation = ConvActivation::kHardSwish;
  } else if (activation == "Clip") {
    std::vector<float> p = ctx.attr_floats(prefix + "activation_params");
    if (p.size() != 2)
      throw ctx.error("activation Clip needs 2 ", prefix, "activation_params, got ", p.size());
    o.activation = ConvActivation::kClip;
    o.clip_min = p[0];
    o.clip_max = p[1];
  } else if (!activation.empty()) {
    throw ctx.error("unknown ", prefix, "activation '", activation,
                    "' (expected \"\", Relu, Clip or HardSwish)");
  }
}

kernels::NhwcConvOptions read_options(const NodeContext& ctx) {
  kernels::NhwcConvOptions o;
  std::vector<int64_t> kernel = ctx.attr_ints("kernel_shape");
  if (kernel.size() != 2) throw ctx.error("attribute 'kernel_shape' must hold 2 values");
  o.kernel = {to_int32(ctx, kernel[0], "kernel_shape"), to_int32(ctx, kernel[1], "kernel_shape")};
  o.strides = pair_attribute(ctx, "strides", 1);
  o.dilations = pair_attribute(ctx, "dilations", 1);
  std::vector<int64_t> pads = ctx.attr_ints("pads", {0, 0, 0, 0});
  if (pads.size() != 4) throw ctx.error("attribute 'pads' must hold 4 values");
  o.pads_begin = {to_int32(ctx, pads[0], "pads"), to_int32(ctx, pads[1], "pads")};
  o.pads_end = {to_int32(ctx, pads[2], "pads"), to_int32(ctx, pads[3], "pads")};
  read_activation(ctx, "", o);
  const std::string layout = ctx.attr_string("input_layout", "NHWC");
  if (layout != "NHWC" && layout != "NCHW")
    throw ctx.error("unknown input_layout '", layout, "' (expected NHWC or NCHW)");
  o.channels_first_input = layout == "NCHW";
  return o;
}

OpOutputs conv_nhwc(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const mx::array& w = ctx.input(1);
  std::optional<mx::array> bias = ctx.optional_input(2);
  std::optional<mx::array> residual = ctx.optional_input(3);
  const kernels::NhwcConvOptions options = read_options(ctx);
  const int64_t out_channels = ctx.required_int("out_channels");
  const int64_t group = ctx.attr_int("group", 1);
  if (x.dtype() != mx::float32 || x.ndim() != 4) {
    throw ctx.error("X must be float32 ", options.channels_first_input ? "[N, C, H, W]" : "[N, H, W, C]",
                    ", got ", x.dtype(), " ", x.shape());
  }
  if (group != 1 && options.channels_first_input) throw ctx.error("input_layout NCHW goes with group 1 only");
  if (group != 1 && (group != x.shape(3) || out_channels != group)) {
    throw ctx.error("group must be 1 or the channel count ", x.shape(3), " with as many outputs, got group ", group,
                    " and out_channels ", out_channels);
  }
  if (residual && (group != 1 || residual->dtype() != mx::float32)) {
    throw ctx.error("Z must be float32 and goes with group 1 only, got ", residual->dtype(), " with group ", group);
  }
  try {
    if (group == 1) return {kernels::conv2d_nhwc(x, w, bias, out_channels, options, ctx.stream(), residual)};
    return {kernels::depthwise_conv_nhwc(x, w, bias, options, ctx.stream())};
  } catch (const std::invalid_argument& e) {
    throw ctx.error(e.what());
  }
}

// ConvWinogradNhwc (ai.transmuter, since 1), made by src/passes/winograd_convs.cpp:
// a group-1 3x3 ConvNhwc with stride 1 and dilation 1 whose weight is U, the
// Winograd F(2x2, 3x3) transform of the 3x3 weight (float32 [16, panels, C,
// P], src/kernels/cpu/winograd_conv.h). Inputs and attributes as ConvNhwc's.
OpOutputs conv_winograd_nhwc(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const kernels::NhwcConvOptions options = read_options(ctx);
  if (x.dtype() != mx::float32 || x.ndim() != 4)
    throw ctx.error("X must be float32 [N, H, W, C], got ", x.dtype(), " ", x.shape());
  if (ctx.attr_int("group", 1) != 1) throw ctx.error("group must be 1");
  if (!kernels::winograd_conv_fits(options))
    throw ctx.error("needs kernel_shape [3, 3], strides 1, dilations 1 and input_layout NHWC");
  std::optional<mx::array> residual = ctx.optional_input(3);
  if (residual && residual->dtype() != mx::float32)
    throw ctx.error("Z must be float32, got ", residual->dtype());
  try {
    return {kernels::winograd_conv_nhwc(x, ctx.input(1), ctx.optional_input(2),
                                        ctx.required_int("out_channels"), options, ctx.stream(), residual)};
  } catch (const std::invalid_argument& e) {
    throw ctx.error(e.what());
  }
}

// DepthwiseBlockNhwc (ai.transmuter, since 1), made by
// src/passes/fuse_depthwise_blocks.cpp: a depthwise ConvNhwc with the 1x1
// ConvNhwc before it (expand) and/or after it (project) fused
// (src/kernels/cpu/depthwise_block.h).
//
//   E = expand_activation(X @ We + Be)        (when We is given; else E = X)
//   D = activation(depthwise(E, Wd) + Bd)
//   Y = project_activation(D @ Wp + Bp + Z)   (when Wp is given; else Y = D)
//
//   Inputs: X float32 [N, H, W, Cin], We (optional: packed as ConvNhwc's
//   group-1 W), Be (optional), Wd [kH, kW, C], Bd (optional), Wp (optional,
//   packed), Bp (optional), Z (optional, with Wp only; Y's shape).
//   Attributes: the depthwise conv's kernel_shape, strides, pads, dilations,
//   activation, activation_params (as ConvNhwc's); expand_channels (C, with
//   We), out_channels (with Wp); expand_activation(_params),
//   project_activation(_params).
OpOutputs depthwise_block_nhwc(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.dtype() != mx::float32 || x.ndim() != 4)
    throw ctx.error("X must be float32 [N, H, W, C], got ", x.dtype(), " ", x.shape());
  const kernels::NhwcConvOptions depthwise = read_options(ctx);
  if (depthwise.channels_first_input) throw ctx.error("input_layout NCHW goes with ConvNhwc group 1 only");
  auto stage = [&](size_t weight, const char* channels,
                   const std::string& prefix) -> std::optional<kernels::PointwiseStage> {
    if (!ctx.has_input(weight)) return std::nullopt;
    kernels::PointwiseStage s{
        ctx.input(weight), ctx.optional_input(weight + 1), ctx.required_int(channels), {}};
    read_activation(ctx, prefix, s.options);
    return s;
  };
  std::optional<kernels::PointwiseStage> expand = stage(1, "expand_channels", "expand_");
  std::optional<kernels::PointwiseStage> project = stage(5, "out_channels", "project_");
  std::optional<mx::array> residual = ctx.optional_input(7);
  if (residual && !project) throw ctx.error("Z needs the project stage (Wp)");
  try {
    return {kernels::depthwise_block_nhwc(x, expand, ctx.input(3), ctx.optional_input(4), depthwise, project,
                                          residual, ctx.stream())};
  } catch (const std::invalid_argument& e) {
    throw ctx.error(e.what());
  }
}

// GlobalAveragePoolNhwc (ai.transmuter, since 1): X [N, H, W, C] -> the mean
// over H and W, [N, 1, 1, C]. Other ranks and dtypes: the mean over the axes
// between the first and the last.
OpOutputs global_average_pool_nhwc(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.ndim() < 3) throw ctx.error("X must have rank >= 3 ([N, D..., C]), got ", x.ndim());
  if (x.ndim() == 4) return {kernels::spatial_mean_nhwc(x, ctx.stream())};
  std::vector<int> axes;
  for (int i = 1; i + 1 < static_cast<int>(x.ndim()); ++i) axes.push_back(i);
  return {mx::mean(x, axes, true, ctx.stream())};
}

// QLinearConvNhwc's inputs from 8 on, when present: the QLinearAdd that reads its output (A, A_scale,
// A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point, the convolution's own slot, A or B, empty).
constexpr size_t kAddInputs = 8;

// The QLinearAdd that reads the convolution's output (inputs kAddInputs on) for the kernel.
kernels::QLinearAddAfter add_after(const NodeContext& ctx) {
  const bool conv_first = !ctx.has_input(kAddInputs);
  if (conv_first == !ctx.has_input(kAddInputs + 3))
    throw ctx.error("the QLinearAdd inputs must leave exactly one of A and B (the convolution's) empty");
  const mx::array& other = ctx.input(conv_first ? kAddInputs + 3 : kAddInputs);
  const mx::Dtype type = ctx.input(6).dtype();
  if (other.dtype() != type)
    throw ctx.error("the QLinearAdd operand must have the output's type ", type, ", got ", other.dtype());
  const kernels::QLinearAddRatios ratios =
      qlinear_add_ratios(read_qlinear_add_quantization(ctx, kAddInputs, type));
  return {other, ratios, conv_first, qlinear_add_reference(ratios, mx::to_stream(ctx.stream()))};
}

OpOutputs qlinear_conv_nhwc(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const kernels::NhwcConvOptions options = read_options(ctx);
  if (options.activation != ConvActivation::kNone) throw ctx.error("takes no activation");
  const int64_t out_channels = ctx.required_int("out_channels");
  const int64_t group = ctx.attr_int("group", 1);
  if ((x.dtype() != mx::uint8 && x.dtype() != mx::int8) || x.ndim() != 4) {
    throw ctx.error("X must be uint8 or int8 ",
                    options.channels_first_input ? "[N, C, H, W]" : "[N, H, W, C]", ", got ", x.dtype(), " ",
                    x.shape());
  }
  if (group != 1 && options.channels_first_input) throw ctx.error("input_layout NCHW goes with group 1 only");
  if (group != 1 && (group != x.shape(3) || out_channels != group)) {
    throw ctx.error("group must be 1 or the channel count ", x.shape(3), " with as many outputs, got group ",
                    group, " and out_channels ", out_channels);
  }
  const kernels::QLinearRequantize requantize{ctx.input(5), ctx.optional_input(7), ctx.input(6)};
  try {
    if (group == 1) {
      const kernels::PackedIntegerRhs w{ctx.input(2), ctx.input(3), ctx.input(4)};
      std::optional<kernels::QLinearAddAfter> add;
      if (ctx.num_inputs() > kAddInputs) add = add_after(ctx);
      return {kernels::qlinear_conv_nhwc(x, ctx.input(1), w, out_channels, requantize, options, ctx.stream(),
                                         add)};
    }
    if (ctx.num_inputs() > kAddInputs) throw ctx.error("a depthwise QLinearConvNhwc takes no QLinearAdd");
    if (ctx.has_input(3) || ctx.has_input(4)) throw ctx.error("a depthwise W takes no column sums or zeros");
    return {kernels::qlinear_depthwise_conv_nhwc(x, ctx.input(1), ctx.input(2), requantize, options,
                                                 ctx.stream())};
  } catch (const std::invalid_argument& e) {
    throw ctx.error(e.what());
  }
}

}  // namespace

void register_transmuter_conv(OpRegistry& r) {
  r.add({
      {"ConvNhwc", kTransmuter, 1, kOpen, conv_nhwc},
      {"ConvWinogradNhwc", kTransmuter, 1, kOpen, conv_winograd_nhwc},
      {"DepthwiseBlockNhwc", kTransmuter, 1, kOpen, depthwise_block_nhwc},
      {"GlobalAveragePoolNhwc", kTransmuter, 1, kOpen, global_average_pool_nhwc},
      {.op_type = "QLinearConvNhwc",
       .domain = kTransmuter,
       .since = 1,
       .until = kOpen,
       .fn = qlinear_conv_nhwc,
       .not_differentiable = "outputs are quantized integers"},
  });
}

}  // namespace transmuter
