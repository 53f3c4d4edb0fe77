// 8-bit convolutions in the channels-last layout, integer throughout: ONNX QLinearConv's
//
//   acc[n, oy, ox, m] = sum_{ky, kx, c} (x[n, iy, ix, c] - x_zero) (w[m, c, ky, kx] - w_zero[m])
//   y[n, oy, ox, m]   = saturate(round_half_even(float(acc + B[m]) * multiplier[m]) + y_zero)
//
// with x uint8 or int8 [N, H, W, C] (the padding holds x_zero, so it adds nothing) and y uint8 or int8
// (y_zero's type); multiplier = x_scale * w_scale[m] / y_scale, computed in float32 in that order (as ONNX
// Runtime's QLinearConv computes it), one value or one per output channel.
//
// Why: a quantized CNN's convolutions in float32 (the weights widened, each output requantized) run at the
// float model's speed or slower; ONNX Runtime's int8 MobileNetV2 runs 2.5x faster than its float one. Here
// a group-1 convolution is the VNNI integer GEMM (integer_gemm.h: four u8 x s8 products a lane per
// instruction, four times float32's multiply-adds) over the image's rows (pointwise: the image as it lies;
// k x k: each position's window unfolded into a byte row) with a requantizing epilogue that writes the
// bytes, and a depthwise one multiplies x by (w - w_zero) across the channels, in int32 lanes on VNNI
// (vpdpwssd: one instruction a multiply-add) and in float32 elsewhere (exact for the integers of at most
// kExactIntegerTerms taps), less x_zero times the weights' sum, then requantizes the same way.
//
// Group-1 kernels need AVX512-VNNI (integer_gemm_available); elsewhere, on other streams and for gradients
// the reference runs: the same integers through integer_matmul's and MLX's exact paths.
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/conv_nhwc.h"         // NhwcConvOptions
#include "kernels/cpu/cpu_kernel.h"        // Reference
#include "kernels/cpu/dynamic_quantize.h"  // QLinearAddRatios
#include "kernels/cpu/integer_gemm.h"  // PackedIntegerRhs

namespace transmuter::kernels {

namespace mx = mlx::core;

/** How a QLinearConv's int32 sums become its output bytes. */
struct QLinearRequantize {
  mx::array multiplier;           // float32: one element, or [M]
  std::optional<mx::array> bias;  // int32 [M], added to the sums
  mx::array y_zero_point;         // uint8 or int8, one element: the output's type
};

/** A com.microsoft QLinearAdd that reads the convolution's output bytes and `other`'s (the output's type
 * and shape), done in the convolution's kernel (qlinear_add's arithmetic over each block of output once
 * it is stored). */
struct QLinearAddAfter {
  mx::array other;
  QLinearAddRatios ratios;
  bool conv_first;      // the convolution's output is the add's A (else its B)
  Reference reference;  // the add of {A, B} as MLX ops (the kernel's reference ends with it)
};

/** An ONNX QLinearConv weight [M, C, kH, kW] (int8 or uint8) as the GEMM's rows [kH * kW * C, M]:
 * row (ky * kW + kx) * C + c, column m (what pack_integer_gemm_rhs packs for qlinear_conv_nhwc). The
 * load-time pass packs from qlinear_conv_weight_columns instead; tests and bench/qlinear_conv_bench build
 * their packed weights from these rows. */
mx::array qlinear_conv_weight_rows(const mx::array& w);

/** The transpose of qlinear_conv_weight_rows: [M, kH * kW * C], output channel m's row holding its weights
 * in the GEMM's row order ((ky * kW + kx) * C + c), what pack_integer_gemm_rhs_columns packs. A 1x1 weight
 * is already that: returned as a reshape of w, without a copy. */
mx::array qlinear_conv_weight_columns(const mx::array& w);

/** A depthwise QLinearConv weight [C, 1, kH, kW] minus its zero point (none, one value or [C], of w's
 * type) as int16 [kH, kW, C]. */
mx::array qlinear_depthwise_weight(const mx::array& w, const std::optional<mx::array>& w_zero_point);

/** Group-1 QLinearConv: x uint8 or int8 [N, H, W, C] ([N, C, H, W] with options.channels_first_input: a
 * stem over at most 4 channels), x_zero_point of x's type (one element), w packed from
 * qlinear_conv_weight_rows (with its zero point) for m output channels. Returns [N, oH, oW, m] of
 * requantize.y_zero_point's type -- with `add`, that output's QLinearAdd with add->other instead (in the
 * kernel when add->other has the output's shape, else add->reference after it). Throws
 * std::invalid_argument when the shapes or types do not agree (add->other's type included). */
mx::array qlinear_conv_nhwc(const mx::array& x, const mx::array& x_zero_point, const PackedIntegerRhs& w,
                            int64_t m, const QLinearRequantize& requantize, const NhwcConvOptions& options,
                            mx::StreamOrDevice s = {},
                            const std::optional<QLinearAddAfter>& add = std::nullopt);

/** Depthwise QLinearConv (group == C == M): x uint8 or int8 [N, H, W, C], x_zero_point as above, w from
 * qlinear_depthwise_weight with at most kExactIntegerTerms taps. Returns [N, oH, oW, C] of y_zero_point's
 * type. Throws as above. */
mx::array qlinear_depthwise_conv_nhwc(const mx::array& x, const mx::array& x_zero_point, const mx::array& w,
                                      const QLinearRequantize& requantize, const NhwcConvOptions& options,
                                      mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
