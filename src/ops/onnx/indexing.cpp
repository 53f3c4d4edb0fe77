// Indexing operators: Slice, Gather, GatherElements, GatherND, ScatterND,
// ScatterElements (and the deprecated Scatter), Trilu, OneHot, NonZero.
// https://onnx.ai/onnx/operators/
//
// Index tensors are data (they may be traced under compilation), so negative
// indices are wrapped with mx ops, never on the host. Slice bounds, Trilu's k
// and OneHot's depth are host inputs.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <mlx/mlx.h>

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
  mx::array negative = mx::less(index, mx::array(0, index.dtype()), s);
  return mx::where(negative, mx::add(index, mx::array(dim, index.dtype()), s), index, s);
}

void require_integer_indices(const NodeContext& ctx, const mx::array& index) {
  if (!mx::issubdtype(index.dtype(), mx::integer)) {
    throw ctx.error("indices must be int32 or int64, got ", index.dtype());
  }
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
  const mx::array& indices = ctx.input(1);
  require_integer_indices(ctx, indices);
  int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), rank_of(data));
  mx::array wrapped = wrap_negative(indices, data.shape(axis), ctx.stream());
  return {mx::take(data, wrapped, axis, ctx.stream())};
}

// out[i][j][k] = data[i][indices[i][j][k]][k] (axis 1). Indices have the
// data's rank but may be shorter on the other axes, which mx::take_along_axis
// would try to broadcast, so the data is cut to the indices' extent first.
OpOutputs gather_elements(NodeContext& ctx) {
  const mx::array& data = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  require_integer_indices(ctx, indices);
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
  mx::array wrapped = wrap_negative(indices, data.shape(axis), ctx.stream());
  return {mx::take_along_axis(cut, wrapped, axis, ctx.stream())};
}

// Coordinates that address every element of an index tensor of `shape`
// along axis `d`: arange(shape[d]) laid out on axis d, broadcastable.
mx::array axis_coordinates(const mx::Shape& shape, int d, mx::Dtype dtype, mx::StreamOrDevice s) {
  mx::Shape layout(shape.size(), 1);
  layout[d] = shape[d];
  return mx::reshape(mx::arange(0, shape[d], 1, dtype, s), layout, s);
}

// Splits the last dim of ND indices [..., k] into k wrapped coordinate arrays
// of shape [...], for data axes first_axis .. first_axis + k - 1.
std::vector<mx::array> nd_coordinates(const mx::array& data, const mx::array& indices, int first_axis,
                                      mx::StreamOrDevice s) {
  const int k = indices.shape(-1);
  std::vector<mx::array> coords;
  for (int i = 0; i < k; ++i) {
    mx::array c = mx::take(indices, i, rank_of(indices) - 1, s);
    coords.push_back(wrap_negative(c, data.shape(first_axis + i), s));
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
    coords.push_back(axis_coordinates(tuple_shape, j, indices.dtype(), ctx.stream()));
    axes.push_back(j);
  }
  for (mx::array& c : nd_coordinates(data, indices, batch, ctx.stream())) {
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
  const int rank = rank_of(data);
  if (rank_of(indices) != rank || indices.shape() != updates.shape()) {
    throw ctx.error("indices and updates must share one shape of the data's rank");
  }
  int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), rank);
  std::vector<mx::array> coords;
  std::vector<int> axes;
  for (int d = 0; d < rank; ++d) {
    coords.push_back(d == axis ? wrap_negative(indices, data.shape(axis), ctx.stream())
                               : axis_coordinates(indices.shape(), d, indices.dtype(), ctx.stream()));
    axes.push_back(d);
  }
  // mx::scatter takes one update slice per index: here 1x...x1.
  mx::Shape update_shape = indices.shape();
  update_shape.insert(update_shape.end(), rank, 1);
  mx::array slices = mx::reshape(mx::astype(updates, data.dtype(), ctx.stream()), update_shape, ctx.stream());
  return {scatter_for(ctx)(data, coords, slices, axes, ctx.stream())};
}

// ScatterND: updates[i...] replaces the slice data[indices[i..., :]], of
// shape data.shape[k:], where k = indices.shape[-1].
OpOutputs scatter_nd(NodeContext& ctx) {
  const mx::array& data = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  const mx::array& updates = ctx.input(2);
  require_integer_indices(ctx, indices);
  const int r = rank_of(data);
  const int k = indices.ndim() > 0 ? indices.shape(-1) : 0;
  if (k < 1 || k > r) throw ctx.error("index tuples of length ", k, " do not fit data of rank ", r);
  mx::Shape tuple_shape(indices.shape().begin(), indices.shape().end() - 1);
  mx::Shape expected = tuple_shape;
  expected.insert(expected.end(), data.shape().begin() + k, data.shape().end());
  if (updates.shape() != expected)
    throw ctx.error("updates shape does not match indices.shape[:-1] + data.shape[k:]");

  std::vector<int> axes(k);
  for (int i = 0; i < k; ++i) axes[i] = i;
  mx::Shape slice_shape = tuple_shape;
  slice_shape.insert(slice_shape.end(), k, 1);
  slice_shape.insert(slice_shape.end(), data.shape().begin() + k, data.shape().end());
  mx::array slices = mx::reshape(mx::astype(updates, data.dtype(), ctx.stream()), slice_shape, ctx.stream());
  return {scatter_for(ctx)(data, nd_coordinates(data, indices, 0, ctx.stream()), slices, axes, ctx.stream())};
}

// --- Trilu / OneHot / NonZero ------------------------------------------------------------

// Keeps the upper (upper=1) or lower triangle of the last two dims, shifted
// by the diagonal offset k (optional host input 1).
OpOutputs trilu(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.ndim() < 2) throw ctx.error("input must have rank >= 2, got ", x.ndim());
  int64_t k = ctx.has_input(1) ? ctx.host_int(1) : 0;
  // Offsets beyond the matrix act like the matrix edge; keep them in int32.
  const int64_t limit = static_cast<int64_t>(x.shape(-2)) + x.shape(-1) + 1;
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
  return {mx::array(coords.begin(), mx::Shape{rank, static_cast<int>(count)}, mx::int64)};
}

// ONNX allows string tensors here; they are not routed through mx ops yet.
constexpr std::string_view kNoStrings = "no string tensors";

}  // namespace

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
