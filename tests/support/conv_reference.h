// The convolution kernels' activations written out as MLX ops, for the tests
// that check the kernels against mx::conv_general.
#pragma once

#include <mlx/mlx.h>

#include "kernels/cpu/depthwise_conv.h"  // ConvActivation

namespace transmuter::testing {

namespace mx = mlx::core;

/** `activation` applied to y (conv + bias); clip bounds for kClip only. */
inline mx::array apply_activation(const mx::array& y, kernels::ConvActivation activation, float clip_min,
                                  float clip_max) {
  switch (activation) {
    case kernels::ConvActivation::kRelu:
      return mx::maximum(y, mx::array(0.0f));
    case kernels::ConvActivation::kClip:
      return mx::clip(y, mx::array(clip_min), mx::array(clip_max));
    case kernels::ConvActivation::kHardSwish:
      return y * mx::clip(y / 6.0f + 0.5f, mx::array(0.0f), mx::array(1.0f));
    case kernels::ConvActivation::kNone:
      break;
  }
  return y;
}

}  // namespace transmuter::testing
