// Shape manipulation operators: Transpose, Reshape, Flatten, Squeeze,
// Unsqueeze, Concat, Split, Shape, Size, Expand, Tile, Pad, DepthToSpace,
// SpaceToDepth. https://onnx.ai/onnx/operators/
//
// Shapes, axes, pads and repeats are read on the host (the rows list those
// inputs in host_inputs); tensor data is only ever composed with mx ops.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/concatenate.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

int rank_of(const mx::array& x) { return static_cast<int>(x.ndim()); }

// Normalizes each axis against `rank` and rejects repeats.
std::vector<int> normalize_axes(const NodeContext& ctx, const std::vector<int64_t>& axes, int rank) {
  std::vector<int> out;
  out.reserve(axes.size());
  for (int64_t axis : axes) {
    int a = ctx.normalize_axis(axis, rank);
    if (std::find(out.begin(), out.end(), a) != out.end()) throw ctx.error("axis ", axis, " is repeated");
    out.push_back(a);
  }
  return out;
}

// Product of shape[begin:end], checked: a lazily broadcast array may have
// dims whose product leaves int64.
int64_t product(const NodeContext& ctx, const mx::Shape& shape, size_t begin, size_t end) {
  return checked_product(ctx, std::vector<int64_t>(shape.begin() + begin, shape.begin() + end),
                         "dims product");
}

// --- Transpose -----------------------------------------------------------------

OpOutputs transpose(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (!ctx.has_attr("perm")) return {mx::transpose(x, ctx.stream())};  // default: reverse the dims
  std::vector<int64_t> perm = ctx.attr_ints("perm");
  if (static_cast<int>(perm.size()) != rank_of(x)) {
    throw ctx.error("perm has ", perm.size(), " entries for an input of rank ", rank_of(x));
  }
  return {mx::transpose(x, normalize_axes(ctx, perm, rank_of(x)), ctx.stream())};
}

// --- Reshape -------------------------------------------------------------------

// ONNX Reshape target: 0 copies the input dim at that position (unless
// allowzero=1, opset 14, where 0 is a real zero), -1 is inferred.
mx::Shape reshape_target(const NodeContext& ctx, const mx::array& x, const std::vector<int64_t>& requested,
                         bool allow_zero) {
  std::vector<int64_t> dims = requested;
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0 && !allow_zero) {
      if (i >= x.ndim())
        throw ctx.error("shape[", i, "] = 0 copies a dim the input (rank ", x.ndim(), ") lacks");
      dims[i] = x.shape(static_cast<int>(i));
    }
    if (dims[i] == -1) {
      if (inferred >= 0) throw ctx.error("shape has more than one -1");
      inferred = static_cast<int>(i);
    } else if (dims[i] < 0) {
      throw ctx.error("shape[", i, "] = ", dims[i], " is invalid");
    } else {
      known = checked_mul(ctx, known, dims[i], "shape product");
    }
  }
  const int64_t total = static_cast<int64_t>(x.size());
  if (inferred >= 0) {
    if (known == 0 || total % known != 0) {
      throw ctx.error("cannot infer the -1 dim: ", total, " elements into a known product of ", known);
    }
    dims[inferred] = total / known;
  } else if (known != total) {
    throw ctx.error("cannot reshape ", total, " elements into a shape of ", known, " elements");
  }
  return to_shape(ctx, dims);
}

// Opset 1-4: shape is an attribute.
OpOutputs reshape_v1(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  return {mx::reshape(x, reshape_target(ctx, x, ctx.attr_ints("shape"), false), ctx.stream())};
}

// Opset 5+: shape is input 1 (host); opset 14 adds allowzero.
OpOutputs reshape_v5(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  bool allow_zero = ctx.attr_int("allowzero", 0) != 0;
  return {mx::reshape(x, reshape_target(ctx, x, ctx.host_ints(1), allow_zero), ctx.stream())};
}

// --- Flatten -------------------------------------------------------------------

// Output is always 2-D: [prod(dims[:axis]), prod(dims[axis:])]; axis is in
// [-r, r] (negative since opset 11).
OpOutputs flatten(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const int rank = rank_of(x);
  int64_t axis = ctx.attr_int("axis", 1);
  if (axis < -rank || axis > rank) throw ctx.error("axis ", axis, " out of range for rank ", rank);
  if (axis < 0) axis += rank;
  const mx::Shape& shape = x.shape();
  mx::Shape out = to_shape(ctx, {product(ctx, shape, 0, axis), product(ctx, shape, axis, shape.size())});
  return {mx::reshape(x, out, ctx.stream())};
}

// --- Squeeze / Unsqueeze -----------------------------------------------------------

mx::array squeeze_axes(const NodeContext& ctx, const mx::array& x, const std::vector<int64_t>& axes) {
  std::vector<int> normalized = normalize_axes(ctx, axes, rank_of(x));
  for (int a : normalized) {
    if (x.shape(a) != 1) throw ctx.error("cannot squeeze axis ", a, " of size ", x.shape(a));
  }
  return mx::squeeze(x, normalized, ctx.stream());
}

// Without axes (or with an empty list, as ONNX Runtime reads it) every
// 1-dim goes.
mx::array squeeze_listed_or_all(const NodeContext& ctx, const mx::array& x,
                                const std::vector<int64_t>& axes) {
  if (axes.empty()) return mx::squeeze(x, ctx.stream());
  return squeeze_axes(ctx, x, axes);
}

// Opset 1-12: axes attribute.
OpOutputs squeeze_v1(NodeContext& ctx) {
  return {squeeze_listed_or_all(ctx, ctx.input(0), ctx.attr_ints("axes"))};
}

// Opset 13+: axes is optional input 1 (host).
OpOutputs squeeze_v13(NodeContext& ctx) {
  std::vector<int64_t> axes = ctx.has_input(1) ? ctx.host_ints(1) : std::vector<int64_t>{};
  return {squeeze_listed_or_all(ctx, ctx.input(0), axes)};
}

// Axes index the output, whose rank is input rank + number of axes; they
// may come in any order.
mx::array unsqueeze_axes(const NodeContext& ctx, const mx::array& x, const std::vector<int64_t>& axes) {
  if (rank_of(x) + axes.size() > kMaxRank && !axes.empty()) {
    throw ctx.error(axes.size(), " axes would give rank ", rank_of(x) + axes.size(), ", more than ",
                    kMaxRank);
  }
  const int out_rank = rank_of(x) + static_cast<int>(axes.size());
  return mx::expand_dims(x, normalize_axes(ctx, axes, out_rank), ctx.stream());
}

OpOutputs unsqueeze_v1(NodeContext& ctx) {
  if (!ctx.has_attr("axes")) throw ctx.error("required attribute 'axes' is missing");
  return {unsqueeze_axes(ctx, ctx.input(0), ctx.attr_ints("axes"))};
}

OpOutputs unsqueeze_v13(NodeContext& ctx) { return {unsqueeze_axes(ctx, ctx.input(0), ctx.host_ints(1))}; }

// --- Concat --------------------------------------------------------------------

mx::array concat_inputs(const NodeContext& ctx, int64_t axis) {
  std::vector<mx::array> parts;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) parts.push_back(ctx.input(i));
  if (parts.empty()) throw ctx.error("needs at least one input");
  const int a = ctx.normalize_axis(axis, rank_of(parts[0]));
  // One input is the identity (exports write one before a decoder's cache Concat): no copy.
  if (parts.size() == 1) return parts[0];
  // MLX adds the sizes along the axis in int32.
  int64_t total = 0;
  for (const mx::array& p : parts) total += p.ndim() > static_cast<size_t>(a) ? p.shape(a) : 0;
  to_int32(ctx, total, "concatenated axis size");
  return kernels::concatenate(parts, a, ctx.stream());  // MLX's where the kernel does not fit
}

// Opset 1-3: axis defaults to 1.
OpOutputs concat_v1(NodeContext& ctx) { return {concat_inputs(ctx, ctx.attr_int("axis", 1))}; }
OpOutputs concat_v4(NodeContext& ctx) { return {concat_inputs(ctx, ctx.required_int("axis"))}; }

// --- Split ---------------------------------------------------------------------

OpOutputs split_by_sizes(const NodeContext& ctx, const mx::array& x, int axis,
                         const std::vector<int64_t>& sizes) {
  const int64_t dim = x.shape(axis);
  int64_t total = 0;
  for (int64_t s : sizes) {
    // Bounding each size first keeps the sum from wrapping around to `dim`.
    if (s < 0 || s > dim)
      throw ctx.error("split size ", s, " is out of range for axis ", axis, " of size ", dim);
    total += s;
  }
  if (total != dim) throw ctx.error("split sizes sum to ", total, " but axis ", axis, " has ", dim);
  if (sizes.size() != ctx.num_outputs()) {
    throw ctx.error(sizes.size(), " split sizes for ", ctx.num_outputs(), " outputs");
  }
  OpOutputs out;
  mx::Shape start(x.ndim(), 0);
  mx::Shape stop = x.shape();
  int64_t offset = 0;
  for (int64_t s : sizes) {
    start[axis] = static_cast<int>(offset);
    stop[axis] = static_cast<int>(offset + s);
    out.push_back(mx::slice(x, start, stop, ctx.stream()));
    offset += s;
  }
  return out;
}

// Equal parts: before opset 18 the axis must divide evenly; from 18 the
// parts are ceil(dim / n) long and the last one takes the remainder.
std::vector<int64_t> equal_split(const NodeContext& ctx, int64_t dim, int64_t parts, bool allow_uneven) {
  if (parts <= 0) throw ctx.error("cannot split into ", parts, " parts");
  if (dim % parts == 0) return std::vector<int64_t>(parts, dim / parts);
  if (!allow_uneven) throw ctx.error("axis of size ", dim, " does not split evenly into ", parts, " parts");
  const int64_t chunk = dim / parts + 1;
  std::vector<int64_t> sizes(parts, chunk);
  sizes.back() = dim - chunk * (parts - 1);
  if (sizes.back() < 0) throw ctx.error("axis of size ", dim, " cannot give ", parts, " parts of ", chunk);
  return sizes;
}

OpOutputs split_with(const NodeContext& ctx, std::vector<int64_t> sizes, bool allow_uneven, int64_t parts) {
  const mx::array& x = ctx.input(0);
  int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), rank_of(x));
  if (sizes.empty()) sizes = equal_split(ctx, x.shape(axis), parts, allow_uneven);
  return split_by_sizes(ctx, x, axis, sizes);
}

// Opset 1: sizes from input 1 (host) or the `split` attribute.
OpOutputs split_v1(NodeContext& ctx) {
  std::vector<int64_t> sizes = ctx.has_input(1) ? ctx.host_ints(1) : ctx.attr_ints("split");
  return split_with(ctx, sizes, false, static_cast<int64_t>(ctx.num_outputs()));
}

// Opset 2-12: sizes in the `split` attribute.
OpOutputs split_v2(NodeContext& ctx) {
  return split_with(ctx, ctx.attr_ints("split"), false, static_cast<int64_t>(ctx.num_outputs()));
}

// Opset 13-17: sizes in optional input 1 (host).
OpOutputs split_v13(NodeContext& ctx) {
  std::vector<int64_t> sizes = ctx.has_input(1) ? ctx.host_ints(1) : std::vector<int64_t>{};
  return split_with(ctx, sizes, false, static_cast<int64_t>(ctx.num_outputs()));
}

// Opset 18+: input 1 or the num_outputs attribute (parts may be uneven).
// With neither, the node's output count decides, as in the ONNX reference.
OpOutputs split_v18(NodeContext& ctx) {
  const bool has_sizes = ctx.has_input(1);
  const bool has_count = ctx.has_attr("num_outputs");
  if (has_sizes && has_count) throw ctx.error("input 'split' and attribute 'num_outputs' are exclusive");
  if (has_sizes) return split_with(ctx, ctx.host_ints(1), true, 0);
  const auto outputs = static_cast<int64_t>(ctx.num_outputs());
  int64_t parts = ctx.attr_int("num_outputs", outputs);
  if (parts != outputs) throw ctx.error("num_outputs = ", parts, " but the node has ", outputs, " outputs");
  return split_with(ctx, {}, true, parts);
}

// --- Shape / Size ----------------------------------------------------------------

mx::array int64_vector(const std::vector<int64_t>& values) {
  return mx::array(values.begin(), mx::Shape{static_cast<int>(values.size())}, mx::int64);
}

// Opset 15 adds start/end (python-style, clamped to [0, rank]); before, the
// attributes are absent and the defaults give the full shape.
OpOutputs shape(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const int64_t rank = rank_of(x);
  auto clamp_dim = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
  int64_t start = clamp_dim(ctx.attr_int("start", 0));
  int64_t end = clamp_dim(ctx.attr_int("end", rank));
  std::vector<int64_t> dims;
  for (int64_t i = start; i < end; ++i) dims.push_back(x.shape(static_cast<int>(i)));
  return {int64_vector(dims)};
}

OpOutputs size(NodeContext& ctx) { return {mx::array(static_cast<int64_t>(ctx.input(0).size()), mx::int64)}; }

// --- Expand / Tile ------------------------------------------------------------------

// Expand broadcasts both ways: a 1 in `shape` keeps the input's dim.
OpOutputs expand(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  std::vector<int64_t> target = ctx.host_ints(1);
  const size_t out_rank = std::max(target.size(), x.ndim());
  std::vector<int64_t> out(out_rank, 1);
  for (size_t i = 0; i < out_rank; ++i) {
    int64_t a = i + x.ndim() >= out_rank ? x.shape(static_cast<int>(i + x.ndim() - out_rank)) : 1;
    int64_t b = i + target.size() >= out_rank ? target[i + target.size() - out_rank] : 1;
    if (a != b && a != 1 && b != 1) throw ctx.error("cannot broadcast dim ", a, " to ", b);
    out[i] = a == 1 ? b : a;
  }
  return {mx::broadcast_to(x, to_shape(ctx, out), ctx.stream())};
}

std::vector<int> repeats_vector(const NodeContext& ctx, const std::vector<int64_t>& repeats,
                                const mx::Shape& shape) {
  const int rank = static_cast<int>(shape.size());
  if (static_cast<int>(repeats.size()) != rank) {
    throw ctx.error(repeats.size(), " repeats for an input of rank ", rank);
  }
  std::vector<int> reps;
  for (int i = 0; i < rank; ++i) {
    const int64_t r = repeats[i];
    if (r < 0) throw ctx.error("repeat ", r, " is negative");
    // MLX multiplies each dim by its repeat in int32.
    to_int32(ctx, checked_mul(ctx, shape[i], r, "tiled dim"), "tiled dim");
    reps.push_back(static_cast<int>(r));
  }
  return reps;
}

// Opset 1-5: inputs (input, tiles, axis) repeat along one axis.
OpOutputs tile_v1(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  std::vector<int64_t> repeats(x.ndim(), 1);
  repeats[ctx.normalize_axis(ctx.host_int(2), rank_of(x))] = ctx.host_int(1);
  return {mx::tile(x, repeats_vector(ctx, repeats, x.shape()), ctx.stream())};
}

OpOutputs tile_v6(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  return {mx::tile(x, repeats_vector(ctx, ctx.host_ints(1), x.shape()), ctx.stream())};
}

// --- Pad -----------------------------------------------------------------------

struct AxisPad {
  int64_t begin = 0;
  int64_t end = 0;
};

// ONNX pad lists are [x1_begin, x2_begin, ..., x1_end, x2_end, ...] over
// `axes` (all axes when empty; opset 18 adds the axes input).
std::vector<AxisPad> pads_per_axis(const NodeContext& ctx, const std::vector<int64_t>& pads,
                                   const std::vector<int64_t>& axes, int rank) {
  std::vector<int64_t> all_axes = axes;
  if (all_axes.empty()) {
    for (int i = 0; i < rank; ++i) all_axes.push_back(i);
  }
  if (pads.size() != 2 * all_axes.size()) {
    throw ctx.error("pads has ", pads.size(), " values for ", all_axes.size(), " axes");
  }
  std::vector<int> normalized = normalize_axes(ctx, all_axes, rank);
  std::vector<AxisPad> out(rank);
  for (size_t i = 0; i < normalized.size(); ++i) {
    out[normalized[i]] = {pads[i], pads[i + normalized.size()]};
  }
  return out;
}

// Source index along an axis of size n for output position j of a padded
// axis (numpy.pad semantics, which the ONNX reference uses).
int64_t pad_source_index(const std::string& mode, int64_t j, int64_t begin, int64_t n) {
  const int64_t i = j - begin;
  if (mode == "edge") return std::clamp(i, int64_t{0}, n - 1);
  if (mode == "wrap") return ((i % n) + n) % n;
  // reflect: mirror without repeating the edge, period 2(n-1).
  if (n == 1) return 0;
  const int64_t period = 2 * (n - 1);
  const int64_t m = ((i % period) + period) % period;
  return m < n ? m : period - m;
}

// mx::pad with a differentiable pad value. MLX's Pad primitive has a vjp for
// the padded array only (asking for the value's crashes), so the cotangent of
// both is given here: the inner block for x, the sum over the border for value.
mx::array constant_pad(const mx::array& x, const std::vector<int>& axes, const mx::Shape& low,
                       const mx::Shape& high, const mx::array& value, mx::StreamOrDevice s) {
  auto pad = [=](const mx::array& a, const mx::array& v) { return mx::pad(a, axes, low, high, v, "constant", s); };
  auto padded = mx::custom_vjp(
      [=](const std::vector<mx::array>& in) { return std::vector<mx::array>{pad(in[0], in[1])}; },
      [=](const std::vector<mx::array>& in, const std::vector<mx::array>& cotangents, const std::vector<mx::array>&) {
        const mx::array& c = cotangents[0];
        mx::Shape start(in[0].ndim(), 0);
        mx::Shape stop = c.shape();
        for (size_t k = 0; k < axes.size(); ++k) {
          start[axes[k]] = low[k];
          stop[axes[k]] = low[k] + in[0].shape(axes[k]);
        }
        mx::array border = pad(mx::zeros(in[0].shape(), c.dtype(), s), mx::array(1, c.dtype()));
        mx::array value_cotangent = mx::reshape(mx::sum(mx::multiply(c, border, s), s), in[1].shape(), s);
        return std::vector<mx::array>{mx::slice(c, start, stop, s), value_cotangent};
      });
  return padded({x, value})[0];
}

// Negative pads crop (ONNX allows them); positive ones grow the axis.
mx::array pad_tensor(const NodeContext& ctx, mx::array x, const std::vector<AxisPad>& pads,
                     const std::string& mode, const mx::array& value) {
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap") {
    throw ctx.error("unsupported mode '", mode, "'");
  }
  const int rank = rank_of(x);
  mx::Shape start(rank, 0);
  mx::Shape stop = x.shape();
  for (int a = 0; a < rank; ++a) {
    const int64_t n = x.shape(a);
    // Checked before negating: -INT64_MIN does not exist.
    if (pads[a].begin < -n || pads[a].end < -n ||
        std::min<int64_t>(pads[a].begin, 0) + std::min<int64_t>(pads[a].end, 0) < -n) {
      throw ctx.error("pads ", pads[a].begin, ", ", pads[a].end, " remove more than axis ", a, " of size ", n,
                      " holds");
    }
    start[a] = static_cast<int>(std::max<int64_t>(0, -pads[a].begin));
    stop[a] = static_cast<int>(n - std::max<int64_t>(0, -pads[a].end));
  }
  x = mx::slice(x, start, stop, ctx.stream());

  std::vector<int> axes;
  mx::Shape low, high;
  for (int a = 0; a < rank; ++a) {
    int64_t b = std::max<int64_t>(0, pads[a].begin), e = std::max<int64_t>(0, pads[a].end);
    if (b == 0 && e == 0) continue;
    // A pad of 2^32 + 1 must not become 1: the padded size must fit int32.
    const int64_t padded = checked_add(ctx, checked_add(ctx, x.shape(a), b, "padded size"), e, "padded size");
    to_int32(ctx, padded, str("padded size of axis ", a));
    axes.push_back(a);
    low.push_back(static_cast<int>(b));
    high.push_back(static_cast<int>(e));
  }
  if (axes.empty()) return x;
  if (mode == "constant")
    return constant_pad(x, axes, low, high, mx::astype(value, x.dtype(), ctx.stream()), ctx.stream());

  // Non-constant modes gather existing entries: the source index of every
  // output position is known on the host.
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t n = x.shape(axes[k]);
    if (n == 0) throw ctx.error("cannot ", mode, "-pad the empty axis ", axes[k]);
    std::vector<int32_t> source;
    for (int64_t j = 0; j < low[k] + n + high[k]; ++j) {
      source.push_back(static_cast<int32_t>(pad_source_index(mode, j, low[k], n)));
    }
    mx::array index(source.begin(), mx::Shape{static_cast<int>(source.size())}, mx::int32);
    x = mx::take(x, index, axes[k], ctx.stream());
  }
  return x;
}

// Opset 1: `paddings` attribute, float `value`.
OpOutputs pad_v1(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto pads = pads_per_axis(ctx, ctx.attr_ints("paddings"), {}, rank_of(x));
  return {
      pad_tensor(ctx, x, pads, ctx.attr_string("mode", "constant"), mx::array(ctx.attr_float("value", 0.f)))};
}

// Opset 2-10: `pads` attribute, float `value`.
OpOutputs pad_v2(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto pads = pads_per_axis(ctx, ctx.attr_ints("pads"), {}, rank_of(x));
  return {
      pad_tensor(ctx, x, pads, ctx.attr_string("mode", "constant"), mx::array(ctx.attr_float("value", 0.f)))};
}

// Opset 11+: pads input 1 (host), constant_value input 2 (a tensor, may be
// traced), axes input 3 (host, opset 18); wrap mode from opset 19.
OpOutputs pad_v11(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  std::vector<int64_t> axes = ctx.has_input(3) ? ctx.host_ints(3) : std::vector<int64_t>{};
  auto pads = pads_per_axis(ctx, ctx.host_ints(1), axes, rank_of(x));
  mx::array value = ctx.has_input(2) ? mx::reshape(ctx.input(2), {}, ctx.stream()) : mx::array(0);
  return {pad_tensor(ctx, x, pads, ctx.attr_string("mode", "constant"), value)};
}

// --- DepthToSpace / SpaceToDepth ----------------------------------------------------------

struct BlockLayout {
  int n, c, h, w, block;
};

BlockLayout block_layout(const NodeContext& ctx, const mx::array& x) {
  if (x.ndim() != 4) throw ctx.error("input must be 4-D [N, C, H, W], got rank ", x.ndim());
  int64_t block = ctx.required_int("blocksize");
  if (block <= 0 || block > std::numeric_limits<int32_t>::max())
    throw ctx.error("blocksize ", block, " is invalid");
  return {x.shape(0), x.shape(1), x.shape(2), x.shape(3), static_cast<int>(block)};
}

// Mode DCR (default; the only mode before opset 11) or CRD; see the ONNX spec's
// reshape/transpose formulation.
OpOutputs depth_to_space(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const auto [n, c, h, w, b] = block_layout(ctx, x);
  // b * b in int64: in int32 it overflows (to 0 for b = 65536) long before b
  // exceeds any channel count.
  const int64_t square = int64_t{b} * b;
  if (c % square != 0) throw ctx.error("channels ", c, " not divisible by blocksize^2 = ", square);
  const int depth = static_cast<int>(c / square);
  const int out_h = to_int32(ctx, int64_t{h} * b, "output height");
  const int out_w = to_int32(ctx, int64_t{w} * b, "output width");
  const std::string mode = ctx.attr_string("mode", "DCR");
  mx::array t = x;
  if (mode == "DCR") {
    t = mx::transpose(mx::reshape(x, {n, b, b, depth, h, w}, ctx.stream()), {0, 3, 4, 1, 5, 2}, ctx.stream());
  } else if (mode == "CRD") {
    t = mx::transpose(mx::reshape(x, {n, depth, b, b, h, w}, ctx.stream()), {0, 1, 4, 2, 5, 3}, ctx.stream());
  } else {
    throw ctx.error("unsupported mode '", mode, "'");
  }
  return {mx::reshape(t, {n, depth, out_h, out_w}, ctx.stream())};
}

// Mode attribute since opset 28 (DCR before).
OpOutputs space_to_depth(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const auto [n, c, h, w, b] = block_layout(ctx, x);
  if (h % b != 0 || w % b != 0)
    throw ctx.error("spatial dims ", h, "x", w, " not divisible by blocksize ", b);
  const int out_c = to_int32(ctx, checked_mul(ctx, int64_t{c} * b, b, "output channels"), "output channels");
  const std::string mode = ctx.attr_string("mode", "DCR");
  mx::array t = mx::reshape(x, {n, c, h / b, b, w / b, b}, ctx.stream());
  if (mode == "DCR") {
    t = mx::transpose(t, {0, 3, 5, 1, 2, 4}, ctx.stream());
  } else if (mode == "CRD") {
    t = mx::transpose(t, {0, 1, 3, 5, 2, 4}, ctx.stream());
  } else {
    throw ctx.error("unsupported mode '", mode, "'");
  }
  return {mx::reshape(t, {n, out_c, h / b, w / b}, ctx.stream())};
}

// ONNX allows string tensors here; they are not routed through mx ops yet.
constexpr std::string_view kNoStrings = "no string tensors";

}  // namespace

void register_shape(OpRegistry& r) {
  r.add({
      {"Transpose", kOnnx, 1, kOpen, transpose, {}, false, kNoStrings},
      {"Reshape", kOnnx, 1, 4, reshape_v1, {}, false, kNoStrings},
      {"Reshape", kOnnx, 5, kOpen, reshape_v5, {1}, false, kNoStrings},
      {"Flatten", kOnnx, 1, kOpen, flatten, {}, false, kNoStrings},
      {"Squeeze", kOnnx, 1, 12, squeeze_v1, {}, false, kNoStrings},
      {"Squeeze", kOnnx, 13, kOpen, squeeze_v13, {1}, false, kNoStrings},
      {"Unsqueeze", kOnnx, 1, 12, unsqueeze_v1, {}, false, kNoStrings},
      {"Unsqueeze", kOnnx, 13, kOpen, unsqueeze_v13, {1}, false, kNoStrings},
      {"Concat", kOnnx, 1, 3, concat_v1, {}, false, kNoStrings},
      {"Concat", kOnnx, 4, kOpen, concat_v4, {}, false, kNoStrings},
      {"Split", kOnnx, 1, 1, split_v1, {1}, false, kNoStrings},
      {"Split", kOnnx, 2, 12, split_v2, {}, false, kNoStrings},
      {"Split", kOnnx, 13, 17, split_v13, {1}, false, kNoStrings},
      {"Split", kOnnx, 18, kOpen, split_v18, {1}, false, kNoStrings},
      {.op_type = "Shape", .domain = kOnnx, .since = 1, .until = kOpen, .fn = shape,
       .restrictions = kNoStrings, .not_differentiable = "integer output", .reads_only_shapes = true},
      {.op_type = "Size", .domain = kOnnx, .since = 1, .until = kOpen, .fn = size,
       .restrictions = kNoStrings, .not_differentiable = "integer output", .reads_only_shapes = true},
      {"Expand", kOnnx, 8, kOpen, expand, {1}, false, kNoStrings},
      {"Tile", kOnnx, 1, 5, tile_v1, {1, 2}, false, kNoStrings},
      {"Tile", kOnnx, 6, kOpen, tile_v6, {1}, false, kNoStrings},
      {"Pad", kOnnx, 1, 1, pad_v1, {}, false, kNoStrings},
      {"Pad", kOnnx, 2, 10, pad_v2, {}, false, kNoStrings},
      {"Pad", kOnnx, 11, 17, pad_v11, {1}, false, kNoStrings},
      {"Pad", kOnnx, 18, kOpen, pad_v11, {1, 3}, false, kNoStrings},
      {"DepthToSpace", kOnnx, 1, kOpen, depth_to_space, {}, false, kNoStrings},
      {"SpaceToDepth", kOnnx, 1, kOpen, space_to_depth, {}, false, kNoStrings},
  });
}

}  // namespace transmuter
