// A chain of QLinearConv layers as quantize_static's QOperator format writes them, for the tests of the
// passes that take them (qlinear_conv_as_conv, qlinear_convs_nhwc).
#pragma once

#include <cstdint>
#include <vector>

#include <mlx/mlx.h>

#include "support/graph_builder.h"

namespace transmuter::testing {

namespace mx = mlx::core;

/** Seeded integers in [lo, hi) of `dtype` (uint8: clipped to [0, 256)). */
mx::array random_integers(mx::Shape shape, mx::Dtype dtype, uint64_t seed, int lo = -128, int hi = 128);

struct QConvLayer {
  int out_channels, kernel, group, stride;
  bool per_channel, bias;
};

/** x ([1, channels, size, size] of `activation_type`, uint8 or int8) -> one QLinearConv per layer ->
 * "l<last>_y": weights of `weight_type` (uint8 ones around a zero point near 128), per-tensor or per-channel
 * weight scales and zero points, int32 biases, padding kernel / 2; one activation scale and zero point
 * between layers, another at the end. */
GraphBuilder qoperator_convs(const std::vector<QConvLayer>& layers, mx::Dtype weight_type, int channels,
                             int size, mx::Dtype activation_type = mx::uint8);

/** quantize_static's QOperator block end: x (uint8 [1, 8, 10, 10]) -> a 3x3 QLinearConv (per-channel int8
 * weights) and a 1x1 shortcut QLinearConv of x -> com.microsoft QLinearAdd -> QLinearGlobalAveragePool ->
 * "pooled" [1, 8, 1, 1]. */
GraphBuilder qoperator_shortcut_and_pool();

}  // namespace transmuter::testing
