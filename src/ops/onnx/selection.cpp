// Selecting and reordering elements by data: Compress, Unique, ReverseSequence.
// https://onnx.ai/onnx/operators/onnx__Compress.html (and the others)
//
// Compress and Unique have output shapes that depend on values, so they run
// eagerly and read the values that decide the shape on the host; the output
// values themselves are gathered from the input with mx::take, so gradients
// still reach the input. ReverseSequence is a gather whose indices come from
// the (possibly traced) sequence lengths.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

mx::array int64_vector(const std::vector<int64_t>& v) {
  return mx::array(v.data(), {static_cast<int>(v.size())}, mx::int64);
}

mx::array int32_indices(const std::vector<int64_t>& v) {
  std::vector<int32_t> narrow(v.begin(), v.end());
  return mx::array(narrow.data(), {static_cast<int>(narrow.size())}, mx::int32);
}

// --- Compress ------------------------------------------------------------------

// The slices of `input` along `axis` (the flattened input without one) where
// `condition` is true; `condition` may be shorter than the axis.
OpOutputs compress(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& input = ctx.input(0);
  const mx::array& condition = ctx.input(1);
  if (condition.ndim() != 1) throw ctx.error("condition must be 1-D, got rank ", condition.ndim());
  const bool has_axis = ctx.has_attr("axis");
  mx::array data = has_axis ? input : mx::flatten(input, s);
  const int axis = has_axis ? ctx.normalize_axis(ctx.attr_int("axis", 0), static_cast<int>(input.ndim())) : 0;
  std::vector<int64_t> flags = ctx.host_ints(1);
  if (static_cast<int64_t>(flags.size()) > data.shape(axis)) {
    throw ctx.error("condition has ", flags.size(), " entries, more than the ", data.shape(axis),
                    " along axis ", axis);
  }
  std::vector<int64_t> kept;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] != 0) kept.push_back(static_cast<int64_t>(i));
  }
  return {mx::take(data, int32_indices(kept), axis, s)};
}

// --- Unique ----------------------------------------------------------------------

struct UniqueGroups {
  std::vector<int64_t> first;    // per unique slice: index of its first occurrence
  std::vector<int64_t> inverse;  // per input slice: index of its unique slice
  std::vector<int64_t> counts;   // per unique slice
};

// A total order on keys: NaN after every number and equal to NaN (as
// numpy.unique sorts and merges them), so sorting never sees an unordered pair.
template <typename Key>
bool key_less(Key a, Key b) {
  if constexpr (std::is_floating_point_v<Key>) {
    if (std::isnan(a) || std::isnan(b)) return !std::isnan(a);
  }
  return a < b;
}
template <typename Key>
bool key_equal(Key a, Key b) {
  if constexpr (std::is_floating_point_v<Key>) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  }
  return a == b;
}

// Groups the `rows` rows of width `width` in `keys` by equality; unique rows
// in ascending lexicographic order (`sorted`) or in order of first occurrence.
template <typename Key>
UniqueGroups group_rows(const std::vector<Key>& keys, int64_t rows, int64_t width, bool sorted) {
  auto row = [&](int64_t r) { return keys.begin() + r * width; };
  auto less = [&](int64_t a, int64_t b) {
    return std::lexicographical_compare(row(a), row(a) + width, row(b), row(b) + width, key_less<Key>);
  };
  auto equal = [&](int64_t a, int64_t b) {
    return std::equal(row(a), row(a) + width, row(b), key_equal<Key>);
  };
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), less);

  UniqueGroups g;
  g.inverse.resize(static_cast<size_t>(rows));
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || !equal(order[i - 1], order[i])) {
      g.first.push_back(order[i]);  // the stable sort puts the first occurrence first
      g.counts.push_back(0);
    }
    g.inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(g.first.size()) - 1;
    ++g.counts.back();
  }
  if (sorted) return g;
  // Renumber the groups by first occurrence.
  std::vector<int64_t> by_first(g.first.size());
  std::iota(by_first.begin(), by_first.end(), 0);
  std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return g.first[a] < g.first[b]; });
  std::vector<int64_t> renumbered(by_first.size());
  for (size_t k = 0; k < by_first.size(); ++k)
    renumbered[static_cast<size_t>(by_first[k])] = static_cast<int64_t>(k);
  UniqueGroups out;
  for (int64_t k : by_first) {
    out.first.push_back(g.first[static_cast<size_t>(k)]);
    out.counts.push_back(g.counts[static_cast<size_t>(k)]);
  }
  for (int64_t k : g.inverse) out.inverse.push_back(renumbered[static_cast<size_t>(k)]);
  return out;
}

/** The values of `a` on the host as T (int64 for integers and bool, double for floats). */
template <typename T>
std::vector<T> host_values(const mx::array& a) {
  mx::array flat = mx::flatten(
      mx::astype(a, std::is_integral_v<T> ? mx::int64 : mx::float64, mx::Device::cpu), mx::Device::cpu);
  flat = mx::contiguous(flat, false, mx::Device::cpu);
  mx::eval(flat);
  return std::vector<T>(flat.data<T>(), flat.data<T>() + flat.size());
}

// Outputs: Y (the unique values or slices), indices (first occurrences),
// inverse_indices, counts. Without `axis` the input is flattened.
OpOutputs unique(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const bool has_axis = ctx.has_attr("axis");
  mx::array data = has_axis ? x : mx::flatten(x, s);
  const int axis = has_axis ? ctx.normalize_axis(ctx.attr_int("axis", 0), static_cast<int>(x.ndim())) : 0;
  const int64_t rows = data.shape(axis);
  // Rows as [rows, width] for comparison, the unique axis first.
  mx::array as_rows = mx::reshape(mx::moveaxis(data, axis, 0, s), {static_cast<int>(rows), -1}, s);
  const int64_t width = rows == 0 ? 0 : static_cast<int64_t>(as_rows.size()) / rows;
  const bool sorted = ctx.attr_int("sorted", 1) != 0;
  const bool integral = mx::issubdtype(x.dtype(), mx::integer) || x.dtype() == mx::bool_;
  UniqueGroups g = integral ? group_rows(host_values<int64_t>(as_rows), rows, width, sorted)
                            : group_rows(host_values<double>(as_rows), rows, width, sorted);
  return {mx::take(data, int32_indices(g.first), axis, s), int64_vector(g.first), int64_vector(g.inverse),
          int64_vector(g.counts)};
}

// --- ReverseSequence -------------------------------------------------------------------

// Reverses the first sequence_lens[b] elements along time_axis of each batch
// entry b; the rest stay in place. Lengths beyond the time axis are clamped.
OpOutputs reverse_sequence(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& lengths = ctx.input(1);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 2) throw ctx.error("input must have rank >= 2, got ", rank);
  const int64_t batch_axis = ctx.attr_int("batch_axis", 1);
  const int64_t time_axis = ctx.attr_int("time_axis", 0);
  if (!((batch_axis == 0 && time_axis == 1) || (batch_axis == 1 && time_axis == 0))) {
    throw ctx.error("batch_axis and time_axis must be 0 and 1 in some order, got ", batch_axis, " and ",
                    time_axis);
  }
  const int steps = x.shape(static_cast<int>(time_axis));
  const int batch = x.shape(static_cast<int>(batch_axis));
  if (lengths.ndim() != 1 || lengths.shape(0) != batch) {
    throw ctx.error("sequence_lens must have shape [", batch, "], got rank ", lengths.ndim());
  }
  if (!mx::issubdtype(lengths.dtype(), mx::integer))
    throw ctx.error("sequence_lens must be an integer tensor");
  // index[t, b] = t < len[b] ? len[b] - 1 - t : t, laid out as [T, B] or [B, T].
  if (!lengths.is_tracer()) {  // traced lengths beyond the time axis act as its size
    for (int64_t length : ctx.host_ints(1)) {
      if (length < 0 || length > steps)
        throw ctx.error("sequence length ", length, " outside [0, ", steps, "]");
    }
  }
  mx::array len = mx::minimum(mx::astype(lengths, mx::int32, s), mx::array(steps), s);
  mx::array t = mx::reshape(mx::arange(steps, mx::int32, s), {steps, 1}, s);
  len = mx::reshape(len, {1, batch}, s);
  mx::array index =
      mx::where(mx::less(t, len, s), mx::subtract(mx::subtract(len, mx::array(1), s), t, s), t, s);
  if (time_axis == 1) index = mx::transpose(index, s);
  mx::Shape expanded = index.shape();
  expanded.resize(static_cast<size_t>(rank), 1);
  index = mx::broadcast_to(mx::reshape(index, expanded, s), x.shape(), s);
  return {mx::take_along_axis(x, index, static_cast<int>(time_axis), s)};
}

constexpr std::string_view kNoStrings = "no string tensors";

}  // namespace

void register_selection(OpRegistry& r) {
  r.add({
      // v11 allows a negative axis; v28 widens the types.
      {.op_type = "Compress",
       .domain = kOnnx,
       .since = 9,
       .until = 10,
       .fn = compress,
       .host_inputs = {1},
       .eager_only = true,
       .restrictions = kNoStrings},
      {.op_type = "Compress",
       .domain = kOnnx,
       .since = 11,
       .until = 27,
       .fn = compress,
       .host_inputs = {1},
       .eager_only = true,
       .restrictions = kNoStrings},
      {.op_type = "Compress",
       .domain = kOnnx,
       .since = 28,
       .until = kOpen,
       .fn = compress,
       .host_inputs = {1},
       .eager_only = true,
       .restrictions = kNoStrings},
      {.op_type = "Unique",
       .domain = kOnnx,
       .since = 11,
       .until = 27,
       .fn = unique,
       .host_inputs = {0},
       .eager_only = true,
       .restrictions = kNoStrings},
      {.op_type = "Unique",
       .domain = kOnnx,
       .since = 28,
       .until = kOpen,
       .fn = unique,
       .host_inputs = {0},
       .eager_only = true,
       .restrictions = kNoStrings},
      {.op_type = "ReverseSequence",
       .domain = kOnnx,
       .since = 10,
       .until = 27,
       .fn = reverse_sequence,
       .restrictions = kNoStrings},
      {.op_type = "ReverseSequence",
       .domain = kOnnx,
       .since = 28,
       .until = kOpen,
       .fn = reverse_sequence,
       .restrictions = kNoStrings},
  });
}

}  // namespace transmuter
