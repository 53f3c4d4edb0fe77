// Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
// MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv; and BitCast.
// https://onnx.ai/onnx/operators/onnx__QuantizeLinear.html
// https://onnx.ai/onnx/operators/onnx__DequantizeLinear.html
// https://onnx.ai/onnx/operators/onnx__DynamicQuantizeLinear.html
// https://onnx.ai/onnx/operators/onnx__MatMulInteger.html
// https://onnx.ai/onnx/operators/onnx__ConvInteger.html
// https://onnx.ai/onnx/operators/onnx__QLinearMatMul.html
// https://onnx.ai/onnx/operators/onnx__QLinearConv.html
// https://onnx.ai/onnx/operators/onnx__BitCast.html
//
// Quantized values of narrow types (int4, uint2, float8, float4, ...) are held
// widened (narrow_types.h); a quantizer rounds and saturates to the narrow
// type's values, and the value's ONNX element type says which type it is.
//
// Integer products (MatMulInteger, ConvInteger, QLinear*) must be exact: ONNX
// Runtime accumulates int8/uint8 products in int32. MLX's matmul and conv take
// floats only, so they run in float32 on operands that are exact small
// integers, with the reduction cut into chunks short enough that every partial
// sum stays below 2^24, where float32 holds every integer (see
// kernels::exact_integer_matmul). The chunks' sums are added in int32. This keeps
// float GEMM speed (Transmuter's own GEMM on CPU streams, whose float32
// multiply-adds are exact on such integers; MLX's matmul elsewhere); an
// elementwise int32 product-and-sum would be exact too but needs an [M, K, N]
// intermediate.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "core/memory.h"
#include "kernels/cpu/dynamic_quantize.h"
#include "kernels/cpu/integer_gemm.h"
#include "ops/node_context.h"
#include "ops/onnx/conv_pool_attributes.h"
#include "ops/onnx/narrow_types.h"
#include "ops/onnx/quantization.h"
#include "ops/registry.h"
#include "transmuter/dtype.h"

namespace transmuter {
namespace {

// --- element types ---------------------------------------------------------------

/** The ONNX element type of input `i` (its narrow type when held widened). */
OnnxType input_type(const NodeContext& ctx, size_t i) { return ctx.value(i).element_type(); }

/** "[2,3]": for messages. */
std::string describe_shape(const mx::Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

/** The output value: `a` holding values of ONNX type `type`. */
Value typed(mx::array a, OnnxType type) { return Value(std::move(a), type); }

/** The dtype named by a type attribute (output_dtype, precision, to). */
mx::Dtype storage_of(const NodeContext& ctx, OnnxType type, const char* what) {
  std::optional<mx::Dtype> dtype = to_mlx_dtype(type);
  if (!dtype) throw ctx.error(what, " ", onnx_type_name(type), " is not a tensor element type");
  return *dtype;
}

bool is_8bit_integer(mx::Dtype dtype) { return dtype == mx::int8 || dtype == mx::uint8; }

/** Integer range of the integer quantized types; nullopt for float8/float4. */
std::optional<IntRange> quantized_range(OnnxType type) {
  switch (type) {
    case OnnxType::kUint8: return IntRange{0, 255};
    case OnnxType::kInt8: return IntRange{-128, 127};
    case OnnxType::kUint16: return IntRange{0, 65535};
    case OnnxType::kInt16: return IntRange{-32768, 32767};
    default: return sub_byte_range(type);
  }
}

bool is_quantized_type(OnnxType type) { return quantized_range(type) || is_narrow_float(type); }

// --- scales and zero points ------------------------------------------------------

/** How a scale (and its zero point) maps onto the elements of x: per tensor
 * (one element), per axis (1-D, the length of x's `axis`), or blocked (x's
 * rank, ceil(D / block_size) along `axis`, each scale repeated block_size
 * times). */
struct Granularity {
  int64_t axis = 1;  // as written; normalized where a parameter needs it
  int64_t block_size = 0;
};

Granularity read_granularity(const NodeContext& ctx) {
  Granularity g{ctx.attr_int("axis", 1), ctx.attr_int("block_size", 0)};
  if (g.block_size < 0) throw ctx.error("block_size must be positive, got ", g.block_size);
  return g;
}

/** A one-element 8-bit zero point as float32. An evaluated one (an initializer, as exports have) is read
 * here and becomes a constant, rather than a cast in every run's graph: MLX's cast is not a kernel, and one
 * keeps an eager run's graph off the calling thread's evaluation (runtime/evaluate_here.h). */
mx::array zero_point_as_float(const mx::array& z, mx::StreamOrDevice s) {
  if (z.is_available() && !z.is_tracer()) {
    if (z.dtype() == mx::uint8) return mx::array(static_cast<float>(z.data<uint8_t>()[0]));
    if (z.dtype() == mx::int8) return mx::array(static_cast<float>(z.data<int8_t>()[0]));
  }
  return mx::astype(z, mx::float32, s);
}

/** `param` (a scale or zero point named `what`) reshaped or repeated to
 * broadcast against x's shape. */
mx::array broadcast_param(const NodeContext& ctx, const mx::array& param, const mx::array& x, const Granularity& g,
                          const char* what) {
  auto s = ctx.stream();
  if (param.size() == 1) return mx::reshape(param, {}, s);  // per tensor
  if (x.ndim() == 0) throw ctx.error(what, " must have one element for a scalar input, got ", param.size());
  const int axis = ctx.normalize_axis(g.axis, static_cast<int>(x.ndim()));
  const int dim = x.shape(axis);
  if (g.block_size == 0) {
    if (param.ndim() != 1 || param.shape(0) != dim) {
      throw ctx.error(what, " must be a scalar or 1-D of length ", dim, " (axis ", axis, "), got shape ",
                      describe_shape(param.shape()));
    }
    mx::Shape shape(x.ndim(), 1);
    shape[axis] = dim;
    return mx::reshape(param, shape, s);
  }
  // Blocked: same shape as x except ceil(dim / block_size) along the axis.
  mx::Shape expected = x.shape();
  expected[axis] = static_cast<int>((dim + g.block_size - 1) / g.block_size);
  if (param.shape() != expected) {
    throw ctx.error(what, " of shape ", describe_shape(param.shape()), " does not fit input ",
                    describe_shape(x.shape()), " with block_size ", g.block_size, " on axis ", axis,
                    " (expected ", describe_shape(expected), ")");
  }
  mx::array repeated = mx::repeat(param, to_int32(ctx, g.block_size, "block_size"), axis, s);
  mx::Shape stop = repeated.shape();
  stop[axis] = dim;
  return mx::slice(repeated, mx::Shape(x.ndim(), 0), stop, s);
}

// --- QuantizeLinear ----------------------------------------------------------------

/** The output type: the zero point's, else output_dtype, else uint8. */
OnnxType quantized_output_type(const NodeContext& ctx) {
  const auto output_dtype = static_cast<OnnxType>(ctx.attr_int("output_dtype", 0));
  OnnxType type = output_dtype == OnnxType::kUndefined ? OnnxType::kUint8 : output_dtype;
  if (ctx.has_input(2)) {
    type = input_type(ctx, 2);
    if (output_dtype != OnnxType::kUndefined && output_dtype != type) {
      throw ctx.error("output_dtype ", onnx_type_name(output_dtype), " differs from the zero point's type ",
                      onnx_type_name(type));
    }
  }
  if (!is_quantized_type(type)) throw ctx.error("cannot quantize to ", onnx_type_name(type));
  return type;
}

/** The precision of x / y_scale: the `precision` attribute, else the scale's
 * float type (float32 for int32 and float8e8m0 scales, held as float32). */
mx::Dtype division_dtype(const NodeContext& ctx, const mx::array& scale) {
  if (const int64_t precision = ctx.attr_int("precision", 0); precision != 0) {
    mx::Dtype dtype = storage_of(ctx, static_cast<OnnxType>(precision), "precision");
    if (!mx::issubdtype(dtype, mx::floating)) throw ctx.error("precision must be a float type");
    return dtype;
  }
  return mx::issubdtype(scale.dtype(), mx::floating) ? scale.dtype() : mx::float32;
}

/** y = saturate(round(x / scale) + zero_point), rounding half to even. */
mx::array quantize(const NodeContext& ctx, const mx::array& x, const mx::array& scale,
                   const std::optional<mx::array>& zero_point, OnnxType type, bool saturate) {
  auto s = ctx.stream();
  const mx::Dtype precision = division_dtype(ctx, scale);
  mx::array scaled = mx::divide(mx::astype(x, precision, s), mx::astype(scale, precision, s), s);
  mx::array zp = zero_point ? mx::astype(*zero_point, mx::float32, s) : mx::array(0.0f);
  const mx::Dtype storage = storage_of(ctx, type, "output type");
  if (std::optional<IntRange> range = quantized_range(type)) {
    // Rounded in the division's precision (exact), then shifted and clipped in
    // float32, which holds every int16/uint16 value and zero point exactly.
    mx::array rounded = mx::astype(mx::round(scaled, 0, s), mx::float32, s);
    mx::array clipped = mx::clip(mx::add(rounded, zp, s), mx::array(static_cast<float>(range->min)),
                                 mx::array(static_cast<float>(range->max)), s);
    return mx::astype(clipped, storage, s);
  }
  // float8/float4: one rounding of x / scale + zero_point to the narrow type.
  return round_to_narrow_float(mx::add(mx::astype(scaled, mx::float32, s), zp, s), type, saturate, s);
}

// QuantizeLinear: v13 per-axis scales (axis); v19 float8 outputs and
// saturate, float16/bfloat16 inputs; v21 blocked scales (block_size),
// output_dtype, int16/uint16/int4/uint4; v23 precision, float4e2m1; v24
// float8e8m0 scales; v25 int2/uint2; v28 float6 (not supported: no such
// element types here). Absent attributes take their defaults, so one
// function serves all.
OpOutputs quantize_linear(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const mx::array& scale = ctx.input(1);
  const OnnxType type = quantized_output_type(ctx);
  const Granularity g = read_granularity(ctx);
  mx::array scale_b = broadcast_param(ctx, scale, x, g, "y_scale");
  std::optional<mx::array> zp;
  if (ctx.has_input(2)) {
    const mx::array& z = ctx.input(2);
    if (z.size() != scale.size()) {
      throw ctx.error("y_zero_point shape ", describe_shape(z.shape()), " differs from y_scale shape ",
                      describe_shape(scale.shape()));
    }
    zp = broadcast_param(ctx, z, x, g, "y_zero_point");
  }
  const bool saturate = ctx.attr_int("saturate", 1) != 0;
  // One float32 scale and zero point to 8 bits (a quantized CNN's input): one kernel pass, the same bytes.
  if ((type == OnnxType::kUint8 || type == OnnxType::kInt8) && g.block_size == 0 &&
      x.dtype() == mx::float32 && scale.dtype() == mx::float32 && scale.size() == 1 && zp &&
      zp->size() == 1 && division_dtype(ctx, scale) == mx::float32) {
    return {kernels::quantize_per_tensor(x, scale, zero_point_as_float(ctx.input(2), ctx.stream()),
                                         storage_of(ctx, type, "output type"), ctx.stream())};
  }
  return {typed(quantize(ctx, x, scale_b, zp, type, saturate), type)};
}

// --- DequantizeLinear --------------------------------------------------------------

// DequantizeLinear: y = (x - x_zero_point) * x_scale, computed in float32 (as
// the ONNX reference does) and rounded once to the output type: output_dtype
// (v23) or the scale's type. v13 axis; v19 float8 inputs and float16/bfloat16
// scales; v21 block_size, int16/uint16/int4/uint4; v23 output_dtype,
// float4e2m1; v24 float8e8m0 scales; v25 int2/uint2; v28 float6 (not
// supported).
OpOutputs dequantize_linear(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& scale = ctx.input(1);
  const OnnxType x_type = input_type(ctx, 0);
  if (!is_quantized_type(x_type) && x_type != OnnxType::kInt32) {
    throw ctx.error("cannot dequantize ", onnx_type_name(x_type));
  }
  if (!mx::issubdtype(scale.dtype(), mx::floating)) {
    throw ctx.error("x_scale must be a float tensor, got ", onnx_type_name(input_type(ctx, 1)));
  }
  const Granularity g = read_granularity(ctx);
  // One scale and zero point over 8-bit x (the QDQ format's activations): one kernel pass, the same floats.
  const bool plain_output = ctx.attr_int("output_dtype", 0) == 0 && scale.dtype() == mx::float32;
  if (plain_output && g.block_size == 0 && scale.size() == 1 &&
      (x_type == OnnxType::kUint8 || x_type == OnnxType::kInt8) &&
      (!ctx.has_input(2) || (ctx.input(2).size() == 1 && input_type(ctx, 2) == x_type))) {
    const mx::array zero = ctx.has_input(2) ? zero_point_as_float(ctx.input(2), s) : mx::array(0.0f);
    return {kernels::dequantize_per_tensor(x, scale, zero, s)};
  }
  mx::array values = mx::astype(x, mx::float32, s);
  if (ctx.has_input(2)) {
    const mx::array& z = ctx.input(2);
    if (input_type(ctx, 2) != x_type) {
      throw ctx.error("x_zero_point type ", onnx_type_name(input_type(ctx, 2)), " differs from x type ",
                      onnx_type_name(x_type));
    }
    if (z.size() != scale.size()) {
      throw ctx.error("x_zero_point shape ", describe_shape(z.shape()), " differs from x_scale shape ",
                      describe_shape(scale.shape()));
    }
    values = mx::subtract(values, mx::astype(broadcast_param(ctx, z, x, g, "x_zero_point"), mx::float32, s), s);
  }
  mx::array scale_b = mx::astype(broadcast_param(ctx, scale, x, g, "x_scale"), mx::float32, s);
  const auto output_dtype = static_cast<OnnxType>(ctx.attr_int("output_dtype", 0));
  const mx::Dtype out = output_dtype == OnnxType::kUndefined ? scale.dtype()
                                                             : storage_of(ctx, output_dtype, "output_dtype");
  if (!mx::issubdtype(out, mx::floating)) throw ctx.error("output_dtype must be a float type");
  OnnxType out_type = output_dtype == OnnxType::kUndefined ? input_type(ctx, 1) : output_dtype;
  // A float8e8m0 scale without output_dtype gives float32 (its storage).
  if (out_type == OnnxType::kFloat8E8M0) out_type = OnnxType::kFloat;
  return {typed(mx::astype(mx::multiply(values, scale_b, s), out, s), out_type)};
}

// --- DynamicQuantizeLinear ----------------------------------------------------------

// DynamicQuantizeLinear (uint8): the range [min(x, 0), max(x, 0)] maps onto
// [0, 255]: y_scale = (max - min) / 255 (1 / 255 when the range is empty, as
// the ONNX reference does; ONNX Runtime's 1.0 differs only in y_scale, y and
// zero point are 0 either way), zero point = round(clip(-min / y_scale)),
// y = clip(round(x / y_scale) + zero point). Rounding is half to even.
OpOutputs dynamic_quantize_linear(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  if (x.dtype() != mx::float32) throw ctx.error("x must be float32, got ", onnx_type_name(input_type(ctx, 0)));
  if (x.size() == 0) throw ctx.error("x is empty: its range, and so the scale, is undefined");
  std::vector<mx::array> out = kernels::dynamic_quantize_linear(x, s);
  return {out[0], out[1], out[2]};
}

// --- exact integer products -----------------------------------------------------------

/** numpy matmul of quantized operands minus zero points (float32), with 1-D
 * operands promoted to matrices and the added axis removed again. `exact`:
 * integer operands through exact_integer_matmul (int32 result); otherwise a
 * float32 matmul (float8 operands of QLinearMatMul v21). */
mx::array quantized_matmul(const NodeContext& ctx, mx::array a, mx::array b, bool exact) {
  auto s = ctx.stream();
  if (a.ndim() == 0 || b.ndim() == 0) throw ctx.error("operands must have rank >= 1");
  const bool vector_a = a.ndim() == 1;
  const bool vector_b = b.ndim() == 1;
  if (vector_a) a = mx::expand_dims(a, 0, s);
  if (vector_b) b = mx::expand_dims(b, -1, s);
  if (a.shape(-1) != b.shape(-2)) {
    throw ctx.error("inner dimensions differ: ", a.shape(-1), " and ", b.shape(-2));
  }
  mx::array out = exact ? kernels::exact_integer_matmul(a, b, s) : mx::matmul(a, b, s);
  if (vector_b) out = mx::squeeze(out, -1, s);
  if (vector_a) out = mx::squeeze(out, vector_b ? -1 : -2, s);
  return out;
}

/** A per-row parameter of a matmul's left operand a: [..., M, K]. A vector of
 * M elements becomes [M, 1] (one value per row); scalars and tensors of a's
 * rank ([..., M, 1]) broadcast as they are. */
mx::array per_row(const NodeContext& ctx, const mx::array& param, const mx::array& a, const char* what) {
  if (param.size() == 1) return mx::reshape(param, {}, ctx.stream());
  if (param.ndim() == 1 && a.ndim() >= 2 && param.shape(0) == a.shape(-2)) {
    return mx::reshape(param, {param.shape(0), 1}, ctx.stream());
  }
  if (param.ndim() == a.ndim() && param.shape(-1) == 1) return param;
  throw ctx.error(what, " of shape ", describe_shape(param.shape()), " is neither per tensor nor per row of ",
                  describe_shape(a.shape()));
}

/** A per-column parameter of a matmul's right operand b: [..., K, N]: a scalar,
 * a vector of N elements, or a tensor of b's rank ([..., 1, N]). */
mx::array per_column(const NodeContext& ctx, const mx::array& param, const mx::array& b, const char* what) {
  if (param.size() == 1) return mx::reshape(param, {}, ctx.stream());
  const bool vector = param.ndim() == 1 && param.shape(0) == b.shape(-1);
  const bool full = param.ndim() == b.ndim() && b.ndim() >= 2 && param.shape(-2) == 1 &&
                    param.shape(-1) == b.shape(-1);
  if (vector || full) return param;
  throw ctx.error(what, " of shape ", describe_shape(param.shape()), " is neither per tensor nor per column of ",
                  describe_shape(b.shape()));
}

/** q - zero_point in float32 (exact: both are 8-bit integers or float8). */
mx::array centered(const NodeContext& ctx, const mx::array& q, const std::optional<mx::array>& zero_point) {
  auto s = ctx.stream();
  mx::array v = mx::astype(q, mx::float32, s);
  return zero_point ? mx::subtract(v, mx::astype(*zero_point, mx::float32, s), s) : v;
}

void check_8bit(const NodeContext& ctx, size_t i, const char* what) {
  if (!is_8bit_integer(ctx.input(i).dtype())) {
    throw ctx.error(what, " must be int8 or uint8, got ", onnx_type_name(input_type(ctx, i)));
  }
}

/** The zero point input `i`, which must have the type of quantized input `of`. */
std::optional<mx::array> zero_point_input(const NodeContext& ctx, size_t i, size_t of, const char* what) {
  if (!ctx.has_input(i)) return std::nullopt;
  if (input_type(ctx, i) != input_type(ctx, of)) {
    throw ctx.error(what, " type ", onnx_type_name(input_type(ctx, i)), " differs from its input's type ",
                    onnx_type_name(input_type(ctx, of)));
  }
  return ctx.input(i);
}

// MatMulInteger: (A - a_zero_point) @ (B - b_zero_point) in int32; a zero
// point is per tensor or per row of A / per column of B.
OpOutputs matmul_integer(NodeContext& ctx) {
  const mx::array& a = ctx.input(0);
  const mx::array& b = ctx.input(1);
  check_8bit(ctx, 0, "A");
  check_8bit(ctx, 1, "B");
  std::optional<mx::array> a_zp = zero_point_input(ctx, 2, 0, "a_zero_point");
  std::optional<mx::array> b_zp = zero_point_input(ctx, 3, 1, "b_zero_point");
  if (a_zp) a_zp = per_row(ctx, *a_zp, a, "a_zero_point");
  if (b_zp) b_zp = per_column(ctx, *b_zp, b, "b_zero_point");
  return {quantized_matmul(ctx, centered(ctx, a, a_zp), centered(ctx, b, b_zp), true)};
}

/** Requantizes float32 `acc` to the type of y_zero_point (input `zp_input`):
 * saturate(round(acc * multiplier) + y_zero_point), half to even. */
mx::array requantize(const NodeContext& ctx, const mx::array& acc, const mx::array& multiplier, size_t zp_input,
                     OnnxType type) {
  auto s = ctx.stream();
  mx::array scaled = mx::multiply(acc, multiplier, s);
  mx::array zp = ctx.has_input(zp_input) ? mx::astype(ctx.input(zp_input), mx::float32, s) : mx::array(0.0f);
  return quantize(ctx, scaled, mx::array(1.0f), zp, type, true);
}

// QLinearMatMul: y = saturate(round((a - a_zp) @ (b - b_zp) * a_scale * b_scale
// / y_scale) + y_zp). The multiplier a_scale * b_scale / y_scale is computed
// in the scales' type, as the reference does. v21 adds float16/bfloat16 scales
// and float8 operands (their product is computed in float32).
OpOutputs qlinear_matmul(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& a = ctx.input(0);
  const mx::array& b = ctx.input(3);
  const OnnxType a_type = input_type(ctx, 0);
  const OnnxType b_type = input_type(ctx, 3);
  const bool integer = is_8bit_integer(a.dtype()) && is_8bit_integer(b.dtype()) && !is_narrow_float(a_type) &&
                       !is_narrow_float(b_type);
  const OnnxType y_type = ctx.has_input(7) ? input_type(ctx, 7) : a_type;
  for (OnnxType t : {a_type, b_type, y_type}) {
    if (!is_8bit_integer(storage_of(ctx, t, "type")) && !(is_narrow_float(t) && t != OnnxType::kFloat4E2M1)) {
      throw ctx.error("operands must be int8, uint8 or float8, got ", onnx_type_name(t));
    }
  }
  std::optional<mx::array> a_zp = zero_point_input(ctx, 2, 0, "a_zero_point");
  std::optional<mx::array> b_zp = zero_point_input(ctx, 5, 3, "b_zero_point");
  if (a_zp) a_zp = per_row(ctx, *a_zp, a, "a_zero_point");
  if (b_zp) b_zp = per_column(ctx, *b_zp, b, "b_zero_point");
  mx::array acc = mx::astype(quantized_matmul(ctx, centered(ctx, a, a_zp), centered(ctx, b, b_zp), integer),
                             mx::float32, s);
  mx::array a_scale = per_row(ctx, ctx.input(1), a, "a_scale");
  mx::array b_scale = per_column(ctx, ctx.input(4), b, "b_scale");
  if (ctx.input(6).size() != 1) throw ctx.error("y_scale must have one element");
  mx::array multiplier = mx::divide(mx::multiply(a_scale, b_scale, s), mx::reshape(ctx.input(6), {}, s), s);
  if (ctx.has_input(7) && ctx.input(7).size() != 1) throw ctx.error("y_zero_point must have one element");
  return {typed(requantize(ctx, acc, mx::astype(multiplier, mx::float32, s), 7, y_type), y_type)};
}

// --- integer convolution ----------------------------------------------------------------


// A window this large would mean one slice op per element; the pools refuse
// the same.
constexpr int64_t kMaxWindowElements = 65536;

/** Exact integer convolution of centered operands (float32 integers in
 * [-255, 255]): x: [N, C, D...], w: [M, C/group, k...] -> int32 [N, M, O...].
 * The input is unfolded (one strided slice of the zero-padded input per
 * kernel offset, as the pools do) and multiplied with the flattened weight
 * through exact_integer_matmul, so every product and sum is exact on every
 * device; MLX's float convolution may use Winograd or FFT algorithms on a GPU,
 * which are not. */
mx::array integer_convolution(const NodeContext& ctx, const mx::array& x, const mx::array& w) {
  auto s = ctx.stream();
  if (x.ndim() < 3) throw ctx.error("input must have rank >= 3 ([N, C, D1, ...]), got ", x.ndim());
  if (w.ndim() != x.ndim()) throw ctx.error("weight rank ", w.ndim(), " differs from input rank ", x.ndim());
  const int spatial = static_cast<int>(x.ndim()) - 2;
  const std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end());
  ConvPoolAttributes attrs = ConvPoolAttributes::read(ctx, spatial, kernel);
  if (attrs.kernel_shape != kernel) throw ctx.error("kernel_shape does not match the weight's shape");
  const int64_t group = ctx.attr_int("group", 1);
  const int channels = x.shape(1);
  if (group < 1 || group > channels || channels != w.shape(1) * group || w.shape(0) % group != 0) {
    throw ctx.error("channels do not match: input ", channels, ", weight ", w.shape(0), "x", w.shape(1), ", group ",
                    group);
  }
  const int64_t window = checked_product(ctx, kernel, "kernel size");
  if (window > kMaxWindowElements) throw ctx.error("kernel of ", window, " elements is too large");
  WindowGeometry geo = resolve_window(ctx, attrs, std::vector<int64_t>(x.shape().begin() + 2, x.shape().end()));

  std::vector<std::pair<int, int>> pads{{0, 0}, {0, 0}};
  for (int i = 0; i < spatial; ++i) {
    pads.emplace_back(to_int32(ctx, geo.pad_begin[i], "pad"), to_int32(ctx, geo.pad_end[i], "pad"));
  }
  mx::array padded = mx::pad(x, pads, mx::array(0.0f), "constant", s);
  const int batch = x.shape(0);
  const int positions = to_int32(ctx, checked_product(ctx, geo.output, "output size"), "output size");
  const int g = static_cast<int>(group);
  const int in_per_group = channels / g;
  const int out_per_group = w.shape(0) / g;
  const int depth = to_int32(ctx, checked_mul(ctx, in_per_group, window, "unfolded depth"), "unfolded depth");
  mx::Shape unfolded_shape{batch, positions, channels, static_cast<int>(window)};
  std::optional<uint64_t> bytes = checked_nbytes(unfolded_shape, mx::float32);
  if (!bytes || *bytes > ctx.memory_limit()) {
    throw ctx.error("the unfolded input of this convolution would need more than the memory limit of ",
                    ctx.memory_limit(), " bytes");
  }

  std::vector<mx::array> slices;
  for_each_offset(kernel, [&](const std::vector<int64_t>& offset) {
    mx::Shape start{0, 0}, stop{batch, channels}, step{1, 1};
    for (int i = 0; i < spatial; ++i) {
      const int64_t first = offset[i] * attrs.dilations[i];
      start.push_back(static_cast<int>(first));
      stop.push_back(static_cast<int>(first + (geo.output[i] - 1) * attrs.strides[i] + 1));
      step.push_back(static_cast<int>(attrs.strides[i]));
    }
    slices.push_back(mx::reshape(mx::slice(padded, start, stop, step, s), {batch, channels, positions}, s));
  });
  // [N, C, P, window] -> [N, G, C/G, P, window] -> [G, N, P, C/G, window] -> [G, N*P, C/G*window]
  mx::array columns = mx::reshape(mx::stack(slices, -1, s), {batch, g, in_per_group, positions, static_cast<int>(window)}, s);
  columns = mx::reshape(mx::transpose(columns, {1, 0, 3, 2, 4}, s), {g, batch * positions, depth}, s);
  // [M, C/G, k...] -> [G, M/G, C/G*window] -> [G, C/G*window, M/G]
  mx::array weights = mx::swapaxes(mx::reshape(w, {g, out_per_group, depth}, s), 1, 2, s);
  mx::array y = kernels::exact_integer_matmul(columns, weights, s);  // [G, N*P, M/G]
  // -> [N, G, M/G, P] -> [N, M, O...]
  y = mx::transpose(mx::reshape(y, {g, batch, positions, out_per_group}, s), {1, 0, 3, 2}, s);
  mx::Shape out_shape{batch, w.shape(0)};
  for (int64_t o : geo.output) out_shape.push_back(static_cast<int>(o));
  return mx::reshape(y, out_shape, s);
}

/** The weight zero point or scale: per tensor, or one per output channel
 * ([M]), shaped to broadcast against a weight [M, C/group, k...] or an output
 * [N, M, O...] (`axis` 0 or 1). */
mx::array per_channel(const NodeContext& ctx, const mx::array& param, int channels, size_t rank, int axis,
                      const char* what) {
  if (param.size() == 1) return mx::reshape(param, {}, ctx.stream());
  if (param.ndim() != 1 || param.shape(0) != channels) {
    throw ctx.error(what, " must be a scalar or 1-D of length ", channels, " (output channels), got shape ",
                    describe_shape(param.shape()));
  }
  mx::Shape shape(rank, 1);
  shape[axis] = channels;
  return mx::reshape(param, shape, ctx.stream());
}

/** x - x_zero_point and w - w_zero_point (inputs `xz`, `wz`), float32. */
std::pair<mx::array, mx::array> centered_conv_operands(const NodeContext& ctx, size_t xi, size_t xz, size_t wi,
                                                        size_t wz) {
  const mx::array& x = ctx.input(xi);
  const mx::array& w = ctx.input(wi);
  check_8bit(ctx, xi, "x");
  check_8bit(ctx, wi, "w");
  std::optional<mx::array> x_zp = zero_point_input(ctx, xz, xi, "x_zero_point");
  std::optional<mx::array> w_zp = zero_point_input(ctx, wz, wi, "w_zero_point");
  if (x_zp && x_zp->size() != 1) throw ctx.error("x_zero_point must have one element (per tensor)");
  if (w.ndim() < 1) throw ctx.error("w must have rank >= 3");
  if (w_zp) w_zp = per_channel(ctx, *w_zp, w.shape(0), w.ndim(), 0, "w_zero_point");
  return {centered(ctx, x, x_zp), centered(ctx, w, w_zp)};
}

// ConvInteger: Conv of (x - x_zero_point) and (w - w_zero_point) in int32; the
// padding holds x_zero_point (0 after centering). w_zero_point is per tensor
// or per output channel.
OpOutputs conv_integer(NodeContext& ctx) {
  auto [x, w] = centered_conv_operands(ctx, 0, 2, 1, 3);
  return {integer_convolution(ctx, x, w)};
}

// QLinearConv: the integer convolution plus the int32 bias B (quantized with
// scale x_scale * w_scale, zero point 0), requantized with x_scale * w_scale /
// y_scale (w_scale per tensor or per output channel) to y_zero_point's type.
OpOutputs qlinear_conv(NodeContext& ctx) {
  auto s = ctx.stream();
  auto [x, w] = centered_conv_operands(ctx, 0, 2, 3, 5);
  mx::array acc = integer_convolution(ctx, x, w);  // [N, M, O...]
  const int channels = acc.shape(1);
  if (auto bias = ctx.optional_input(8)) {
    if (bias->dtype() != mx::int32 || bias->ndim() != 1 || bias->shape(0) != channels) {
      throw ctx.error("B must be int32 of shape [", channels, "]");
    }
    acc = mx::add(acc, per_channel(ctx, *bias, channels, acc.ndim(), 1, "B"), s);
  }
  for (size_t i : {1, 6}) {
    if (ctx.input(i).size() != 1) throw ctx.error(i == 1 ? "x_scale" : "y_scale", " must have one element");
  }
  mx::array w_scale = per_channel(ctx, ctx.input(4), channels, acc.ndim(), 1, "w_scale");
  mx::array multiplier =
      mx::divide(mx::multiply(mx::reshape(ctx.input(1), {}, s), w_scale, s), mx::reshape(ctx.input(6), {}, s), s);
  const OnnxType y_type = ctx.has_input(7) ? input_type(ctx, 7) : input_type(ctx, 0);
  if (!is_8bit_integer(storage_of(ctx, y_type, "y type"))) throw ctx.error("y_zero_point must be int8 or uint8");
  if (ctx.has_input(7) && ctx.input(7).size() != 1) throw ctx.error("y_zero_point must have one element");
  return {typed(requantize(ctx, mx::astype(acc, mx::float32, s), mx::astype(multiplier, mx::float32, s), 7, y_type),
                y_type)};
}

// --- BitCast ------------------------------------------------------------------------------

// BitCast (26): the same bits read as another type of the same width. Types
// held widened (float8, float4, int4, int2...) keep no bits of their own
// here, so they are not supported.
OpOutputs bitcast(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const OnnxType from = input_type(ctx, 0);
  const auto to = static_cast<OnnxType>(ctx.required_int("to"));
  std::optional<mx::Dtype> target = to_mlx_dtype(to);
  if (!target) throw ctx.error("cannot bitcast to ", onnx_type_name(to));
  auto widened = [](OnnxType t) { return to_mlx_dtype(t) && to_onnx_type(*to_mlx_dtype(t)) != t; };
  if (widened(from) || widened(to)) {
    throw ctx.error("bitcast between ", onnx_type_name(from), " and ", onnx_type_name(to),
                    " is not supported (sub-byte and float8 types are held widened)");
  }
  if (x.dtype().size() != target->size()) {
    throw ctx.error("cannot bitcast ", onnx_type_name(from), " (", x.dtype().size() * 8, " bits) to ",
                    onnx_type_name(to), " (", target->size() * 8, " bits)");
  }
  if (*target == mx::bool_) {
    // A bool holds 0 or 1; other bytes have no bool meaning (the spec leaves them undefined).
    return {mx::not_equal(mx::view(x, mx::uint8, ctx.stream()), mx::array(0, mx::uint8), ctx.stream())};
  }
  return {mx::view(x, *target, ctx.stream())};
}

constexpr std::string_view kQuantizedOutput = "outputs are quantized (integers or float8/float4 values)";
constexpr std::string_view kIntegerOutput = "integer output";
constexpr std::string_view kNoFloat6 = "float6e2m3/float6e3m2 (new in v28) not supported";

}  // namespace

OpOutputs onnx_quantize_linear(NodeContext& ctx) { return quantize_linear(ctx); }
OpOutputs onnx_dequantize_linear(NodeContext& ctx) { return dequantize_linear(ctx); }
mx::array exact_centered_matmul(const NodeContext& ctx, mx::array a, mx::array b) {
  return quantized_matmul(ctx, std::move(a), std::move(b), true);
}

void register_quantization(OpRegistry& r) {
  const OpRow quantize{.op_type = "QuantizeLinear", .domain = kOnnx, .since = 10, .until = 12, .fn = quantize_linear,
                       .not_differentiable = kQuantizedOutput, .sets_element_types = true};
  const OpRow dequantize{.op_type = "DequantizeLinear", .domain = kOnnx, .since = 10, .until = 12, .fn = dequantize_linear,
                         .restrictions = "int32 x computed in float32 (exact below 2^24)",
                         .sets_element_types = true};
  // One row per version (what changed is written at quantize_linear and
  // dequantize_linear); a single function reads every version's attributes.
  const int versions[] = {10, 13, 19, 21, 23, 24, 25, 28};
  for (size_t i = 0; i < std::size(versions); ++i) {
    const int until = i + 1 < std::size(versions) ? versions[i + 1] - 1 : kOpen;
    OpRow q = quantize, d = dequantize;
    q.since = d.since = versions[i];
    q.until = d.until = until;
    if (versions[i] == 28) q.restrictions = d.restrictions = kNoFloat6;
    r.add(q);
    r.add(d);
  }
  r.add({
      {.op_type = "DynamicQuantizeLinear", .domain = kOnnx, .since = 11, .until = kOpen, .fn = dynamic_quantize_linear,
       .not_differentiable = "y and y_zero_point are integers (y_scale, a max - min range, is not checked)"},
      {.op_type = "MatMulInteger", .domain = kOnnx, .since = 10, .until = kOpen, .fn = matmul_integer,
       .not_differentiable = kIntegerOutput},
      {.op_type = "ConvInteger", .domain = kOnnx, .since = 10, .until = kOpen, .fn = conv_integer,
       .not_differentiable = kIntegerOutput},
      {.op_type = "QLinearMatMul", .domain = kOnnx, .since = 10, .until = 20, .fn = qlinear_matmul,
       .not_differentiable = kQuantizedOutput, .sets_element_types = true},
      // 21: float16/bfloat16 scales and float8 operands.
      {.op_type = "QLinearMatMul", .domain = kOnnx, .since = 21, .until = kOpen, .fn = qlinear_matmul,
       .restrictions = "float8 operands multiplied in float32", .not_differentiable = kQuantizedOutput,
       .sets_element_types = true},
      {.op_type = "QLinearConv", .domain = kOnnx, .since = 10, .until = kOpen, .fn = qlinear_conv,
       .not_differentiable = kQuantizedOutput, .sets_element_types = true},
      {.op_type = "BitCast", .domain = kOnnx, .since = 26, .until = kOpen, .fn = bitcast,
       .restrictions = "not from or to float8, float4, int4/uint4, int2/uint2 (held widened)",
       .not_differentiable = "reinterprets bits", .sets_element_types = true},
  });
}

}  // namespace transmuter
