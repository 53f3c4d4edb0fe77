// com.microsoft QLinearAdd's arithmetic (ONNX Runtime's kernel; the formula is in qlinear.cpp's header),
// shared by the operator (qlinear.cpp) and by QLinearConvNhwc nodes that end in one
// (ops/transmuter/conv.cpp, made by passes/fuse_qlinear_conv_add.cpp).
#pragma once

#include <cstddef>

#include <mlx/mlx.h>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/dynamic_quantize.h"
#include "ops/node_context.h"

namespace transmuter {

/** QLinearAdd's per-tensor scales and zero points (the zero points as integers of the operands' type). */
struct QLinearAddQuantization {
  float a_scale = 1;
  int a_zero = 0;
  float b_scale = 1;
  int b_zero = 0;
  float c_scale = 1;
  int c_zero = 0;
};

/** Reads them on the host from ctx's inputs first + 1, 2 (A's), first + 4, 5 (B's) and first + 6, 7 (C's),
 * in QLinearAdd's order (A and B themselves, at first and first + 3, are not read); `type` is the
 * operands'. Throws ctx.error for a scale that is not one float32 or a zero point not one `type` value. */
QLinearAddQuantization read_qlinear_add_quantization(const NodeContext& ctx, size_t first, mx::Dtype type);

/** ONNX Runtime's ratios, in its float32 order: a = sA / sC, b = sB / sC, fixed = zC - (a zA + b zB). */
kernels::QLinearAddRatios qlinear_add_ratios(const QLinearAddQuantization& q);

/** QLinearAdd of {A, B} (8-bit, one type, broadcasting) as MLX ops, on `s`: the kernels' reference and the
 * path of operands the kernel does not take. */
kernels::Reference qlinear_add_reference(const kernels::QLinearAddRatios& r, mx::Stream s);

/** QLinearAdd of a and b (8-bit, one type, broadcastable): the CPU kernel for operands of one shape,
 * else qlinear_add_reference. */
mx::array qlinear_add_values(const mx::array& a, const mx::array& b, const QLinearAddQuantization& q,
                             mx::StreamOrDevice s);

}  // namespace transmuter
