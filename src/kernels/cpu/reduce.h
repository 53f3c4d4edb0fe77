// The sum or mean of a float32 tensor over adjacent axes, as a CPU kernel.
//
//   y = sum over axes of x        (or that sum times 1/n, n the number of elements summed: mx::mean's
//                                  definition, so that the mean of n equal values may differ from them
//                                  by a rounding)
//
// The axes must be adjacent once dimensions of extent 1 are set aside: x is then [outer, n, inner] and
// each output element sums n values in float32, 16 lanes at a time along the rows (inner = 1) or row by
// row (inner > 1). The order of the additions is not MLX's, so results differ from mx::sum / mx::mean
// by roundings: |error| <= ~n * 2^-24 * sum |x| (sequential float32 summation's bound), checked in
// tests/kernels/cpu/reduce_test.cpp. Gradients are those of mx::sum / mx::mean (the reference).
//
// Why: a global average pool at a CNN's head, the height pooling of a text recognizer and an encoder's
// mean pooling are ReduceMean / ReduceSum nodes; as MLX ops they kept those models' compiled segments
// off direct runs (src/runtime/direct_run.h).
#pragma once

#include <vector>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

/** True when `sum_over_axes` runs the kernel for x on a CPU stream: x float32 and non-empty, `axes`
 * (normalized, distinct) non-empty and adjacent once extents of 1 are set aside. */
bool sum_over_axes_fits(const mx::array& x, const std::vector<int>& axes);

/** mx::sum(x, axes, keepdims), or mx::mean when `mean`: the kernel on CPU streams when
 * sum_over_axes_fits, else MLX's op. */
mx::array sum_over_axes(const mx::array& x, const std::vector<int>& axes, bool keepdims, bool mean,
                        mx::StreamOrDevice s = {});

}  // namespace transmuter::kernels
