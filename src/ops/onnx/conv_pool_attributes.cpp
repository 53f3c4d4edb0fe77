#include "ops/onnx/conv_pool_attributes.h"

#include <algorithm>

#include "ops/node_context.h"

namespace transmuter {
namespace {

// Reads an ints attribute that has one value per spatial axis (or is absent,
// giving `fill` for every axis).
std::vector<int64_t> per_axis(const NodeContext& ctx, const char* name, int spatial_rank, int64_t fill) {
  std::vector<int64_t> values = ctx.attr_ints(name);
  if (values.empty()) return std::vector<int64_t>(spatial_rank, fill);
  if (static_cast<int>(values.size()) != spatial_rank) {
    throw ctx.error("attribute '", name, "' has ", values.size(), " values, expected ", spatial_rank);
  }
  for (int64_t v : values) {
    if (v < 1) throw ctx.error("attribute '", name, "' must be positive, got ", v);
    to_int32(ctx, v, str("attribute '", name, "' value"));
  }
  return values;
}

int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

}  // namespace

ConvPoolAttributes ConvPoolAttributes::read(const NodeContext& ctx, int spatial_rank,
                                            const std::vector<int64_t>& kernel_fallback) {
  ConvPoolAttributes a;
  a.kernel_shape = ctx.attr_ints("kernel_shape", kernel_fallback);
  if (a.kernel_shape.empty()) throw ctx.error("required attribute 'kernel_shape' is missing");
  if (static_cast<int>(a.kernel_shape.size()) != spatial_rank) {
    throw ctx.error("kernel_shape has ", a.kernel_shape.size(), " values but the input has ", spatial_rank,
                    " spatial axes");
  }
  // Every value fits int32 (MLX's type for them), so the int64 window math
  // below (products of two, sums of a few) cannot overflow.
  for (int64_t k : a.kernel_shape) {
    if (k < 1) throw ctx.error("kernel_shape must be positive, got ", k);
    to_int32(ctx, k, "kernel_shape value");
  }
  a.strides = per_axis(ctx, "strides", spatial_rank, 1);
  a.dilations = per_axis(ctx, "dilations", spatial_rank, 1);
  a.pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * spatial_rank, 0));
  if (static_cast<int>(a.pads.size()) != 2 * spatial_rank) {
    throw ctx.error("attribute 'pads' has ", a.pads.size(), " values, expected ", 2 * spatial_rank);
  }
  for (int64_t p : a.pads) {
    if (p < 0) throw ctx.error("negative pads are not supported, got ", p);
    to_int32(ctx, p, "pad");
  }
  a.auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  if (a.auto_pad.empty()) a.auto_pad = "NOTSET";
  if (a.auto_pad != "NOTSET" && a.auto_pad != "SAME_UPPER" && a.auto_pad != "SAME_LOWER" &&
      a.auto_pad != "VALID") {
    throw ctx.error("unknown auto_pad '", a.auto_pad, "'");
  }
  a.ceil_mode = ctx.attr_int("ceil_mode", 0) != 0;
  return a;
}

WindowGeometry resolve_window(const NodeContext& ctx, const ConvPoolAttributes& attrs,
                              const std::vector<int64_t>& input_spatial) {
  const size_t rank = input_spatial.size();
  WindowGeometry g{std::vector<int64_t>(rank, 0), std::vector<int64_t>(rank, 0),
                   std::vector<int64_t>(rank, 0)};
  for (size_t i = 0; i < rank; ++i) {
    const int64_t in = input_spatial[i];
    const int64_t stride = attrs.strides[i];
    const int64_t extent = attrs.window_extent(i);
    if (attrs.auto_pad == "SAME_UPPER" || attrs.auto_pad == "SAME_LOWER") {
      g.output[i] = ceil_div(in, stride);
      int64_t total = std::max<int64_t>(0, (g.output[i] - 1) * stride + extent - in);
      int64_t smaller_half = total / 2;
      bool upper = attrs.auto_pad == "SAME_UPPER";
      g.pad_begin[i] = upper ? smaller_half : total - smaller_half;
      g.pad_end[i] = total - g.pad_begin[i];
    } else if (attrs.auto_pad == "VALID") {
      g.output[i] = floor_div(in - extent, stride) + 1;
    } else {
      g.pad_begin[i] = attrs.pads[i];
      g.pad_end[i] = attrs.pads[i + rank];
      const int64_t span = in + g.pad_begin[i] + g.pad_end[i] - extent;
      if (attrs.ceil_mode) {
        g.output[i] = ceil_div(span, stride) + 1;
        // The last window must start inside the input or the begin padding.
        if ((g.output[i] - 1) * stride >= in + g.pad_begin[i]) --g.output[i];
      } else {
        g.output[i] = floor_div(span, stride) + 1;
      }
    }
    if (g.output[i] < 1) {
      throw ctx.error("window of extent ", extent, " does not fit spatial axis ", i, " of size ", in,
                      " with pads ", g.pad_begin[i], "+", g.pad_end[i]);
    }
  }
  return g;
}

void for_each_offset(const std::vector<int64_t>& kernel,
                     const std::function<void(const std::vector<int64_t>&)>& fn) {
  std::vector<int64_t> offset(kernel.size(), 0);
  int64_t count = 1;
  for (int64_t k : kernel) count *= k;
  for (; count > 0; --count) {
    fn(offset);
    for (size_t i = kernel.size(); i-- > 0;) {
      if (++offset[i] < kernel[i]) break;
      offset[i] = 0;
    }
  }
}

}  // namespace transmuter
