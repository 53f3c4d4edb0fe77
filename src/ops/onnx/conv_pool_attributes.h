// The window attributes shared by Conv, ConvTranspose and the pooling ops
// (kernel_shape, strides, dilations, pads, auto_pad, ceil_mode), and the one
// place that turns them into explicit pads and an output size.
// https://onnx.ai/onnx/operators/onnx__Conv.html
// https://onnx.ai/onnx/operators/onnx__MaxPool.html
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace transmuter {

class NodeContext;

/** The attributes as written on the node, with ONNX defaults filled in. All
 * vectors have one entry per spatial axis, except `pads` ([begin..., end...]). */
struct ConvPoolAttributes {
  std::vector<int64_t> kernel_shape;
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  std::vector<int64_t> pads;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;

  /** Reads the attributes of the node in `ctx` for `spatial_rank` spatial
   * axes. `kernel_fallback` is used when kernel_shape is absent (Conv infers it
   * from the weight); pass {} for ops where kernel_shape is required. */
  static ConvPoolAttributes read(const NodeContext& ctx, int spatial_rank,
                                 const std::vector<int64_t>& kernel_fallback = {});

  /** The extent of one dilated window along `axis`: (k - 1) * d + 1. */
  int64_t window_extent(size_t axis) const { return (kernel_shape[axis] - 1) * dilations[axis] + 1; }
};

/** Explicit geometry of a sliding window over the spatial axes: where the
 * first window starts (pad_begin) and how many windows fit (output). */
struct WindowGeometry {
  std::vector<int64_t> pad_begin;
  std::vector<int64_t> pad_end;
  std::vector<int64_t> output;
};

/** Resolves auto_pad (SAME_UPPER, SAME_LOWER, VALID, NOTSET) and ceil_mode
 * into explicit pads and the output size for a forward window (Conv, pools).
 * SAME_*: output = ceil(in / stride), the total pad split evenly with the
 * odd element at the end (UPPER) or the beginning (LOWER). NOTSET: the given
 * pads; with ceil_mode the output rounds up, but a last window that would
 * start in the end padding is dropped (as ONNX Runtime and PyTorch do).
 * Throws OpError (through `ctx`) when a window does not fit. */
WindowGeometry resolve_window(const NodeContext& ctx, const ConvPoolAttributes& attrs,
                              const std::vector<int64_t>& input_spatial);

/** Calls `fn(offset)` for every kernel offset (one index per spatial axis),
 * in row-major order: the order of a weight's flattened kernel elements, and
 * the order in which the ONNX reference scans a pooling window (which decides
 * MaxPool's ties for Indices). */
void for_each_offset(const std::vector<int64_t>& kernel,
                     const std::function<void(const std::vector<int64_t>&)>& fn);

}  // namespace transmuter
