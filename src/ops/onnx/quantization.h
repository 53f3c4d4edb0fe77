// The parts of src/ops/onnx/quantization.cpp that com.microsoft's quantized
// operators (src/ops/microsoft/qlinear*.cpp) reuse.
#pragma once

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {

/** ONNX QuantizeLinear (every version's attributes: axis, block_size,
 * output_dtype, saturate, precision): y = saturate(round(x / y_scale) +
 * y_zero_point), half to even. */
OpOutputs onnx_quantize_linear(NodeContext& ctx);

/** ONNX DequantizeLinear: y = (x - x_zero_point) * x_scale, in float32,
 * rounded once to the scale's type. */
OpOutputs onnx_dequantize_linear(NodeContext& ctx);

/** Exact numpy matmul of centered integer operands: a: [..., M, K] (or [K]),
 * b: [..., K, N] (or [K]), float32 holding integers in [-255, 255] (8-bit
 * values minus 8-bit zero points); int32 result, every product and partial
 * sum exact on every device (see exact_integer_matmul in quantization.cpp). */
mx::array exact_centered_matmul(const NodeContext& ctx, mx::array a, mx::array b);

}  // namespace transmuter
