// Quantization kernels. ONNX DynamicQuantizeLinear as one CPU kernel: uint8 quantization of a float32
// tensor with one scale and zero point computed from its own range,
//
//   high = max(max(x), 0), low = min(min(x), 0), scale = (high - low) / 255
//   (1 / 255 when the range is 0), zero = round(clip(-low / scale, 0, 255)),
//   y = clip(round(x / scale) + zero, 0, 255)          (round: half to even)
//
// in two threaded SIMD passes over x (the range, then the quantization) instead
// of MLX's seven single-threaded ones. The division is x / scale, as the
// composition computes it, so y is the same bytes. Inputs with NaN: the range
// ignores them here (x86 min/max), where the composition's is NaN; either way
// the result means nothing.
#pragma once

#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/cpu_kernel.h"

namespace transmuter::kernels {

namespace mx = mlx::core;

/** {y (uint8, x's shape), scale (float32 scalar), zero point (uint8 scalar)} for non-empty float32 x;
 * on other streams, or for other inputs, the MLX composition (the kernel's reference). */
std::vector<mx::array> dynamic_quantize_linear(const mx::array& x, mx::StreamOrDevice s = {});

/** The kernel's reference: the same quantization composed of MLX ops. */
std::vector<mx::array> dynamic_quantize_linear_reference(const mx::array& x, mx::StreamOrDevice s = {});

/** A QuantizeLinear -> DequantizeLinear pair with one scale and zero point (the QDQ format's pair on every
 * activation) as one pass over x instead of MLX's nine:
 *   y = (clip(round(x / scale) + zero, low, high) - zero) * scale      (round: half to even)
 * in float32, the operators' own arithmetic (the quotient rounded, then shifted, clipped, shifted back and
 * scaled), so y is the same floats. x float32, scale and zero float32 scalars (zero holds an integer),
 * [low, high] the quantized type's range. Gradients, other streams and other dtypes: the MLX composition. */
mx::array quantize_dequantize(const mx::array& x, const mx::array& scale, const mx::array& zero, float low,
                              float high, mx::StreamOrDevice s = {});

/** QuantizeLinear with one scale and zero point (float32 scalars, the zero holding an integer) to uint8 or
 * int8 `type`: y = clip(round(x / scale) + zero) (round half to even), one pass over float32 x instead of
 * MLX's five (a division, a rounding, an addition, a clip and a cast; the same bytes). Other inputs and
 * streams: that composition. */
mx::array quantize_per_tensor(const mx::array& x, const mx::array& scale, const mx::array& zero,
                              mx::Dtype type, mx::StreamOrDevice s = {});

/** DequantizeLinear with one scale and zero point: y = (float(x) - zero) * scale, float32, from uint8 or
 * int8 x, one pass (MLX: a cast, a subtraction, a multiplication). Other inputs: the MLX composition. */
mx::array dequantize_per_tensor(const mx::array& x, const mx::array& scale, const mx::array& zero,
                                mx::StreamOrDevice s = {});

/** A DequantizeLinear with one scale and zero point (float32 scalars, the zero holding an integer). */
struct Dequantization {
  mx::array scale, zero;
};

/** The requantization that ends a quantized layer, y = saturate(round(v * multiplier) + zero) to `type`
 * (uint8 or int8; round half to even), one pass: v float32 [..., C], multiplier float32 one value or [C]
 * (per channel along the last axis), zero a float32 scalar holding an integer. With `then`, the
 * DequantizeLinear that reads y follows in the same pass, (y - then.zero) * then.scale in float32 (as
 * dequantize_per_tensor computes it), the integers never stored; the float32 result takes v's buffer when
 * nothing else holds v. Other shapes and streams: the MLX composition. */
mx::array requantize(const mx::array& v, const mx::array& multiplier, const mx::array& zero, mx::Dtype type,
                     mx::StreamOrDevice s = {}, const std::optional<Dequantization>& then = std::nullopt);

/** com.microsoft QLinearAdd's ratios: a = sA / sC, b = sB / sC, fixed = zC - (a zA + b zB). */
struct QLinearAddRatios {
  float a = 0, b = 0, fixed = 0;
  bool operator==(const QLinearAddRatios&) const = default;
};

/** com.microsoft QLinearAdd of two uint8 or int8 tensors of one shape, as ONNX Runtime's kernel computes it:
 *   c = saturate(round(fma(A, r.a, fma(B, r.b, r.fixed))))     (float32 fused multiply-adds, each rounded
 * once; round half to even), one pass. The result takes A's buffer when nothing else holds A. Other shapes,
 * types and streams (and gradients, which integers have none of): reference({A, B}). */
mx::array qlinear_add(const mx::array& a, const mx::array& b, QLinearAddRatios ratios,
                      const Reference& reference, mx::StreamOrDevice s = {});

/** qlinear_add's arithmetic over n bytes (int8 when is_signed, else uint8) on the calling thread:
 * y = saturate(round(fma(a, r.a, fma(b, r.b, r.fixed)))); y may be a or b. */
void qlinear_add_bytes(const void* a, const void* b, int64_t n, QLinearAddRatios r, bool is_signed, void* y);

/** com.microsoft QLinearGlobalAveragePool's requantization: y = saturate(round((sum - x_zero * n) * scale) +
 * y_zero), scale = sX / (sY * n) in float32, n the positions summed. */
struct QGlobalAverage {
  float scale = 0;
  int32_t x_zero = 0, y_zero = 0;
  bool operator==(const QGlobalAverage&) const = default;
};

/** QLinearGlobalAveragePool over channels-last x uint8 or int8 [N, D1, ..., C] as ONNX Runtime's kernel
 * computes it: per image and channel the int32 sum over D1..., minus x_zero * n, times q.scale in float32,
 * rounded half to even, plus y_zero, saturated. Returns [N, 1, ..., 1, C] of x's type (the reduced axes
 * kept). One kernel in place of the composition's ten primitives (widen, sum, center, scale, round, clip,
 * narrow) at the end of a quantized CNN. Other types, layouts and streams: reference({x}). */
mx::array qlinear_global_average_nhwc(const mx::array& x, QGlobalAverage q, const Reference& reference,
                                      mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
