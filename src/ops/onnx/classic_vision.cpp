// Operators of early convolutional networks: LRN (AlexNet),
// MeanVarianceNormalization, MaxUnpool.
// https://onnx.ai/onnx/operators/onnx__LRN.html (and the others)
#include <algorithm>
#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

mx::array scalar_like(const mx::array& like, double v) { return mx::array(v, like.dtype()); }

// --- LRN ------------------------------------------------------------------------

// y = x / (bias + alpha / size * square_sum)^beta, square_sum over the channels
// [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] clipped to [0, C):
// a sum of shifted slices of the zero-padded squares. Only shifts that reach
// a real channel for some c are summed (at most 2C - 1 of them).
OpOutputs lrn(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  if (x.ndim() < 3) throw ctx.error("input must have rank >= 3 ([N, C, D1, ...]), got ", x.ndim());
  if (!mx::issubdtype(x.dtype(), mx::floating))
    throw ctx.error("input must be a float tensor, got ", x.dtype());
  const int64_t size = ctx.required_int("size");
  if (size < 1) throw ctx.error("size must be positive, got ", size);
  const float alpha = ctx.attr_float("alpha", 1e-4f);
  const float beta = ctx.attr_float("beta", 0.75f);
  const float bias = ctx.attr_float("bias", 1.0f);
  const int channels = x.shape(1);
  const int64_t before = (size - 1) / 2;

  // Channel c + k - before of the squares, zero outside [0, C), summed over k.
  mx::array wide = mx::astype(x, mx::float32, s);
  mx::array squares = mx::square(wide, s);
  std::optional<mx::array> square_sum;
  const int64_t first = std::max<int64_t>(0, before - (channels - 1));
  const int64_t last = std::min<int64_t>(size - 1, before + channels - 1);
  for (int64_t k = first; k <= last; ++k) {
    const int shift = static_cast<int>(k - before);  // in (-C, C)
    std::vector<std::pair<int, int>> pads(x.ndim(), {0, 0});
    pads[1] = {std::max(-shift, 0), std::max(shift, 0)};
    mx::Shape start(x.ndim(), 0), stop = x.shape();
    start[1] = std::max(shift, 0);
    stop[1] = std::min(channels, channels + shift);
    mx::array shifted = mx::pad(mx::slice(squares, start, stop, s), pads, mx::array(0.0f), "constant", s);
    square_sum = square_sum ? mx::add(*square_sum, shifted, s) : shifted;
  }
  if (!square_sum) square_sum = mx::zeros_like(squares, s);  // no channels
  mx::array scale =
      mx::add(mx::multiply(*square_sum, mx::array(alpha / static_cast<float>(size)), s), mx::array(bias), s);
  mx::array y = mx::divide(wide, mx::power(scale, mx::array(beta), s), s);
  return {mx::astype(y, x.dtype(), s)};
}

// --- MeanVarianceNormalization ------------------------------------------------------

// (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9) over `axes`, as the spec's
// function body computes it.
OpOutputs mean_variance_normalization(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  if (!mx::issubdtype(x.dtype(), mx::floating))
    throw ctx.error("input must be a float tensor, got ", x.dtype());
  const int rank = static_cast<int>(x.ndim());
  std::vector<int> axes;
  for (int64_t a : ctx.attr_ints("axes", {0, 2, 3})) axes.push_back(ctx.normalize_axis(a, rank));
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) throw ctx.error("axes has a repeated axis");
  mx::array mean = mx::mean(x, axes, true, s);
  mx::array mean_of_squares = mx::mean(mx::square(x, s), axes, true, s);
  mx::array std_dev = mx::sqrt(mx::subtract(mean_of_squares, mx::square(mean, s), s), s);
  mx::array y = mx::divide(mx::subtract(x, mean, s), mx::add(std_dev, scalar_like(x, 1e-9), s), s);
  return {mx::astype(y, x.dtype(), s)};
}

// --- MaxUnpool ------------------------------------------------------------------------

// Scatters X into a zero tensor at the flat positions in I (MaxPool's
// Indices: row-major over the whole unpooled tensor). The output's spatial
// size is (in - 1) * stride + kernel - pad_begin - pad_end, zero-padded up to
// output_shape when that is given.
// Indices known on the host must address the output; traced ones (under
// compile) outside it are dropped (sent to a scratch element that is cut
// off), so they never write out of bounds.
OpOutputs max_unpool(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 3) throw ctx.error("X must have rank >= 3 ([N, C, D1, ...]), got ", rank);
  if (indices.shape() != x.shape()) throw ctx.error("I must have X's shape");
  if (!mx::issubdtype(indices.dtype(), mx::integer)) throw ctx.error("I must be an integer tensor");
  const size_t spatial = static_cast<size_t>(rank - 2);
  std::vector<int64_t> kernel = ctx.attr_ints("kernel_shape");
  if (kernel.size() != spatial)
    throw ctx.error("kernel_shape must have ", spatial, " entries, got ", kernel.size());
  std::vector<int64_t> strides = ctx.attr_ints("strides", std::vector<int64_t>(spatial, 1));
  std::vector<int64_t> pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * spatial, 0));
  if (strides.size() != spatial || pads.size() != 2 * spatial)
    throw ctx.error("strides or pads have the wrong length");

  std::vector<int64_t> out_dims = {x.shape(0), x.shape(1)};
  for (size_t i = 0; i < spatial; ++i) {
    if (kernel[i] < 1 || strides[i] < 1 || pads[i] < 0 || pads[i + spatial] < 0) {
      throw ctx.error("kernel_shape and strides must be positive and pads non-negative");
    }
    int64_t dim = checked_mul(ctx, x.shape(static_cast<int>(i) + 2) - 1, strides[i], "output size");
    dim = checked_add(ctx, dim, kernel[i] - pads[i] - pads[i + spatial], "output size");
    out_dims.push_back(dim);
  }
  // output_shape only widens the result: the indices address the inferred
  // shape, which is zero-padded at the end of each axis (the ONNX reference).
  std::optional<std::vector<int64_t>> requested;
  if (ctx.has_input(2)) {
    requested = ctx.host_ints(2);
    bool fits = requested->size() == static_cast<size_t>(rank);
    for (size_t i = 0; fits && i < requested->size(); ++i) fits = (*requested)[i] >= out_dims[i];
    if (!fits || (*requested)[0] != x.shape(0) || (*requested)[1] != x.shape(1)) {
      throw ctx.error("output_shape must have rank ", rank,
                      ", X's batch and channel dims and spatial dims no smaller ", "than the inferred ones");
    }
  }
  mx::Shape out_shape = to_shape(ctx, out_dims);
  const int64_t total = checked_product(ctx, out_dims, "output size");
  const int scratch = to_int32(ctx, total, "output size");  // the index one past the end

  if (!indices.is_tracer()) {  // known indices are checked; traced ones out of range are dropped
    for (int64_t i : ctx.host_ints(1)) {
      if (i < 0 || i >= total) throw ctx.error("index ", i, " out of range for ", total, " output elements");
    }
  }
  mx::array flat_index = mx::flatten(mx::astype(indices, mx::int64, s), s);
  mx::array valid = mx::logical_and(mx::greater_equal(flat_index, mx::array(int64_t{0}), s),
                                    mx::less(flat_index, mx::array(total), s), s);
  mx::array target = mx::where(valid, mx::astype(flat_index, mx::int32, s), mx::array(scratch), s);
  mx::array updates = mx::reshape(mx::flatten(x, s), {-1, 1}, s);
  mx::array out = mx::scatter(mx::zeros({scratch + 1}, x.dtype(), s), target, updates, 0, s);
  out = mx::slice(out, {0}, {scratch}, s);
  out = mx::reshape(out, out_shape, s);
  if (!requested) return {out};
  std::vector<std::pair<int, int>> widen;
  for (size_t i = 0; i < static_cast<size_t>(rank); ++i) {
    widen.push_back({0, to_int32(ctx, (*requested)[i] - out_dims[i], "output_shape")});
  }
  to_shape(ctx, *requested);
  return {mx::pad(out, widen, mx::array(0, x.dtype()), "constant", s)};
}

}  // namespace

void register_classic_vision(OpRegistry& r) {
  r.add({
      // v13: bfloat16.
      {.op_type = "LRN", .domain = kOnnx, .since = 1, .until = 12, .fn = lrn},
      {.op_type = "LRN", .domain = kOnnx, .since = 13, .until = kOpen, .fn = lrn},
      {.op_type = "MeanVarianceNormalization",
       .domain = kOnnx,
       .since = 9,
       .until = 12,
       .fn = mean_variance_normalization},
      {.op_type = "MeanVarianceNormalization",
       .domain = kOnnx,
       .since = 13,
       .until = kOpen,
       .fn = mean_variance_normalization},
      // v11: output_shape documented as the full shape; v22: bfloat16.
      {.op_type = "MaxUnpool",
       .domain = kOnnx,
       .since = 9,
       .until = 10,
       .fn = max_unpool,
       .host_inputs = {2}},
      {.op_type = "MaxUnpool",
       .domain = kOnnx,
       .since = 11,
       .until = 21,
       .fn = max_unpool,
       .host_inputs = {2}},
      {.op_type = "MaxUnpool",
       .domain = kOnnx,
       .since = 22,
       .until = kOpen,
       .fn = max_unpool,
       .host_inputs = {2}},
  });
}

}  // namespace transmuter
