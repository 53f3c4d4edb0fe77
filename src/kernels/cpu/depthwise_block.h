// A depthwise convolution fused with the pointwise convolutions around it, in
// the channels-last layout: MobileNetV2's inverted residual block (1x1 expand,
// depthwise, 1x1 project + shortcut) and the depthwise-separable pair of
// PP-LCNet and MobileNetV1 (depthwise, 1x1).
//
//   E = act_e(X @ We + be)                  (the expand stage, optional)
//   D = act_d(depthwise(E, Wd) + bd)
//   Y = act_p(D @ Wp + bp + Z)              (the project stage, optional)
//
// Why: the expanded tensor E (6x the block's channels) and D are the largest
// activations of such a network (MobileNetV2: 112x112x96, 4.8 MB per image).
// Run as separate convolutions each is written to memory and read back, and
// the layers spend most of their time waiting on it: a pointwise conv of
// MobileNetV2 ran at 0.28 ms with its operands in cache and 0.55-0.70 ms in the
// model (gemm_bench --cold). Here each thread walks a strip of output rows,
// computes the rows of E its depthwise taps need into a small window (kept
// from one output row to the next), the depthwise rows of D into a row
// buffer, and the project product straight from that buffer, so E and D stay
// in the core's L2.
//
// Each strip runs on one thread. When the images give fewer strips than there
// are threads (a 14x14 image at batch 1 is one strip), the block runs as the
// three separate kernels instead, which split each product across the threads.
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/conv_nhwc.h"

namespace transmuter::kernels {

namespace mx = mlx::core;

/** A 1x1 convolution stage: its weight packed by pack_conv_weight_nhwc, its
 * bias [out_channels] or none, and its activation (options.activation and the
 * clip bounds; the geometry fields must be a 1x1 kernel's defaults). */
struct PointwiseStage {
  mx::array packed;
  std::optional<mx::array> bias;
  int64_t out_channels = 0;
  NhwcConvOptions options;
};

/** The block above: x float32 [N, H, W, Cin]; expand (Cin -> C) or none
 * (then C = Cin); the depthwise weight [kH, kW, C] (depthwise_weight_nhwc),
 * its bias [C] or none and its options; project (C -> M) or none; residual
 * (project only) Y's shape, added before the project's activation. Returns
 * [N, oH, oW, M or C]. Gradients and non-CPU streams: the composition of
 * conv2d_nhwc and depthwise_conv_nhwc. Throws std::invalid_argument when the
 * shapes do not agree. */
mx::array depthwise_block_nhwc(const mx::array& x, const std::optional<PointwiseStage>& expand,
                               const mx::array& depthwise_weight,
                               const std::optional<mx::array>& depthwise_bias,
                               const NhwcConvOptions& depthwise_options,
                               const std::optional<PointwiseStage>& project,
                               const std::optional<mx::array>& residual, mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
