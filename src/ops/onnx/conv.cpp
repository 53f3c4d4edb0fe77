// Convolutions: Conv and ConvTranspose, on mx::conv_general.
// https://onnx.ai/onnx/operators/onnx__Conv.html
// https://onnx.ai/onnx/operators/onnx__ConvTranspose.html
//
// ONNX is channels-first (x: [N, C, D1, ...], Conv weight: [M, C/group, k1, ...]);
// MLX is channels-last (x: [N, D1, ..., C], weight: [M, k1, ..., C/group]), so
// each op transposes in and out; MLX fuses or elides the copies where it can.
// On CPU streams float32 2-D Conv avoids that: group 1 runs the kernel of
// src/kernels/cpu/conv2d.h and depthwise that of src/kernels/cpu/depthwise_conv.h,
// both in ONNX's layout.
#include <algorithm>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <vector>

#include <mlx/mlx.h>

#include "core/memory.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/depthwise_conv.h"
#include "ops/node_context.h"
#include "ops/onnx/conv.h"
#include "ops/onnx/conv_pool_attributes.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// Checked: SAME pads and ConvTranspose's derived pads are computed in int64.
std::vector<int> to_ints(const NodeContext& ctx, const std::vector<int64_t>& v, std::string_view what) {
  std::vector<int> out;
  for (int64_t x : v) out.push_back(to_int32(ctx, x, what));
  return out;
}

// [N, C, D...] -> [N, D..., C]
mx::array channels_last(const mx::array& x, mx::StreamOrDevice s) {
  std::vector<int> perm = {0};
  for (int i = 2; i < static_cast<int>(x.ndim()); ++i) perm.push_back(i);
  perm.push_back(1);
  return mx::transpose(x, perm, s);
}

// [N, D..., C] -> [N, C, D...]
mx::array channels_first(const mx::array& y, mx::StreamOrDevice s) {
  std::vector<int> perm = {0, static_cast<int>(y.ndim()) - 1};
  for (int i = 1; i < static_cast<int>(y.ndim()) - 1; ++i) perm.push_back(i);
  return mx::transpose(y, perm, s);
}

// Adds a per-output-channel bias B of shape [M] to y: [N, M, D...].
mx::array add_bias(const NodeContext& ctx, mx::array y, mx::StreamOrDevice s) {
  auto bias = ctx.optional_input(2);
  if (!bias) return y;
  if (bias->ndim() != 1 || bias->shape(0) != y.shape(1)) {
    throw ctx.error("bias must have shape [", y.shape(1), "], got ", bias->ndim(), "-D");
  }
  mx::Shape shape(y.ndim() - 1, 1);
  shape[0] = y.shape(1);
  return mx::add(y, mx::reshape(*bias, shape, s), s);
}

std::vector<int64_t> spatial_dims(const mx::array& a) {
  return std::vector<int64_t>(a.shape().begin() + 2, a.shape().end());
}

void check_operands(const NodeContext& ctx, const mx::array& x, const mx::array& w) {
  if (x.ndim() < 3) throw ctx.error("input must have rank >= 3 ([N, C, D1, ...]), got ", x.ndim());
  if (w.ndim() != x.ndim()) throw ctx.error("weight rank ", w.ndim(), " differs from input rank ", x.ndim());
}

// Checks X and W against each other and reads the window attributes, whose
// kernel_shape (optional since v11) must agree with W.
ConvPoolAttributes checked_attributes(const NodeContext& ctx, const mx::array& x, const mx::array& w) {
  check_operands(ctx, x, w);
  ConvPoolAttributes attrs = ConvPoolAttributes::read(ctx, static_cast<int>(x.ndim()) - 2, spatial_dims(w));
  if (attrs.kernel_shape != spatial_dims(w)) throw ctx.error("kernel_shape does not match the weight's shape");
  return attrs;
}

// MLX's CPU convolution unfolds the input (im2col) into a buffer of
// N * output positions * C * kernel elements that it allocates without
// checking; a huge kernel over a large input asks for far more than the output
// itself. Refuse what would not fit the memory limit, before MLX tries.
void check_unfold_size(const NodeContext& ctx, const mx::array& x, const mx::array& w,
                       const mx::Shape& y_shape) {
  // y is channels-last, [N, D1, ..., C_out]; the unfolded input holds
  // N * D1 * ... rows of C_in * K1 * ... elements.
  mx::Shape unfolded(y_shape.begin(), y_shape.end() - 1);
  unfolded.push_back(x.shape(1));
  for (int d = 2; d < static_cast<int>(w.ndim()); ++d) unfolded.push_back(w.shape(d));
  std::optional<uint64_t> bytes = checked_nbytes(unfolded, x.dtype());
  if (!bytes || *bytes > ctx.memory_limit()) {
    throw ctx.error("the unfolded input of this convolution would need ",
                    bytes ? std::to_string(*bytes) : std::string("more than 2^64"), " bytes, over the memory limit of ",
                    ctx.memory_limit(), " bytes");
  }
}

// Depthwise Conv (one input channel per group) with 1 or 2 spatial axes: on
// CPU streams for float32 our kernel, in ONNX's layout with the bias added in
// the same pass; elsewhere the same composition as below, under the same
// unfold size check (the kernel itself unfolds nothing).
mx::array depthwise(const NodeContext& ctx, const mx::array& x, const mx::array& w,
                    const ConvPoolAttributes& attrs, const WindowGeometry& g, const ConvEpilogue& epilogue,
                    mx::StreamOrDevice s) {
  auto bias = ctx.optional_input(2);
  if (bias && (bias->ndim() != 1 || bias->shape(0) != w.shape(0))) {
    throw ctx.error("bias must have shape [", w.shape(0), "], got ", bias->ndim(), "-D");
  }
  kernels::DepthwiseConvOptions options{.strides = to_ints(ctx, attrs.strides, "stride"),
                                        .pads_begin = to_ints(ctx, g.pad_begin, "pad"),
                                        .pads_end = to_ints(ctx, g.pad_end, "pad"),
                                        .dilations = to_ints(ctx, attrs.dilations, "dilation"),
                                        .groups = static_cast<int>(x.shape(1)),
                                        .activation = epilogue.activation,
                                        .clip_min = epilogue.clip_min,
                                        .clip_max = epilogue.clip_max};
  mx::array y = [&] {
    try {
      return kernels::depthwise_conv(x, w, bias, options, s);
    } catch (const std::invalid_argument& e) {
      throw ctx.error(e.what());
    }
  }();
  if (!kernels::is_cpu_stream(s) || x.dtype() != mx::float32 || w.dtype() != mx::float32) {
    mx::Shape y_channels_last = y.shape();
    std::rotate(y_channels_last.begin() + 1, y_channels_last.begin() + 2, y_channels_last.end());
    check_unfold_size(ctx, x, w, y_channels_last);
  }
  return y;
}

// A 1x1 convolution with unit strides and no padding: one matrix product per
// image in ONNX's layout, y[n] = W[M, C] @ x[n][C, D1 * ...], with no
// transposes to channels-last and back (which cost more than the product on
// narrow layers) and the bias added to a contiguous result.
bool is_pointwise(const ConvPoolAttributes& attrs, const WindowGeometry& g) {
  auto all_equal = [](const std::vector<int64_t>& v, int64_t value) {
    return std::all_of(v.begin(), v.end(), [value](int64_t x) { return x == value; });
  };
  return all_equal(attrs.kernel_shape, 1) && all_equal(attrs.strides, 1) && all_equal(g.pad_begin, 0) &&
         all_equal(g.pad_end, 0);
}

mx::array pointwise(const NodeContext& ctx, const mx::array& x, const mx::array& w, mx::StreamOrDevice s) {
  const int batch = x.shape(0), channels = x.shape(1), out_channels = w.shape(0);
  const int positions = to_int32(ctx, checked_product(ctx, spatial_dims(x), "spatial size"), "spatial size");
  mx::array y = mx::matmul(mx::reshape(w, {out_channels, channels}, s),
                           mx::reshape(x, {batch, channels, positions}, s), s);
  mx::Shape shape = x.shape();
  shape[1] = out_channels;
  return add_bias(ctx, mx::reshape(y, shape, s), s);
}

// Group-1 2-D float32 Conv on a CPU stream: the kernel of
// src/kernels/cpu/conv2d.h, in ONNX's layout (unfold + one GEMM per image,
// bias in the same pass), when its arguments fit; nullopt otherwise. Its
// unfold buffer holds one image, checked against the memory limit like MLX's.
std::optional<mx::array> planar(const NodeContext& ctx, const mx::array& x, const mx::array& w,
                                const ConvPoolAttributes& attrs, const WindowGeometry& g,
                                const ConvEpilogue& epilogue, mx::StreamOrDevice s) {
  auto bias = ctx.optional_input(2);
  kernels::Conv2dOptions options{.strides = to_ints(ctx, attrs.strides, "stride"),
                                 .pads_begin = to_ints(ctx, g.pad_begin, "pad"),
                                 .pads_end = to_ints(ctx, g.pad_end, "pad"),
                                 .dilations = to_ints(ctx, attrs.dilations, "dilation"),
                                 .activation = epilogue.activation,
                                 .clip_min = epilogue.clip_min,
                                 .clip_max = epilogue.clip_max};
  if (!kernels::conv2d_fits(x, w, bias, options)) return std::nullopt;
  const size_t unfold_bytes = kernels::conv2d_unfold_bytes(x, w, options);
  if (unfold_bytes > ctx.memory_limit()) {
    throw ctx.error("the unfolded input of this convolution would need ", unfold_bytes,
                    " bytes, over the memory limit of ", ctx.memory_limit(), " bytes");
  }
  return kernels::conv2d(x, w, bias, options, s);
}

// Group-1 1-D float32 Conv on a CPU stream (Whisper's front end, wav2vec2's feature encoder): the 2-D
// kernel above over a height of one, x [N, C, L] and w [M, C, k] viewed as [N, C, 1, L] and [M, C, 1, k]
// (reshapes of row-contiguous arrays: views); nullopt where the kernel does not fit. MLX's own 1-D
// convolution is not a kernel, and kept whole compiled segments and eager graphs on MLX's scheduler.
std::optional<mx::array> planar_1d(const NodeContext& ctx, const mx::array& x, const mx::array& w,
                                   const ConvPoolAttributes& attrs, const WindowGeometry& g,
                                   const ConvEpilogue& epilogue, mx::StreamOrDevice s) {
  auto bias = ctx.optional_input(2);
  kernels::Conv2dOptions options{.strides = {1, to_ints(ctx, attrs.strides, "stride")[0]},
                                 .pads_begin = {0, to_ints(ctx, g.pad_begin, "pad")[0]},
                                 .pads_end = {0, to_ints(ctx, g.pad_end, "pad")[0]},
                                 .dilations = {1, to_ints(ctx, attrs.dilations, "dilation")[0]},
                                 .activation = epilogue.activation,
                                 .clip_min = epilogue.clip_min,
                                 .clip_max = epilogue.clip_max};
  const mx::array x2 = mx::reshape(x, {x.shape(0), x.shape(1), 1, x.shape(2)}, s);
  const mx::array w2 = mx::reshape(w, {w.shape(0), w.shape(1), 1, w.shape(2)}, s);
  if (!kernels::conv2d_fits(x2, w2, bias, options)) return std::nullopt;
  const size_t unfold_bytes = kernels::conv2d_unfold_bytes(x2, w2, options);
  if (unfold_bytes > ctx.memory_limit()) {
    throw ctx.error("the unfolded input of this convolution would need ", unfold_bytes,
                    " bytes, over the memory limit of ", ctx.memory_limit(), " bytes");
  }
  mx::array y = kernels::conv2d(x2, w2, bias, options, s);
  return mx::reshape(y, {y.shape(0), y.shape(1), y.shape(3)}, s);
}

}  // namespace

mx::array apply_conv_activation(const mx::array& v, const ConvEpilogue& e, mx::StreamOrDevice s) {
  const mx::Dtype t = v.dtype();
  switch (e.activation) {
    case kernels::ConvActivation::kRelu:
      return mx::maximum(v, mx::array(0.0f, t), s);
    case kernels::ConvActivation::kClip:
      return mx::minimum(mx::maximum(v, mx::array(e.clip_min, t), s), mx::array(e.clip_max, t), s);
    case kernels::ConvActivation::kHardSwish: {
      mx::array gate = mx::add(mx::multiply(v, mx::array(1.0f / 6.0f, t), s), mx::array(0.5f, t), s);
      return mx::multiply(v, mx::clip(gate, mx::array(0.0f, t), mx::array(1.0f, t), s), s);
    }
    case kernels::ConvActivation::kNone:
      break;
  }
  return v;
}

// Conv: v11 allows kernel_shape to be omitted and inferred from W; v22 adds
// bfloat16. Asymmetric pads go straight to conv_general (padding_lo/hi).
// The epilogue runs inside the CPU kernels and as MLX ops elsewhere.
mx::array convolution(NodeContext& ctx, const ConvEpilogue& epilogue) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& w = ctx.input(1);
  ConvPoolAttributes attrs = checked_attributes(ctx, x, w);
  const int64_t group = ctx.attr_int("group", 1);
  if (group < 1 || group > x.shape(1) || x.shape(1) != w.shape(1) * group || w.shape(0) % group != 0) {
    throw ctx.error("channels do not match: input ", x.shape(1), ", weight ", w.shape(0), "x", w.shape(1),
                    ", group ", group);
  }
  WindowGeometry g = resolve_window(ctx, attrs, spatial_dims(x));
  if (group == 1 && x.ndim() == 4 && kernels::is_cpu_stream(s)) {
    if (auto y = planar(ctx, x, w, attrs, g, epilogue, s)) return *y;
  }
  if (group == 1 && x.ndim() == 3 && kernels::is_cpu_stream(s)) {
    if (auto y = planar_1d(ctx, x, w, attrs, g, epilogue, s)) return *y;
  }
  if (group == 1 && is_pointwise(attrs, g)) return apply_conv_activation(pointwise(ctx, x, w, s), epilogue, s);
  // Other group-1 convolutions (3-D, other dtypes, other devices) run MLX's unfold + GEMM below.
  if (group > 1 && group == x.shape(1) && w.shape(1) == 1 && x.ndim() <= 4) {
    return depthwise(ctx, x, w, attrs, g, epilogue, s);
  }
  mx::array y = [&] {
    try {
      return mx::conv_general(channels_last(x, s), channels_last(w, s), to_ints(ctx, attrs.strides, "stride"),
                              to_ints(ctx, g.pad_begin, "pad"), to_ints(ctx, g.pad_end, "pad"),
                              to_ints(ctx, attrs.dilations, "dilation"), {}, static_cast<int>(group), false,
                              s);
    } catch (const std::invalid_argument& e) {
      throw ctx.error(e.what());
    }
  }();
  check_unfold_size(ctx, x, w, y.shape());  // y is channels-last: [N, D1..., C_out]
  return apply_conv_activation(add_bias(ctx, channels_first(y, s), s), epilogue, s);
}

namespace {

OpOutputs conv(NodeContext& ctx) { return {convolution(ctx, {})}; }

// Per-axis pads of a transposed convolution: cropped off the begin and end of
// the full output (stride * (in - 1) + extent + output_padding). Negative
// values extend the output with zeros instead.
struct TransposedPads {
  std::vector<int64_t> begin;
  std::vector<int64_t> end;
};

int64_t floor_half(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

// output_shape (or auto_pad SAME_*, which asks for in * stride) fixes the
// pads: total = stride * (in - 1) + output_padding + extent - output_shape,
// split as the spec says (the odd element at the end for SAME_UPPER, at the
// beginning otherwise). Without either, the pads attribute applies.
TransposedPads transposed_pads(const NodeContext& ctx, const ConvPoolAttributes& attrs,
                               const std::vector<int64_t>& in, const std::vector<int64_t>& output_padding) {
  const size_t rank = in.size();
  std::vector<int64_t> output_shape = ctx.attr_ints("output_shape");
  if (output_shape.size() == rank + 2) output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
  const bool same = attrs.auto_pad == "SAME_UPPER" || attrs.auto_pad == "SAME_LOWER";
  if (output_shape.empty() && same) {
    for (size_t i = 0; i < rank; ++i) output_shape.push_back(in[i] * attrs.strides[i]);
  }
  TransposedPads p;
  if (output_shape.empty()) {
    if (attrs.auto_pad == "VALID") return {std::vector<int64_t>(rank, 0), std::vector<int64_t>(rank, 0)};
    p.begin.assign(attrs.pads.begin(), attrs.pads.begin() + rank);
    p.end.assign(attrs.pads.begin() + rank, attrs.pads.end());
    return p;
  }
  if (output_shape.size() != rank) throw ctx.error("output_shape must have ", rank, " values");
  // int32 values keep the int64 pad arithmetic below from overflowing.
  for (int64_t d : output_shape) to_int32(ctx, d, "output_shape value");
  for (size_t i = 0; i < rank; ++i) {
    int64_t total =
        attrs.strides[i] * (in[i] - 1) + output_padding[i] + attrs.window_extent(i) - output_shape[i];
    int64_t half = floor_half(total);
    p.begin.push_back(attrs.auto_pad == "SAME_UPPER" ? half : total - half);
    p.end.push_back(total - p.begin.back());
  }
  return p;
}

// ConvTranspose as a convolution of the stride-dilated input with the
// flipped kernel, padded by extent - 1 on both sides to get the full output,
// then cropped by the pads (or zero-extended where pads are negative).
// W: [C, M/group, k...] -> MLX [M, k..., C/group].
// x: [N, D..., C] with stride-1 zeros inserted between neighbours along each
// spatial axis D_i: length (D_i - 1) * stride + 1, as input dilation does.
mx::array dilate_spatial(const mx::array& x, const std::vector<int>& strides, mx::StreamOrDevice s) {
  mx::array out = x;
  for (size_t i = 0; i < strides.size(); ++i) {
    const int axis = static_cast<int>(i) + 1, stride = strides[i], n = out.shape(axis);
    if (stride == 1 || n == 0) continue;
    mx::array spread = mx::pad(mx::expand_dims(out, axis + 1, s), {axis + 1}, {0}, {stride - 1},
                               mx::array(0, x.dtype()), "constant", s);
    mx::Shape shape = out.shape();
    shape[axis] = n * stride;
    mx::Shape start(out.ndim(), 0);
    mx::Shape stop = shape;
    stop[axis] = (n - 1) * stride + 1;
    out = mx::slice(mx::reshape(spread, shape, s), start, stop, s);
  }
  return out;
}

// The transposed convolution as MLX computes it: a flipped convolution of the
// input dilated by the strides. MLX's vjp of an input-dilated convolution
// returns an input gradient of the wrong shape when the padding runs past the
// last input (strides > 1 with output_padding or small pads), so with strides
// > 1 the gradient is taken from the same convolution on an explicitly dilated
// input; the forward pass keeps the input dilation.
mx::array transposed_convolution(const mx::array& x, const mx::array& weight, const std::vector<int>& lo,
                                 const std::vector<int>& hi, const std::vector<int>& dilations,
                                 const std::vector<int>& strides, int group, mx::StreamOrDevice s) {
  auto direct = [=](const std::vector<mx::array>& in) {
    mx::array y = mx::conv_general(in[0], in[1], {}, lo, hi, dilations, strides, group, true, s);
    return std::vector<mx::array>{y};
  };
  bool unit_strides = std::all_of(strides.begin(), strides.end(), [](int v) { return v == 1; });
  if (unit_strides) return direct({x, weight})[0];
  auto dilated = [=](const std::vector<mx::array>& in) {
    mx::array xd = dilate_spatial(in[0], strides, s);
    return std::vector<mx::array>{mx::conv_general(xd, in[1], {}, lo, hi, dilations, {}, group, true, s)};
  };
  auto conv = mx::custom_vjp(direct, [dilated](const std::vector<mx::array>& primals,
                                               const std::vector<mx::array>& cotangents,
                                               const std::vector<mx::array>&) {
    return mx::vjp(dilated, primals, cotangents).second;
  });
  return conv({x, weight})[0];
}

OpOutputs conv_transpose(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& w = ctx.input(1);
  const int spatial = static_cast<int>(x.ndim()) - 2;
  ConvPoolAttributes attrs = checked_attributes(ctx, x, w);
  const int group = to_int32(ctx, ctx.attr_int("group", 1), "group");
  const int in_channels = x.shape(1);
  if (group < 1 || w.shape(0) != in_channels || in_channels % group != 0) {
    throw ctx.error("channels do not match: input ", in_channels, ", weight ", w.shape(0), ", group ", group);
  }
  std::vector<int64_t> output_padding = ctx.attr_ints("output_padding", std::vector<int64_t>(spatial, 0));
  if (static_cast<int>(output_padding.size()) != spatial)
    throw ctx.error("output_padding must have ", spatial, " values");
  for (int64_t p : output_padding) to_int32(ctx, p, "output_padding value");
  TransposedPads pads = transposed_pads(ctx, attrs, spatial_dims(x), output_padding);

  // [C, M/g, k...] -> [g, C/g, M/g, k...] -> [g, M/g, k..., C/g] -> [M, k..., C/g]
  const int out_per_group = w.shape(1);
  mx::Shape grouped = {group, in_channels / group, out_per_group};
  grouped.insert(grouped.end(), w.shape().begin() + 2, w.shape().end());
  std::vector<int> perm = {0, 2};
  for (int i = 0; i < spatial; ++i) perm.push_back(3 + i);
  perm.push_back(1);
  mx::Shape mlx_shape = {group * out_per_group};
  mlx_shape.insert(mlx_shape.end(), w.shape().begin() + 2, w.shape().end());
  mlx_shape.push_back(in_channels / group);
  mx::array weight = mx::reshape(mx::transpose(mx::reshape(w, grouped, s), perm, s), mlx_shape, s);

  std::vector<int> lo, hi;
  mx::Shape crop_start(spatial + 2, 0);
  mx::Shape crop_stop;
  for (int i = 0; i < spatial; ++i) {
    const int64_t full_pad = attrs.window_extent(i) - 1;
    const int64_t want_lo = full_pad - pads.begin[i];
    const int64_t want_hi = full_pad - pads.end[i] + output_padding[i];
    lo.push_back(to_int32(ctx, std::max<int64_t>(want_lo, 0), "padding"));
    hi.push_back(to_int32(ctx, std::max<int64_t>(want_hi, 0), "padding"));
    crop_start[1 + i] = to_int32(ctx, std::max<int64_t>(-want_lo, 0), "crop");
  }
  mx::array y = [&] {
    try {
      return transposed_convolution(channels_last(x, s), weight, lo, hi, to_ints(ctx, attrs.dilations, "dilation"),
                                    to_ints(ctx, attrs.strides, "stride"), group, s);
    } catch (const std::invalid_argument& e) {
      throw ctx.error(e.what());
    }
  }();
  check_unfold_size(ctx, x, w, y.shape());  // MLX runs it as a convolution over the dilated input
  // Negative padding amounts (pads larger than extent - 1) crop the result.
  crop_stop = y.shape();
  bool crop = false;
  for (int i = 0; i < spatial; ++i) {
    const int64_t want_hi = attrs.window_extent(i) - 1 - pads.end[i] + output_padding[i];
    crop_stop[1 + i] -= to_int32(ctx, std::max<int64_t>(-want_hi, 0), "crop");
    crop = crop || crop_start[1 + i] > 0 || want_hi < 0;
  }
  if (crop) y = mx::slice(y, crop_start, crop_stop, s);
  return {add_bias(ctx, channels_first(y, s), s)};
}

}  // namespace

void register_conv(OpRegistry& r) {
  r.add({
      {"Conv", kOnnx, 1, kOpen, conv, {}, false, "1 to 3 spatial axes"},
      {"ConvTranspose", kOnnx, 1, kOpen, conv_transpose, {}, false, "1 to 3 spatial axes"},
  });
}

}  // namespace transmuter
