// Elementwise arithmetic, math, comparison and logic operators, plus Where,
// Clip, the variadic Sum/Mean/Min/Max and Identity.
// https://onnx.ai/onnx/operators/ (Add, Sub, Mul, Div, ...)
#include <cstdint>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/elementwise.h"
#include "ops/node_context.h"
#include "ops/rational_erf.h"
#include "ops/registry.h"
#include "ops/string_tensors.h"

namespace transmuter {
namespace {

using BinaryFn = mx::array (*)(const mx::array&, const mx::array&, mx::StreamOrDevice);
using UnaryFn = mx::array (*)(const mx::array&, mx::StreamOrDevice);

/** A 0-d array holding `v` in the dtype of `like`, so that mixing it in does
 * not promote float16 to float32 or int8 to int32. */
mx::array scalar_like(const mx::array& like, double v) { return mx::array(v, like.dtype()); }

bool is_signed_integer(mx::Dtype t) { return mx::issubdtype(t, mx::signedinteger); }

// Before opset 7, binary ops broadcast only when `broadcast=1`, aligning B to
// A starting at `axis` (default: trailing alignment, like numpy).
mx::array legacy_broadcast(const NodeContext& ctx, const mx::array& a, mx::array b) {
  if (ctx.attr_int("broadcast", 0) == 0 || !ctx.has_attr("axis")) return b;
  int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), a.ndim());
  mx::Shape shape = b.shape();
  for (int i = axis + static_cast<int>(b.ndim()); i < static_cast<int>(a.ndim()); ++i) shape.push_back(1);
  return mx::reshape(b, shape, ctx.stream());
}

/** Input 1 of a binary op, aligned to input 0 the way the opset asks. */
mx::array second_operand(const NodeContext& ctx) {
  return ctx.opset() < 7 ? legacy_broadcast(ctx, ctx.input(0), ctx.input(1)) : ctx.input(1);
}

template <BinaryFn Fn>
OpOutputs binary(NodeContext& ctx) {
  return {Fn(ctx.input(0), second_operand(ctx), ctx.stream())};
}

/** Float32 arithmetic through the CPU kernel (kernels/cpu/elementwise.h: MLX's result bit for bit, and
 * a kernel that keeps a compiled segment eligible for direct runs); other types and streams MLX's op. */
template <kernels::BinaryOp Op>
mx::array arithmetic(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  return kernels::binary(Op, a, b, s);
}

/** Comparisons and logic through the CPU kernel where the types fit (kernels/cpu/elementwise.h). */
template <kernels::CompareOp Op>
mx::array comparison(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  return kernels::compare(Op, a, b, s);
}

template <UnaryFn Fn>
OpOutputs unary(NodeContext& ctx) {
  return {Fn(ctx.input(0), ctx.stream())};
}

// --- arithmetic ---------------------------------------------------------------

/** Integer division that truncates toward zero like C (ONNX Div on integers);
 * MLX's integer floor_divide rounds toward negative infinity. */
mx::array truncating_divide(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  mx::array floored = mx::floor_divide(a, b, s);
  if (!is_signed_integer(floored.dtype())) return floored;
  mx::array zero = scalar_like(floored, 0);
  mx::array inexact = mx::not_equal(mx::remainder(a, b, s), zero, s);
  mx::array signs_differ = mx::not_equal(mx::less(a, zero, s), mx::less(b, zero, s), s);
  mx::array fix = mx::logical_and(inexact, signs_differ, s);
  return mx::where(fix, mx::add(floored, scalar_like(floored, 1), s), floored, s);
}

OpOutputs div_op(NodeContext& ctx) {
  const mx::array& a = ctx.input(0);
  mx::array b = second_operand(ctx);
  if (mx::issubdtype(a.dtype(), mx::integer)) return {truncating_divide(a, b, ctx.stream())};
  return {arithmetic<kernels::BinaryOp::kDivide>(a, b, ctx.stream())};
}

// Pow's output has the dtype of the base X; the exponent may have another
// type (opset 12+). An integer base with a float exponent is computed in the
// float type and converted back (truncating, as the ONNX reference does).
OpOutputs pow_op(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  mx::array y = second_operand(ctx);
  auto s = ctx.stream();
  bool x_float = mx::issubdtype(x.dtype(), mx::floating);
  bool y_float = mx::issubdtype(y.dtype(), mx::floating);
  if (!x_float && y_float) {
    return {mx::astype(mx::power(mx::astype(x, y.dtype(), s), y, s), x.dtype(), s)};
  }
  return {mx::power(x, mx::astype(y, x.dtype(), s), s)};
}

/** C fmod: the remainder has the sign of the dividend. Built from MLX's
 * remainder on magnitudes, where it is exact and equals fmod. */
mx::array c_fmod(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  return mx::multiply(mx::sign(a, s), mx::remainder(mx::abs(a, s), mx::abs(b, s), s), s);
}

/** Python-style modulo: the remainder has the sign of the divisor; a zero
 * result takes the sign of the divisor too (Mod-28 float rules). */
mx::array floor_mod(const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  mx::array r = mx::remainder(a, b, s);
  if (!mx::issubdtype(r.dtype(), mx::floating)) return r;
  mx::array zero = scalar_like(r, 0.0);
  mx::array signed_zero = mx::where(mx::less(b, zero, s), scalar_like(r, -0.0), zero, s);
  return mx::where(mx::equal(r, zero, s), signed_zero, r, s);
}

OpOutputs mod_op(NodeContext& ctx) {
  int64_t fmod = ctx.attr_int("fmod", 0);
  if (fmod != 0 && fmod != 1) throw ctx.error("attribute 'fmod' must be 0 or 1, got ", fmod);
  const mx::array& a = ctx.input(0);
  const mx::array& b = ctx.input(1);
  return {fmod == 1 ? c_fmod(a, b, ctx.stream()) : floor_mod(a, b, ctx.stream())};
}

// Opset 28 defines what older versions left undefined: a shift by a negative
// amount or by at least the bit width gives what sign extension alone gives
// (-1 for a right shift of a negative value, else 0).
OpOutputs bitshift_op(NodeContext& ctx) {
  std::string direction = ctx.attr_string("direction", "");
  if (direction != "LEFT" && direction != "RIGHT") {
    throw ctx.error("attribute 'direction' must be \"LEFT\" or \"RIGHT\", got \"", direction, "\"");
  }
  const mx::array& x = ctx.input(0);
  const mx::array& y = ctx.input(1);
  auto s = ctx.stream();
  mx::array zero = scalar_like(y, 0);
  mx::array width = scalar_like(y, static_cast<double>(x.itemsize() * 8));
  mx::array in_range = mx::logical_and(mx::greater_equal(y, zero, s), mx::less(y, width, s), s);
  mx::array amount = mx::where(in_range, y, zero, s);
  bool left = direction == "LEFT";
  mx::array shifted = left ? mx::left_shift(x, amount, s) : mx::right_shift(x, amount, s);
  mx::array fill = scalar_like(x, 0);
  if (!left && is_signed_integer(x.dtype())) {
    fill = mx::where(mx::less(x, fill, s), scalar_like(x, -1), fill, s);
  }
  return {mx::astype(mx::where(in_range, shifted, fill, s), x.dtype(), s)};
}

// --- comparison and logic -----------------------------------------------------

// Equal accepts string tensors from opset 19; they live on the host, so the
// comparison runs there and yields an ordinary bool tensor.
mx::array equal_strings(const NodeContext& ctx, const StringTensor& a, const StringTensor& b) {
  std::vector<int64_t> shape = broadcast_shapes(ctx, a.shape, b.shape);
  to_shape(ctx, shape);  // checked before the loop below
  size_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<int64_t> index(shape.size(), 0);
  std::vector<bool> result(count);
  for (size_t flat = 0; flat < count; ++flat, next_index(index, shape)) {
    result[flat] = a.data[broadcast_offset(a.shape, index)] == b.data[broadcast_offset(b.shape, index)];
  }
  return bool_tensor(ctx, shape, result);
}

OpOutputs equal_op(NodeContext& ctx) {
  const Value& a = ctx.value(0);
  const Value& b = ctx.value(1);
  if (a.is_strings() || b.is_strings()) {
    if (!a.is_strings() || !b.is_strings()) {
      throw ctx.error("cannot compare ", a.describe(), " with ", b.describe());
    }
    return {equal_strings(ctx, a.strings(), b.strings())};
  }
  return binary<comparison<kernels::CompareOp::kEqual>>(ctx);
}

// --- math ----------------------------------------------------------------------

OpOutputs isinf_op(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  bool positive = ctx.attr_int("detect_positive", 1) != 0;
  bool negative = ctx.attr_int("detect_negative", 1) != 0;
  if (positive && negative) return {mx::isinf(x, s)};
  if (positive) return {mx::isposinf(x, s)};
  if (negative) return {mx::isneginf(x, s)};
  return {mx::zeros(x.shape(), mx::bool_, s)};
}

// Clip 1-10 reads its bounds from attributes (absent bound: no clamp); from
// opset 11 they are optional inputs. min > max gives max everywhere, as
// numpy.clip does (the ONNX reference).
mx::array clamp(const mx::array& x, const std::optional<mx::array>& lo, const std::optional<mx::array>& hi,
                mx::StreamOrDevice s) {
  mx::array out = x;
  if (lo) out = arithmetic<kernels::BinaryOp::kMaximum>(out, mx::astype(*lo, x.dtype(), s), s);
  if (hi) out = arithmetic<kernels::BinaryOp::kMinimum>(out, mx::astype(*hi, x.dtype(), s), s);
  return out;
}

OpOutputs clip_v1(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  std::optional<mx::array> lo, hi;
  if (ctx.has_attr("min")) lo = scalar_like(x, ctx.attr_float("min", 0));
  if (ctx.has_attr("max")) hi = scalar_like(x, ctx.attr_float("max", 0));
  return {clamp(x, lo, hi, ctx.stream())};
}

OpOutputs clip_v11(NodeContext& ctx) {
  return {clamp(ctx.input(0), ctx.optional_input(1), ctx.optional_input(2), ctx.stream())};
}

// --- variadic -------------------------------------------------------------------

template <BinaryFn Fn>
mx::array fold_inputs(const NodeContext& ctx) {
  if (ctx.num_inputs() == 0) throw ctx.error("needs at least one input");
  mx::array acc = ctx.input(0);
  for (size_t i = 1; i < ctx.num_inputs(); ++i) acc = Fn(acc, ctx.input(i), ctx.stream());
  return acc;
}

template <BinaryFn Fn>
OpOutputs variadic(NodeContext& ctx) {
  return {fold_inputs<Fn>(ctx)};
}

OpOutputs mean_op(NodeContext& ctx) {
  mx::array sum = fold_inputs<mx::add>(ctx);
  return {mx::divide(sum, scalar_like(sum, static_cast<double>(ctx.num_inputs())), ctx.stream())};
}

// Identity passes any value through: tensors, and from opset 14/16 sequences
// and optionals.
OpOutputs identity_op(NodeContext& ctx) { return {ctx.value(0)}; }

// float32 on a CPU stream: the threaded SIMD kernel (Highway's tanh, 4 ulp); otherwise mx::tanh.
OpOutputs tanh_op(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (kernels::is_cpu_stream(ctx.stream()) && kernels::bias_activation_fits(x, std::nullopt)) {
    return {kernels::bias_activation(x, std::nullopt, kernels::Activation::kTanh, ctx.stream())};
  }
  return {mx::tanh(x, ctx.stream())};
}

// float32 on a CPU stream: the threaded SIMD kernel (same rational erf as
// rational_erf); otherwise rational_erf's composition.
OpOutputs erf(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (kernels::is_cpu_stream(ctx.stream()) && kernels::bias_activation_fits(x, std::nullopt)) {
    return {kernels::bias_activation(x, std::nullopt, kernels::Activation::kErf, ctx.stream())};
  }
  return {rational_erf(x, ctx.stream())};
}

}  // namespace

void register_elementwise(OpRegistry& r) {
  using Cmp = kernels::CompareOp;
  constexpr std::string_view kBooleanOutput = "boolean output";
  constexpr std::string_view kIntegerOnly = "integer types only";
  r.add({
      // Binary arithmetic: opset < 7 has the broadcast/axis attributes.
      {"Add", kOnnx, 1, 6, binary<arithmetic<kernels::BinaryOp::kAdd>>},
      {"Add", kOnnx, 7, kOpen, binary<arithmetic<kernels::BinaryOp::kAdd>>},
      {"Sub", kOnnx, 1, 6, binary<arithmetic<kernels::BinaryOp::kSubtract>>},
      {"Sub", kOnnx, 7, kOpen, binary<arithmetic<kernels::BinaryOp::kSubtract>>},
      {"Mul", kOnnx, 1, 6, binary<arithmetic<kernels::BinaryOp::kMultiply>>},
      {"Mul", kOnnx, 7, kOpen, binary<arithmetic<kernels::BinaryOp::kMultiply>>},
      {"Div", kOnnx, 1, 6, div_op},
      {"Div", kOnnx, 7, kOpen, div_op},
      {"Pow", kOnnx, 1, 6, pow_op},
      {"Pow", kOnnx, 7, kOpen, pow_op},
      // Mod 28 extends fmod=0 (floor semantics) to floating types.
      {"Mod", kOnnx, 10, 27, mod_op},
      {"Mod", kOnnx, 28, kOpen, mod_op},
      // BitShift 28 defines out-of-range shift amounts.
      {"BitShift", kOnnx, 11, 27, bitshift_op, {}, false, {}, kIntegerOnly},
      {"BitShift", kOnnx, 28, kOpen, bitshift_op, {}, false, {}, kIntegerOnly},
      // Comparison and logic.
      {"Equal", kOnnx, 1, 6, equal_op, {}, false, {}, kBooleanOutput},
      {"Equal", kOnnx, 7, kOpen, equal_op, {}, false, {}, kBooleanOutput},
      {"Less", kOnnx, 1, 6, binary<comparison<Cmp::kLess>>, {}, false, {}, kBooleanOutput},
      {"Less", kOnnx, 7, kOpen, binary<comparison<Cmp::kLess>>, {}, false, {}, kBooleanOutput},
      {"Greater", kOnnx, 1, 6, binary<comparison<Cmp::kGreater>>, {}, false, {}, kBooleanOutput},
      {"Greater", kOnnx, 7, kOpen, binary<comparison<Cmp::kGreater>>, {}, false, {}, kBooleanOutput},
      {"LessOrEqual", kOnnx, 12, kOpen, binary<comparison<Cmp::kLessEqual>>, {}, false, {}, kBooleanOutput},
      {"GreaterOrEqual",
       kOnnx,
       12,
       kOpen,
       binary<comparison<Cmp::kGreaterEqual>>,
       {},
       false,
       {},
       kBooleanOutput},
      {"And", kOnnx, 1, 6, binary<comparison<Cmp::kAnd>>, {}, false, {}, kBooleanOutput},
      {"And", kOnnx, 7, kOpen, binary<comparison<Cmp::kAnd>>, {}, false, {}, kBooleanOutput},
      {"Or", kOnnx, 1, 6, binary<comparison<Cmp::kOr>>, {}, false, {}, kBooleanOutput},
      {"Or", kOnnx, 7, kOpen, binary<comparison<Cmp::kOr>>, {}, false, {}, kBooleanOutput},
      {"Xor", kOnnx, 1, 6, binary<mx::logical_xor>, {}, false, {}, kBooleanOutput},
      {"Xor", kOnnx, 7, kOpen, binary<mx::logical_xor>, {}, false, {}, kBooleanOutput},
      {"Not", kOnnx, 1, kOpen, unary<mx::logical_not>, {}, false, {}, kBooleanOutput},
      {"BitwiseAnd", kOnnx, 18, kOpen, binary<mx::bitwise_and>, {}, false, {}, kIntegerOnly},
      {"BitwiseOr", kOnnx, 18, kOpen, binary<mx::bitwise_or>, {}, false, {}, kIntegerOnly},
      {"BitwiseXor", kOnnx, 18, kOpen, binary<mx::bitwise_xor>, {}, false, {}, kIntegerOnly},
      {"BitwiseNot", kOnnx, 18, kOpen, unary<mx::bitwise_invert>, {}, false, {}, kIntegerOnly},
      {"Where", kOnnx, 9, kOpen,
       [](NodeContext& ctx) -> OpOutputs {
         return {kernels::select(ctx.input(0), ctx.input(1), ctx.input(2), ctx.stream())};
       }},
      // Unary math.
      {"Sqrt", kOnnx, 1, kOpen, unary<mx::sqrt>},
      {"Reciprocal", kOnnx, 1, kOpen, unary<mx::reciprocal>},
      {"Neg", kOnnx, 1, kOpen, unary<mx::negative>},
      {"Abs", kOnnx, 1, kOpen, unary<mx::abs>},
      {"Exp", kOnnx, 1, kOpen, unary<mx::exp>},
      {"Log", kOnnx, 1, kOpen, unary<mx::log>},
      {"Tanh", kOnnx, 1, kOpen, tanh_op},
      {"Sin", kOnnx, 7, kOpen, unary<mx::sin>},
      {"Cos", kOnnx, 7, kOpen, unary<mx::cos>},
      // 22 added bfloat16 to the trig and hyperbolic family: one function serves both versions.
      {"Tan", kOnnx, 7, kOpen, unary<mx::tan>},
      {"Asin", kOnnx, 7, kOpen, unary<mx::arcsin>},
      {"Acos", kOnnx, 7, kOpen, unary<mx::arccos>},
      {"Atan", kOnnx, 7, kOpen, unary<mx::arctan>},
      {"Sinh", kOnnx, 9, kOpen, unary<mx::sinh>},
      {"Cosh", kOnnx, 9, kOpen, unary<mx::cosh>},
      {"Asinh", kOnnx, 9, kOpen, unary<mx::arcsinh>},
      {"Acosh", kOnnx, 9, kOpen, unary<mx::arccosh>},
      {"Atanh", kOnnx, 9, kOpen, unary<mx::arctanh>},
      {"Erf", kOnnx, 9, kOpen, erf},
      {"Sign", kOnnx, 9, kOpen, unary<mx::sign>},
      {"Floor", kOnnx, 1, kOpen, unary<mx::floor>},
      {"Ceil", kOnnx, 1, kOpen, unary<mx::ceil>},
      // Round half to even, like MLX's round.
      {"Round", kOnnx, 11, kOpen,
       [](NodeContext& ctx) -> OpOutputs { return {mx::round(ctx.input(0), 0, ctx.stream())}; }},
      {"IsNaN", kOnnx, 9, kOpen, unary<mx::isnan>, {}, false, {}, kBooleanOutput},
      {"IsInf", kOnnx, 10, kOpen, isinf_op, {}, false, {}, kBooleanOutput},
      {"Clip", kOnnx, 1, 10, clip_v1},
      {"Clip", kOnnx, 11, kOpen, clip_v11},
      // Variadic: 1..N inputs, numpy broadcasting from opset 8 (a superset of
      // the same-shape rule before it).
      {"Sum", kOnnx, 1, kOpen, variadic<arithmetic<kernels::BinaryOp::kAdd>>},
      {"Min", kOnnx, 1, kOpen, variadic<arithmetic<kernels::BinaryOp::kMinimum>>},
      {"Max", kOnnx, 1, kOpen, variadic<arithmetic<kernels::BinaryOp::kMaximum>>},
      {"Mean", kOnnx, 1, kOpen, mean_op},
      {"Identity", kOnnx, 1, kOpen, identity_op},
  });
}

}  // namespace transmuter
