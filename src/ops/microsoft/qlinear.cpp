// ONNX Runtime's quantized (QOperator format) contrib operators, domain
// com.microsoft, version 1: QLinearAdd, QLinearMul, QLinearSigmoid,
// QLinearLeakyRelu, QLinearSoftmax, QLinearConcat, QLinearGlobalAveragePool,
// QLinearAveragePool. The matmul-like ones (DynamicQuantizeMatMul,
// MatMulIntegerToFloat, QuantizeLinear, DequantizeLinear,
// DynamicQuantizeLSTM) are in qlinear_matmul.cpp.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//
// Values are int8 or uint8 with per-tensor float32 scales s and zero points z
// (z absent: 0); real(q) = s * (q - z), quantize(v) = saturate(round(v / s) + z),
// round half to even. Each formula is ONNX Runtime's CPU kernel's (MLAS), in
// its float32 operation order, so that results match it bit for bit:
//
//   QLinearAdd:  C = saturate(round(rA * a + (rB * b + k))),
//                rA = sA / sC, rB = sB / sC, k = zC - (rA * zA + rB * zB);
//                an operand that is one value per innermost run (ORT's scalar
//                path) is folded into k first: k' = k + rA * a. The
//                multiply-adds are fused as in ORT's AVX2 kernel (emulated in
//                float64 on the CPU; on a GPU a sum within an ulp of n + 0.5
//                may round one step apart).
//   QLinearMul:  C = saturate(round((a - zA) * (b - zB) * (sA * sB / sC)) + zC)
//   QLinearSigmoid, QLinearLeakyRelu (alpha, default 0.01): a 256-entry table
//                T[q] = quantize(f(sX * (q - zX))), Y = T[X].
//   QLinearConcat (axis; inputs Y_scale, Y_zero_point, then (X, X_scale,
//                X_zero_point) per input): each input requantized by the table
//                T[q] = quantize(sX * (q - zX)) (copied when sX, zX equal sY, zY).
//   QLinearSoftmax (axis, opset): E[k] = float(exp((k - 255 + shift) * sX)),
//                shift = max(0, log(FLT_MAX / D) - 5) / sX, k = x - max(x) + 255;
//                y = saturate(round(E[k] * floor(1 / sY) / sum(E[k])) + zY), the
//                sum taken in row order as ORT takes it (rows up to 256 long).
//                opset < 13: over the flattened dims from axis; opset >= 13:
//                over one axis (axis default -1 for both: the schema's).
//   QLinearGlobalAveragePool (channels_last): integer sums,
//                y = saturate(round((sum(x) - zX * n) * (sX / (sY * n))) + zY).
//   QLinearAveragePool (kernel_shape, strides, pads, auto_pad, ceil_mode,
//                count_include_pad, channels_last): the window sum of sX * (x - zX)
//                in float32, in window order, divided by the count (the
//                kernel size with count_include_pad, else the elements inside
//                the input), then y = saturate(round(avg / sY + zY)). A window
//                covering the whole unpadded input is the global pool.
//
// Scales and zero points are read on the host (row host_inputs): they are
// initializers in quantized models, and the tables and ratios above are
// computed from them in C++ float exactly as ONNX Runtime computes them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/dynamic_quantize.h"
#include "ops/microsoft/qlinear_add.h"
#include "ops/node_context.h"
#include "ops/onnx/conv_pool_attributes.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

bool is_8bit(mx::Dtype dtype) { return dtype == mx::int8 || dtype == mx::uint8; }

struct QuantRange {
  int lo, hi;
};
QuantRange range_of(mx::Dtype dtype) {
  return dtype == mx::int8 ? QuantRange{-128, 127} : QuantRange{0, 255};
}

/** The value of byte `b` read as `dtype` (int8: two's complement). */
int byte_value(int b, mx::Dtype dtype) { return dtype == mx::int8 && b >= 128 ? b - 256 : b; }

const mx::array& quantized_input(const NodeContext& ctx, size_t i, const char* what) {
  const mx::array& x = ctx.input(i);
  if (!is_8bit(x.dtype())) throw ctx.error(what, " must be int8 or uint8, got ", x.dtype());
  return x;
}

/** A per-tensor float32 scale (input `i`), read on the host. */
float host_scale(const NodeContext& ctx, size_t i, const char* what) {
  const mx::array& a = ctx.input(i);
  if (a.dtype() != mx::float32) throw ctx.error(what, " must be float32, got ", a.dtype());
  if (a.size() != 1) {
    throw ctx.error(what, " must be a scalar or a 1-D tensor of one element (per tensor), got shape ",
                    a.shape());
  }
  return static_cast<float>(ctx.host_double(i));
}

/** A per-tensor zero point of type `type` (input `i`), 0 when absent. */
int host_zero_point(const NodeContext& ctx, size_t i, mx::Dtype type, const char* what) {
  if (!ctx.has_input(i)) return 0;
  const mx::array& a = ctx.input(i);
  if (a.dtype() != type) throw ctx.error(what, " must have its tensor's type ", type, ", got ", a.dtype());
  if (a.size() != 1) {
    throw ctx.error(what, " must be a scalar or a 1-D tensor of one element (per tensor), got shape ",
                    a.shape());
  }
  return static_cast<int>(ctx.host_int(i));
}

/** MLAS's quantizer: saturate(nearbyint(v / scale) + zero_point). */
int quantize_value(float v, float scale, int zero_point, QuantRange r) {
  float q = std::nearbyint(v / scale) + static_cast<float>(zero_point);
  q = std::min(std::max(q, static_cast<float>(r.lo)), static_cast<float>(r.hi));
  return static_cast<int>(q);
}

/** float32 `v` rounded half to even, shifted by `zero_point` and saturated to
 * `dtype` (int8 or uint8). */
mx::array saturate_round(const mx::array& v, float zero_point, mx::Dtype dtype, mx::StreamOrDevice s) {
  const QuantRange r = range_of(dtype);
  mx::array q = mx::add(mx::round(v, 0, s), mx::array(zero_point), s);
  return mx::astype(mx::clip(q, mx::array(static_cast<float>(r.lo)), mx::array(static_cast<float>(r.hi)), s),
                    dtype, s);
}

/** Y = table[X] for int8/uint8 X; table holds one value per byte (0..255). */
mx::array lookup(const mx::array& x, const std::vector<int32_t>& table, mx::Dtype out, mx::StreamOrDevice s) {
  mx::array values = mx::astype(mx::array(table.begin(), {256}, mx::int32), out, s);
  mx::array index = mx::bitwise_and(mx::astype(x, mx::int32, s), mx::array(255), s);
  return mx::take(values, index, 0, s);
}

/** The requantization table of f: q -> quantize(f(x_scale * (q - x_zp))). */
template <typename F>
std::vector<int32_t> requantize_table(mx::Dtype type, float x_scale, int x_zp, float y_scale, int y_zp, F f) {
  std::vector<int32_t> table(256);
  for (int b = 0; b < 256; ++b) {
    const float real = x_scale * static_cast<float>(byte_value(b, type) - x_zp);
    table[b] = quantize_value(f(real), y_scale, y_zp, range_of(type));
  }
  return table;
}

// --- QLinearAdd, QLinearMul -----------------------------------------------------------

/** True when `operand` is one value per innermost run of the broadcast
 * (trailing dims that are 1 in both operands merged away): ONNX Runtime's
 * scalar path, which rounds in a different order. */
bool is_run_scalar(const mx::Shape& operand, const mx::Shape& other) {
  auto dim = [](const mx::Shape& s, size_t from_end) {
    return from_end < s.size() ? s[s.size() - 1 - from_end] : 1;
  };
  const size_t rank = std::max(operand.size(), other.size());
  for (size_t i = 0; i < rank; ++i) {
    const int a = dim(operand, i), b = dim(other, i);
    if (a == 1 && b == 1) continue;
    return a == 1;
  }
  return true;  // both are single values
}

OpOutputs qlinear_binary(NodeContext& ctx, bool multiply) {
  auto s = ctx.stream();
  const mx::array& a = quantized_input(ctx, 0, "A");
  const mx::array& b = quantized_input(ctx, 3, "B");
  if (b.dtype() != a.dtype()) throw ctx.error("B must have A's type ", a.dtype(), ", got ", b.dtype());
  const mx::Dtype type = a.dtype();
  const QLinearAddQuantization q = read_qlinear_add_quantization(ctx, 0, type);
  try {
    mx::broadcast_shapes(a.shape(), b.shape());
  } catch (const std::invalid_argument&) {
    throw ctx.error("A of shape ", a.shape(), " and B of shape ", b.shape(), " do not broadcast");
  }
  if (!multiply) return {qlinear_add_values(a, b, q, s)};
  // (a - zA) * (b - zB) is an exact integer in float32 (|.| <= 255^2).
  const float ratio = q.a_scale * q.b_scale / q.c_scale;
  mx::array product = mx::multiply(
      mx::subtract(mx::astype(a, mx::float32, s), mx::array(static_cast<float>(q.a_zero)), s),
      mx::subtract(mx::astype(b, mx::float32, s), mx::array(static_cast<float>(q.b_zero)), s), s);
  return {saturate_round(mx::multiply(product, mx::array(ratio), s), static_cast<float>(q.c_zero), type, s)};
}

OpOutputs qlinear_add(NodeContext& ctx) { return qlinear_binary(ctx, false); }
OpOutputs qlinear_mul(NodeContext& ctx) { return qlinear_binary(ctx, true); }

// --- QLinearSigmoid, QLinearLeakyRelu ------------------------------------------------------

template <typename F>
OpOutputs lookup_activation(NodeContext& ctx, F f) {
  const mx::array& x = quantized_input(ctx, 0, "X");
  const float sx = host_scale(ctx, 1, "X_scale"), sy = host_scale(ctx, 3, "Y_scale");
  const int zx = host_zero_point(ctx, 2, x.dtype(), "X_zero_point");
  const int zy = host_zero_point(ctx, 4, x.dtype(), "Y_zero_point");
  return {lookup(x, requantize_table(x.dtype(), sx, zx, sy, zy, f), x.dtype(), ctx.stream())};
}

// ONNX Runtime evaluates the logistic with MLAS's polynomial; std::exp here
// may differ in the last bits, which moves a table entry by one step when
// sigmoid(v) / Y_scale falls within an ulp of a rounding boundary.
OpOutputs qlinear_sigmoid(NodeContext& ctx) {
  return lookup_activation(ctx, [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
}

OpOutputs qlinear_leaky_relu(NodeContext& ctx) {
  const float alpha = ctx.attr_float("alpha", 0.01f);
  return lookup_activation(ctx, [alpha](float v) { return v >= 0.0f ? v : alpha * v; });
}

// --- QLinearSoftmax -----------------------------------------------------------------------

constexpr int64_t kSequentialRow = 256;

OpOutputs qlinear_softmax(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = quantized_input(ctx, 0, "X");
  const mx::Dtype type = x.dtype();
  const float sx = host_scale(ctx, 1, "X_scale");
  if (ctx.has_input(2)) host_zero_point(ctx, 2, type, "x_zero_point");  // checked; softmax ignores shifts
  const float sy = host_scale(ctx, 3, "y_scale");
  const int zy = host_zero_point(ctx, 4, type, "y_zero_point");
  if (!ctx.has_attr("opset"))
    throw ctx.error("attribute 'opset' (the Softmax version whose axis rule applies) is required");
  const int64_t opset = ctx.attr_int("opset", 13);
  const int rank = static_cast<int>(x.ndim());
  if (rank == 0) throw ctx.error("X must have rank >= 1");
  // The schema's default axis is -1 whatever the opset (ORT's kernel falls
  // back to 1 for opset < 13 only when the schema gives no default).
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", -1), rank);
  if (x.size() == 0) return {x};

  // Rows [R, D]: the flattened dims from `axis` (opset < 13), or `axis` moved last.
  mx::array rows = x;
  if (opset < 13) {
    int64_t d = 1;
    for (int i = axis; i < rank; ++i) d *= x.shape(i);
    rows = mx::reshape(x, {static_cast<int>(x.size() / d), static_cast<int>(d)}, s);
  } else if (axis != rank - 1) {
    rows = mx::moveaxis(x, axis, -1, s);
  }
  const int64_t d = rows.shape(-1);
  double shift = std::log(static_cast<double>(std::numeric_limits<float>::max() / static_cast<float>(d)));
  shift = std::max(0.0, shift - 5.0) / static_cast<double>(sx);
  std::vector<float> table(256);
  for (int k = 0; k < 256; ++k) {
    table[k] =
        static_cast<float>(std::exp((static_cast<double>(k) - 255.0 + shift) * static_cast<double>(sx)));
  }
  mx::array exp_table(table.begin(), {256}, mx::float32);
  mx::array xi = mx::astype(rows, mx::int32, s);
  mx::array k = mx::add(mx::subtract(xi, mx::max(xi, -1, true, s), s), mx::array(255), s);
  mx::array e = mx::take(exp_table, k, 0, s);
  // ORT adds a row's entries one by one in float32; rows up to
  // kSequentialRow long are added in that order (one add per entry), longer
  // ones by MLX's reduction, which can move a result at a rounding boundary
  // by one step.
  mx::array total = mx::take(e, 0, -1, s);
  if (d <= kSequentialRow) {
    for (int i = 1; i < d; ++i) total = mx::add(total, mx::take(e, i, -1, s), s);
    total = mx::expand_dims(total, -1, s);
  } else {
    total = mx::sum(e, -1, true, s);
  }
  const float y_multiplier = std::floor(1.0f / sy);
  mx::array q = mx::astype(mx::round(mx::divide(mx::multiply(e, mx::array(y_multiplier), s), total, s), 0, s),
                           mx::int32, s);
  const QuantRange r = range_of(type);
  q = mx::clip(mx::add(q, mx::array(zy), s), mx::array(r.lo), mx::array(r.hi), s);
  mx::array y = mx::astype(q, type, s);
  if (opset < 13) return {mx::reshape(y, x.shape(), s)};
  return {axis != rank - 1 ? mx::moveaxis(y, -1, axis, s) : y};
}

// --- QLinearConcat ---------------------------------------------------------------------------

OpOutputs qlinear_concat(NodeContext& ctx) {
  auto s = ctx.stream();
  const size_t n = ctx.num_inputs();
  if (n < 5 || (n - 2) % 3 != 0) {
    throw ctx.error("inputs must be Y_scale, Y_zero_point and (X, X_scale, X_zero_point) per input, got ", n,
                    " inputs");
  }
  const float sy = host_scale(ctx, 0, "Y_scale");
  if (!ctx.has_input(1)) throw ctx.error("Y_zero_point is required");
  const mx::Dtype type = ctx.input(1).dtype();
  if (!is_8bit(type)) throw ctx.error("Y_zero_point must be int8 or uint8, got ", type);
  const int zy = host_zero_point(ctx, 1, type, "Y_zero_point");
  std::vector<mx::array> parts;
  for (size_t i = 2; i < n; i += 3) {
    const std::string index = std::to_string((i - 2) / 3);
    const mx::array& x = ctx.input(i);
    if (x.dtype() != type)
      throw ctx.error("input ", index, " must have Y_zero_point's type ", type, ", got ", x.dtype());
    const float sx = host_scale(ctx, i + 1, ("X_scale of input " + index).c_str());
    if (!ctx.has_input(i + 2)) throw ctx.error("X_zero_point of input ", index, " is required");
    const int zx = host_zero_point(ctx, i + 2, type, ("X_zero_point of input " + index).c_str());
    if (sx == sy && zx == zy) {
      parts.push_back(x);
    } else {
      parts.push_back(lookup(x, requantize_table(type, sx, zx, sy, zy, [](float v) { return v; }), type, s));
    }
  }
  const int rank = static_cast<int>(parts[0].ndim());
  if (rank == 0) throw ctx.error("inputs must have rank >= 1");
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), rank);
  if (!ctx.has_attr("axis")) throw ctx.error("attribute 'axis' is required");
  for (size_t i = 1; i < parts.size(); ++i) {
    bool fits = static_cast<int>(parts[i].ndim()) == rank;
    for (int d = 0; fits && d < rank; ++d) fits = d == axis || parts[i].shape(d) == parts[0].shape(d);
    if (!fits) {
      throw ctx.error("input ", i, " of shape ", parts[i].shape(),
                      " does not concatenate with input 0 of shape ", parts[0].shape(), " on axis ", axis);
    }
  }
  return {mx::concatenate(parts, axis, s)};
}

// --- QLinearGlobalAveragePool, QLinearAveragePool ---------------------------------------------

struct PoolQuantization {
  float sx;
  int zx;
  float sy;
  int zy;
};

PoolQuantization read_pool_quantization(const NodeContext& ctx, mx::Dtype type) {
  return {host_scale(ctx, 1, "x_scale"), host_zero_point(ctx, 2, type, "x_zero_point"),
          host_scale(ctx, 3, "y_scale"), host_zero_point(ctx, 4, type, "y_zero_point")};
}

/** MLAS's global average: integer sums over `axes` (kept), requantized with
 * sX / (sY * n). Channels-last (the spatial axes between the batch and the
 * channels) runs as one CPU kernel; the composition is its reference. */
mx::array global_average(const NodeContext& ctx, const mx::array& x, const std::vector<int>& axes,
                         bool channels_last, const PoolQuantization& q) {
  auto s = ctx.stream();
  int64_t n = 1;
  for (int a : axes) n *= x.shape(a);
  if (n >= (int64_t{1} << 24))
    throw ctx.error("an image of ", n, " elements is too large (ONNX Runtime's limit is 2^24)");
  const float scale = q.sx / (q.sy * static_cast<float>(n));
  if (n == 0 || !(scale >= 0x1.0p-32f && scale < 256.0f)) {
    throw ctx.error("x_scale / (y_scale * image size) = ", scale,
                    " is outside [2^-32, 256), where every output would be constant");
  }
  const auto centering = static_cast<int32_t>(q.zx * n);
  const float y_zero = static_cast<float>(q.zy);
  kernels::Reference reference = [axes, scale, centering, y_zero, s](const std::vector<mx::array>& in) {
    mx::array sum = mx::sum(mx::astype(in[0], mx::int32, s), axes, true, s);
    mx::array centered = mx::subtract(sum, mx::array(centering), s);
    return std::vector<mx::array>{saturate_round(
        mx::multiply(mx::astype(centered, mx::float32, s), mx::array(scale), s), y_zero, in[0].dtype(), s)};
  };
  if (!channels_last) return reference({x})[0];
  return kernels::qlinear_global_average_nhwc(x, {scale, q.zx, q.zy}, reference, s);
}

std::vector<int> spatial_axes(int rank, bool channels_last) {
  std::vector<int> axes;
  for (int i = channels_last ? 1 : 2; i < (channels_last ? rank - 1 : rank); ++i) axes.push_back(i);
  return axes;
}

OpOutputs qlinear_global_average_pool(NodeContext& ctx) {
  const mx::array& x = quantized_input(ctx, 0, "X");
  if (x.ndim() < 3) throw ctx.error("X must have rank >= 3 ([N, C, D1, ...]), got ", x.ndim());
  const bool channels_last = ctx.attr_int("channels_last", 0) != 0;
  PoolQuantization q = read_pool_quantization(ctx, x.dtype());
  return {global_average(ctx, x, spatial_axes(static_cast<int>(x.ndim()), channels_last), channels_last, q)};
}

OpOutputs qlinear_average_pool(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x_in = quantized_input(ctx, 0, "X");
  const int rank = static_cast<int>(x_in.ndim());
  if (rank < 3) throw ctx.error("X must have rank >= 3 ([N, C, D1, ...]), got ", rank);
  const bool channels_last = ctx.attr_int("channels_last", 0) != 0;
  const int spatial = rank - 2;
  if (spatial > 3)
    throw ctx.error("at most 3 spatial axes are supported (as in ONNX Runtime), got ", spatial);
  PoolQuantization q = read_pool_quantization(ctx, x_in.dtype());
  mx::array x = channels_last ? mx::moveaxis(x_in, -1, 1, s) : x_in;  // [N, C, D...]
  const std::vector<int64_t> input(x.shape().begin() + 2, x.shape().end());
  ConvPoolAttributes attrs = ConvPoolAttributes::read(ctx, spatial);
  for (int64_t d : attrs.dilations) {
    if (d != 1) throw ctx.error("dilations are not supported (ONNX Runtime's kernel has none), got ", d);
  }
  WindowGeometry geo = resolve_window(ctx, attrs, input);
  const bool whole =
      attrs.kernel_shape == input &&
      std::all_of(geo.pad_begin.begin(), geo.pad_begin.end(), [](int64_t p) { return p == 0; }) &&
      std::all_of(geo.pad_end.begin(), geo.pad_end.end(), [](int64_t p) { return p == 0; });
  if (whole) return {global_average(ctx, x_in, spatial_axes(rank, channels_last), channels_last, q)};

  const int64_t window = checked_product(ctx, attrs.kernel_shape, "window size");
  if (window > 65536) throw ctx.error("a window of ", window, " elements is too large");
  const bool count_include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  // Dequantized input, zero padded so that every window lies inside it.
  mx::array real =
      mx::multiply(mx::astype(mx::subtract(mx::astype(x, mx::int32, s), mx::array(q.zx), s), mx::float32, s),
                   mx::array(q.sx), s);
  std::vector<int> axes;
  mx::Shape low, high;
  for (int i = 0; i < spatial; ++i) {
    const int64_t reach = (geo.output[i] - 1) * attrs.strides[i] + attrs.kernel_shape[i];
    axes.push_back(i + 2);
    low.push_back(to_int32(ctx, geo.pad_begin[i], "pad"));
    high.push_back(to_int32(ctx, std::max<int64_t>(0, reach - input[i] - geo.pad_begin[i]), "pad"));
  }
  mx::array padded = mx::pad(real, axes, low, high, mx::array(0.0f), "constant", s);
  // Window sums in ORT's order (row-major offsets, one float32 add each; the
  // padding adds exact zeros).
  std::optional<mx::array> sum;
  for_each_offset(attrs.kernel_shape, [&](const std::vector<int64_t>& offset) {
    mx::Shape start(rank, 0), stop = padded.shape(), strides(rank, 1);
    for (int i = 0; i < spatial; ++i) {
      start[i + 2] = static_cast<int>(offset[i]);
      stop[i + 2] = static_cast<int>(offset[i] + (geo.output[i] - 1) * attrs.strides[i] + 1);
      strides[i + 2] = static_cast<int>(attrs.strides[i]);
    }
    mx::array slice = mx::slice(padded, start, stop, strides, s);
    sum = sum ? mx::add(*sum, slice, s) : mx::add(mx::array(0.0f), slice, s);
  });
  // Divisors per output position: the kernel size, or the window's elements
  // inside the unpadded input.
  const int64_t positions = checked_product(ctx, geo.output, "output size");
  std::vector<float> counts(static_cast<size_t>(positions));
  for (int64_t flat = 0; flat < positions; ++flat) {
    int64_t rest = flat, count = 1;
    for (int i = spatial - 1; i >= 0; --i) {
      const int64_t o = rest % geo.output[i];
      rest /= geo.output[i];
      const int64_t begin = o * attrs.strides[i] - geo.pad_begin[i];
      const int64_t end = std::min(begin + attrs.kernel_shape[i], input[i]);
      count *= end - std::max<int64_t>(begin, 0);
    }
    counts[static_cast<size_t>(flat)] = static_cast<float>(count_include_pad ? window : count);
  }
  mx::Shape count_shape{1, 1};
  for (int64_t o : geo.output) count_shape.push_back(static_cast<int>(o));
  mx::array average = mx::divide(*sum, mx::array(counts.begin(), count_shape, mx::float32), s);
  mx::array shifted =
      mx::add(mx::divide(average, mx::array(q.sy), s), mx::array(static_cast<float>(q.zy)), s);
  mx::array y = saturate_round(shifted, 0.0f, x.dtype(), s);
  return {channels_last ? mx::moveaxis(y, 1, -1, s) : y};
}

/** Host inputs of QLinearConcat: Y_scale, Y_zero_point and every X_scale,
 * X_zero_point (indices past the node's inputs are ignored). */
std::vector<int> concat_host_inputs() {
  std::vector<int> inputs{0, 1};
  for (int i = 2; i < 2 + 3 * 256; i += 3) inputs.insert(inputs.end(), {i + 1, i + 2});
  return inputs;
}

constexpr std::string_view kQuantized = "outputs are quantized integers";
constexpr std::string_view kPerTensor = "int8/uint8, per-tensor scales and zero points";

}  // namespace

QLinearAddQuantization read_qlinear_add_quantization(const NodeContext& ctx, size_t first, mx::Dtype type) {
  return {host_scale(ctx, first + 1, "A_scale"), host_zero_point(ctx, first + 2, type, "A_zero_point"),
          host_scale(ctx, first + 4, "B_scale"), host_zero_point(ctx, first + 5, type, "B_zero_point"),
          host_scale(ctx, first + 6, "C_scale"), host_zero_point(ctx, first + 7, type, "C_zero_point")};
}

kernels::QLinearAddRatios qlinear_add_ratios(const QLinearAddQuantization& q) {
  const float ra = q.a_scale / q.c_scale, rb = q.b_scale / q.c_scale;
  const float ka = ra * static_cast<float>(q.a_zero);
  const float kb = rb * static_cast<float>(q.b_zero);
  return {ra, rb, static_cast<float>(q.c_zero) - (ka + kb)};
}

// ORT's kernel computes v * r + t as one fused multiply-add, rounded once. The CPU kernel
// (kernels::qlinear_add, operands of one shape) does so in float32. The composition, for the other
// cases: on the CPU exact in float64 (v * r, an 8-bit integer times a float32, has at most 33
// significant bits) and rounded once to float32; elsewhere (no float64 on GPUs) a float32 multiply and
// add, which can leave a sum within an ulp of n + 0.5 one step apart.
kernels::Reference qlinear_add_reference(const kernels::QLinearAddRatios& r, mx::Stream s) {
  const bool fused = s.device == mx::Device::cpu;
  return [s, r, fused](const std::vector<mx::array>& in) {
    const mx::array &a = in[0], &b = in[1];
    const mx::array fixed(r.fixed);
    mx::array af = mx::astype(a, mx::float32, s);
    mx::array bf = mx::astype(b, mx::float32, s);
    auto fma = [&](const mx::array& v, float ratio, const mx::array& t) {
      if (!fused) return mx::add(mx::multiply(v, mx::array(ratio), s), t, s);
      mx::array wide = mx::add(
          mx::multiply(mx::astype(v, mx::float64, s), mx::array(static_cast<double>(ratio), mx::float64), s),
          mx::astype(t, mx::float64, s), s);
      return mx::astype(wide, mx::float32, s);
    };
    auto term = [&](const mx::array& v, float ratio) { return mx::multiply(v, mx::array(ratio), s); };
    mx::array sum = [&] {
      // A run-scalar operand joins the constant first (a multiply and an add).
      if (is_run_scalar(a.shape(), b.shape())) return fma(bf, r.b, mx::add(fixed, term(af, r.a), s));
      if (is_run_scalar(b.shape(), a.shape())) return fma(af, r.a, mx::add(fixed, term(bf, r.b), s));
      return fma(af, r.a, fma(bf, r.b, fixed));
    }();
    return std::vector<mx::array>{saturate_round(sum, 0.0f, a.dtype(), s)};
  };
}

mx::array qlinear_add_values(const mx::array& a, const mx::array& b, const QLinearAddQuantization& q,
                             mx::StreamOrDevice s) {
  const kernels::QLinearAddRatios ratios = qlinear_add_ratios(q);
  const mx::Stream stream = mx::to_stream(s);
  return kernels::qlinear_add(a, b, ratios, qlinear_add_reference(ratios, stream), stream);
}

void register_microsoft_qlinear(OpRegistry& r) {
  // clang-format off
  r.add({
      {.op_type = "QLinearAdd", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = qlinear_add,
       .host_inputs = {1, 2, 4, 5, 6, 7}, .restrictions = kPerTensor, .not_differentiable = kQuantized},
      {.op_type = "QLinearMul", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = qlinear_mul,
       .host_inputs = {1, 2, 4, 5, 6, 7}, .restrictions = kPerTensor, .not_differentiable = kQuantized},
      {.op_type = "QLinearSigmoid", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = qlinear_sigmoid,
       .host_inputs = {1, 2, 3, 4}, .restrictions = kPerTensor, .not_differentiable = kQuantized},
      {.op_type = "QLinearLeakyRelu", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = qlinear_leaky_relu,
       .host_inputs = {1, 2, 3, 4}, .restrictions = kPerTensor, .not_differentiable = kQuantized},
      {.op_type = "QLinearSoftmax", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = qlinear_softmax,
       .host_inputs = {1, 2, 3, 4}, .restrictions = kPerTensor, .not_differentiable = kQuantized},
      {.op_type = "QLinearConcat", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = qlinear_concat,
       .host_inputs = concat_host_inputs(), .restrictions = kPerTensor, .not_differentiable = kQuantized},
      {.op_type = "QLinearGlobalAveragePool", .domain = kMicrosoft, .since = 1, .until = kOpen,
       .fn = qlinear_global_average_pool, .host_inputs = {1, 2, 3, 4}, .restrictions = kPerTensor,
       .not_differentiable = kQuantized},
      {.op_type = "QLinearAveragePool", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = qlinear_average_pool,
       .host_inputs = {1, 2, 3, 4}, .restrictions = "int8/uint8, per-tensor scales; 1 to 3 spatial axes, no dilations",
       .not_differentiable = kQuantized},
  });
  // clang-format on
  register_microsoft_qlinear_matmul(r);
}

}  // namespace transmuter
