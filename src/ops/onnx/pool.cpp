// Pooling: MaxPool (with its optional Indices output), AveragePool, LpPool,
// GlobalAveragePool, GlobalMaxPool, GlobalLpPool.
// https://onnx.ai/onnx/operators/onnx__MaxPool.html
// https://onnx.ai/onnx/operators/onnx__AveragePool.html
//
// A pool over kernel k1 x ... x kd folds strided slices of the padded input:
// along one axis, slice j holds, for every output position, the element under
// offset j of its window. Max and sum are separable, so the window is folded
// one axis at a time (k1 + ... + kd slices, not k1 * ... * kd: EfficientNet's
// pooler has a 320 x 320 kernel). MaxPool's Indices output needs the whole
// window's slices (one per kernel offset) to find where each max came from.
// This works for any number of spatial axes, strides, dilations, pads and
// ceil_mode, is plain MLX ops (so it traces under mx::compile), and everything
// that depends on shapes alone (divisors, indices) is computed on the host.
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/max_pool.h"
#include "ops/node_context.h"
#include "ops/onnx/conv_pool_attributes.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<int64_t>());
}

// The pooling problem, resolved: input, attributes, window geometry.
struct Pooling {
  mx::array x;  // [N, C, D...], or [N, D..., C] when first_spatial is 1
  ConvPoolAttributes attrs;
  WindowGeometry geometry;
  std::vector<int64_t> input;  // D...
  int first_spatial = 2;       // the axis of D1

  size_t rank() const { return input.size(); }
  // Input coordinate of offset `k` of the window at output position `o` along axis i.
  int64_t coordinate(size_t i, int64_t o, int64_t k) const {
    return o * attrs.strides[i] - geometry.pad_begin[i] + k * attrs.dilations[i];
  }
};

// A pool composes one slice per kernel offset along each axis (per window
// element for MaxPool's Indices); beyond this many the graph (and the host
// loops over offsets) would not finish in reasonable time.
constexpr int64_t kMaxWindowElements = 1 << 16;

Pooling make_pooling(const NodeContext& ctx, bool channels_last = false) {
  const mx::array& x = ctx.input(0);
  if (x.ndim() < 3) throw ctx.error("input must have rank >= 3 ([N, C, D1, ...]), got ", x.ndim());
  const int first_spatial = channels_last ? 1 : 2;
  std::vector<int64_t> input(x.shape().begin() + first_spatial, x.shape().begin() + first_spatial + x.ndim() - 2);
  ConvPoolAttributes attrs = ConvPoolAttributes::read(ctx, static_cast<int>(input.size()));
  const int64_t along_axes =
      std::accumulate(attrs.kernel_shape.begin(), attrs.kernel_shape.end(), int64_t{0});
  if (along_axes > kMaxWindowElements) {
    throw ctx.error("a window of ", along_axes, " elements along its axes exceeds the ", kMaxWindowElements,
                    " supported");
  }
  WindowGeometry geometry = resolve_window(ctx, attrs, input);
  checked_product(ctx, geometry.output, "output size");  // the output (and the divisor table) must not wrap
  // MaxPool's Indices count images with an int32 arange.
  to_int32(ctx, int64_t{x.shape(0)} * x.shape(1), "batch * channels");
  // The padded input and the output are MLX shapes: int32 dims.
  for (size_t i = 0; i < input.size(); ++i) {
    to_int32(ctx, geometry.output[i], "output size");
    const int64_t reach = (geometry.output[i] - 1) * attrs.strides[i] + attrs.window_extent(i);
    to_int32(ctx, std::max(reach, input[i] + geometry.pad_begin[i]), "padded input size");
  }
  return {x, attrs, geometry, input, first_spatial};
}

// One [N, C, out...] slice per kernel offset, in row-major offset order. The
// input is padded with `pad_value` so that every window lies inside it
// (ceil_mode windows may reach past the declared end pads).
mx::array padded_input(const Pooling& p, const mx::array& pad_value, mx::StreamOrDevice s) {
  const size_t rank = p.rank();
  std::vector<int> axes;
  mx::Shape low, high;
  for (size_t i = 0; i < rank; ++i) {
    int64_t needed = (p.geometry.output[i] - 1) * p.attrs.strides[i] + p.attrs.window_extent(i);
    axes.push_back(static_cast<int>(i) + p.first_spatial);
    low.push_back(static_cast<int>(p.geometry.pad_begin[i]));
    high.push_back(static_cast<int>(std::max<int64_t>(0, needed - p.input[i] - p.geometry.pad_begin[i])));
  }
  return mx::pad(p.x, axes, low, high, pad_value, "constant", s);
}

// Combines the window's elements with `combine` (max or add), one spatial axis
// at a time: [N, C, out...] (channels last: [N, out..., C]).
mx::array fold_window(const Pooling& p, const mx::array& pad_value,
                      const std::function<mx::array(const mx::array&, const mx::array&)>& combine,
                      mx::StreamOrDevice s) {
  mx::array folded = padded_input(p, pad_value, s);
  for (size_t i = 0; i < p.rank(); ++i) {
    const int axis = static_cast<int>(i) + p.first_spatial;
    std::optional<mx::array> along;
    for (int64_t k = 0; k < p.attrs.kernel_shape[i]; ++k) {
      mx::Shape start(folded.ndim(), 0), stop = folded.shape(), strides(folded.ndim(), 1);
      start[axis] = static_cast<int>(k * p.attrs.dilations[i]);
      stop[axis] = static_cast<int>(start[axis] + (p.geometry.output[i] - 1) * p.attrs.strides[i] + 1);
      strides[axis] = static_cast<int>(p.attrs.strides[i]);
      mx::array slice = mx::slice(folded, start, stop, strides, s);
      along = along ? combine(*along, slice) : slice;
    }
    folded = *along;
  }
  return folded;
}

// Every window element's slice, [N, C, out...] each, in row-major offset order
// (MaxPool's Indices: which element each max came from).
std::vector<mx::array> window_slices(const NodeContext& ctx, const Pooling& p, const mx::array& pad_value,
                                     mx::StreamOrDevice s) {
  const int64_t window = checked_product(ctx, p.attrs.kernel_shape, "window size");
  if (window > kMaxWindowElements) {
    throw ctx.error("a window of ", window, " elements exceeds the ", kMaxWindowElements,
                    " supported with Indices");
  }
  // The index table holds one entry per output position and window element: its size must not wrap.
  checked_mul(ctx, checked_product(ctx, p.geometry.output, "output size"), window, "window table size");
  const size_t rank = p.rank();
  mx::array padded = padded_input(p, pad_value, s);
  std::vector<mx::array> slices;
  for_each_offset(p.attrs.kernel_shape, [&](const std::vector<int64_t>& offset) {
    mx::Shape start(rank + 2, 0), stop = padded.shape(), strides(rank + 2, 1);
    for (size_t i = 0; i < rank; ++i) {
      const size_t axis = i + p.first_spatial;
      start[axis] = static_cast<int>(offset[i] * p.attrs.dilations[i]);
      stop[axis] = static_cast<int>(start[axis] + (p.geometry.output[i] - 1) * p.attrs.strides[i] + 1);
      strides[axis] = static_cast<int>(p.attrs.strides[i]);
    }
    slices.push_back(mx::slice(padded, start, stop, strides, s));
  });
  return slices;
}

mx::Shape output_shape(const Pooling& p, bool with_batch_and_channels) {
  mx::Shape shape;
  if (with_batch_and_channels)
    shape = {p.x.shape(0), p.x.shape(1)};
  else
    shape = {1, 1};
  for (int64_t o : p.geometry.output) shape.push_back(static_cast<int>(o));
  return shape;
}

// --- AveragePool ------------------------------------------------------------------

// How many elements each window averages, [1, 1, out...]: positions inside
// the input (count_include_pad=0) or inside input + declared pads
// (count_include_pad=1); never the extra reach of ceil_mode windows.
mx::array window_counts(const Pooling& p, bool count_include_pad) {
  const size_t rank = p.rank();
  std::vector<std::vector<float>> per_axis(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t lo = count_include_pad ? -p.geometry.pad_begin[i] : 0;
    const int64_t hi = p.input[i] + (count_include_pad ? p.geometry.pad_end[i] : 0);
    for (int64_t o = 0; o < p.geometry.output[i]; ++o) {
      int64_t n = 0;
      for (int64_t k = 0; k < p.attrs.kernel_shape[i]; ++k) {
        int64_t c = p.coordinate(i, o, k);
        n += (c >= lo && c < hi) ? 1 : 0;
      }
      per_axis[i].push_back(static_cast<float>(n));
    }
  }
  std::vector<float> counts(static_cast<size_t>(product(p.geometry.output)));
  for (size_t flat = 0; flat < counts.size(); ++flat) {
    float n = 1;
    size_t rest = flat;
    for (size_t i = rank; i-- > 0;) {
      n *= per_axis[i][rest % p.geometry.output[i]];
      rest /= p.geometry.output[i];
    }
    counts[flat] = n;
  }
  // Exact in float32: a count is at most the window size.
  return mx::array(counts.data(), output_shape(p, false), mx::float32);
}

// AveragePool: v7 count_include_pad, v10 ceil_mode, v19 dilations, v22 bfloat16.
OpOutputs average_pool(NodeContext& ctx) {
  auto s = ctx.stream();
  Pooling p = make_pooling(ctx);
  const bool count_include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  mx::array sum =
      fold_window(p, mx::array(0, p.x.dtype()), [&](auto& a, auto& b) { return mx::add(a, b, s); }, s);
  mx::array counts = mx::astype(window_counts(p, count_include_pad), p.x.dtype(), s);
  return {mx::astype(mx::divide(sum, counts, s), p.x.dtype(), s)};
}

// --- MaxPool ------------------------------------------------------------------------

// Flat input index of each window element, [K, 1, 1, out...] int64, per
// kernel offset: within one [D...] image, row-major (storage_order=0) or
// column-major (storage_order=1). Padding positions get -1; they never win.
mx::array spatial_index_table(const Pooling& p, bool column_major) {
  const size_t rank = p.rank();
  const int64_t outputs = product(p.geometry.output);
  std::vector<int64_t> table;
  table.reserve(static_cast<size_t>(outputs * product(p.attrs.kernel_shape)));
  std::vector<int64_t> out_index(rank);
  for_each_offset(p.attrs.kernel_shape, [&](const std::vector<int64_t>& offset) {
    for (int64_t flat = 0; flat < outputs; ++flat) {
      int64_t rest = flat;
      for (size_t i = rank; i-- > 0;) {
        out_index[i] = rest % p.geometry.output[i];
        rest /= p.geometry.output[i];
      }
      int64_t index = 0, scale = 1;
      bool inside = true;
      for (size_t step = 0; step < rank; ++step) {
        size_t i = column_major ? step : rank - 1 - step;  // fastest-varying axis first
        int64_t c = p.coordinate(i, out_index[i], offset[i]);
        inside = inside && c >= 0 && c < p.input[i];
        index += c * scale;
        scale *= p.input[i];
      }
      table.push_back(inside ? index : -1);
    }
  });
  mx::Shape shape = output_shape(p, false);
  shape.insert(shape.begin(), static_cast<int>(product(p.attrs.kernel_shape)));
  return mx::array(table.data(), shape, mx::int64);
}

// The Indices output: flat indices into the whole [N, C, D...] input of the
// element each max came from (the first of equal maxima, as the reference).
mx::array max_indices(const Pooling& p, const std::vector<mx::array>& slices, bool column_major,
                      mx::StreamOrDevice s) {
  mx::array winner = mx::expand_dims(mx::argmax(mx::stack(slices, s), 0, false, s), 0, s);
  mx::array table = spatial_index_table(p, column_major);
  mx::Shape broadcast = winner.shape();
  broadcast[0] = table.shape(0);
  mx::array spatial =
      mx::take_along_axis(mx::broadcast_to(table, broadcast, s), mx::astype(winner, mx::int32, s), 0, s);
  spatial = mx::squeeze(spatial, 0, s);
  // Offset of image (n, c) in the flat input: (n * C + c) * prod(D).
  const int64_t image = product(p.input);
  const int64_t images = int64_t{p.x.shape(0)} * p.x.shape(1);  // fits int32: make_pooling
  mx::Shape base_shape(p.x.ndim(), 1);
  base_shape[0] = p.x.shape(0);
  base_shape[1] = p.x.shape(1);
  mx::array base = mx::multiply(mx::arange(0, static_cast<double>(images), 1, mx::int64, s),
                                mx::array(image, mx::int64), s);
  return mx::add(spatial, mx::reshape(base, base_shape, s), s);
}

// MaxPool: v8 Indices output and storage_order, v10 ceil_mode and dilations,
// v12 int8/uint8, v22 bfloat16.
OpOutputs max_pool(NodeContext& ctx) {
  auto s = ctx.stream();
  Pooling p = make_pooling(ctx);
  auto maximum = [&](const mx::array& a, const mx::array& b) { return mx::maximum(a, b, s); };
  if (!ctx.output_requested(1)) return {fold_window(p, kernels::lowest_value(p.x.dtype()), maximum, s)};
  std::vector<mx::array> slices = window_slices(ctx, p, kernels::lowest_value(p.x.dtype()), s);
  mx::array result = slices[0];
  for (size_t j = 1; j < slices.size(); ++j) result = maximum(result, slices[j]);
  const bool column_major = ctx.attr_int("storage_order", 0) != 0;
  return {result, max_indices(p, slices, column_major, s)};
}

// A 2-D pooling's window as kernels::max_pool_nhwc takes it; nullopt for
// other ranks, or an attribute beyond int32 (make_pooling checks the sizes
// that MLX shapes hold, not each stride).
std::optional<kernels::MaxPoolOptions> max_pool_2d_options(const Pooling& p) {
  if (p.rank() != 2) return std::nullopt;
  kernels::MaxPoolOptions o;
  for (size_t i = 0; i < 2; ++i) {
    for (int64_t v : {p.attrs.kernel_shape[i], p.attrs.strides[i], p.attrs.dilations[i],
                      p.geometry.pad_begin[i], p.geometry.output[i]}) {
      if (v < 0 || v > std::numeric_limits<int32_t>::max()) return std::nullopt;
    }
    o.kernel[i] = static_cast<int>(p.attrs.kernel_shape[i]);
    o.strides[i] = static_cast<int>(p.attrs.strides[i]);
    o.dilations[i] = static_cast<int>(p.attrs.dilations[i]);
    o.pads_begin[i] = static_cast<int>(p.geometry.pad_begin[i]);
    o.output[i] = static_cast<int>(p.geometry.output[i]);
  }
  return o;
}

// MaxPoolNhwc (ai.transmuter, since 1), made by src/passes/channels_last_convs.cpp:
// MaxPool's attributes and Y over a channels-last X [N, D..., C]; no Indices.
OpOutputs max_pool_channels_last(NodeContext& ctx) {
  if (ctx.output_requested(1)) throw ctx.error("the channels-last MaxPool has no Indices output");
  Pooling p = make_pooling(ctx, true);
  auto s = ctx.stream();
  if (std::optional<kernels::MaxPoolOptions> options = max_pool_2d_options(p)) {
    return {kernels::max_pool_nhwc(p.x, *options, s)};  // the CPU kernel, or its reference elsewhere
  }
  return {fold_window(
      p, kernels::lowest_value(p.x.dtype()), [&](auto& a, auto& b) { return mx::maximum(a, b, s); }, s)};
}

// --- LpPool ---------------------------------------------------------------------------

// The p of LpPool/GlobalLpPool: a float attribute in v1, an int from v2.
template <bool kFloatP>
float lp_exponent(const NodeContext& ctx) {
  float p = kFloatP ? ctx.attr_float("p", 2.0f) : static_cast<float>(ctx.attr_int("p", 2));
  if (!(p > 0)) throw ctx.error("p must be positive, got ", p);
  return p;
}

// (sum |x|^p)^(1/p) over each window; padding contributes zeros.
// v11 auto_pad/pads cleanup, v18 ceil_mode and dilations, v22 bfloat16.
template <bool kFloatP>
OpOutputs lp_pool(NodeContext& ctx) {
  auto s = ctx.stream();
  Pooling pooling = make_pooling(ctx);
  const mx::Dtype dtype = pooling.x.dtype();
  mx::array p = mx::array(lp_exponent<kFloatP>(ctx), dtype);
  // |x|^p before the window: the zero padding stays zero.
  pooling.x = mx::power(mx::abs(pooling.x, s), p, s);
  mx::array sum =
      fold_window(pooling, mx::array(0, dtype), [&](auto& a, auto& b) { return mx::add(a, b, s); }, s);
  return {mx::power(sum, mx::reciprocal(p, s), s)};
}

// --- Global pools ----------------------------------------------------------------------

std::vector<int> spatial_axes(const NodeContext& ctx, const mx::array& x) {
  if (x.ndim() < 3) throw ctx.error("input must have rank >= 3 ([N, C, D1, ...]), got ", x.ndim());
  std::vector<int> axes(x.ndim() - 2);
  std::iota(axes.begin(), axes.end(), 2);
  return axes;
}

OpOutputs global_average_pool(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  return {mx::mean(x, spatial_axes(ctx, x), true, ctx.stream())};
}

OpOutputs global_max_pool(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  return {mx::max(x, spatial_axes(ctx, x), true, ctx.stream())};
}

template <bool kFloatP>
OpOutputs global_lp_pool(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  mx::array p = mx::array(lp_exponent<kFloatP>(ctx), x.dtype());
  mx::array sum = mx::sum(mx::power(mx::abs(x, s), p, s), spatial_axes(ctx, x), true, s);
  return {mx::power(sum, mx::reciprocal(p, s), s)};
}

}  // namespace

void register_pool(OpRegistry& r) {
  r.add({
      {"MaxPool", kOnnx, 1, kOpen, max_pool},
      {"AveragePool", kOnnx, 1, kOpen, average_pool},
      {"GlobalAveragePool", kOnnx, 1, kOpen, global_average_pool},  // v22: bfloat16
      {"GlobalMaxPool", kOnnx, 1, kOpen, global_max_pool},          // v22: bfloat16
      {"LpPool", kOnnx, 1, 1, lp_pool<true>},
      {"LpPool", kOnnx, 2, kOpen, lp_pool<false>},
      {"GlobalLpPool", kOnnx, 1, 1, global_lp_pool<true>},
      {"GlobalLpPool", kOnnx, 2, kOpen, global_lp_pool<false>},  // v22: bfloat16
      {"MaxPoolNhwc", kTransmuter, 1, kOpen, max_pool_channels_last},
  });
}

}  // namespace transmuter
