// Operators that create tensors: Constant, ConstantOfShape, Range, EyeLike.
// https://onnx.ai/onnx/operators/ (Constant, ConstantOfShape, Range, EyeLike)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"
#include "transmuter/dtype.h"

namespace transmuter {
namespace {

mx::array vector_array(const std::vector<int64_t>& v) {
  return mx::array(v.begin(), {static_cast<int>(v.size())}, mx::int64);
}
mx::array vector_array(const std::vector<float>& v) {
  return mx::array(v.begin(), {static_cast<int>(v.size())}, mx::float32);
}

// Constant holds its value in exactly one attribute: `value` (a tensor, string
// tensors stay StringTensor), or from opset 12 one of value_float(s),
// value_int(s), value_string(s). Scalars are 0-d, lists 1-d.
OpOutputs constant(NodeContext& ctx) {
  if (ctx.has_attr("value")) return {ctx.attr_tensor("value")};
  if (ctx.has_attr("value_float")) return {mx::array(ctx.attr_float("value_float", 0))};
  if (ctx.has_attr("value_floats")) return {vector_array(ctx.attr_floats("value_floats"))};
  if (ctx.has_attr("value_int")) return {mx::array(ctx.attr_int("value_int", 0), mx::int64)};
  if (ctx.has_attr("value_ints")) return {vector_array(ctx.attr_ints("value_ints"))};
  if (ctx.has_attr("value_string")) return {StringTensor{{}, {ctx.attr_string("value_string", "")}}};
  if (ctx.has_attr("value_strings")) {
    std::vector<std::string> strings = ctx.attr_strings("value_strings");
    return {StringTensor{{static_cast<int64_t>(strings.size())}, strings}};
  }
  if (ctx.has_attr("sparse_value")) throw ctx.error("sparse_value is not supported");
  throw ctx.error("has none of the value attributes");
}

// ConstantOfShape: the shape comes from input 0 (read on the host); the
// one-element `value` tensor gives value and dtype (default float32 0).
OpOutputs constant_of_shape(NodeContext& ctx) {
  mx::Shape shape = to_shape(ctx, ctx.host_ints(0));
  if (!ctx.has_attr("value")) return {mx::zeros(shape, mx::float32, ctx.stream())};
  const mx::array& value = ctx.attr_tensor("value").tensor();
  if (value.size() != 1) throw ctx.error("attribute 'value' must hold one element, got ", value.size());
  return {mx::full(shape, mx::reshape(value, {}, ctx.stream()), ctx.stream())};
}

/** Element count of Range: max(ceil((limit - start) / delta), 0). */
int range_count(const NodeContext& ctx, double start, double limit, double delta) {
  if (delta == 0) throw ctx.error("delta must not be zero");
  double count = std::max(std::ceil((limit - start) / delta), 0.0);
  if (!(count <= std::numeric_limits<int32_t>::max())) throw ctx.error("would produce ", count, " elements");
  return static_cast<int>(count);
}

// Range: start, limit and delta are scalars read on the host; the output has
// their dtype. Element i is start + i * delta, computed in int64 or float64
// and then converted, which is at least as exact as Range-27's float32 stash
// for float16/bfloat16.
OpOutputs range(NodeContext& ctx) {
  mx::Dtype dtype = ctx.input(0).dtype();
  if (mx::issubdtype(dtype, mx::integer)) {
    int64_t start = ctx.host_int(0), limit = ctx.host_int(1), delta = ctx.host_int(2);
    if (delta == 0) throw ctx.error("delta must not be zero");
    // Integer ceil division, exact beyond 2^53; in 128 bits because
    // limit - start of INT64_MAX and INT64_MIN does not fit in 64.
    const __int128 span = static_cast<__int128>(limit) - start;
    __int128 count = span / delta + ((span % delta != 0 && (span < 0) == (delta < 0)) ? 1 : 0);
    if (count < 0) count = 0;
    if (count > std::numeric_limits<int32_t>::max()) {
      throw ctx.error("would produce more than 2^31 - 1 elements (start ", start, ", limit ", limit,
                      ", delta ", delta, ")");
    }
    // Built lazily (the runtime's memory check sees the size before anything
    // is allocated) in uint64, whose wrap-around is defined: i * delta may
    // leave int64 where start + i * delta, inside [start, limit), does not.
    auto s = ctx.stream();
    mx::array steps = mx::arange(0, static_cast<double>(count), 1, mx::uint64, s);
    mx::array offsets = mx::multiply(steps, mx::array(static_cast<uint64_t>(delta), mx::uint64), s);
    mx::array values = mx::add(offsets, mx::array(static_cast<uint64_t>(start), mx::uint64), s);
    return {mx::astype(values, dtype, s)};
  }
  double start = ctx.host_double(0), limit = ctx.host_double(1), delta = ctx.host_double(2);
  int count = range_count(ctx, start, limit, delta);
  // float64 is CPU-only in MLX; the step indices are exact integers.
  mx::array steps = mx::arange(0, count, 1, mx::float64, mx::Device::cpu);
  mx::array out =
      mx::add(mx::array(start, mx::float64),
              mx::multiply(steps, mx::array(delta, mx::float64), mx::Device::cpu), mx::Device::cpu);
  return {mx::astype(out, dtype, ctx.stream())};
}

// EyeLike: ones on diagonal `k` of a 2-D tensor shaped like input 0, of the
// `dtype` attribute's type (default: the input's).
OpOutputs eye_like(NodeContext& ctx) {
  const mx::array& like = ctx.input(0);
  if (like.ndim() != 2) throw ctx.error("input must be 2-D, got rank ", like.ndim());
  mx::Dtype dtype = like.dtype();
  if (ctx.has_attr("dtype")) {
    auto type = static_cast<OnnxType>(ctx.attr_int("dtype", 0));
    std::optional<mx::Dtype> mapped = to_mlx_dtype(type);
    if (!mapped) throw ctx.error("unsupported dtype ", onnx_type_name(type));
    dtype = *mapped;
  }
  // A diagonal beyond the matrix leaves it all zeros; keep it in int32.
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(like.shape(0)) + like.shape(1),
                                          std::numeric_limits<int32_t>::max());
  const int k = static_cast<int>(std::clamp(ctx.attr_int("k", 0), -limit, limit));
  return {mx::eye(like.shape(0), like.shape(1), k, dtype, ctx.stream())};
}

}  // namespace

void register_generator(OpRegistry& r) {
  constexpr std::string_view kFromHost = "computed on the host from host inputs";
  r.add({
      // Later versions only add attributes (value_*, sparse_value) and types.
      {"Constant", kOnnx, 1, kOpen, constant, {}, false, {}, "no inputs: the value is an attribute"},
      {"ConstantOfShape", kOnnx, 9, kOpen, constant_of_shape, {0}, false, {}, kFromHost},
      // Range 27 adds `stash_type`; computing in 64 bits covers both.
      {"Range", kOnnx, 11, 26, range, {0, 1, 2}, false, {}, kFromHost},
      {"Range", kOnnx, 27, kOpen, range, {0, 1, 2}, false, {}, kFromHost},
      {"EyeLike", kOnnx, 9, kOpen, eye_like, {}, false, {}, "depends only on the input's shape"},
  });
}

}  // namespace transmuter
