// 3x3 stride-1 convolutions in the channels-last layout by Winograd's minimal
// filtering algorithm F(2x2, 3x3) (Lavin and Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2015).
//
// Each 2x2 block of outputs ("tile") is computed from the 4x4 block of input
// under it: with d that input block (one channel), g a 3x3 filter and
//
//   B^T = | 1  0 -1  0 |    G = | 1    0    0  |    A^T = | 1  1  1  0 |
//         | 0  1  1  0 |        | 1/2  1/2  1/2 |          | 0  1 -1 -1 |
//         | 0 -1  1  0 |        | 1/2 -1/2  1/2 |
//         | 0  1  0 -1 |        | 0    0    1  |
//
//   Y = A^T [ sum_c (G g_c G^T) .* (B^T d_c B) ] A.
//
// The sum over input channels, for each of the 16 positions e = (xi, nu) of
// the 4x4 transformed blocks, is a matrix product [tiles, C] x [C, M]: 16
// products with 16 * C * M multiply-adds per tile against the direct
// convolution's 36 * C * M (2.25x fewer). The transformed weights U_e = G g G^T
// are computed once at load, each packed as the GEMM's right-hand side
// (gemm.h), so the products run on the same kernel as every other product.
//
// Why: ResNet-50's 3x3 convolutions are ~45 % of its multiply-adds, and as
// unfolded products they run at the GEMM's peak already. ONNX Runtime's CPU
// provider convolves them directly (NCHWc); fewer multiply-adds is the way
// past it.
//
// Precision: the transforms only add, subtract and halve, and the result is as
// close to the exact convolution as a direct float32 sum: a float32 emulation
// in numpy over 20 random tiles (unit inputs, weights scaled by 1/sqrt(9 C))
// (bench/winograd_error.py) measured a largest error against float64 of 1.0e-6 (C = 64) and 1.7e-6
// (C = 256), the direct float32 sum 0.8-1.0e-6 and 1.7-2.9e-6. F(4x4, 3x3), 4x fewer
// multiply-adds, transforms with factors 4, 5, 1/6 and 1/24: 2.4e-5 and
// 2.6e-5 in the same emulation, beyond the 1e-5 a pass may move an output,
// and 4x the weights' memory; not used.
//
// Gradients and non-CPU streams use the reference: the 3x3 weight recovered
// from U exactly by g = L U L^T with L = [[1,0,0,0],[0,1,-1,0],[0,0,0,1]] (L G
// = I), then mx::conv_general.
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/conv_nhwc.h"  // NhwcConvOptions

namespace transmuter::kernels {

namespace mx = mlx::core;

/** True when `o` is a convolution winograd_conv_nhwc runs: a 3x3 kernel, stride 1, dilation 1, pads
 * of at most 2 per side, channels-last input. */
bool winograd_conv_fits(const NhwcConvOptions& o);

/** The transformed weights U of a 3x3 convolution weight given packed by pack_conv_weight_nhwc
 * (float32 [panels, 9 * C, P], P = gemm_panel_width()) for `channels` input channels: float32
 * [16, panels, C, P], U[e] the GEMM's packed right-hand side of position e = xi * 4 + nu. Throws
 * std::invalid_argument when `packed` is not such a weight. */
mx::array winograd_weight_from_packed(const mx::array& packed, int64_t channels);

/** winograd_weight_from_packed(pack_conv_weight_nhwc(w), C), the same floats, made from the filters
 * themselves: w float [M, C, 3, 3] (an ONNX Conv's weight; evaluated unless it is a deferred copy,
 * which is read in place). No packed copy is made. Throws std::invalid_argument for another shape. */
mx::array winograd_weight_from_filters(const mx::array& w);

/** The 3x3 weight [3, 3, C, m] that `u` (winograd_weight_from_packed's layout) was made from, as an
 * MLX composition (differentiable; exact up to the rounding of U itself). */
mx::array winograd_weight_to_hwcm(const mx::array& u, int64_t m, mx::StreamOrDevice s = {});

/** act(conv3x3(x, w) + bias [+ residual]) for x float32 [N, H, W, C], the weight as U above, bias [m]
 * or none, a residual of the output's shape or none. Returns [N, oH, oW, m]. Throws
 * std::invalid_argument when the shapes or options do not fit (winograd_conv_fits). */
mx::array winograd_conv_nhwc(const mx::array& x, const mx::array& u, const std::optional<mx::array>& bias,
                             int64_t m, const NhwcConvOptions& options, mx::StreamOrDevice s = {},
                             const std::optional<mx::array>& residual = std::nullopt);

}  // namespace transmuter::kernels
