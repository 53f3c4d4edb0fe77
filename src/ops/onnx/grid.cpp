// Spatial sampling and rearrangement: GridSample, AffineGrid, CenterCropPad,
// Col2Im.
// https://onnx.ai/onnx/operators/onnx__GridSample.html (and the others)
//
// GridSample reads the input at coordinates that are data (the grid may be
// traced), so its taps are computed with MLX ops: every tap index is clipped
// into its axis before the gather (MLX does not check bounds) and taps that
// fall outside under padding_mode "zeros" are masked to 0 instead.
// AffineGrid's and CenterCropPad's sizes and Col2Im's shapes are host inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// --- GridSample (v16: 4-D, modes bilinear/nearest/bicubic; v20: N-D, modes
// linear/nearest/cubic; v22: bfloat16) ------------------------------------------

enum class SampleMode { kNearest, kLinear, kCubic };
enum class Padding { kZeros, kBorder, kReflection };

SampleMode sample_mode_of(const NodeContext& ctx, int since) {
  const std::string mode = ctx.attr_string("mode", since < 20 ? "bilinear" : "linear");
  if (mode == "nearest") return SampleMode::kNearest;
  if (mode == (since < 20 ? "bilinear" : "linear")) return SampleMode::kLinear;
  if (mode == (since < 20 ? "bicubic" : "cubic")) return SampleMode::kCubic;
  throw ctx.error("unknown mode '", mode, "'");
}

Padding padding_of(const NodeContext& ctx) {
  const std::string padding = ctx.attr_string("padding_mode", "zeros");
  if (padding == "zeros") return Padding::kZeros;
  if (padding == "border") return Padding::kBorder;
  if (padding == "reflection") return Padding::kReflection;
  throw ctx.error("padding_mode must be 'zeros', 'border' or 'reflection', got '", padding, "'");
}

mx::array scalar(double v, mx::Dtype dtype) { return mx::array(v, dtype); }

// Reflects v into [low, high] by mirroring at the nearer border as often as
// needed (PyTorch's reflect_coordinates). A zero-width range maps to low.
mx::array reflect(const mx::array& v, double low, double high, mx::StreamOrDevice s) {
  const mx::Dtype dt = v.dtype();
  const double span = high - low;
  if (span <= 0) return mx::full(v.shape(), scalar(low, dt), s);
  auto fold = [&](const mx::array& distance, double near, double far, double direction) {
    // distance >= 0 past the border `near`; an even number of whole spans
    // lands at near + direction * rest, an odd number at far - direction * rest.
    mx::array spans = mx::floor(mx::divide(distance, scalar(span, dt), s), s);
    mx::array rest = mx::subtract(distance, mx::multiply(spans, scalar(span, dt), s), s);
    mx::array even = mx::equal(mx::remainder(spans, scalar(2, dt), s), scalar(0, dt), s);
    return mx::where(even, mx::add(scalar(near, dt), mx::multiply(scalar(direction, dt), rest, s), s),
                     mx::subtract(scalar(far, dt), mx::multiply(scalar(direction, dt), rest, s), s), s);
  };
  mx::array below = fold(mx::subtract(scalar(low, dt), v, s), low, high, 1.0);
  mx::array above = fold(mx::subtract(v, scalar(high, dt), s), high, low, -1.0);
  return mx::where(mx::less(v, scalar(low, dt), s), below,
                   mx::where(mx::greater(v, scalar(high, dt), s), above, v, s), s);
}

// Keys' cubic convolution weight with A = -0.75 (PyTorch's bicubic).
mx::array cubic_weight(const mx::array& distance, mx::StreamOrDevice s) {
  const mx::Dtype dt = distance.dtype();
  const double a = -0.75;
  mx::array d = mx::abs(distance, s);
  mx::array near = mx::add(
      mx::multiply(
          mx::multiply(mx::subtract(mx::multiply(scalar(a + 2, dt), d, s), scalar(a + 3, dt), s), d, s), d,
          s),
      scalar(1, dt), s);
  mx::array far = mx::subtract(
      mx::multiply(
          mx::add(mx::multiply(mx::subtract(mx::multiply(scalar(a, dt), d, s), scalar(5 * a, dt), s), d, s),
                  scalar(8 * a, dt), s),
          d, s),
      scalar(4 * a, dt), s);
  return mx::where(mx::less_equal(d, scalar(1, dt), s), near,
                   mx::where(mx::less(d, scalar(2, dt), s), far, scalar(0, dt), s), s);
}

// One tap along one spatial axis: the input position (clipped into the
// axis), its weight, and whether it lies inside the input (for zeros padding).
struct Tap {
  mx::array index;
  mx::array weight;
  std::optional<mx::array> inside;
};

struct AxisSampling {
  int size;
  double low;  // the coordinate range that needs no padding
  double high;
};

// The taps of source coordinates `x` (float, any shape) on one axis.
std::vector<Tap> axis_taps(const mx::array& x, const AxisSampling& axis, SampleMode mode, Padding padding,
                           mx::StreamOrDevice s) {
  const mx::Dtype dt = x.dtype();
  std::vector<mx::array> positions, weights;
  if (mode == SampleMode::kNearest) {
    positions.push_back(x);
    weights.push_back(mx::ones_like(x, s));
  } else {
    mx::array first = mx::floor(x, s);
    mx::array fraction = mx::subtract(x, first, s);
    if (mode == SampleMode::kLinear) {
      positions = {first, mx::add(first, scalar(1, dt), s)};
      weights = {mx::subtract(scalar(1, dt), fraction, s), fraction};
    } else {
      for (int t = -1; t <= 2; ++t) {
        positions.push_back(mx::add(first, scalar(t, dt), s));
        weights.push_back(cubic_weight(mx::subtract(fraction, scalar(t, dt), s), s));
      }
    }
  }
  std::vector<Tap> taps;
  for (size_t t = 0; t < positions.size(); ++t) {
    mx::array position = positions[t];
    std::optional<mx::array> inside;
    if (padding == Padding::kReflection) position = reflect(position, axis.low, axis.high, s);
    if (padding == Padding::kZeros) {
      inside = mx::logical_and(mx::greater_equal(position, scalar(0, dt), s),
                               mx::less(position, scalar(axis.size, dt), s), s);
    }
    // Truncation as the reference's int(); then clip so that no index (NaN
    // coordinates included) leaves the axis.
    mx::array index = mx::clip(mx::astype(position, mx::int32, s), mx::array(0), mx::array(axis.size - 1), s);
    taps.push_back({index, weights[t], inside});
  }
  return taps;
}

OpOutputs grid_sample(NodeContext& ctx, int since) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& grid = ctx.input(1);
  const int rank = static_cast<int>(x.ndim());
  const int spatial = rank - 2;
  if (rank < 3) throw ctx.error("X must have rank >= 3 ([N, C, D1, ...]), got ", rank);
  if (since < 20 && rank != 4)
    throw ctx.error("X must have rank 4 ([N, C, H, W]) before opset 20, got ", rank);
  if (static_cast<int>(grid.ndim()) != rank || grid.shape(0) != x.shape(0) || grid.shape(-1) != spatial) {
    throw ctx.error("Grid must have shape [", x.shape(0), ", ..., ", spatial, "] for X of shape ", x.shape(),
                    ", got ", grid.shape());
  }
  if (!mx::issubdtype(grid.dtype(), mx::floating))
    throw ctx.error("Grid must be a float tensor, got ", grid.dtype());
  const SampleMode mode = sample_mode_of(ctx, since);
  const Padding padding = padding_of(ctx);
  const bool align_corners = ctx.attr_int("align_corners", 0) != 0;
  if (mode == SampleMode::kCubic && spatial != 2)
    throw ctx.error("cubic mode needs 4-D input, got rank ", rank);

  const int n = x.shape(0), channels = x.shape(1);
  mx::Shape out_spatial(grid.shape().begin() + 1, grid.shape().end() - 1);
  const int points =
      static_cast<int>(checked_product(ctx, {out_spatial.begin(), out_spatial.end()}, "grid points"));
  int64_t pixels = 1;
  for (int i = 0; i < spatial; ++i) pixels = checked_mul(ctx, pixels, x.shape(2 + i), "input positions");
  to_int32(ctx, pixels, "input positions");
  mx::Shape out_shape = {n, channels};
  out_shape.insert(out_shape.end(), out_spatial.begin(), out_spatial.end());
  if (points == 0 || n == 0 || channels == 0) return {mx::zeros(out_shape, x.dtype(), s)};
  if (pixels == 0) throw ctx.error("X has no spatial positions to sample");

  const mx::Dtype dt = x.dtype() == mx::float64 || grid.dtype() == mx::float64 ? mx::float64 : mx::float32;
  mx::array coordinates = mx::reshape(mx::astype(grid, dt, s), {n, points, spatial}, s);

  // Per spatial axis (grid's last dim lists them innermost first: x, y, z).
  std::vector<std::vector<Tap>> taps(spatial);
  for (int i = 0; i < spatial; ++i) {
    const int size = x.shape(2 + i);
    mx::array normalized = mx::take(coordinates, spatial - 1 - i, 2, s);  // [N, P]
    mx::array one = scalar(1, dt);
    mx::array v =
        align_corners
            ? mx::multiply(mx::divide(mx::add(normalized, one, s), scalar(2, dt), s), scalar(size - 1, dt), s)
            : mx::divide(mx::subtract(mx::multiply(mx::add(normalized, one, s), scalar(size, dt), s), one, s),
                         scalar(2, dt), s);
    if (mode == SampleMode::kNearest) v = mx::round(v, s);  // half to even, as PyTorch
    AxisSampling axis{size, align_corners ? 0.0 : -0.5, align_corners ? size - 1.0 : size - 0.5};
    mx::array outside =
        mx::logical_or(mx::less(v, scalar(axis.low, dt), s), mx::greater(v, scalar(axis.high, dt), s), s);
    if (padding == Padding::kBorder) {
      v = mx::where(outside, mx::clip(v, scalar(0, dt), scalar(size - 1, dt), s), v, s);
    } else if (padding == Padding::kReflection) {
      v = mx::where(outside, reflect(v, axis.low, axis.high, s), v, s);
    }
    taps[i] = axis_taps(v, axis, mode, padding, s);
  }

  // Sum over every combination of one tap per axis: gather the flat input
  // position, weight by the product of the axis weights.
  mx::array flat_x = mx::reshape(mx::astype(x, dt, s), {n, channels, static_cast<int>(pixels)}, s);
  std::optional<mx::array> sum;
  std::vector<size_t> pick(spatial, 0);
  while (true) {
    std::optional<mx::array> flat, weight, inside;
    int64_t stride = 1;
    for (int i = spatial - 1; i >= 0; --i) {
      const Tap& tap = taps[i][pick[i]];
      mx::array scaled = mx::multiply(tap.index, mx::array(static_cast<int32_t>(stride)), s);
      flat = flat ? mx::add(*flat, scaled, s) : scaled;
      weight = weight ? mx::multiply(*weight, tap.weight, s) : tap.weight;
      if (tap.inside) inside = inside ? mx::logical_and(*inside, *tap.inside, s) : *tap.inside;
      stride *= x.shape(2 + i);
    }
    // The positions are piecewise constant in the grid: no gradient flows
    // through them (MLX has no vjp for gather indices); the weights carry it.
    mx::array position = mx::stop_gradient(mx::expand_dims(*flat, 1, s), s);
    mx::array gathered = mx::take_along_axis(flat_x, position, 2, s);  // [N, C, P]
    mx::array term = mx::multiply(gathered, mx::expand_dims(*weight, 1, s), s);
    if (inside) term = mx::where(mx::expand_dims(*inside, 1, s), term, scalar(0, dt), s);
    sum = sum ? mx::add(*sum, term, s) : term;
    int i = spatial - 1;  // next combination
    while (i >= 0 && ++pick[i] == taps[i].size()) pick[i--] = 0;
    if (i < 0) break;
  }
  return {mx::astype(mx::reshape(*sum, out_shape, s), x.dtype(), s)};
}

OpOutputs grid_sample_v16(NodeContext& ctx) { return grid_sample(ctx, 16); }
OpOutputs grid_sample_v20(NodeContext& ctx) { return grid_sample(ctx, 20); }

// --- AffineGrid (v20) ---------------------------------------------------------------

// The normalized coordinates of the centres of `size` cells in [-1, 1]
// (align_corners: of the end cells' centres at -1 and 1).
std::vector<double> base_coordinates(int64_t size, bool align_corners) {
  std::vector<double> c(size);
  for (int64_t i = 0; i < size; ++i) {
    if (align_corners) {
      c[i] = size == 1 ? -1.0 : -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(size - 1);
    } else {
      c[i] = (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(size) - 1.0;
    }
  }
  return c;
}

// theta: [N, 2, 3] with size [N, C, H, W] -> grid [N, H, W, 2];
// theta: [N, 3, 4] with size [N, C, D, H, W] -> grid [N, D, H, W, 3].
// grid[n, ..., k] = sum_j theta[n, k, j] * base_j + theta[n, k, last], base_j
// running over x (W), y (H), z (D).
OpOutputs affine_grid(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& theta = ctx.input(0);
  const std::vector<int64_t> size = ctx.host_ints(1);
  if (size.size() != 4 && size.size() != 5)
    throw ctx.error("size must have 4 or 5 values, got ", size.size());
  const int spatial = static_cast<int>(size.size()) - 2;
  if (theta.ndim() != 3 || theta.shape(0) != size[0] || theta.shape(1) != spatial ||
      theta.shape(2) != spatial + 1) {
    throw ctx.error("theta must have shape [", size[0], ", ", spatial, ", ", spatial + 1, "], got ",
                    theta.shape());
  }
  if (!mx::issubdtype(theta.dtype(), mx::floating))
    throw ctx.error("theta must be a float tensor, got ", theta.dtype());
  const bool align_corners = ctx.attr_int("align_corners", 0) != 0;
  const mx::Shape dims = to_shape(ctx, std::vector<int64_t>(size.begin() + 2, size.end()));
  const int n = static_cast<int>(size[0]);

  // base_j as [1, D..., 1]-shaped constants along their own axis.
  std::vector<mx::array> base;  // x, y, z
  for (int j = 0; j < spatial; ++j) {
    const int axis = spatial - 1 - j;  // x runs along the last spatial axis
    std::vector<double> c = base_coordinates(dims[axis], align_corners);
    std::vector<float> narrow(c.begin(), c.end());
    mx::Shape shape(spatial + 1, 1);
    shape[axis + 1] = dims[axis];
    base.push_back(mx::astype(mx::array(narrow.begin(), shape, mx::float32), theta.dtype(), s));
  }
  mx::Shape coefficient_shape(spatial + 1, 1);
  coefficient_shape[0] = n;
  std::vector<mx::array> components;
  for (int k = 0; k < spatial; ++k) {
    auto coefficient = [&](int j) {
      return mx::reshape(mx::slice(theta, {0, k, j}, {n, k + 1, j + 1}, s), coefficient_shape, s);
    };
    mx::array value = coefficient(spatial);
    for (int j = 0; j < spatial; ++j) value = mx::add(value, mx::multiply(coefficient(j), base[j], s), s);
    mx::Shape full = {n};
    full.insert(full.end(), dims.begin(), dims.end());
    components.push_back(mx::broadcast_to(value, full, s));
  }
  return {mx::stack(components, spatial + 1, s)};
}

// --- CenterCropPad (v18) ------------------------------------------------------------

// Crops or zero-pads each listed axis to the requested size, keeping the
// centre; an odd difference puts the extra element at the end.
OpOutputs center_crop_pad(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const std::vector<int64_t> shape = ctx.host_ints(1);
  const int rank = static_cast<int>(x.ndim());
  std::vector<int> axes;
  if (ctx.has_attr("axes")) {
    for (int64_t axis : ctx.attr_ints("axes")) {
      const int a = ctx.normalize_axis(axis, rank);
      if (std::find(axes.begin(), axes.end(), a) != axes.end())
        throw ctx.error("axis ", axis, " repeats in axes");
      axes.push_back(a);
    }
  } else {
    for (int i = 0; i < rank; ++i) axes.push_back(i);
  }
  if (shape.size() != axes.size()) {
    throw ctx.error("shape must have one value per axis (", axes.size(), "), got ", shape.size());
  }
  mx::Shape starts(rank, 0), stops = x.shape();
  std::vector<int> pad_axes;
  mx::Shape low, high;
  for (size_t j = 0; j < axes.size(); ++j) {
    const int axis = axes[j];
    const int64_t dim = x.shape(axis);
    const int target = to_int32(ctx, shape[j], "target size");
    if (target < 0) throw ctx.error("target size ", shape[j], " of axis ", axis, " is negative");
    if (target < dim) {
      starts[axis] = static_cast<int>((dim - target) / 2);
      stops[axis] = starts[axis] + target;
    } else if (target > dim) {
      pad_axes.push_back(axis);
      low.push_back(static_cast<int>((target - dim) / 2));
      high.push_back(static_cast<int>(target - dim - (target - dim) / 2));
    }
  }
  mx::array y = mx::slice(x, starts, stops, s);
  if (!pad_axes.empty()) y = mx::pad(y, pad_axes, low, high, mx::array(0, x.dtype()), "constant", s);
  return {y};
}

// --- Col2Im (v18) --------------------------------------------------------------------

// input [N, C * prod(block), L] -> image [N, C, image...]: column (k, l)
// holds kernel offset k of sliding block l; overlapping blocks add up. One
// strided slice update per kernel offset on the padded image, then the pads
// are cut off.
OpOutputs col2im(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& input = ctx.input(0);
  const std::vector<int64_t> image = ctx.host_ints(1);
  const std::vector<int64_t> block = ctx.host_ints(2);
  const size_t dims = image.size();
  if (dims == 0 || block.size() != dims) {
    throw ctx.error("image_shape and block_shape must have the same non-zero length, got ", dims, " and ",
                    block.size());
  }
  const std::vector<int64_t> dilations = ctx.attr_ints("dilations", std::vector<int64_t>(dims, 1));
  const std::vector<int64_t> strides = ctx.attr_ints("strides", std::vector<int64_t>(dims, 1));
  const std::vector<int64_t> pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * dims, 0));
  if (dilations.size() != dims || strides.size() != dims || pads.size() != 2 * dims) {
    throw ctx.error("dilations and strides need ", dims, " values and pads ", 2 * dims);
  }
  if (input.ndim() != 3)
    throw ctx.error("input must have rank 3 ([N, C * prod(block_shape), L]), got ", input.ndim());

  const int64_t kernel = checked_product(ctx, block, "block size");
  if (kernel <= 0 || input.shape(1) % kernel != 0) {
    throw ctx.error("input dim 1 (", input.shape(1), ") is not a multiple of the block size ", kernel);
  }
  std::vector<int64_t> padded(dims), blocks(dims);
  for (size_t i = 0; i < dims; ++i) {
    if (image[i] <= 0 || block[i] <= 0 || dilations[i] <= 0 || strides[i] <= 0 || pads[i] < 0 ||
        pads[dims + i] < 0) {
      throw ctx.error(
          "image_shape, block_shape, dilations and strides must be positive and pads non-negative");
    }
    padded[i] =
        checked_add(ctx, checked_add(ctx, image[i], pads[i], "padded size"), pads[dims + i], "padded size");
    const int64_t extent =
        checked_add(ctx, checked_mul(ctx, dilations[i], block[i] - 1, "block extent"), 1, "block extent");
    if (padded[i] < extent)
      throw ctx.error("block extent ", extent, " exceeds the padded image size ", padded[i]);
    blocks[i] = (padded[i] - extent) / strides[i] + 1;
  }
  if (checked_product(ctx, blocks, "block count") != input.shape(2)) {
    throw ctx.error("input dim 2 (", input.shape(2), ") must equal the number of sliding blocks ",
                    checked_product(ctx, blocks, "block count"));
  }
  const int n = input.shape(0), channels = static_cast<int>(input.shape(1) / kernel);
  mx::Shape padded_shape = {n, channels};
  for (int64_t p : padded) padded_shape.push_back(to_int32(ctx, p, "padded size"));
  to_shape(ctx, {padded_shape.begin(), padded_shape.end()});

  // [N, C, K, blocks...]: kernel offset k's columns laid out as the block grid.
  mx::Shape columns_shape = {n, channels, static_cast<int>(kernel)};
  for (int64_t b : blocks) columns_shape.push_back(static_cast<int>(b));
  mx::array columns = mx::reshape(input, columns_shape, s);
  mx::array result = mx::zeros(padded_shape, input.dtype(), s);
  std::vector<int64_t> offset(dims, 0);  // kernel offset k as a multi-index
  for (int k = 0; k < kernel; ++k) {
    mx::Shape starts(dims + 2, 0), stops = padded_shape, steps(dims + 2, 1);
    for (size_t i = 0; i < dims; ++i) {
      starts[2 + i] = static_cast<int>(offset[i] * dilations[i]);
      stops[2 + i] = static_cast<int>(starts[2 + i] + strides[i] * (blocks[i] - 1) + 1);
      steps[2 + i] = static_cast<int>(strides[i]);
    }
    mx::array contribution = mx::take(columns, k, 2, s);  // [N, C, blocks...]
    mx::array current = mx::slice(result, starts, stops, steps, s);
    result = mx::slice_update(result, mx::add(current, contribution, s), starts, stops, steps, s);
    for (int i = static_cast<int>(dims) - 1; i >= 0 && ++offset[i] == block[i]; --i) offset[i] = 0;
  }
  mx::Shape crop_start(dims + 2, 0), crop_stop = padded_shape;
  for (size_t i = 0; i < dims; ++i) {
    crop_start[2 + i] = static_cast<int>(pads[i]);
    crop_stop[2 + i] = static_cast<int>(pads[i] + image[i]);
  }
  return {mx::slice(result, crop_start, crop_stop, s)};
}

}  // namespace

void register_grid(OpRegistry& r) {
  r.add({
      {"GridSample", kOnnx, 16, 19, grid_sample_v16},
      // v20: N-D input, modes renamed linear/cubic. v22: bfloat16.
      {"GridSample", kOnnx, 20, 21, grid_sample_v20, {}, false, "cubic mode: 4-D input only"},
      {"GridSample", kOnnx, 22, kOpen, grid_sample_v20, {}, false, "cubic mode: 4-D input only"},
      {"AffineGrid", kOnnx, 20, kOpen, affine_grid, {1}},
      {"CenterCropPad", kOnnx, 18, kOpen, center_crop_pad, {1}, false, "string tensors are not supported"},
      {"Col2Im", kOnnx, 18, kOpen, col2im, {1, 2}},
  });
}

}  // namespace transmuter
