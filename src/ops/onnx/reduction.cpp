// Reductions (ReduceSum, ReduceMean, ... ReduceLogSumExp), ArgMax/ArgMin,
// CumSum and TopK.
// https://onnx.ai/onnx/operators/onnx__ReduceSum.html (and the other Reduce* pages)
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/reduce.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// --- Reduce* ------------------------------------------------------------------

enum class Reduction { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

// Where a Reduce op reads its axes: an attribute in early versions, an
// optional host input (with noop_with_empty_axes) from ReduceSum v13 and the
// other Reduce ops v18.
enum class AxesFrom { kAttribute, kInput };

bool is_integral(mx::Dtype dtype) { return mx::issubdtype(dtype, mx::integer) || dtype == mx::bool_; }

// The smallest value of `dtype`: the identity of max (-inf for floats).
mx::array lowest_of(mx::Dtype dtype) {
  if (dtype == mx::bool_) return mx::array(false);
  if (mx::issubdtype(dtype, mx::inexact)) return mx::array(-std::numeric_limits<double>::infinity(), dtype);
  return mx::array(mx::iinfo(dtype).min, dtype);
}

// The largest value of `dtype`: the identity of min (+inf for floats).
mx::array highest_of(mx::Dtype dtype) {
  if (dtype == mx::bool_) return mx::array(true);
  if (mx::issubdtype(dtype, mx::inexact)) return mx::array(std::numeric_limits<double>::infinity(), dtype);
  return mx::array(mx::iinfo(dtype).max, dtype);
}

// The value of a reduction over an empty set, as the ONNX spec gives it
// ("Reduction over an empty set of values yields ...").
mx::array empty_set_value(Reduction kind, mx::Dtype dtype) {
  switch (kind) {
    case Reduction::kMax:
      return lowest_of(dtype);
    case Reduction::kMin:
      return highest_of(dtype);
    case Reduction::kProd:
      return mx::array(1, dtype);
    case Reduction::kLogSum:
    case Reduction::kLogSumExp:
      return mx::array(-std::numeric_limits<double>::infinity(), dtype);
    case Reduction::kMean:
      return mx::array(std::numeric_limits<double>::quiet_NaN(), dtype);
    default:
      return mx::array(0, dtype);
  }
}

// Sorted, de-duplicated, non-negative axes to reduce. An empty result means
// "reduce nothing" (noop_with_empty_axes).
std::vector<int> reduction_axes(const NodeContext& ctx, AxesFrom from, int rank) {
  std::vector<int64_t> raw;
  bool noop_when_empty = false;
  if (from == AxesFrom::kAttribute) {
    raw = ctx.attr_ints("axes");
  } else {
    if (ctx.has_input(1)) raw = ctx.host_ints(1);
    noop_when_empty = ctx.attr_int("noop_with_empty_axes", 0) != 0;
  }
  std::vector<int> axes;
  if (raw.empty()) {
    if (noop_when_empty) return axes;
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (int64_t a : raw) axes.push_back(ctx.normalize_axis(a, rank));
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  return axes;
}

mx::Shape reduced_shape(const mx::array& x, const std::vector<int>& axes, bool keepdims) {
  mx::Shape shape;
  for (int i = 0; i < static_cast<int>(x.ndim()); ++i) {
    bool reduced = std::binary_search(axes.begin(), axes.end(), i);
    if (!reduced) {
      shape.push_back(x.shape(i));
    } else if (keepdims) {
      shape.push_back(1);
    }
  }
  return shape;
}

// `x` itself, or as float32 when integral (for sqrt and log). MLX builds
// graphs lazily, so an unused cast costs nothing at evaluation.
mx::array as_floating(const mx::array& x, mx::StreamOrDevice s) {
  return is_integral(x.dtype()) ? mx::astype(x, mx::float32, s) : x;
}

// Mean of integers as the reference computes it (numpy mean with an integer
// dtype): the exact integer sum divided by the count, truncated toward zero.
mx::array integer_mean(const mx::array& x, const std::vector<int>& axes, bool keepdims,
                       mx::StreamOrDevice s) {
  int64_t count = 1;
  for (int a : axes) count *= x.shape(a);
  mx::array sum = mx::sum(mx::astype(x, mx::int64, s), axes, keepdims, s);
  mx::array n = mx::array(count, mx::int64);
  mx::array toward_zero = mx::negative(mx::floor_divide(mx::negative(sum, s), n, s), s);
  return mx::where(mx::less(sum, mx::array(int64_t{0}), s), toward_zero, mx::floor_divide(sum, n, s), s);
}

// The reduction proper, for a non-empty set of values along non-empty `axes`.
// Integer inputs are reduced exactly for sum, mean, max, min, prod, L1 and
// sum of squares, and through float32 for L2 and the logarithms; the caller
// casts the result back to the input dtype.
mx::array reduce_values(Reduction kind, const mx::array& x, const std::vector<int>& axes, bool keepdims,
                        mx::StreamOrDevice s) {
  mx::array xf = as_floating(x, s);
  switch (kind) {
    // float32 sums and means through the CPU kernel where it fits (kernels/cpu/reduce.h), else MLX's.
    case Reduction::kSum:
      return kernels::sum_over_axes(x, axes, keepdims, /*mean=*/false, s);
    case Reduction::kMean:
      return is_integral(x.dtype()) ? integer_mean(x, axes, keepdims, s)
                                    : kernels::sum_over_axes(x, axes, keepdims, /*mean=*/true, s);
    case Reduction::kMax:
      return mx::max(x, axes, keepdims, s);
    case Reduction::kMin:
      return mx::min(x, axes, keepdims, s);
    case Reduction::kProd:
      return mx::prod(x, axes, keepdims, s);
    case Reduction::kL1:
      return mx::sum(mx::abs(x, s), axes, keepdims, s);
    case Reduction::kL2:
      return mx::sqrt(mx::sum(mx::square(xf, s), axes, keepdims, s), s);
    case Reduction::kLogSum:
      return mx::log(mx::sum(xf, axes, keepdims, s), s);
    case Reduction::kLogSumExp:
      return mx::logsumexp(xf, axes, keepdims, s);
    case Reduction::kSumSquare:
      return mx::sum(mx::square(x, s), axes, keepdims, s);
  }
  return x;
}

// A reduction over no axes: the elementwise part of the op alone
// (ReduceSumSquare -> x*x, ReduceL2 -> |x|, ReduceLogSum -> log x ...), as the
// reference implementation computes it for noop_with_empty_axes.
mx::array reduce_nothing(Reduction kind, const mx::array& x, mx::StreamOrDevice s) {
  switch (kind) {
    case Reduction::kL1:
    case Reduction::kL2:
      return mx::abs(x, s);
    case Reduction::kLogSum:
      return mx::log(as_floating(x, s), s);
    case Reduction::kSumSquare:
      return mx::square(x, s);
    default:
      return x;
  }
}

template <Reduction kKind, AxesFrom kFrom>
OpOutputs reduce(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  const bool keepdims = ctx.attr_int("keepdims", 1) != 0;
  std::vector<int> axes = reduction_axes(ctx, kFrom, static_cast<int>(x.ndim()));
  if (axes.empty()) return {mx::astype(reduce_nothing(kKind, x, s), x.dtype(), s)};

  bool empty_set = std::any_of(axes.begin(), axes.end(), [&](int a) { return x.shape(a) == 0; });
  if (empty_set) {
    return {mx::full(reduced_shape(x, axes, keepdims), empty_set_value(kKind, x.dtype()), x.dtype(), s)};
  }
  return {mx::astype(reduce_values(kKind, x, axes, keepdims, s), x.dtype(), s)};
}

// --- ArgMax / ArgMin ------------------------------------------------------------

// ArgMax/ArgMin return int64 indices (MLX gives uint32). select_last_index
// (v12) picks the last of equal extremes: reduce the reversed axis and map
// the index back.
template <bool kMax>
OpOutputs arg_extreme(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  const int rank = static_cast<int>(x.ndim());
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), rank);
  const bool keepdims = ctx.attr_int("keepdims", 1) != 0;
  const bool last = ctx.attr_int("select_last_index", 0) != 0;
  const int n = rank == 0 ? 1 : x.shape(axis);
  if (n == 0) throw ctx.error("cannot take the arg", kMax ? "max" : "min", " of an empty axis");

  mx::array input = x;
  if (last) input = mx::take(x, mx::arange(n - 1, -1, -1, mx::int32, s), axis, s);
  mx::array index = kMax ? mx::argmax(input, axis, keepdims, s) : mx::argmin(input, axis, keepdims, s);
  index = mx::astype(index, mx::int64, s);
  if (last) index = mx::subtract(mx::array(int64_t{n - 1}), index, s);
  return {index};
}

// --- CumSum ----------------------------------------------------------------------

// CumSum and CumProd: the axis is host input 1; `exclusive` shifts in the
// identity, `reverse` scans from the end.
template <mx::array (*Scan)(const mx::array&, int, bool, bool, mx::StreamOrDevice)>
OpOutputs cumulative(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  const int axis = ctx.normalize_axis(ctx.host_int(1), static_cast<int>(x.ndim()));
  const bool exclusive = ctx.attr_int("exclusive", 0) != 0;
  const bool reverse = ctx.attr_int("reverse", 0) != 0;
  return {mx::astype(Scan(x, axis, reverse, !exclusive, s), x.dtype(), s)};
}

// --- TopK ------------------------------------------------------------------------

// A key whose ascending order is the descending order of `x`, so that one
// stable ascending argsort serves `largest` and keeps equal values in index
// order (the ONNX tie-break). ~x reverses integer order without the overflow
// of -x at the minimum value.
mx::array descending_key(const mx::array& x, mx::StreamOrDevice s) {
  if (is_integral(x.dtype())) return mx::bitwise_invert(x, s);
  return mx::negative(x, s);
}

// TopK: k is an attribute before v10 and host input 1 after; `largest` and
// `sorted` arrived in v11. Both outputs are sorted (also when sorted=0, where
// any order is allowed); indices are int64.
template <bool kKFromInput>
OpOutputs topk(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  const int rank = static_cast<int>(x.ndim());
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", -1), rank);
  const int64_t k = kKFromInput ? ctx.host_int(1) : ctx.required_int("k");
  const int n = x.shape(axis);
  if (k < 0 || k > n) throw ctx.error("k = ", k, " is out of range for axis ", axis, " of size ", n);
  const bool largest = ctx.attr_int("largest", 1) != 0;

  mx::array order = mx::argsort(largest ? descending_key(x, s) : x, axis, s);
  mx::Shape start(rank, 0);
  mx::Shape stop = x.shape();
  stop[axis] = static_cast<int>(k);
  mx::array indices = mx::slice(order, start, stop, s);
  mx::array values = mx::take_along_axis(x, indices, axis, s);
  return {values, mx::astype(indices, mx::int64, s)};
}

}  // namespace

void register_reduction(OpRegistry& r) {
  using R = Reduction;
  constexpr auto kAttr = AxesFrom::kAttribute;
  constexpr auto kInput = AxesFrom::kInput;
  constexpr std::string_view kViaFloat32 = "integer inputs are reduced in float32";
  // Versions within one row differ only in the dtypes they accept (and v11
  // allowing negative axes); the rows split where axes became an input.
  r.add({
      {"ReduceSum", kOnnx, 1, 12, reduce<R::kSum, kAttr>},
      {"ReduceSum", kOnnx, 13, kOpen, reduce<R::kSum, kInput>, {1}},
      {"ReduceMean", kOnnx, 1, 17, reduce<R::kMean, kAttr>},
      {"ReduceMean", kOnnx, 18, kOpen, reduce<R::kMean, kInput>, {1}},
      {"ReduceMax", kOnnx, 1, 17, reduce<R::kMax, kAttr>},
      {"ReduceMax", kOnnx, 18, kOpen, reduce<R::kMax, kInput>, {1}},  // v20: bool
      {"ReduceMin", kOnnx, 1, 17, reduce<R::kMin, kAttr>},
      {"ReduceMin", kOnnx, 18, kOpen, reduce<R::kMin, kInput>, {1}},  // v20: bool
      {"ReduceProd", kOnnx, 1, 17, reduce<R::kProd, kAttr>},
      {"ReduceProd", kOnnx, 18, kOpen, reduce<R::kProd, kInput>, {1}},
      {"ReduceL1", kOnnx, 1, 17, reduce<R::kL1, kAttr>},
      {"ReduceL1", kOnnx, 18, kOpen, reduce<R::kL1, kInput>, {1}},
      {"ReduceL2", kOnnx, 1, 17, reduce<R::kL2, kAttr>, {}, false, kViaFloat32},
      {"ReduceL2", kOnnx, 18, kOpen, reduce<R::kL2, kInput>, {1}, false, kViaFloat32},
      {"ReduceLogSum", kOnnx, 1, 17, reduce<R::kLogSum, kAttr>, {}, false, kViaFloat32},
      // v28: floats only
      {"ReduceLogSum", kOnnx, 18, kOpen, reduce<R::kLogSum, kInput>, {1}, false, kViaFloat32},
      {"ReduceLogSumExp", kOnnx, 1, 17, reduce<R::kLogSumExp, kAttr>, {}, false, kViaFloat32},
      // v28: floats only
      {"ReduceLogSumExp", kOnnx, 18, kOpen, reduce<R::kLogSumExp, kInput>, {1}, false, kViaFloat32},
      {"ReduceSumSquare", kOnnx, 1, 17, reduce<R::kSumSquare, kAttr>},
      {"ReduceSumSquare", kOnnx, 18, kOpen, reduce<R::kSumSquare, kInput>, {1}},
      // ArgMax/ArgMin: v11 negative axis, v12 select_last_index, v13 bfloat16.
      {"ArgMax", kOnnx, 1, 11, arg_extreme<true>, {}, false, {}, "integer output"},
      {"ArgMax", kOnnx, 12, kOpen, arg_extreme<true>, {}, false, {}, "integer output"},
      {"ArgMin", kOnnx, 1, 11, arg_extreme<false>, {}, false, {}, "integer output"},
      {"ArgMin", kOnnx, 12, kOpen, arg_extreme<false>, {}, false, {}, "integer output"},
      // CumSum v14 adds float16/bfloat16.
      {"CumSum", kOnnx, 11, kOpen, cumulative<mx::cumsum>, {1}},
      {"CumProd", kOnnx, 26, kOpen, cumulative<mx::cumprod>, {1}},
      {"TopK", kOnnx, 1, 9, topk<false>},
      {"TopK", kOnnx, 10, 10, topk<true>, {1}},
      {"TopK", kOnnx, 11, kOpen, topk<true>, {1}},  // largest, sorted, negative axis; v24: bfloat16
  });
}

}  // namespace transmuter
