// Object detection: NonMaxSuppression, RoiAlign, DeformConv.
// https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html (and the others)
//
// NonMaxSuppression and RoiAlign read box coordinates on the host. NonMaxSuppression's output length
// depends on them (eager only). RoiAlign's sampling grid depends on each
// region's size (sampling_ratio 0), so the sample positions and bilinear
// weights are computed on the host and the feature map is gathered with MLX
// ops: gradients reach X, not the regions.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// --- NonMaxSuppression ------------------------------------------------------------

struct Box {
  double x_min, y_min, x_max, y_max;
};

// center_point_box 0: [y1, x1, y2, x2] with any two opposite corners;
// 1: [x_center, y_center, width, height].
Box box_at(const std::vector<double>& data, size_t offset, bool center_point) {
  const double* b = data.data() + offset;
  if (center_point) return {b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2};
  return {std::min(b[1], b[3]), std::min(b[0], b[2]), std::max(b[1], b[3]), std::max(b[0], b[2])};
}

// Intersection over union; 0 when the boxes do not overlap or one is empty.
double iou(const Box& a, const Box& b) {
  const double width = std::min(a.x_max, b.x_max) - std::max(a.x_min, b.x_min);
  const double height = std::min(a.y_max, b.y_max) - std::max(a.y_min, b.y_min);
  if (width <= 0 || height <= 0) return 0;
  const double intersection = width * height;
  const double area_a = (a.x_max - a.x_min) * (a.y_max - a.y_min);
  const double area_b = (b.x_max - b.x_min) * (b.y_max - b.y_min);
  const double union_area = area_a + area_b - intersection;
  if (area_a <= 0 || area_b <= 0 || union_area <= 0) return 0;
  return intersection / union_area;
}

// Per batch and class: boxes in descending score order (ties: lower index
// first) above score_threshold, each kept unless its IoU with a kept box is
// strictly greater than iou_threshold, at most max_output_boxes_per_class.
// Output [selected, 3] int64 rows (batch, class, box).
OpOutputs non_max_suppression(NodeContext& ctx) {
  const mx::array& boxes = ctx.input(0);
  const mx::array& scores = ctx.input(1);
  if (boxes.ndim() != 3 || boxes.shape(2) != 4) throw ctx.error("boxes must be [batches, boxes, 4]");
  if (scores.ndim() != 3 || scores.shape(0) != boxes.shape(0) || scores.shape(2) != boxes.shape(1)) {
    throw ctx.error("scores must be [batches, classes, boxes] matching boxes");
  }
  const int64_t max_per_class = ctx.has_input(2) ? ctx.host_int(2) : 0;
  const double iou_threshold = ctx.has_input(3) ? ctx.host_double(3) : 0.0;
  const bool has_score_threshold = ctx.has_input(4);
  const double score_threshold = has_score_threshold ? ctx.host_double(4) : 0.0;
  const int64_t center_point_box = ctx.attr_int("center_point_box", 0);
  if (center_point_box != 0 && center_point_box != 1) {
    throw ctx.error("center_point_box must be 0 or 1, got ", center_point_box);
  }
  const std::vector<double> box_data = ctx.host_doubles(0);
  const std::vector<double> score_data = ctx.host_doubles(1);
  const int64_t batches = boxes.shape(0), count = boxes.shape(1), classes = scores.shape(1);

  std::vector<int64_t> selected;  // flattened rows
  for (int64_t b = 0; b < batches && max_per_class > 0; ++b) {
    for (int64_t c = 0; c < classes; ++c) {
      const double* class_scores = score_data.data() + (b * classes + c) * count;
      std::vector<int64_t> candidates;
      for (int64_t i = 0; i < count; ++i) {
        if (!has_score_threshold || class_scores[i] > score_threshold) candidates.push_back(i);
      }
      std::stable_sort(candidates.begin(), candidates.end(),
                       [&](int64_t l, int64_t r) { return class_scores[l] > class_scores[r]; });
      std::vector<Box> kept;
      for (int64_t i : candidates) {
        if (static_cast<int64_t>(kept.size()) >= max_per_class) break;
        Box candidate = box_at(box_data, static_cast<size_t>((b * count + i) * 4), center_point_box == 1);
        bool suppressed = std::any_of(kept.begin(), kept.end(),
                                      [&](const Box& k) { return iou(candidate, k) > iou_threshold; });
        if (suppressed) continue;
        kept.push_back(candidate);
        selected.insert(selected.end(), {b, c, i});
      }
    }
  }
  const int rows = to_int32(ctx, static_cast<int64_t>(selected.size() / 3), "selected box count");
  return {mx::array(selected.data(), {rows, 3}, mx::int64)};
}

// --- RoiAlign ------------------------------------------------------------------------

struct RoiAlignOptions {
  int pooled_h, pooled_w;
  int64_t sampling_ratio;
  double spatial_scale;
  bool half_pixel;
  bool max_mode;
};

// Host tables for the bilinear samples of every region and output bin:
// flat positions in the H*W plane and weights, 4 per sample, padded to the
// largest sample count with `valid` false.
struct SampleTables {
  std::vector<int32_t> positions;  // [R, bins, S, 4]
  std::vector<float> weights;      // [R, bins, S, 4]
  std::vector<bool> valid;         // [R, bins, S]
  std::vector<float> counts;       // [R]: samples averaged per bin (at least 1)
  int samples = 0;                 // S
};

// Region geometry in `Real`, X's precision (float for all but float64):
// the adaptive grid size is a ceil() of it, which float rounding can move,
// and ONNX Runtime and the reference compute it in X's type.
template <typename Real>
struct Grid {
  Real start_h, start_w, bin_h, bin_w;
  int64_t grid_h, grid_w;
};

template <typename Real>
Grid<Real> region_grid(const Real* roi, const RoiAlignOptions& o) {
  const Real offset = o.half_pixel ? Real(0.5) : Real(0);
  const Real scale = static_cast<Real>(o.spatial_scale);
  Grid<Real> g{};
  g.start_w = roi[0] * scale - offset;
  g.start_h = roi[1] * scale - offset;
  Real width = roi[2] * scale - offset - g.start_w;
  Real height = roi[3] * scale - offset - g.start_h;
  if (!o.half_pixel) {  // the legacy mode makes every region at least one pixel
    width = std::max(width, Real(1));
    height = std::max(height, Real(1));
  }
  g.bin_h = height / o.pooled_h;
  g.bin_w = width / o.pooled_w;
  g.grid_h = o.sampling_ratio > 0 ? o.sampling_ratio : static_cast<int64_t>(std::ceil(height / o.pooled_h));
  g.grid_w = o.sampling_ratio > 0 ? o.sampling_ratio : static_cast<int64_t>(std::ceil(width / o.pooled_w));
  g.grid_h = std::max<int64_t>(g.grid_h, 0);
  g.grid_w = std::max<int64_t>(g.grid_w, 0);
  return g;
}

template <typename Real>
SampleTables sample_tables(const NodeContext& ctx, const std::vector<Real>& rois, int64_t num_rois,
                           int height, int width, const RoiAlignOptions& o) {
  std::vector<Grid<Real>> grids;
  int64_t samples = 0;
  for (int64_t r = 0; r < num_rois; ++r) {
    grids.push_back(region_grid(rois.data() + r * 4, o));
    samples = std::max(
        samples, checked_mul(ctx, grids.back().grid_h, grids.back().grid_w, "RoiAlign samples per bin"));
  }
  const int64_t bins = int64_t{o.pooled_h} * o.pooled_w;
  int64_t cells =
      checked_mul(ctx, checked_mul(ctx, num_rois, bins, "RoiAlign table"), samples, "RoiAlign table");
  cells = checked_mul(ctx, cells, 4, "RoiAlign table");
  to_int32(ctx, cells, "RoiAlign table size");
  if (static_cast<uint64_t>(cells) * 8 > ctx.memory_limit())
    throw ctx.error("RoiAlign sample tables exceed the memory limit");

  SampleTables t;
  t.samples = static_cast<int>(samples);
  t.positions.assign(static_cast<size_t>(cells), 0);
  t.weights.assign(static_cast<size_t>(cells), 0.0f);
  t.valid.assign(static_cast<size_t>(cells / 4), false);
  for (int64_t r = 0; r < num_rois; ++r) {
    const Grid<Real>& g = grids[static_cast<size_t>(r)];
    t.counts.push_back(static_cast<float>(std::max<int64_t>(g.grid_h * g.grid_w, 1)));
    for (int64_t bin = 0; bin < bins; ++bin) {
      const int64_t ph = bin / o.pooled_w, pw = bin % o.pooled_w;
      int64_t sample = 0;
      for (int64_t iy = 0; iy < g.grid_h; ++iy) {
        for (int64_t ix = 0; ix < g.grid_w; ++ix, ++sample) {
          const size_t slot = static_cast<size_t>((r * bins + bin) * samples + sample);
          t.valid[slot] = true;
          Real y = g.start_h + static_cast<Real>(ph) * g.bin_h +
                   (static_cast<Real>(iy) + Real(0.5)) * g.bin_h / static_cast<Real>(g.grid_h);
          Real x = g.start_w + static_cast<Real>(pw) * g.bin_w +
                   (static_cast<Real>(ix) + Real(0.5)) * g.bin_w / static_cast<Real>(g.grid_w);
          if (y < -1.0 || y > height || x < -1.0 || x > width) continue;  // contributes 0
          y = std::max(y, Real(0));
          x = std::max(x, Real(0));
          int64_t y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x), y_high, x_high;
          if (y_low >= height - 1) {
            y_high = y_low = height - 1;
            y = static_cast<Real>(y_low);
          } else {
            y_high = y_low + 1;
          }
          if (x_low >= width - 1) {
            x_high = x_low = width - 1;
            x = static_cast<Real>(x_low);
          } else {
            x_high = x_low + 1;
          }
          const Real ly = y - static_cast<Real>(y_low), lx = x - static_cast<Real>(x_low);
          const Real hy = 1 - ly, hx = 1 - lx;
          const int32_t corners[4] = {
              static_cast<int32_t>(y_low * width + x_low), static_cast<int32_t>(y_low * width + x_high),
              static_cast<int32_t>(y_high * width + x_low), static_cast<int32_t>(y_high * width + x_high)};
          const Real w[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
          for (int k = 0; k < 4; ++k) {
            t.positions[slot * 4 + k] = corners[k];
            t.weights[slot * 4 + k] = static_cast<float>(w[k]);
          }
        }
      }
    }
  }
  return t;
}

// Y [R, C, output_height, output_width]: per bin, the average (or maximum)
// of bilinear samples of X[batch_indices[r]] on a grid over the region. Max
// mode takes, per sample, the largest of the four weighted corner values, as
// the ONNX reference and ONNX Runtime do.
template <bool kHalfPixelDefault>
OpOutputs roi_align(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& rois = ctx.input(1);
  if (x.ndim() != 4) throw ctx.error("X must be [N, C, H, W], got rank ", x.ndim());
  if (!mx::issubdtype(x.dtype(), mx::floating)) throw ctx.error("X must be a float tensor, got ", x.dtype());
  if (rois.ndim() != 2 || rois.shape(1) != 4) throw ctx.error("rois must be [num_rois, 4]");
  const int64_t num_rois = rois.shape(0);
  std::vector<int64_t> batch = ctx.host_ints(2);
  if (static_cast<int64_t>(batch.size()) != num_rois)
    throw ctx.error("batch_indices must have one entry per roi");
  for (int64_t b : batch) {
    if (b < 0 || b >= x.shape(0))
      throw ctx.error("batch index ", b, " out of range for batch size ", x.shape(0));
  }
  RoiAlignOptions o{};
  const int64_t out_h = ctx.attr_int("output_height", 1), out_w = ctx.attr_int("output_width", 1);
  if (out_h < 1 || out_w < 1) throw ctx.error("output_height and output_width must be positive");
  o.pooled_h = to_int32(ctx, out_h, "output_height");
  o.pooled_w = to_int32(ctx, out_w, "output_width");
  o.sampling_ratio = ctx.attr_int("sampling_ratio", 0);
  if (o.sampling_ratio < 0) throw ctx.error("sampling_ratio must be non-negative, got ", o.sampling_ratio);
  o.spatial_scale = ctx.attr_float("spatial_scale", 1.0f);
  const std::string mode = ctx.attr_string("mode", "avg");
  if (mode != "avg" && mode != "max") throw ctx.error("mode must be avg or max, got '", mode, "'");
  o.max_mode = mode == "max";
  const std::string transform = ctx.attr_string("coordinate_transformation_mode",
                                                kHalfPixelDefault ? "half_pixel" : "output_half_pixel");
  if (transform != "half_pixel" && transform != "output_half_pixel") {
    throw ctx.error("coordinate_transformation_mode must be half_pixel or output_half_pixel, got '",
                    transform, "'");
  }
  o.half_pixel = transform == "half_pixel";

  const int height = x.shape(2), width = x.shape(3), channels = x.shape(1);
  std::vector<double> roi_values = ctx.host_doubles(1);
  SampleTables t = x.dtype() == mx::float64
                       ? sample_tables(ctx, roi_values, num_rois, height, width, o)
                       : sample_tables(ctx, std::vector<float>(roi_values.begin(), roi_values.end()),
                                       num_rois, height, width, o);
  const int R = static_cast<int>(num_rois), bins = o.pooled_h * o.pooled_w, S = t.samples;

  std::vector<int32_t> batch32(batch.begin(), batch.end());
  mx::array planes = mx::take(mx::reshape(x, {x.shape(0), channels, height * width}, s),
                              mx::array(batch32.data(), {R}, mx::int32), 0, s);  // [R, C, H*W]
  mx::array positions = mx::array(t.positions.data(), {R, 1, bins * S * 4}, mx::int32);
  mx::array gathered =
      mx::take_along_axis(planes, mx::broadcast_to(positions, {R, channels, bins * S * 4}, s), 2, s);
  gathered = mx::reshape(mx::astype(gathered, mx::float32, s), {R, channels, bins, S, 4}, s);
  mx::array weights = mx::array(t.weights.data(), {R, 1, bins, S, 4}, mx::float32);
  mx::array weighted = mx::multiply(gathered, weights, s);
  mx::array y = [&] {
    if (!o.max_mode) {
      mx::array counts = mx::array(t.counts.data(), {R, 1, 1}, mx::float32);
      return mx::divide(mx::sum(weighted, {3, 4}, false, s), counts, s);
    }
    std::vector<uint8_t> valid_bytes(t.valid.begin(), t.valid.end());
    mx::array valid = mx::astype(mx::array(valid_bytes.data(), {R, 1, bins, S}, mx::uint8), mx::bool_, s);
    mx::array per_sample = mx::where(valid, mx::max(weighted, 4, false, s), mx::array(-INFINITY), s);
    // A bin without samples is 0.
    mx::array any = mx::any(valid, 3, false, s);
    return mx::where(any, mx::max(per_sample, 3, false, s), mx::array(0.0f), s);
  }();
  if (S == 0) y = mx::zeros({R, channels, bins}, mx::float32, s);
  return {mx::astype(mx::reshape(y, {R, channels, o.pooled_h, o.pooled_w}, s), x.dtype(), s)};
}

// --- DeformConv ---------------------------------------------------------------------

/** "[1, 8, 2, 2]" */
std::string shape_text(const mx::Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

/** Row-major coordinates of flat index `flat` in `dims`. */
std::vector<int64_t> unflatten(int64_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> coords(dims.size());
  for (size_t a = dims.size(); a-- > 0;) {
    coords[a] = flat % dims[a];
    flat /= dims[a];
  }
  return coords;
}

// N-D deformable convolution: kernel tap k of output position p samples X at
// (p * stride - pad_begin + k * dilation + offset[k, p]) per spatial axis,
// multilinearly (corners outside X count as 0, as GridSample with
// align_corners=1 and zero padding), scaled by mask[k, p]; the samples form
// the columns of a grouped matmul with W. Offsets and mask stay traced: the
// sampling is MLX gathers, and gradients reach X, W, the offsets (through the
// interpolation weights) and the mask.
OpOutputs deform_conv(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& w = ctx.input(1);
  const mx::array& offset = ctx.input(2);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 3) throw ctx.error("X must be [N, C, D1, ...], got rank ", rank);
  if (!mx::issubdtype(x.dtype(), mx::floating)) throw ctx.error("X must be a float tensor, got ", x.dtype());
  if (w.ndim() != x.ndim() || offset.ndim() != x.ndim())
    throw ctx.error("W and offset must have X's rank ", rank);
  const size_t n = static_cast<size_t>(rank - 2);
  const int N = x.shape(0), C = x.shape(1), out_channels = w.shape(0);
  const int64_t group = ctx.attr_int("group", 1), offset_group = ctx.attr_int("offset_group", 1);
  if (group < 1 || C % group != 0 || out_channels % group != 0 || w.shape(1) * group != C) {
    throw ctx.error("group ", group, " does not fit ", C, " input channels and W of shape [", out_channels,
                    ", ", w.shape(1), ", ...]");
  }
  if (offset_group < 1 || C % offset_group != 0) {
    throw ctx.error("offset_group ", offset_group, " does not divide ", C, " channels");
  }
  std::vector<int64_t> w_kernel(w.shape().begin() + 2, w.shape().end());
  std::vector<int64_t> kernel = ctx.attr_ints("kernel_shape", w_kernel);
  std::vector<int64_t> strides = ctx.attr_ints("strides", std::vector<int64_t>(n, 1));
  std::vector<int64_t> dilations = ctx.attr_ints("dilations", std::vector<int64_t>(n, 1));
  std::vector<int64_t> pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * n, 0));
  if (kernel != w_kernel) throw ctx.error("kernel_shape does not match W's spatial dims");
  if (strides.size() != n || dilations.size() != n || pads.size() != 2 * n) {
    throw ctx.error("strides and dilations need ", n, " entries and pads ", 2 * n);
  }
  std::vector<int64_t> in_dims, out_dims;
  for (size_t a = 0; a < n; ++a) {
    if (strides[a] < 1 || dilations[a] < 1 || pads[a] < 0 || pads[a + n] < 0 || kernel[a] > 65536 ||
        dilations[a] > 65536 || pads[a] > 65536 || pads[a + n] > 65536) {
      throw ctx.error("strides and dilations must lie in [1, 65536], pads in [0, 65536]");
    }
    in_dims.push_back(x.shape(static_cast<int>(a) + 2));
    const int64_t span = (kernel[a] - 1) * dilations[a] + 1;
    out_dims.push_back((in_dims[a] + pads[a] + pads[a + n] - span) / strides[a] + 1);
    if (out_dims[a] < 1) throw ctx.error("the kernel does not fit the padded input along axis ", a + 2);
  }
  const int64_t taps = checked_product(ctx, kernel, "kernel size");
  const int64_t positions = checked_product(ctx, out_dims, "output size");
  const int64_t plane = checked_product(ctx, in_dims, "input size");
  const int K = to_int32(ctx, taps, "kernel size"), P = to_int32(ctx, positions, "output size");
  const int G = static_cast<int>(offset_group), dims = static_cast<int>(n);
  mx::Shape offset_shape = {
      N, to_int32(ctx, checked_mul(ctx, int64_t{G} * K, dims, "offset channels"), "offset")};
  mx::Shape mask_shape = {N, G * K};
  for (int64_t d : out_dims)
    offset_shape.push_back(static_cast<int>(d)), mask_shape.push_back(static_cast<int>(d));
  if (offset.shape() != offset_shape) throw ctx.error("offset must have shape ", shape_text(offset_shape));
  const int64_t columns =
      checked_mul(ctx, checked_mul(ctx, int64_t{N} * C, K, "DeformConv columns"), P, "columns");
  to_int32(ctx, columns, "DeformConv columns");
  to_int32(ctx, plane, "input size");

  // Sampling positions per axis, [N, G, K, P] in float32.
  mx::array off = mx::reshape(mx::astype(offset, mx::float32, s), {N, G, K, dims, P}, s);
  std::vector<mx::array> position, fraction, low;
  for (int a = 0; a < dims; ++a) {
    std::vector<float> base(static_cast<size_t>(K) * P);  // p * stride - pad + k * dilation
    for (int k = 0; k < K; ++k) {
      const int64_t tap = unflatten(k, kernel)[a];
      for (int p = 0; p < P; ++p) {
        base[static_cast<size_t>(k) * P + p] =
            static_cast<float>(unflatten(p, out_dims)[a] * strides[a] - pads[a] + tap * dilations[a]);
      }
    }
    mx::array along = mx::take(off, a, 3, s);
    mx::array pos = mx::add(mx::array(base.data(), {1, 1, K, P}, mx::float32), along, s);
    mx::array floor = mx::floor(pos, s);
    low.push_back(floor);
    fraction.push_back(mx::subtract(pos, floor, s));
  }

  // Channels grouped by offset group: [N, G, C/G, plane].
  mx::array planes = mx::reshape(x, {N, G, C / G, static_cast<int>(plane)}, s);
  std::optional<mx::array> sampled;
  mx::array one = mx::array(1.0f);
  for (int corner = 0; corner < (1 << dims); ++corner) {
    std::optional<mx::array> weight, inside, index;
    int64_t axis_stride = plane;
    for (int a = 0; a < dims; ++a) {
      const bool upper = (corner >> a) & 1;
      axis_stride /= in_dims[static_cast<size_t>(a)];
      mx::array c = upper ? mx::add(low[a], one, s) : low[a];
      mx::array wa = upper ? fraction[a] : mx::subtract(one, fraction[a], s);
      const float size = static_cast<float>(in_dims[static_cast<size_t>(a)]);
      mx::array in_a =
          mx::logical_and(mx::greater_equal(c, mx::array(0.0f), s), mx::less(c, mx::array(size), s), s);
      mx::array ia =
          mx::multiply(mx::astype(mx::clip(c, mx::array(0.0f), mx::array(size - 1), s), mx::int32, s),
                       mx::array(static_cast<int>(axis_stride)), s);
      weight = weight ? mx::multiply(*weight, wa, s) : wa;
      inside = inside ? mx::logical_and(*inside, in_a, s) : in_a;
      index = index ? mx::add(*index, ia, s) : ia;
    }
    mx::array wt = mx::where(*inside, *weight, mx::array(0.0f), s);
    // The gradient reaches the offsets through the weights; the corner
    // indices are piecewise constant in them.
    mx::array idx = mx::stop_gradient(*index, s);
    idx = mx::broadcast_to(mx::reshape(idx, {N, G, 1, K * P}, s), {N, G, C / G, K * P}, s);
    mx::array values = mx::reshape(mx::take_along_axis(planes, idx, 3, s), {N, G, C / G, K, P}, s);
    mx::array term = mx::multiply(values, mx::astype(mx::reshape(wt, {N, G, 1, K, P}, s), x.dtype(), s), s);
    sampled = sampled ? mx::add(*sampled, term, s) : term;
  }
  mx::array columns_array = *sampled;  // [N, G, C/G, K, P]
  if (auto mask = ctx.optional_input(4)) {
    if (mask->shape() != mask_shape) throw ctx.error("mask must have shape ", shape_text(mask_shape));
    columns_array =
        mx::multiply(columns_array, mx::reshape(mx::astype(*mask, x.dtype(), s), {N, G, 1, K, P}, s), s);
  }
  // Grouped matmul: W [g, oC/g, C/g * K] x columns [N, g, C/g * K, P].
  const int g = static_cast<int>(group);
  mx::array cols = mx::reshape(columns_array, {N, g, (C / g) * K, P}, s);
  mx::array weights = mx::reshape(mx::astype(w, x.dtype(), s), {1, g, out_channels / g, (C / g) * K}, s);
  mx::Shape out_shape = {N, out_channels};
  for (int64_t d : out_dims) out_shape.push_back(static_cast<int>(d));
  mx::array out = mx::reshape(mx::matmul(weights, cols, s), out_shape, s);
  if (auto bias = ctx.optional_input(3)) {
    mx::Shape b_shape(static_cast<size_t>(rank), 1);
    b_shape[1] = out_channels;
    out = mx::add(out, mx::reshape(*bias, b_shape, s), s);
  }
  return {mx::astype(out, x.dtype(), s)};
}

}  // namespace

void register_detection(OpRegistry& r) {
  r.add({
      // v11 adds nothing to the computation (clarified boxes' format).
      {.op_type = "NonMaxSuppression",
       .domain = kOnnx,
       .since = 10,
       .until = 10,
       .fn = non_max_suppression,
       .host_inputs = {0, 1, 2, 3, 4},
       .eager_only = true,
       .not_differentiable = "integer output"},
      {.op_type = "NonMaxSuppression",
       .domain = kOnnx,
       .since = 11,
       .until = kOpen,
       .fn = non_max_suppression,
       .host_inputs = {0, 1, 2, 3, 4},
       .eager_only = true,
       .not_differentiable = "integer output"},
      // v16 adds coordinate_transformation_mode (default half_pixel; v10
      // behaves as output_half_pixel); v22 bfloat16.
      {.op_type = "RoiAlign",
       .domain = kOnnx,
       .since = 10,
       .until = 15,
       .fn = roi_align<false>,
       .host_inputs = {1, 2}},
      {.op_type = "RoiAlign",
       .domain = kOnnx,
       .since = 16,
       .until = 21,
       .fn = roi_align<true>,
       .host_inputs = {1, 2}},
      {.op_type = "RoiAlign",
       .domain = kOnnx,
       .since = 22,
       .until = kOpen,
       .fn = roi_align<true>,
       .host_inputs = {1, 2}},
      // v22: bfloat16.
      {
          .op_type = "DeformConv",
          .domain = kOnnx,
          .since = 19,
          .until = 21,
          .fn = deform_conv,
      },
      {
          .op_type = "DeformConv",
          .domain = kOnnx,
          .since = 22,
          .until = kOpen,
          .fn = deform_conv,
      },
  });
}

}  // namespace transmuter
