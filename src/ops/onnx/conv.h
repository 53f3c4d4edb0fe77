// Conv with an activation applied to its output (conv + bias), shared by
// ONNX's Conv (no activation) and com.microsoft FusedConv
// (src/ops/microsoft/conv.cpp). On CPU streams the group-1 and depthwise
// float32 kernels apply it while the output is in cache; elsewhere it is MLX
// ops after the convolution.
#pragma once

#include <mlx/mlx.h>

#include "kernels/cpu/depthwise_conv.h"  // ConvActivation
#include "ops/node_context.h"

namespace transmuter {

struct ConvEpilogue {
  kernels::ConvActivation activation = kernels::ConvActivation::kNone;
  float clip_min = 0.0f, clip_max = 6.0f;  // kClip only
};

/** ONNX Conv of the node's inputs X, W[, B] and attributes, then `epilogue`. */
mx::array convolution(NodeContext& ctx, const ConvEpilogue& epilogue);

/** `epilogue` as MLX ops on v (conv + bias). */
mx::array apply_conv_activation(const mx::array& v, const ConvEpilogue& epilogue, mx::StreamOrDevice s);

}  // namespace transmuter
