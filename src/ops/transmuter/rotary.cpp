// RotateHalfRotary (ai.transmuter, since 1), made by src/passes/fuse_rotary_embedding.cpp:
//
//   Y = X * Cos + Rotated * Sin
//
//   inputs  0 X, 1 Cos, 2 Sin        (broadcast as Mul and Add broadcast)
//           3 Rotated                the graph's Concat(Neg(X[..., h:]), X[..., :h]) (rotate_half)
//           4-7  starts, ends, axes, steps of the Slice giving X's first part (the Concat's second input)
//           8-11 the same of the Slice giving the negated part (the Concat's first input)
//
// When the two Slices are X[..., :h] and X[..., h:] with h = D / 2 (read on the host: exporters compute
// h from X's shape), the op computes rotate_half itself (src/kernels/cpu/rotary.h), one kernel where the
// export has seven ops, and the Rotated input is never evaluated; otherwise it is the Mul/Mul/Add above
// on the Rotated the graph computed.
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/rotary.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

/** The [begin, end) a Slice (inputs first..first+3 of the node: starts, ends, axes, steps) takes on
 * the last axis of a rank-`rank` tensor whose last axis is `d` long, when it slices that axis alone with
 * step 1; else nullopt. ONNX's clamping: negative bounds count from the end, ends past d stop at d. */
std::optional<std::pair<int64_t, int64_t>> last_axis_range(const NodeContext& ctx, size_t first, size_t rank,
                                                           int64_t d) {
  if (!ctx.has_input(first) || !ctx.has_input(first + 1) || !ctx.has_input(first + 2)) return std::nullopt;
  const std::vector<int64_t> starts = ctx.host_ints(first), ends = ctx.host_ints(first + 1);
  const std::vector<int64_t> axes = ctx.host_ints(first + 2);
  if (starts.size() != 1 || ends.size() != 1 || axes.size() != 1) return std::nullopt;
  if (axes[0] != -1 && axes[0] != static_cast<int64_t>(rank) - 1) return std::nullopt;
  if (ctx.has_input(first + 3) && ctx.host_ints(first + 3) != std::vector<int64_t>{1}) return std::nullopt;
  auto clamp = [d](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + d : i, 0, d); };
  return std::pair{clamp(starts[0]), clamp(ends[0])};
}

OpOutputs rotate_half_rotary(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array &x = ctx.input(0), &cos = ctx.input(1), &sin = ctx.input(2);
  if (x.ndim() >= 1 && x.shape(-1) % 2 == 0) {
    const int64_t d = x.shape(-1);
    auto first = last_axis_range(ctx, 4, x.ndim(), d), negated = last_axis_range(ctx, 8, x.ndim(), d);
    if (first == std::pair<int64_t, int64_t>{0, d / 2} && negated == std::pair<int64_t, int64_t>{d / 2, d})
      return {kernels::rotate_half_rotary(x, cos, sin, s)};
  }
  const mx::array& rotated = ctx.input(3);
  return {mx::add(mx::multiply(x, cos, s), mx::multiply(rotated, sin, s), s)};
}

}  // namespace

void register_transmuter_rotary(OpRegistry& r) {
  r.add({
      {"RotateHalfRotary", kTransmuter, 1, kOpen, rotate_half_rotary, {4, 5, 6, 7, 8, 9, 10, 11}},
  });
}

}  // namespace transmuter
