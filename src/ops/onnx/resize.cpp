// Resize (10, 11, 13, 18, 19) and the deprecated Upsample (1, 7, 9, 10).
// https://onnx.ai/onnx/operators/onnx__Resize.html
// https://onnx.ai/onnx/operators/onnx__Upsample.html
//
// Every mode is separable: each resized axis is resampled on its own, output
// position o reading `taps` input positions with fixed weights. Those tables
// depend only on shapes, scales, sizes and roi (host values), so they are
// computed here on the host, in float64, exactly as the ONNX reference
// computes its coefficients, and become constants of the graph:
//
// - When out / in = p / q and the table repeats every p outputs shifted by q
//   inputs (half_pixel, asymmetric, pytorch_half_pixel with scales 2, 1/2,
//   7/5...: the nearest and bilinear resizes of detectors and OCR models),
//   output phase r is a weighted sum of strided slices of the edge-padded
//   input, and the phases are interleaved: slices and elementwise work that
//   fuses under mx::compile. A nearest integer upscale is a broadcast.
// - Anything else (align_corners, sizes with no short period) is one mx::take
//   per tap (indices clamped on the host, so never out of bounds) and the
//   weighted sum of the gathered tensors.
// tf_crop_and_resize positions whose source lies outside the input take
// extrapolation_value. Upsample and Resize-10 are the asymmetric transform
// with their own nearest rounding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

enum class Mode { kNearest, kLinear, kCubic };

enum class CoordinateMode {
  kHalfPixel,
  kHalfPixelSymmetric,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfHalfPixelForNn,
  kTfCropAndResize,
};

enum class NearestMode {
  kRoundPreferFloor,
  kRoundPreferCeil,
  kFloor,
  kCeil,
  // Upsample and Resize-10: floor when upscaling, ceil when downscaling (what
  // ONNX Runtime keeps for these versions).
  kLegacy,
};

struct ResizeAttributes {
  Mode mode = Mode::kNearest;
  CoordinateMode coordinates = CoordinateMode::kHalfPixel;
  NearestMode nearest = NearestMode::kRoundPreferFloor;
  double cubic_coeff_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation_value = 0.0;
};

Mode mode_of(const NodeContext& ctx, const std::string& mode) {
  if (mode == "nearest") return Mode::kNearest;
  if (mode == "linear" || mode == "bilinear") return Mode::kLinear;  // "bilinear": Upsample-1
  if (mode == "cubic") return Mode::kCubic;
  throw ctx.error("mode must be 'nearest', 'linear' or 'cubic', got '", mode, "'");
}

CoordinateMode coordinate_mode_of(const NodeContext& ctx) {
  const std::string name = ctx.attr_string("coordinate_transformation_mode", "half_pixel");
  if (name == "half_pixel") return CoordinateMode::kHalfPixel;
  if (name == "half_pixel_symmetric") return CoordinateMode::kHalfPixelSymmetric;
  if (name == "pytorch_half_pixel") return CoordinateMode::kPytorchHalfPixel;
  if (name == "align_corners") return CoordinateMode::kAlignCorners;
  if (name == "asymmetric") return CoordinateMode::kAsymmetric;
  if (name == "tf_half_pixel_for_nn") return CoordinateMode::kTfHalfPixelForNn;  // v11 only, still accepted
  if (name == "tf_crop_and_resize") return CoordinateMode::kTfCropAndResize;
  throw ctx.error("unknown coordinate_transformation_mode '", name, "'");
}

NearestMode nearest_mode_of(const NodeContext& ctx) {
  const std::string name = ctx.attr_string("nearest_mode", "round_prefer_floor");
  if (name == "round_prefer_floor") return NearestMode::kRoundPreferFloor;
  if (name == "round_prefer_ceil") return NearestMode::kRoundPreferCeil;
  if (name == "floor") return NearestMode::kFloor;
  if (name == "ceil") return NearestMode::kCeil;
  throw ctx.error("unknown nearest_mode '", name, "'");
}

// Resize v11 and later.
ResizeAttributes resize_attributes(const NodeContext& ctx) {
  ResizeAttributes a;
  a.mode = mode_of(ctx, ctx.attr_string("mode", "nearest"));
  a.coordinates = coordinate_mode_of(ctx);
  a.nearest = nearest_mode_of(ctx);
  a.cubic_coeff_a = ctx.attr_float("cubic_coeff_a", -0.75f);
  a.exclude_outside = ctx.attr_int("exclude_outside", 0) != 0;
  a.antialias = ctx.attr_int("antialias", 0) != 0;
  a.extrapolation_value = ctx.attr_float("extrapolation_value", 0.0f);
  return a;
}

// Upsample and Resize-10: asymmetric coordinates, no other option.
ResizeAttributes legacy_attributes(const NodeContext& ctx) {
  ResizeAttributes a;
  a.mode = mode_of(ctx, ctx.attr_string("mode", "nearest"));
  if (a.mode == Mode::kCubic) throw ctx.error("mode 'cubic' needs Resize v11 or later");
  a.coordinates = CoordinateMode::kAsymmetric;
  a.nearest = NearestMode::kLegacy;
  return a;
}

// --- One axis on the host -----------------------------------------------------

// What one axis is resized from and to. `scale` is the factor the coordinate
// transforms divide by (the scales value, or sizes / input size).
struct AxisGeometry {
  int64_t in = 0;
  int64_t out = 0;
  double scale = 1.0;
  float roi_start = 0.0f;
  float roi_end = 1.0f;
};

// Output position o reads input positions index[o * taps + t] (clamped into
// [0, in)) with weight[o * taps + t]; `offset` holds the same positions
// before clamping. `extrapolated[o]`: tf_crop_and_resize's source lies
// outside the input.
struct AxisTable {
  int taps = 1;
  std::vector<int64_t> offset;
  std::vector<int32_t> index;
  std::vector<double> weight;
  std::vector<bool> extrapolated;
  bool any_extrapolated = false;
};

// The source coordinate of output position o, as the ONNX reference computes
// it (float64, with its float32 roi arithmetic). `width` is scale * in, which
// align_corners and tf_crop_and_resize use instead of the integer output size.
double source_coordinate(const ResizeAttributes& a, const AxisGeometry& g, int64_t o) {
  const double y = static_cast<double>(o);
  const double width = g.scale * static_cast<double>(g.in);
  switch (a.coordinates) {
    case CoordinateMode::kHalfPixel:
      return (y + 0.5) / g.scale - 0.5;
    case CoordinateMode::kHalfPixelSymmetric: {
      const double adjustment = static_cast<double>(g.out) / width;
      const double offset = static_cast<double>(g.in) / 2 * (1 - adjustment);
      return offset + (y + 0.5) / g.scale - 0.5;
    }
    case CoordinateMode::kPytorchHalfPixel:
      return width == 1 ? -0.5 : (y + 0.5) / g.scale - 0.5;
    case CoordinateMode::kAlignCorners:
      return width == 1 ? 0.0 : y * static_cast<double>(g.in - 1) / (width - 1);
    case CoordinateMode::kAsymmetric:
      return y / g.scale;
    case CoordinateMode::kTfHalfPixelForNn:
      return (y + 0.5) / g.scale;
    case CoordinateMode::kTfCropAndResize: {
      const double span = static_cast<float>(g.roi_end - g.roi_start);
      const double start = static_cast<float>(g.roi_start * static_cast<float>(g.in - 1));
      const double x = width == 1 ? span * static_cast<double>(g.in - 1) / 2
                                  : y * span * static_cast<double>(g.in - 1) / (width - 1);
      return x + start;
    }
  }
  return y;
}

// The nearest input position of source coordinate x. At an integer x every
// mode picks x itself.
int64_t nearest_position(NearestMode mode, double x, double scale) {
  const double below = std::floor(x);
  const double fraction = x - below;
  const auto pick = [&](bool upper) { return static_cast<int64_t>(below) + (upper ? 1 : 0); };
  if (fraction == 0) return static_cast<int64_t>(below);
  switch (mode) {
    case NearestMode::kRoundPreferFloor:
      return pick(fraction > 0.5);
    case NearestMode::kRoundPreferCeil:
      return pick(fraction >= 0.5);
    case NearestMode::kFloor:
      return pick(false);
    case NearestMode::kCeil:
      return pick(true);
    case NearestMode::kLegacy:
      return scale < 1 ? pick(true) : static_cast<int64_t>(std::trunc(x));
  }
  return pick(false);
}

// Cubic convolution kernel with coefficient A (Keys), zero beyond |d| = 2.
double cubic_kernel(double d, double a) {
  d = std::abs(d);
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0.0;
}

// Number of taps of the linear (radius 1) or cubic (radius 2) kernel; with
// antialias a downscale by s stretches the kernel by 1/s.
int tap_count(const NodeContext& ctx, const ResizeAttributes& a, double scale) {
  const double radius = a.mode == Mode::kCubic ? 2.0 : 1.0;
  if (!a.antialias || scale >= 1) return static_cast<int>(2 * radius);
  // The reference's footprint: 2 - 2 * (floor(-radius / s) + 1).
  const double taps = -2 * std::floor(-radius / scale);
  if (!(taps <= 65536)) throw ctx.error("antialias downscale by ", scale, " needs too wide a filter");
  return static_cast<int>(taps);
}

// Interpolation weights of output position o whose taps start at `first`.
void interpolation_weights(const ResizeAttributes& a, const AxisGeometry& g, double x, int64_t first,
                           int taps, double* weight) {
  const double stretch = a.antialias ? std::min(g.scale, 1.0) : 1.0;
  double sum = 0;
  for (int t = 0; t < taps; ++t) {
    const double d = stretch * (static_cast<double>(first + t) - x);
    weight[t] =
        a.mode == Mode::kCubic ? cubic_kernel(d, a.cubic_coeff_a) : std::clamp(1 - std::abs(d), 0.0, 1.0);
    sum += weight[t];
  }
  if (a.antialias) {
    for (int t = 0; t < taps; ++t) weight[t] /= sum;
  }
  if (a.exclude_outside) {
    // Taps outside the input get no weight; the others are renormalized.
    sum = 0;
    for (int t = 0; t < taps; ++t) {
      if (first + t < 0 || first + t >= g.in) weight[t] = 0;
      sum += weight[t];
    }
    if (sum != 0) {
      for (int t = 0; t < taps; ++t) weight[t] /= sum;
    }
  }
}

AxisTable axis_table(const NodeContext& ctx, const ResizeAttributes& a, const AxisGeometry& g) {
  AxisTable table;
  table.taps = a.mode == Mode::kNearest ? 1 : tap_count(ctx, a, g.scale);
  const int64_t entries = checked_mul(ctx, g.out, table.taps, "resize table size");
  table.offset.resize(entries);
  table.index.resize(entries);
  table.weight.resize(entries);
  table.extrapolated.assign(g.out, false);
  for (int64_t o = 0; o < g.out; ++o) {
    const double x = source_coordinate(a, g, o);
    if (!std::isfinite(x)) throw ctx.error("source coordinate of output ", o, " is not finite");
    if (a.coordinates == CoordinateMode::kTfCropAndResize && (x < 0 || x > static_cast<double>(g.in - 1))) {
      table.extrapolated[o] = table.any_extrapolated = true;
    }
    const int64_t row = o * table.taps;
    if (a.mode == Mode::kNearest) {
      table.offset[row] = nearest_position(a.nearest, x, g.scale);
      table.weight[row] = 1.0;
    } else {
      // The taps centred on x; at an integer x the window ends at x (the
      // reference prefers the pixels left of x; the extra tap has weight 0).
      const double below = std::floor(x);
      const int64_t first = static_cast<int64_t>(below) - table.taps / 2 + (x == below ? 0 : 1);
      for (int t = 0; t < table.taps; ++t) table.offset[row + t] = first + t;
      interpolation_weights(a, g, x, first, table.taps, &table.weight[row]);
    }
    for (int t = 0; t < table.taps; ++t) {
      table.index[row + t] = static_cast<int32_t>(std::clamp<int64_t>(table.offset[row + t], 0, g.in - 1));
    }
  }
  return table;
}

// True when the axis is left as it is: each output reads its own position
// with weight 1 and nothing is extrapolated.
bool is_identity(const AxisTable& table, const AxisGeometry& g) {
  if (g.in != g.out || table.any_extrapolated) return false;
  for (int64_t o = 0; o < g.out; ++o) {
    for (int t = 0; t < table.taps; ++t) {
      const double w = table.weight[o * table.taps + t];
      if (w != (table.index[o * table.taps + t] == o ? 1.0 : 0.0)) return false;
    }
  }
  return true;
}

// out / in = p / q in lowest terms. When output o + p reads the taps of
// output o shifted by q inputs with the same weights (up to float64 rounding
// of the coordinates), output p*i + r is phase r, a weighted sum of strided
// slices x[offset + q*i]: the usual half_pixel and asymmetric scales (2, 1/2,
// 7/5...) qualify, align_corners does not.
struct Period {
  int64_t outputs = 0;  // p; 0: the table has no short period
  int64_t inputs = 0;   // q
};

// Most phases sliced out one by one (p * taps slices): keeps the graph small.
constexpr int64_t kMaxPhases = 64;

Period period_of(const AxisTable& table, const AxisGeometry& g) {
  if (g.in == 0 || g.out == 0 || table.any_extrapolated) return {};
  const int64_t divisor = std::gcd(g.in, g.out);
  const Period period{g.out / divisor, g.in / divisor};
  if (period.outputs > kMaxPhases) return {};
  const int taps = table.taps;
  for (int64_t o = period.outputs; o < g.out; ++o) {
    const int64_t base = (o - period.outputs) * taps, row = o * taps;
    for (int t = 0; t < taps; ++t) {
      if (table.offset[row + t] != table.offset[base + t] + period.inputs) return {};
      if (std::abs(table.weight[row + t] - table.weight[base + t]) > 1e-12) return {};
    }
  }
  return period;
}

// --- One axis as MLX ops --------------------------------------------------------

// x[start : start + step * count : step] along `axis`.
mx::array slice_axis(const mx::array& x, int axis, int start, int count, int step, mx::StreamOrDevice s) {
  if (start == 0 && count == x.shape(axis) && step == 1) return x;
  mx::Shape starts(x.ndim(), 0), stops = x.shape(), strides(x.ndim(), 1);
  starts[axis] = start;
  stops[axis] = start + step * (count - 1) + 1;
  strides[axis] = step;
  return mx::slice(x, starts, stops, strides, s);
}

// x with its first and last element along `axis` repeated `low` and `high`
// times (clamping the taps that fall off the input).
mx::array edge_pad(const mx::array& x, int axis, int low, int high, mx::StreamOrDevice s) {
  if (low == 0 && high == 0) return x;
  const int size = x.shape(axis);
  auto repeated = [&](int at, int count) {
    mx::Shape shape = x.shape();
    shape[axis] = count;
    return mx::broadcast_to(slice_axis(x, axis, at, 1, 1, s), shape, s);
  };
  std::vector<mx::array> parts;
  if (low > 0) parts.push_back(repeated(0, low));
  parts.push_back(x);
  if (high > 0) parts.push_back(repeated(size - 1, high));
  return mx::concatenate(parts, axis, s);
}

// The shape [1, .., dims..., .., 1] of rank `rank` with `dims` from `axis` on.
mx::Shape shape_along(const mx::Shape& dims, int axis, int rank) {
  mx::Shape shape(rank, 1);
  for (size_t i = 0; i < dims.size(); ++i) shape[axis + i] = dims[i];
  return shape;
}

// Host weights as a constant of `dtype` (converted on the host: float64
// arrays exist on CPU streams only).
mx::array weights_along(const std::vector<double>& weights, const mx::Shape& shape, mx::Dtype dtype) {
  if (dtype == mx::float64) return mx::array(weights.begin(), shape, mx::float64);
  std::vector<float> narrow(weights.begin(), weights.end());
  return mx::astype(mx::array(narrow.begin(), shape, mx::float32), dtype);
}

mx::array mask_along(const std::vector<bool>& mask, const mx::Shape& shape) {
  std::vector<uint8_t> bytes(mask.begin(), mask.end());
  return mx::astype(mx::array(bytes.begin(), shape, mx::uint8), mx::bool_);
}

// [.., n, ..] phases -> [.., p * n, ..] with output p*i + r = phases[r][.., i, ..].
mx::array interleave(const std::vector<mx::array>& phases, int axis, mx::StreamOrDevice s) {
  if (phases.size() == 1) return phases[0];
  mx::Shape shape = phases[0].shape();
  shape[axis] *= static_cast<int>(phases.size());
  bool same =
      std::all_of(phases.begin(), phases.end(), [&](const mx::array& p) { return p.id() == phases[0].id(); });
  if (same) {
    // Nearest upscale: every phase is the same slice, so repeat it.
    mx::Shape repeated = phases[0].shape();
    repeated.insert(repeated.begin() + axis + 1, static_cast<int>(phases.size()));
    return mx::reshape(mx::broadcast_to(mx::expand_dims(phases[0], axis + 1, s), repeated, s), shape, s);
  }
  return mx::reshape(mx::stack(phases, axis + 1, s), shape, s);
}

// Periodic table: phase r is sum_t w[r][t] * x[offset[r][t] + q*i] over the
// edge-padded input (the padding stands for the clamped taps).
mx::array resample_periodic(const mx::array& x, int axis, const AxisTable& table, const Period& period,
                            mx::StreamOrDevice s) {
  const int taps = table.taps;
  const int count = static_cast<int>(x.shape(axis) / period.inputs);  // periods
  const int step = static_cast<int>(period.inputs);
  // Taps of phase 0..p-1 over periods 0..count-1 reach from the lowest
  // offset to the highest offset + q * (count - 1).
  int64_t lowest = 0, highest = 0;
  for (int64_t i = 0; i < period.outputs * taps; ++i) {
    lowest = std::min(lowest, table.offset[i]);
    highest = std::max(highest, table.offset[i] + step * int64_t{count - 1} - (x.shape(axis) - 1));
  }
  const int low = static_cast<int>(-lowest);
  mx::array padded = edge_pad(x, axis, low, static_cast<int>(highest), s);
  std::vector<mx::array> phases;
  for (int64_t r = 0; r < period.outputs; ++r) {
    std::optional<mx::array> phase;
    for (int t = 0; t < taps; ++t) {
      const double w = table.weight[r * taps + t];
      if (w == 0 && taps > 1) continue;
      const int start = static_cast<int>(table.offset[r * taps + t]) + low;
      mx::array term = slice_axis(padded, axis, start, count, step, s);
      if (w != 1.0) term = mx::multiply(term, mx::array(w, x.dtype()), s);
      phase = phase ? mx::add(*phase, term, s) : term;
    }
    if (!phase) {
      mx::Shape shape = x.shape();
      shape[axis] = count;
      phase = mx::zeros(shape, x.dtype(), s);
    }
    phases.push_back(*phase);
  }
  return interleave(phases, axis, s);
}

// General case: one gather per tap (indices clamped on the host) and the
// weighted sum of the gathered tensors, which fuses under mx::compile.
mx::array resample_gather(const mx::array& x, int axis, const AxisTable& table, int64_t out,
                          mx::StreamOrDevice s) {
  const int rank = static_cast<int>(x.ndim()), taps = table.taps, out32 = static_cast<int>(out);
  const mx::Shape shape = shape_along({out32}, axis, rank);
  std::optional<mx::array> sum;
  for (int t = 0; t < taps; ++t) {
    std::vector<int32_t> index(out);
    std::vector<double> weight(out);
    bool all_zero = true, all_one = true;
    for (int64_t o = 0; o < out; ++o) {
      index[o] = table.index[o * taps + t];
      weight[o] = table.weight[o * taps + t];
      all_zero = all_zero && weight[o] == 0;
      all_one = all_one && weight[o] == 1;
    }
    if (all_zero && taps > 1) continue;
    mx::array term = mx::take(x, mx::array(index.begin(), {out32}, mx::int32), axis, s);
    if (!all_one) term = mx::multiply(term, weights_along(weight, shape, x.dtype()), s);
    sum = sum ? mx::add(*sum, term, s) : term;
  }
  if (sum) return *sum;
  mx::Shape zeros = x.shape();
  zeros[axis] = out32;
  return mx::zeros(zeros, x.dtype(), s);
}

mx::array resample_axis(const NodeContext& ctx, const ResizeAttributes& a, const mx::array& x, int axis,
                        const AxisGeometry& g) {
  auto s = ctx.stream();
  const AxisTable table = axis_table(ctx, a, g);
  if (is_identity(table, g)) return x;
  mx::array y = [&] {
    if (g.out == 0 || g.in == 0) {
      mx::Shape shape = x.shape();
      shape[axis] = static_cast<int>(g.out);
      return mx::zeros(shape, x.dtype(), s);
    }
    const Period period = period_of(table, g);
    return period.outputs > 0 ? resample_periodic(x, axis, table, period, s)
                              : resample_gather(x, axis, table, g.out, s);
  }();
  if (table.any_extrapolated) {
    mx::array mask = mask_along(table.extrapolated,
                                shape_along({static_cast<int>(g.out)}, axis, static_cast<int>(x.ndim())));
    y = mx::where(mask, mx::array(a.extrapolation_value, y.dtype()), y, s);
  }
  return y;
}

// --- The whole tensor -------------------------------------------------------------

// Interpolating modes compute in float32 (float64 for float64 and wide
// integers) and round back once; nearest only moves elements.
mx::Dtype compute_dtype(mx::Dtype dtype) {
  if (dtype == mx::float64 || dtype == mx::int64 || dtype == mx::uint64 || dtype == mx::int32 ||
      dtype == mx::uint32) {
    return mx::float64;
  }
  return dtype == mx::complex64 ? mx::complex64 : mx::float32;
}

// The range of an integer dtype, as doubles.
std::pair<double, double> integer_range(mx::Dtype dtype) {
  switch (dtype.val()) {
    case mx::Dtype::Val::int8:
      return {-128.0, 127.0};
    case mx::Dtype::Val::uint8:
      return {0.0, 255.0};
    case mx::Dtype::Val::int16:
      return {-32768.0, 32767.0};
    case mx::Dtype::Val::uint16:
      return {0.0, 65535.0};
    case mx::Dtype::Val::int32:
      return {-2147483648.0, 2147483647.0};
    case mx::Dtype::Val::uint32:
      return {0.0, 4294967295.0};
    case mx::Dtype::Val::int64:
      return {-9223372036854775808.0, 9223372036854775807.0};
    default:
      return {0.0, 18446744073709551615.0};
  }
}

// Back to the input dtype; integers round half to even and saturate, as the
// reference does.
mx::array to_input_dtype(const mx::array& y, mx::Dtype dtype, mx::StreamOrDevice s) {
  if (y.dtype() == dtype) return y;
  if (!mx::issubdtype(dtype, mx::integer)) return mx::astype(y, dtype, s);
  const auto [low, high] = integer_range(dtype);
  mx::array rounded = mx::clip(mx::round(y, s), mx::array(low, y.dtype()), mx::array(high, y.dtype()), s);
  return mx::astype(rounded, dtype, s);
}

mx::array resize_axes(const NodeContext& ctx, const ResizeAttributes& a, const mx::array& x,
                      const std::vector<AxisGeometry>& geometry) {
  auto s = ctx.stream();
  const bool interpolates = a.mode != Mode::kNearest;
  if (interpolates && x.dtype() == mx::bool_)
    throw ctx.error("linear and cubic modes need numeric data, got bool");
  mx::array y = interpolates ? mx::astype(x, compute_dtype(x.dtype()), s) : x;
  // Shrinking axes first keeps the intermediate tensors small.
  std::vector<int> order(geometry.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int l, int r) {
    const auto ratio = [&](int i) {
      return geometry[i].in == 0 ? 1.0
                                 : static_cast<double>(geometry[i].out) / static_cast<double>(geometry[i].in);
    };
    return ratio(l) < ratio(r);
  });
  for (int axis : order) y = resample_axis(ctx, a, y, axis, geometry[axis]);
  return interpolates ? to_input_dtype(y, x.dtype(), s) : y;
}

// Geometry from per-axis scales: out = floor(in * scale).
std::vector<AxisGeometry> geometry_from_scales(const NodeContext& ctx, const mx::array& x,
                                               const std::vector<double>& scales) {
  if (scales.size() != x.ndim()) {
    throw ctx.error("scales must have one value per input axis (", x.ndim(), "), got ", scales.size());
  }
  std::vector<AxisGeometry> geometry(x.ndim());
  std::vector<int64_t> dims(x.ndim());
  for (size_t i = 0; i < scales.size(); ++i) {
    if (!(scales[i] > 0) || !std::isfinite(scales[i]))
      throw ctx.error("scale ", scales[i], " of axis ", i, " must be positive");
    AxisGeometry& g = geometry[i];
    g.in = x.shape(static_cast<int>(i));
    g.scale = scales[i];
    const double out = std::floor(static_cast<double>(g.in) * g.scale);
    if (!(out < 2147483648.0)) throw ctx.error("output size of axis ", i, " does not fit int32");
    g.out = dims[i] = static_cast<int64_t>(out);
  }
  to_shape(ctx, dims);
  return geometry;
}

// --- Resize v11+ -------------------------------------------------------------------

// Inputs X, roi, scales, sizes; `axes` (v18) names the axes that roi, scales
// and sizes describe (all axes when absent).
OpOutputs resize_v11(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const ResizeAttributes a = resize_attributes(ctx);
  const int rank = static_cast<int>(x.ndim());

  std::vector<int> axes;
  if (ctx.has_attr("axes")) {
    for (int64_t axis : ctx.attr_ints("axes")) {
      const int normalized = ctx.normalize_axis(axis, rank);
      if (std::find(axes.begin(), axes.end(), normalized) != axes.end())
        throw ctx.error("axis ", axis, " repeats in axes");
      axes.push_back(normalized);
    }
  } else {
    for (int i = 0; i < rank; ++i) axes.push_back(i);
  }
  const size_t count = axes.size();

  auto host_values = [&](size_t i) { return ctx.has_input(i) ? ctx.host_doubles(i) : std::vector<double>{}; };
  const std::vector<double> roi = host_values(1);
  const std::vector<double> scales = host_values(2);
  const std::vector<int64_t> sizes = ctx.has_input(3) ? ctx.host_ints(3) : std::vector<int64_t>{};
  if (scales.empty() == sizes.empty()) throw ctx.error("exactly one of scales and sizes must be given");
  if (!scales.empty() && scales.size() != count) {
    throw ctx.error("scales must have ", count, " values (one per resized axis), got ", scales.size());
  }
  if (!sizes.empty() && sizes.size() != count) {
    throw ctx.error("sizes must have ", count, " values (one per resized axis), got ", sizes.size());
  }

  std::vector<AxisGeometry> geometry(rank);
  for (int i = 0; i < rank; ++i) geometry[i].in = geometry[i].out = x.shape(i);
  if (!scales.empty()) {
    std::vector<double> all(rank, 1.0);
    for (size_t j = 0; j < count; ++j) all[axes[j]] = scales[j];
    geometry = geometry_from_scales(ctx, x, all);
  } else {
    const std::string policy = ctx.attr_string("keep_aspect_ratio_policy", "stretch");
    if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller") {
      throw ctx.error("unknown keep_aspect_ratio_policy '", policy, "'");
    }
    std::vector<double> ratios(count);
    for (size_t j = 0; j < count; ++j) {
      const AxisGeometry& g = geometry[axes[j]];
      if (sizes[j] < 0) throw ctx.error("size ", sizes[j], " of axis ", axes[j], " is negative");
      if (g.in == 0 && sizes[j] != 0)
        throw ctx.error("axis ", axes[j], " of size 0 cannot be resized to ", sizes[j]);
      ratios[j] = g.in == 0 ? 1.0 : static_cast<double>(sizes[j]) / static_cast<double>(g.in);
    }
    for (size_t j = 0; j < count; ++j) {
      AxisGeometry& g = geometry[axes[j]];
      if (policy == "stretch") {
        g.scale = ratios[j];
        g.out = sizes[j];
        continue;
      }
      // One scale for every axis, the smallest (not_larger) or largest
      // (not_smaller); sizes round half up.
      g.scale = policy == "not_larger" ? *std::min_element(ratios.begin(), ratios.end())
                                       : *std::max_element(ratios.begin(), ratios.end());
      g.out = static_cast<int64_t>(g.scale * static_cast<double>(g.in) + 0.5);
    }
    std::vector<int64_t> dims(rank);
    for (int i = 0; i < rank; ++i) dims[i] = geometry[i].out;
    to_shape(ctx, dims);
  }

  if (a.coordinates == CoordinateMode::kTfCropAndResize) {
    if (roi.size() != 2 * count)
      throw ctx.error("roi must have ", 2 * count, " values for tf_crop_and_resize, got ", roi.size());
    for (size_t j = 0; j < count; ++j) {
      geometry[axes[j]].roi_start = static_cast<float>(roi[j]);
      geometry[axes[j]].roi_end = static_cast<float>(roi[count + j]);
    }
  }
  return {resize_axes(ctx, a, x, geometry)};
}

// --- Resize v10, Upsample ----------------------------------------------------------

OpOutputs resize_with_scales_input(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  return {resize_axes(ctx, legacy_attributes(ctx), x, geometry_from_scales(ctx, x, ctx.host_doubles(1)))};
}

// v7: scales attribute.
OpOutputs upsample_v7(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  std::vector<double> scales;
  for (float scale : ctx.attr_floats("scales")) scales.push_back(scale);
  return {resize_axes(ctx, legacy_attributes(ctx), x, geometry_from_scales(ctx, x, scales))};
}

// v1 (experimental): height_scale and width_scale of an NCHW input.
OpOutputs upsample_v1(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.ndim() != 4) throw ctx.error("input must have rank 4 ([N, C, H, W]), got ", x.ndim());
  if (!ctx.has_attr("height_scale") || !ctx.has_attr("width_scale")) {
    throw ctx.error("height_scale and width_scale are required");
  }
  std::vector<double> scales = {1.0, 1.0, ctx.attr_float("height_scale", 1.0f),
                                ctx.attr_float("width_scale", 1.0f)};
  return {resize_axes(ctx, legacy_attributes(ctx), x, geometry_from_scales(ctx, x, scales))};
}

constexpr std::string_view kNoStrings = "string tensors are not supported";

}  // namespace

void register_resize(OpRegistry& r) {
  r.add({
      {"Resize", kOnnx, 10, 10, resize_with_scales_input, {1}, false, kNoStrings},
      // v11: roi, sizes, coordinate modes, cubic, nearest_mode. v13: roi and
      // scales optional, bfloat16. v18: axes, antialias,
      // keep_aspect_ratio_policy. v19: half_pixel_symmetric.
      {"Resize", kOnnx, 11, 12, resize_v11, {1, 2, 3}, false, kNoStrings},
      {"Resize", kOnnx, 13, 17, resize_v11, {1, 2, 3}, false, kNoStrings},
      {"Resize", kOnnx, 18, 18, resize_v11, {1, 2, 3}, false, kNoStrings},
      {"Resize", kOnnx, 19, kOpen, resize_v11, {1, 2, 3}, false, kNoStrings},
      {"Upsample", kOnnx, 1, 6, upsample_v1, {}, false, kNoStrings},
      {"Upsample", kOnnx, 7, 8, upsample_v7, {}, false, kNoStrings},
      // v10 only marks Upsample deprecated (Resize replaces it), with v9's
      // signature: such models run as v9.
      {"Upsample", kOnnx, 9, kOpen, resize_with_scales_input, {1}, false, kNoStrings},
  });
}

}  // namespace transmuter
