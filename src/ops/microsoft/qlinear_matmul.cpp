// ONNX Runtime's quantized matmul-like contrib operators, domain
// com.microsoft, version 1: DynamicQuantizeMatMul, MatMulIntegerToFloat,
// QuantizeLinear, DequantizeLinear, DynamicQuantizeLSTM.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
// (QGemm: below, beside its function.)
//
//   MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zp?, b_zp?, bias?):
//     Y = float((A - a_zp) @ (B - b_zp)) * (a_scale * b_scale) [+ bias]
//     A, B int8/uint8; a_scale, a_zp per tensor; b_scale, b_zp per tensor or
//     per column of B ([N]); the integer product is exact (int32).
//   DynamicQuantizeMatMul(A, B, b_scale, b_zp?, bias?): A (float32) quantized
//     to uint8 first, as ONNX Runtime does: lo = min(min(A), 0),
//     hi = max(max(A), 0), a_scale = (hi - lo) / 255 (1 when hi == lo),
//     a_zp = round(clip(-lo / a_scale, 0, 255)), qA = saturate(round(A / a_scale)
//     + a_zp), then MatMulIntegerToFloat(qA, B, a_scale, b_scale, a_zp, b_zp, bias).
//   QuantizeLinear, DequantizeLinear (axis): ONNX's (per tensor or per axis),
//     float32 values and scales: y = saturate(round(x / y_scale) + y_zp),
//     y = (x - x_zp) * x_scale.
//   DynamicQuantizeLSTM(X, W, R, B, sequence_lens, initial_h, initial_c, P,
//     W_scale, W_zero_point, R_scale, R_zero_point): ONNX LSTM with
//     W [D, I, 4H] and R [D, H, 4H] quantized (int8/uint8) with scales and
//     zero points per direction ([D]) or per gate column ([D, 4H]):
//     W_real = (W - W_zp) * W_scale. ONNX Runtime also rounds X (the whole
//     input, as DynamicQuantizeMatMul rounds A) and the state Ht-1 (at each
//     step, per direction) to uint8 before its integer GEMMs; both roundings
//     are reproduced (dequantize(quantize(v)) enters rnn.cpp's float LSTM).
//     With sequence_lens the state's range can differ slightly: ORT rounds
//     ended entries as zeros and steps reverse entries through their own
//     reversed sequences, while rnn.cpp's mask keeps ended states and aligns
//     reverse entries at the last time step.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/onnx/quantization.h"
#include "ops/onnx/rnn.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

bool is_8bit(mx::Dtype dtype) { return dtype == mx::int8 || dtype == mx::uint8; }

const mx::array& quantized_input(const NodeContext& ctx, size_t i, const char* what) {
  const mx::array& x = ctx.input(i);
  if (!is_8bit(x.dtype())) throw ctx.error(what, " must be int8 or uint8, got ", x.dtype());
  return x;
}

const mx::array& float_input(const NodeContext& ctx, size_t i, const char* what) {
  const mx::array& x = ctx.input(i);
  if (x.dtype() != mx::float32) throw ctx.error(what, " must be float32, got ", x.dtype());
  return x;
}

/** A per-tensor parameter (one element) as a scalar. */
mx::array per_tensor(const NodeContext& ctx, const mx::array& p, const char* what) {
  if (p.size() != 1) {
    throw ctx.error(what, " must be a scalar or a 1-D tensor of one element (per tensor), got shape ",
                    p.shape());
  }
  return mx::reshape(p, {}, ctx.stream());
}

/** A parameter per tensor or per column of B [..., K, N]: scalar or [N]. */
mx::array per_column(const NodeContext& ctx, const mx::array& p, const mx::array& b, const char* what) {
  if (p.size() == 1) return mx::reshape(p, {}, ctx.stream());
  const int n = b.ndim() >= 1 ? b.shape(-1) : 1;
  if (p.ndim() == 1 && p.shape(0) == n && b.ndim() >= 2) return p;
  throw ctx.error(what, " must be a scalar or 1-D of B's column count ", n, ", got shape ", p.shape());
}

std::optional<mx::array> zero_point(const NodeContext& ctx, size_t i, mx::Dtype type, const char* what) {
  if (!ctx.has_input(i)) return std::nullopt;
  const mx::array& z = ctx.input(i);
  if (z.dtype() != type) throw ctx.error(what, " must have its tensor's type ", type, ", got ", z.dtype());
  return z;
}

/** float((qa - a_zp) @ (b - b_zp)) * (a_scale * b_scale) [+ bias]; a_scale and
 * a_zp scalars, b_scale and b_zp scalars or per column. */
mx::array integer_matmul_to_float(const NodeContext& ctx, const mx::array& qa, const mx::array& a_zp,
                                  const mx::array& a_scale, const mx::array& b,
                                  const std::optional<mx::array>& b_zp, const mx::array& b_scale,
                                  size_t bias_input) {
  auto s = ctx.stream();
  if (qa.ndim() == 0 || b.ndim() == 0) throw ctx.error("A and B must have rank >= 1");
  const int k_a = qa.shape(-1), k_b = b.ndim() == 1 ? b.shape(0) : b.shape(-2);
  if (k_a != k_b)
    throw ctx.error("A of shape ", qa.shape(), " and B of shape ", b.shape(), " do not multiply");
  mx::array ca = mx::subtract(mx::astype(qa, mx::float32, s), mx::astype(a_zp, mx::float32, s), s);
  mx::array cb = mx::astype(b, mx::float32, s);
  if (b_zp) cb = mx::subtract(cb, mx::astype(per_column(ctx, *b_zp, b, "b_zero_point"), mx::float32, s), s);
  mx::array acc = exact_centered_matmul(ctx, ca, cb);
  mx::array multiplier = mx::multiply(a_scale, per_column(ctx, b_scale, b, "b_scale"), s);
  mx::array y = mx::multiply(mx::astype(acc, mx::float32, s), multiplier, s);
  if (ctx.has_input(bias_input)) {
    const mx::array& bias = float_input(ctx, bias_input, "bias");
    const int n = b.ndim() == 1 ? 1 : b.shape(-1);
    if (bias.ndim() != 1 || bias.shape(0) != n) {
      throw ctx.error("bias must be 1-D of B's column count ", n, ", got shape ", bias.shape());
    }
    y = mx::add(y, b.ndim() == 1 ? mx::reshape(bias, {}, s) : bias, s);
  }
  return y;
}

/** ONNX Runtime's dynamic uint8 quantization of float32 `a`: (q, scale, zp),
 * one range over `axes` (kept; empty: the whole tensor). */
struct DynamicQuantized {
  mx::array q, scale, zero_point;  // q and zero_point hold integers in float32
};
DynamicQuantized dynamic_quantize(const mx::array& a, const std::vector<int>& axes, mx::StreamOrDevice s) {
  const mx::array zero(0.0f);
  auto reduce = [&](bool max) {
    if (a.size() == 0) return zero;
    mx::array v = axes.empty() ? (max ? mx::max(a, s) : mx::min(a, s))
                               : (max ? mx::max(a, axes, true, s) : mx::min(a, axes, true, s));
    return max ? mx::maximum(v, zero, s) : mx::minimum(v, zero, s);
  };
  mx::array lo = reduce(false), hi = reduce(true);
  mx::array scale = mx::where(mx::equal(hi, lo, s), mx::array(1.0f),
                              mx::divide(mx::subtract(hi, lo, s), mx::array(255.0f), s), s);
  mx::array zp =
      mx::round(mx::clip(mx::subtract(zero, mx::divide(lo, scale, s), s), zero, mx::array(255.0f), s), 0, s);
  mx::array q =
      mx::clip(mx::add(mx::round(mx::divide(a, scale, s), 0, s), zp, s), zero, mx::array(255.0f), s);
  return {q, scale, zp};
}

/** dequantize(quantize(a)): what ORT's integer GEMM multiplies in place of a. */
mx::array dynamic_round_trip(const mx::array& a, const std::vector<int>& axes, mx::StreamOrDevice s) {
  DynamicQuantized q = dynamic_quantize(a, axes, s);
  return mx::multiply(mx::subtract(q.q, q.zero_point, s), q.scale, s);
}

OpOutputs matmul_integer_to_float(NodeContext& ctx) {
  const mx::array& a = quantized_input(ctx, 0, "A");
  const mx::array& b = quantized_input(ctx, 1, "B");
  mx::array a_scale = per_tensor(ctx, float_input(ctx, 2, "a_scale"), "a_scale");
  const mx::array& b_scale = float_input(ctx, 3, "b_scale");
  std::optional<mx::array> a_zp = zero_point(ctx, 4, a.dtype(), "a_zero_point");
  std::optional<mx::array> b_zp = zero_point(ctx, 5, b.dtype(), "b_zero_point");
  mx::array a_zero = a_zp ? per_tensor(ctx, *a_zp, "a_zero_point") : mx::array(0.0f);
  return {integer_matmul_to_float(ctx, a, a_zero, a_scale, b, b_zp, b_scale, 6)};
}

OpOutputs dynamic_quantize_matmul(NodeContext& ctx) {
  const mx::array& a = float_input(ctx, 0, "A");
  const mx::array& b = quantized_input(ctx, 1, "B");
  const mx::array& b_scale = float_input(ctx, 2, "b_scale");
  std::optional<mx::array> b_zp = zero_point(ctx, 3, b.dtype(), "b_zero_point");
  DynamicQuantized qa = dynamic_quantize(a, {}, ctx.stream());
  return {integer_matmul_to_float(ctx, qa.q, qa.zero_point, qa.scale, b, b_zp, b_scale, 4)};
}

OpOutputs quantize_linear(NodeContext& ctx) {
  float_input(ctx, 0, "x");
  float_input(ctx, 1, "y_scale");
  if (ctx.has_input(2)) {
    const mx::Dtype z = ctx.input(2).dtype();
    if (z != mx::int8 && z != mx::uint8 && z != mx::int16 && z != mx::uint16) {
      throw ctx.error("y_zero_point must be int8, uint8, int16 or uint16, got ", z);
    }
  }
  return onnx_quantize_linear(ctx);
}

OpOutputs dequantize_linear(NodeContext& ctx) {
  const mx::Dtype x = ctx.input(0).dtype();
  if (x != mx::int8 && x != mx::uint8 && x != mx::int16 && x != mx::uint16 && x != mx::int32) {
    throw ctx.error("x must be int8, uint8, int16, uint16 or int32, got ", x);
  }
  float_input(ctx, 1, "x_scale");
  return onnx_dequantize_linear(ctx);
}

// --- QGemm --------------------------------------------------------------------------------

/** A 2-D operand of QGemm, transposed when `transposed`. */
mx::array gemm_operand(const NodeContext& ctx, size_t i, const char* what, bool transposed) {
  const mx::array& x = quantized_input(ctx, i, what);
  if (x.ndim() != 2) throw ctx.error(what, " must be 2-D, got shape ", x.shape());
  return transposed ? mx::transpose(x, {1, 0}, ctx.stream()) : x;
}

// QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C?, y_scale?, y_zero_point?), attributes
// alpha, transA, transB (what quantize_static's QOperator format makes of Gemm), as ONNX Runtime's CPU
// kernel computes it:
//   acc = (A' - a_zp) @ (B' - b_zp) + C        int32, exact; A' [M, K], B' [K, N] after the transposes;
//                                              C int32 broadcast to [M, N] ((), [1], [N], [1, N], [M, 1], [M,
//                                              N])
//   scale = alpha * a_scale * b_scale [/ y_scale]   float32, per tensor or per column of B', in that order
//   Y = saturate(round_half_even(float(acc) * scale) + y_zp) of y_zp's type when y_zero_point is given,
//   else float(acc) * scale (float32).
OpOutputs qgemm(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array a = gemm_operand(ctx, 0, "A", ctx.attr_int("transA", 0) != 0);
  const mx::array b = gemm_operand(ctx, 3, "B", ctx.attr_int("transB", 0) != 0);
  if (a.shape(1) != b.shape(0))
    throw ctx.error("A (", a.shape(0), " x ", a.shape(1), ") and B (", b.shape(0), " x ", b.shape(1),
                    ") do not multiply (after transA/transB)");
  const int m = a.shape(0), n = b.shape(1);
  const mx::array a_scale = per_tensor(ctx, float_input(ctx, 1, "a_scale"), "a_scale");
  const std::optional<mx::array> a_zero = zero_point(ctx, 2, a.dtype(), "a_zero_point");
  const mx::array a_zp = a_zero ? per_tensor(ctx, *a_zero, "a_zero_point") : mx::array(0.0f);
  const std::optional<mx::array> b_zp = zero_point(ctx, 5, b.dtype(), "b_zero_point");
  mx::array ca = mx::subtract(mx::astype(a, mx::float32, s), mx::astype(a_zp, mx::float32, s), s);
  mx::array cb = mx::astype(b, mx::float32, s);
  if (b_zp) cb = mx::subtract(cb, mx::astype(per_column(ctx, *b_zp, b, "b_zero_point"), mx::float32, s), s);
  mx::array acc = exact_centered_matmul(ctx, ca, cb);
  if (ctx.has_input(6)) {
    const mx::array& c = ctx.input(6);
    if (c.dtype() != mx::int32) throw ctx.error("C must be int32, got ", c.dtype());
    const bool fits =
        c.size() == 1 || (c.ndim() == 1 && c.shape(0) == n) ||
        (c.ndim() == 2 && (c.shape(0) == 1 || c.shape(0) == m) && (c.shape(1) == 1 || c.shape(1) == n));
    if (!fits || c.ndim() > 2)
      throw ctx.error("C of shape ", c.shape(), " does not broadcast to [", m, ", ", n, "]");
    acc = mx::add(acc, c.size() == 1 ? mx::reshape(c, {}, s) : c, s);
  }
  mx::array scale = mx::multiply(mx::multiply(mx::array(ctx.attr_float("alpha", 1.0f)), a_scale, s),
                                 per_column(ctx, float_input(ctx, 4, "b_scale"), b, "b_scale"), s);
  if (ctx.has_input(7))
    scale = mx::divide(scale, per_tensor(ctx, float_input(ctx, 7, "y_scale"), "y_scale"), s);
  mx::array y = mx::multiply(mx::astype(acc, mx::float32, s), scale, s);
  if (!ctx.has_input(8)) return {y};
  const mx::array& y_zp = quantized_input(ctx, 8, "y_zero_point");
  const bool is_signed = y_zp.dtype() == mx::int8;
  mx::array shifted =
      mx::add(mx::round(y, 0, s), mx::astype(per_tensor(ctx, y_zp, "y_zero_point"), mx::float32, s), s);
  mx::array clipped =
      mx::clip(shifted, mx::array(is_signed ? -128.0f : 0.0f), mx::array(is_signed ? 127.0f : 255.0f), s);
  return {mx::astype(clipped, y_zp.dtype(), s)};
}

// --- DynamicQuantizeLSTM -------------------------------------------------------------------

/** Dequantized weight [D, K, 4H] -> [D, 4H, K] (ONNX LSTM layout). */
mx::array dequantized_weight(const NodeContext& ctx, size_t wi, size_t si, size_t zi, const char* name, int d,
                             int k, int gates) {
  auto s = ctx.stream();
  const mx::array& w = quantized_input(ctx, wi, name);
  const std::string n = name;
  if (w.shape() != mx::Shape{d, k, gates}) {
    throw ctx.error(name, " must have shape [", d, ", ", k, ", ", gates, "], got ", w.shape());
  }
  const mx::array& scale = float_input(ctx, si, (n + "_scale").c_str());
  if (!ctx.has_input(zi)) throw ctx.error(name, "_zero_point is required");
  const mx::array& zp = ctx.input(zi);
  if (zp.dtype() != w.dtype()) throw ctx.error(name, "_zero_point must have ", name, "'s type ", w.dtype());
  auto shaped = [&](const mx::array& p, const std::string& what) {
    if (p.shape() == mx::Shape{d}) return mx::reshape(p, {d, 1, 1}, s);
    if (p.shape() == mx::Shape{d, gates}) return mx::reshape(p, {d, 1, gates}, s);
    throw ctx.error(what, " must have shape [", d, "] (per direction) or [", d, ", ", gates,
                    "] (per channel), got ", p.shape());
  };
  mx::array real = mx::multiply(mx::subtract(mx::astype(w, mx::float32, s),
                                             mx::astype(shaped(zp, n + "_zero_point"), mx::float32, s), s),
                                shaped(scale, n + "_scale"), s);
  return mx::swapaxes(real, 1, 2, s);
}

OpOutputs dynamic_quantize_lstm(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = float_input(ctx, 0, "X");
  if (x.ndim() != 3) throw ctx.error("X must have rank 3 ([T, B, I]), got ", x.ndim());
  if (ctx.attr_int("layout", 0) != 0) throw ctx.error("layout is not an attribute of DynamicQuantizeLSTM");
  const int64_t hidden = ctx.required_int("hidden_size");
  if (hidden < 1) throw ctx.error("hidden_size must be positive, got ", hidden);
  const std::string direction = ctx.attr_string("direction", "forward");
  const int d = direction == "bidirectional" ? 2 : 1;
  const int h = to_int32(ctx, hidden, "hidden_size");
  const int gates = to_int32(ctx, checked_mul(ctx, hidden, 4, "4 * hidden_size"), "4 * hidden_size");
  mx::array w = dequantized_weight(ctx, 1, 8, 9, "W", d, x.shape(2), gates);
  mx::array r = dequantized_weight(ctx, 2, 10, 11, "R", d, h, gates);
  // X and each step's state [D', B, H] rounded as ONNX Runtime's GEMMs
  // round them: the whole input at once, the state per direction.
  auto state = [](const mx::array& h, mx::StreamOrDevice st) { return dynamic_round_trip(h, {1, 2}, st); };
  return lstm_with_weights(ctx, dynamic_round_trip(x, {}, s), w, r, state);
}

constexpr std::string_view kIntegerOperands =
    "the quantized operands are integers (gradients reach only scales and bias)";

}  // namespace

void register_microsoft_qlinear_matmul(OpRegistry& r) {
  // clang-format off
  r.add({
      {.op_type = "MatMulIntegerToFloat", .domain = kMicrosoft, .since = 1, .until = kOpen,
       .fn = matmul_integer_to_float,
       .restrictions = "float32 scales and output; int8 A accepted too (ONNX Runtime's CPU kernel: uint8 A)",
       .not_differentiable = kIntegerOperands},
      {.op_type = "QGemm", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = qgemm,
       .restrictions = "2-D A and B; int8 A with uint8 B accepted too (ONNX Runtime's CPU kernel: uint8 A, or "
                       "int8 A and B)",
       .not_differentiable = kIntegerOperands},
      {.op_type = "DynamicQuantizeMatMul", .domain = kMicrosoft, .since = 1, .until = kOpen,
       .fn = dynamic_quantize_matmul,
       .not_differentiable = "A is rounded to uint8 (zero gradient almost everywhere)"},
      {.op_type = "QuantizeLinear", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = quantize_linear,
       .restrictions = "float32 x and scales", .not_differentiable = "outputs are quantized integers",
       .sets_element_types = true},
      {.op_type = "DequantizeLinear", .domain = kMicrosoft, .since = 1, .until = kOpen, .fn = dequantize_linear,
       .restrictions = "float32 scales", .not_differentiable = kIntegerOperands, .sets_element_types = true},
      {.op_type = "DynamicQuantizeLSTM", .domain = kMicrosoft, .since = 1, .until = kOpen,
       .fn = dynamic_quantize_lstm,
       .restrictions = "float32; with sequence_lens the hidden state's per-step uint8 range can differ from "
                       "ONNX Runtime's (outputs within about 1e-3)",
       .not_differentiable = "X and each step's state are rounded to uint8 (zero gradient almost everywhere)"},
  });
  // clang-format on
}

}  // namespace transmuter
