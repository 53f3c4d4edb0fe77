// Indexing operators: Slice, Gather, GatherElements, GatherND, ScatterND,
// ScatterElements (and the deprecated Scatter), Trilu, OneHot, NonZero.
// https://onnx.ai/onnx/operators/
//
// Index tensors are data (they may be traced under compilation), so negative
// indices are wrapped with mx ops, never on the host. Slice bounds, Trilu's k
// and OneHot's depth are host inputs.
//
// MLX's take, gather and scatter do not check bounds, so every index goes
// through the checks below first: values known on the host (not tracers:
// initializers, host constants, every eager run) are checked and a bad one is
// an OpError; inside a compiled segment, where values are unknown while
// tracing, gathers clamp each index to the nearest valid one and scatters drop
// out-of-range updates (JAX's defaults). docs/architecture.md, "Bad values".
#include "ops/onnx/indexing.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/take_rows.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

int rank_of(const mx::array& x) { return static_cast<int>(x.ndim()); }

// Negative indices count from the end of an axis of size `dim` (ONNX allows
// them in Gather*, Scatter*, GatherND since opset 11).
mx::array wrap_negative(const mx::array& index, int dim, mx::StreamOrDevice s) {
  if (!mx::issubdtype(index.dtype(), mx::signedinteger) && !mx::issubdtype(index.dtype(), mx::floating)) {
    return index;
  }
  // int8/int16 can hold neither every dim nor index + dim: widen first.
  const mx::array wide = mx::issubdtype(index.dtype(), mx::integer) && index.itemsize() < 4
                             ? mx::astype(index, mx::int32, s)
                             : index;
  mx::array negative = mx::less(wide, mx::array(0, wide.dtype()), s);
  return mx::where(negative, mx::add(wide, mx::array(dim, wide.dtype()), s), wide, s);
}

void require_integer_indices(const NodeContext& ctx, const mx::array& index) {
  if (!mx::issubdtype(index.dtype(), mx::integer)) {
    throw ctx.error("indices must be int32 or int64, got ", index.dtype());
  }
}

// A scalar has no axis to index (normalize_axis accepts axis 0 for rank 0).
void require_data_rank(const NodeContext& ctx, const mx::array& data) {
  if (data.ndim() == 0) throw ctx.error("data must have rank >= 1, got a scalar");
}

// --- Index bounds --------------------------------------------------------------

// `a` as int64; uint64 values beyond int64 saturate (they are out of range
// either way).
mx::array saturated_int64(mx::array a, mx::StreamOrDevice s) {
  if (a.dtype() == mx::uint64) {
    a = mx::minimum(a, mx::array(static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), mx::uint64), s);
  }
  return mx::astype(a, mx::int64, s);
}

// Throws an OpError naming the first index outside [-size, size) (ONNX
// allows negatives down to -size). Column j of `indices` addresses data axis
// axes[j] of size sizes[j]: one column is the whole tensor (Gather*,
// ScatterElements), several are its last dim (GatherND, ScatterND). Only the
// per-column min and max are evaluated, once.
// The per-column extremes of an evaluated, row-contiguous int32 or int64 index table, read where it lies:
// an eager run's input ids need no evaluation on MLX's stream (a round trip to its thread per lookup).
template <typename T>
void column_extremes(const mx::array& indices, int columns, std::vector<int64_t>& low,
                     std::vector<int64_t>& high) {
  const T* data = indices.data<T>();
  const size_t rows = indices.size() / static_cast<size_t>(columns);
  for (size_t r = 0; r < rows; ++r) {
    for (int j = 0; j < columns; ++j) {
      const auto v = static_cast<int64_t>(data[r * static_cast<size_t>(columns) + static_cast<size_t>(j)]);
      low[j] = std::min(low[j], v);
      high[j] = std::max(high[j], v);
    }
  }
}

void check_index_values(const NodeContext& ctx, const mx::array& indices, const std::vector<int>& axes,
                        const std::vector<int>& sizes) {
  if (indices.size() == 0) return;
  auto s = ctx.stream();
  const int columns = static_cast<int>(axes.size());
  std::vector<int64_t> low_of(columns, std::numeric_limits<int64_t>::max()),
      high_of(columns, std::numeric_limits<int64_t>::min());
  const bool readable = indices.status() == mx::array::Status::available && indices.flags().row_contiguous;
  if (readable && indices.dtype() == mx::int64) {
    column_extremes<int64_t>(indices, columns, low_of, high_of);
  } else if (readable && indices.dtype() == mx::int32) {
    column_extremes<int32_t>(indices, columns, low_of, high_of);
  } else {
    mx::array table = mx::reshape(indices, {-1, columns}, s);
    mx::array low = saturated_int64(mx::min(table, 0, false, s), s);
    mx::array high = saturated_int64(mx::max(table, 0, false, s), s);
    mx::eval({low, high});
    std::copy_n(low.data<int64_t>(), columns, low_of.begin());
    std::copy_n(high.data<int64_t>(), columns, high_of.begin());
  }
  for (int j = 0; j < columns; ++j) {
    const int64_t lowest = low_of[j], highest = high_of[j];
    if (highest >= sizes[j] || lowest < -int64_t{sizes[j]}) {
      throw ctx.error("index ", highest >= sizes[j] ? highest : lowest, " out of range for axis ", axes[j],
                      " of size ", sizes[j]);
    }
  }
}

// Traced indices cannot be checked; an empty axis has no index to clamp to.
void require_indexable(const NodeContext& ctx, const mx::array& indices, int axis, int size) {
  if (size == 0 && indices.size() > 0) throw ctx.error("axis ", axis, " of size 0 cannot be indexed");
}

// Traced gather: each index clamped into [-size, size - 1], then wrapped, so
// it always lands in [0, size).
mx::array clamped_index(const mx::array& index, int size, mx::StreamOrDevice s) {
  mx::array i =
      mx::clip(mx::astype(index, mx::int64, s), mx::array(-int64_t{size}), mx::array(int64_t{size} - 1), s);
  return wrap_negative(i, size, s);
}

// Indices for mx::take along one axis of `size`: checked when known, clamped
// when traced.
mx::array bounded_index(const NodeContext& ctx, const mx::array& index, int axis, int size) {
  if (!index.is_tracer()) {
    check_index_values(ctx, index, {axis}, {size});
    return wrap_negative(index, size, ctx.stream());
  }
  require_indexable(ctx, index, axis, size);
  return clamped_index(index, size, ctx.stream());
}

// Traced scatter: where `valid`, the index wrapped into [0, size); elsewhere
// `fallback`, which for the scratch axis is `size`: a slot one past the end
// that the caller pads on and cuts off again, so the update lands nowhere.
mx::array index_or_scratch(const mx::array& index, const mx::array& valid, int size, int fallback,
                           mx::StreamOrDevice s) {
  mx::array i = mx::astype(index, mx::int64, s);
  return mx::where(valid, wrap_negative(i, size, s), mx::array(int64_t{fallback}), s);
}

mx::array in_range(const mx::array& index, int size, mx::StreamOrDevice s) {
  mx::array i = mx::astype(index, mx::int64, s);
  return mx::logical_and(mx::greater_equal(i, mx::array(-int64_t{size}), s),
                         mx::less(i, mx::array(int64_t{size}), s), s);
}

// Scatters into `data` grown by one scratch slot at the end of `axis`, then
// cuts the slot off: the traced scatters' way to drop updates.
mx::array scatter_with_scratch(const NodeContext& ctx, const mx::array& data, int axis,
                               const std::function<mx::array(const mx::array&)>& scatter) {
  auto s = ctx.stream();
  to_int32(ctx, int64_t{data.shape(axis)} + 1, "axis size with a scratch slot");
  mx::array grown = mx::pad(data, {axis}, {0}, {1}, mx::array(0, data.dtype()), "constant", s);
  return mx::slice(scatter(grown), mx::Shape(data.ndim(), 0), data.shape(), s);
}

// --- Slice ----------------------------------------------------------------------

// Clamps one ONNX (start, end, step) triple for an axis of size `dim` as the
// spec says: negatives count from the end; with step > 0 both clamp to
// [0, dim], with step < 0 start clamps to [0, dim-1] and end to [-1, dim-1]
// (-1 meaning "past the front"). INT64_MIN/INT64_MAX sentinels fall out.
struct AxisSlice {
  int start, stop, step;
};

AxisSlice clamp_slice(const NodeContext& ctx, int64_t start, int64_t end, int64_t step, int64_t dim) {
  if (step == 0) throw ctx.error("slice step cannot be 0");
  if (dim == 0) return {0, 0, 1};
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  // A step longer than the axis takes one element either way; keep it in int32.
  step = std::clamp(step, -dim, dim);
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    return {static_cast<int>(start), static_cast<int>(end), static_cast<int>(step)};
  }
  start = std::clamp<int64_t>(start, 0, dim - 1);
  end = std::clamp<int64_t>(end, -1, dim - 1);
  // mx::slice reads a negative stop python-style (from the end): -dim-1
  // is how "before index 0" is spelled.
  int64_t stop = end == -1 ? -dim - 1 : end;
  return {static_cast<int>(start), static_cast<int>(stop), static_cast<int>(step)};
}

mx::array slice_tensor(const NodeContext& ctx, const mx::array& x, const std::vector<int64_t>& starts,
                       const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                       std::vector<int64_t> steps) {
  const int rank = rank_of(x);
  if (starts.size() != ends.size()) throw ctx.error(starts.size(), " starts but ", ends.size(), " ends");
  if (axes.empty()) {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) {
    throw ctx.error("starts, ends, axes and steps must have the same length");
  }
  mx::Shape start(rank, 0), stop = x.shape(), stride(rank, 1);
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < starts.size(); ++i) {
    int a = ctx.normalize_axis(axes[i], rank);
    if (seen[a]) throw ctx.error("axis ", axes[i], " is repeated");
    seen[a] = true;
    AxisSlice s = clamp_slice(ctx, starts[i], ends[i], steps[i], x.shape(a));
    start[a] = s.start;
    stop[a] = s.stop;
    stride[a] = s.step;
  }
  return mx::slice(x, start, stop, stride, ctx.stream());
}

// Opset 1-9: starts, ends, axes are attributes.
OpOutputs slice_v1(NodeContext& ctx) {
  return {slice_tensor(ctx, ctx.input(0), ctx.attr_ints("starts"), ctx.attr_ints("ends"),
                       ctx.attr_ints("axes"), {})};
}

// Opset 10+: starts, ends, axes?, steps? are inputs 1-4 (host).
OpOutputs slice_v10(NodeContext& ctx) {
  std::vector<int64_t> axes = ctx.has_input(3) ? ctx.host_ints(3) : std::vector<int64_t>{};
  std::vector<int64_t> steps = ctx.has_input(4) ? ctx.host_ints(4) : std::vector<int64_t>{};
  return {slice_tensor(ctx, ctx.input(0), ctx.host_ints(1), ctx.host_ints(2), axes, steps)};
}

// --- Gather family --------------------------------------------------------------------

// out = data indexed along `axis` by every entry of `indices`; the output
// shape is data.shape[:axis] + indices.shape + data.shape[axis+1:].
OpOutputs gather(NodeContext& ctx) {
  const mx::array& data = ctx.input(0);
  return {checked_gather(ctx, data, ctx.input(1), ctx.attr_int("axis", 0))};
}

// out[i][j][k] = data[i][indices[i][j][k]][k] (axis 1). Indices have the
// data's rank but may be shorter on the other axes, which mx::take_along_axis
// would try to broadcast, so the data is cut to the indices' extent first.
OpOutputs gather_elements(NodeContext& ctx) {
  const mx::array& data = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  require_integer_indices(ctx, indices);
  require_data_rank(ctx, data);
  const int rank = rank_of(data);
  if (rank_of(indices) != rank)
    throw ctx.error("indices rank ", indices.ndim(), " differs from data rank ", rank);
  int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), rank);
  mx::Shape stop = indices.shape();
  stop[axis] = data.shape(axis);
  for (int a = 0; a < rank; ++a) {
    if (stop[a] > data.shape(a)) throw ctx.error("indices dim ", a, " exceeds the data's");
  }
  mx::array cut = mx::slice(data, mx::Shape(rank, 0), stop, ctx.stream());
  mx::array bounded = bounded_index(ctx, indices, axis, data.shape(axis));
  return {mx::take_along_axis(cut, bounded, axis, ctx.stream())};
}

// Coordinates that address every element of an index tensor of `shape`
// along axis `d`: arange(shape[d]) laid out on axis d, broadcastable.
mx::array axis_coordinates(const mx::Shape& shape, int d, mx::Dtype dtype, mx::StreamOrDevice s) {
  mx::Shape layout(shape.size(), 1);
  layout[d] = shape[d];
  return mx::reshape(mx::arange(0, shape[d], 1, dtype, s), layout, s);
}

// The last dim of ND indices [..., k] as k coordinate arrays of shape [...].
std::vector<mx::array> index_columns(const mx::array& indices, mx::StreamOrDevice s) {
  std::vector<mx::array> columns;
  for (int i = 0; i < indices.shape(-1); ++i)
    columns.push_back(mx::take(indices, i, rank_of(indices) - 1, s));
  return columns;
}

// The data axes first_axis .. first_axis + k - 1 that ND index tuples address.
std::vector<int> tuple_axes(int first_axis, int k) {
  std::vector<int> axes(k);
  for (int i = 0; i < k; ++i) axes[i] = first_axis + i;
  return axes;
}

std::vector<int> sizes_of(const mx::array& data, const std::vector<int>& axes) {
  std::vector<int> sizes;
  for (int a : axes) sizes.push_back(data.shape(a));
  return sizes;
}

// ND index tuples for data axes first_axis .. first_axis + k - 1 as k
// coordinate arrays in range: checked when known, clamped when traced.
std::vector<mx::array> nd_coordinates(const NodeContext& ctx, const mx::array& data, const mx::array& indices,
                                      int first_axis) {
  auto s = ctx.stream();
  const std::vector<int> axes = tuple_axes(first_axis, indices.shape(-1));
  const std::vector<int> sizes = sizes_of(data, axes);
  const bool traced = indices.is_tracer();
  if (!traced) check_index_values(ctx, indices, axes, sizes);
  std::vector<mx::array> coords = index_columns(indices, s);
  for (size_t i = 0; i < coords.size(); ++i) {
    if (traced) require_indexable(ctx, indices, axes[i], sizes[i]);
    mx::array c = mx::astype(coords[i], mx::int64, s);
    coords[i] = traced ? clamped_index(c, sizes[i], s) : wrap_negative(c, sizes[i], s);
  }
  return coords;
}

// GatherND (opset 12 adds batch_dims b): each index tuple indices[..., :]
// picks a slice data[b0..., i0, ..., ik-1, :], with the leading b dims
// shared between data and indices.
OpOutputs gather_nd(NodeContext& ctx) {
  const mx::array& data = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  require_integer_indices(ctx, indices);
  const int r = rank_of(data), q = rank_of(indices);
  const int64_t b = ctx.attr_int("batch_dims", 0);
  if (q < 1 || b < 0 || b >= std::min(q, r))
    throw ctx.error("batch_dims ", b, " invalid for ranks ", r, ", ", q);
  const int batch = static_cast<int>(b);
  const int k = indices.shape(-1);
  if (k < 1 || batch + k > r) throw ctx.error("index tuples of length ", k, " do not fit data of rank ", r);

  mx::Shape tuple_shape(indices.shape().begin(), indices.shape().end() - 1);  // indices.shape[:-1]
  std::vector<mx::array> coords;
  std::vector<int> axes;
  for (int j = 0; j < batch; ++j) {
    if (data.shape(j) != indices.shape(j))
      throw ctx.error("batch dim ", j, " differs between data and indices");
    coords.push_back(axis_coordinates(tuple_shape, j, mx::int64, ctx.stream()));
    axes.push_back(j);
  }
  for (mx::array& c : nd_coordinates(ctx, data, indices, batch)) {
    coords.push_back(c);
    axes.push_back(static_cast<int>(axes.size()));
  }
  mx::Shape slice_sizes(batch + k, 1);
  mx::Shape out_shape = tuple_shape;
  for (int a = batch + k; a < r; ++a) {
    slice_sizes.push_back(data.shape(a));
    out_shape.push_back(data.shape(a));
  }
  mx::array gathered = mx::gather(data, coords, axes, slice_sizes, ctx.stream());
  return {mx::reshape(gathered, out_shape, ctx.stream())};
}

// --- Scatter family --------------------------------------------------------------------

using ScatterFn = mx::array (*)(const mx::array&, const std::vector<mx::array>&, const mx::array&,
                                const std::vector<int>&, mx::StreamOrDevice);

// reduction: none (opset 11), add/mul (16), max/min (18).
ScatterFn scatter_for(const NodeContext& ctx) {
  const std::string reduction = ctx.attr_string("reduction", "none");
  if (reduction == "none") return mx::scatter;
  if (reduction == "add") return mx::scatter_add;
  if (reduction == "mul") return mx::scatter_prod;
  if (reduction == "max") return mx::scatter_max;
  if (reduction == "min") return mx::scatter_min;
  throw ctx.error("unsupported reduction '", reduction, "'");
}

// output[indices[i][j]][j] = updates[i][j] (axis 0): every updates entry goes
// to its own position except along `axis`, where indices say where.
OpOutputs scatter_elements(NodeContext& ctx) {
  const mx::array& data = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  const mx::array& updates = ctx.input(2);
  require_integer_indices(ctx, indices);
  require_data_rank(ctx, data);
  auto s = ctx.stream();
  const int rank = rank_of(data);
  if (rank_of(indices) != rank || indices.shape() != updates.shape()) {
    throw ctx.error("indices and updates must share one shape of the data's rank");
  }
  int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), rank);
  // Off the scatter axis, positions come from the indices' own shape.
  for (int d = 0; d < rank; ++d) {
    if (d != axis && indices.shape(d) > data.shape(d)) {
      throw ctx.error("indices dim ", d, " (", indices.shape(d), ") exceeds the data's (", data.shape(d),
                      ")");
    }
  }
  const int size = data.shape(axis);
  const bool traced = indices.is_tracer();
  if (!traced) check_index_values(ctx, indices, {axis}, {size});
  mx::array positions = traced ? index_or_scratch(indices, in_range(indices, size, s), size, size, s)
                               : wrap_negative(mx::astype(indices, mx::int64, s), size, s);
  std::vector<mx::array> coords;
  std::vector<int> axes;
  for (int d = 0; d < rank; ++d) {
    coords.push_back(d == axis ? positions : axis_coordinates(indices.shape(), d, mx::int64, s));
    axes.push_back(d);
  }
  // mx::scatter takes one update slice per index: here 1x...x1.
  mx::Shape update_shape = indices.shape();
  update_shape.insert(update_shape.end(), rank, 1);
  mx::array slices = mx::reshape(mx::astype(updates, data.dtype(), s), update_shape, s);
  ScatterFn scatter = scatter_for(ctx);
  if (!traced) return {scatter(data, coords, slices, axes, s)};
  return {scatter_with_scratch(
      ctx, data, axis, [&](const mx::array& grown) { return scatter(grown, coords, slices, axes, s); })};
}

// ScatterND: updates[i...] replaces the slice data[indices[i..., :]], of
// shape data.shape[k:], where k = indices.shape[-1].
OpOutputs scatter_nd(NodeContext& ctx) {
  const mx::array& data = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  const mx::array& updates = ctx.input(2);
  require_integer_indices(ctx, indices);
  auto s = ctx.stream();
  const int r = rank_of(data);
  const int k = indices.ndim() > 0 ? indices.shape(-1) : 0;
  if (k < 1 || k > r) throw ctx.error("index tuples of length ", k, " do not fit data of rank ", r);
  mx::Shape tuple_shape(indices.shape().begin(), indices.shape().end() - 1);
  mx::Shape expected = tuple_shape;
  expected.insert(expected.end(), data.shape().begin() + k, data.shape().end());
  if (updates.shape() != expected)
    throw ctx.error("updates shape does not match indices.shape[:-1] + data.shape[k:]");

  const std::vector<int> axes = tuple_axes(0, k);
  mx::Shape slice_shape = tuple_shape;
  slice_shape.insert(slice_shape.end(), k, 1);
  slice_shape.insert(slice_shape.end(), data.shape().begin() + k, data.shape().end());
  mx::array slices = mx::reshape(mx::astype(updates, data.dtype(), s), slice_shape, s);
  ScatterFn scatter = scatter_for(ctx);
  if (!indices.is_tracer()) return {scatter(data, nd_coordinates(ctx, data, indices, 0), slices, axes, s)};
  // An empty tuple axis admits no valid tuple (and no scratch coordinate).
  for (int i = 0; i < k; ++i) {
    if (data.shape(i) == 0) return {data};
  }

  // Traced: a tuple with any coordinate out of range goes to the scratch
  // row of axis 0 (its other coordinates to 0).
  std::vector<mx::array> columns = index_columns(indices, s);
  mx::array valid = mx::array(true);
  for (int i = 0; i < k; ++i) valid = mx::logical_and(valid, in_range(columns[i], data.shape(i), s), s);
  std::vector<mx::array> coords;
  for (int i = 0; i < k; ++i) {
    coords.push_back(index_or_scratch(columns[i], valid, data.shape(i), i == 0 ? data.shape(0) : 0, s));
  }
  return {scatter_with_scratch(
      ctx, data, 0, [&](const mx::array& grown) { return scatter(grown, coords, slices, axes, s); })};
}

// --- Trilu / OneHot / NonZero ------------------------------------------------------------

// Keeps the upper (upper=1) or lower triangle of the last two dims, shifted
// by the diagonal offset k (optional host input 1).
OpOutputs trilu(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.ndim() < 2) throw ctx.error("input must have rank >= 2, got ", x.ndim());
  int64_t k = ctx.has_input(1) ? ctx.host_int(1) : 0;
  // Offsets beyond the matrix act like the matrix edge; keep them in int32
  // (rows + cols + 1 itself may not fit).
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(x.shape(-2)) + x.shape(-1) + 1,
                                          std::numeric_limits<int32_t>::max());
  int diagonal = static_cast<int>(std::clamp(k, -limit, limit));
  bool upper = ctx.attr_int("upper", 1) != 0;
  return {upper ? mx::triu(x, diagonal, ctx.stream()) : mx::tril(x, diagonal, ctx.stream())};
}

// output[..., j, ...] = (indices[...] == j) ? on : off, j on the new `axis`.
// Negative indices in [-depth, -1] wrap; others out of range give all-off
// (the ONNX reference compares in the indices' own dtype).
OpOutputs one_hot(NodeContext& ctx) {
  const mx::array& indices = ctx.input(0);
  const int64_t depth = ctx.host_int(1);
  const mx::array& values = ctx.input(2);
  if (depth < 1 || depth > std::numeric_limits<int32_t>::max())
    throw ctx.error("depth ", depth, " is invalid");
  if (values.size() != 2) throw ctx.error("values must hold [off_value, on_value], got ", values.size());
  const int out_rank = rank_of(indices) + 1;
  int axis = ctx.normalize_axis(ctx.attr_int("axis", -1), out_rank);

  mx::array flat_values = mx::flatten(values, ctx.stream());
  mx::array off = mx::take(flat_values, 0, ctx.stream());
  mx::array on = mx::take(flat_values, 1, ctx.stream());
  // Integer indices compare as int64 so that narrow types (uint8) cannot
  // overflow the class range; float indices compare in their own dtype.
  mx::array ids =
      mx::issubdtype(indices.dtype(), mx::integer) ? mx::astype(indices, mx::int64, ctx.stream()) : indices;
  mx::array wrapped = wrap_negative(ids, static_cast<int>(depth), ctx.stream());
  mx::Shape classes_shape(out_rank, 1);
  classes_shape[axis] = static_cast<int>(depth);
  mx::array classes = mx::reshape(mx::arange(0, static_cast<int>(depth), 1, ids.dtype(), ctx.stream()),
                                  classes_shape, ctx.stream());
  mx::array hits = mx::equal(mx::expand_dims(wrapped, axis, ctx.stream()), classes, ctx.stream());
  return {mx::where(hits, on, off, ctx.stream())};
}

// Coordinates of the non-zero entries, int64 [rank, count] in row-major
// order. The count depends on the data, so this row is eager-only and reads
// its input on the host.
OpOutputs non_zero(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  mx::array flags = mx::contiguous(
      mx::flatten(mx::not_equal(x, mx::zeros({}, x.dtype()), mx::Device::cpu), mx::Device::cpu), false,
      mx::Device::cpu);
  mx::eval(flags);
  const bool* set = flags.data<bool>();
  const int rank = rank_of(x);
  std::vector<int64_t> positions;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (set[i]) positions.push_back(static_cast<int64_t>(i));
  }
  const size_t count = positions.size();
  // A scalar has no axes to report: the result is [0, count] (ONNX reference).
  std::vector<int64_t> coords(static_cast<size_t>(rank) * count);
  for (size_t n = 0; n < count; ++n) {
    int64_t flat = positions[n];
    for (int a = rank - 1; a >= 0; --a) {
      coords[static_cast<size_t>(a) * count + n] = flat % x.shape(a);
      flat /= x.shape(a);
    }
  }
  const int columns = to_int32(ctx, static_cast<int64_t>(count), "non-zero count");
  return {mx::array(coords.begin(), mx::Shape{rank, columns}, mx::int64)};
}

// ONNX allows string tensors here; they are not routed through mx ops yet.
constexpr std::string_view kNoStrings = "no string tensors";

}  // namespace

mx::array checked_gather(const NodeContext& ctx, const mx::array& data, const mx::array& indices,
                         int64_t axis) {
  require_integer_indices(ctx, indices);
  require_data_rank(ctx, data);
  const int normalized = ctx.normalize_axis(axis, rank_of(data));
  const int size = data.shape(normalized);
  if (size == 0)
    return mx::take(data, bounded_index(ctx, indices, normalized, size), normalized, ctx.stream());
  // Checked where the values are known, then one kernel that clamps and wraps each index as the traced
  // path does (kernels/cpu/take_rows.h: an embedding lookup on axis 0, a pooler's first token on axis 1);
  // the traced path is its reference.
  if (!indices.is_tracer()) check_index_values(ctx, indices, {normalized}, {size});
  const mx::Stream s = mx::to_stream(ctx.stream());
  const kernels::Reference reference = [size, normalized, s](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::take(in[0], clamped_index(in[1], size, s), normalized, s)};
  };
  return kernels::take_rows(data, indices, reference, s, normalized);
}

void register_indexing(OpRegistry& r) {
  r.add({
      {"Slice", kOnnx, 1, 9, slice_v1, {}, false, kNoStrings},
      {"Slice", kOnnx, 10, kOpen, slice_v10, {1, 2, 3, 4}, false, kNoStrings},
      {"Gather", kOnnx, 1, kOpen, gather, {}, false, kNoStrings},
      {"GatherElements", kOnnx, 11, kOpen, gather_elements, {}, false, kNoStrings},
      {"GatherND", kOnnx, 11, kOpen, gather_nd, {}, false, kNoStrings},
      // Scatter is the pre-opset-11 name of ScatterElements (deprecated at 11).
      {"Scatter", kOnnx, 9, kOpen, scatter_elements, {}, false, kNoStrings},
      {"ScatterElements", kOnnx, 11, kOpen, scatter_elements, {}, false, kNoStrings},
      {"ScatterND", kOnnx, 11, kOpen, scatter_nd, {}, false, kNoStrings},
      {"Trilu", kOnnx, 14, kOpen, trilu, {1}, false, kNoStrings},
      {"OneHot", kOnnx, 9, kOpen, one_hot, {1}, false, kNoStrings},
      {"NonZero", kOnnx, 9, kOpen, non_zero, {}, true, kNoStrings, "integer output"},
  });
}

}  // namespace transmuter
