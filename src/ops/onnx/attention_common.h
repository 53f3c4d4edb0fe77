// Rotary-embedding pieces shared by the ONNX RotaryEmbedding
// (src/ops/onnx/attention.cpp) and ONNX Runtime's contrib RotaryEmbedding and
// GroupQueryAttention (src/ops/microsoft/rotary_embedding.cpp, attention.cpp).
#pragma once

#include <string_view>

#include <mlx/mlx.h>

#include "ops/node_context.h"

namespace transmuter {

namespace mx = mlx::core;

/** Rotary embedding of the first 2 * cos.shape(-1) features of x's last axis:
 * pairs (x1, x2) become (x1 cos - x2 sin, x1 sin + x2 cos); the pairs are the
 * two halves [x1 | x2] of the rotated features, or neighbours (x1, x2, x1, x2,
 * ...) when `interleaved`. The other features pass unchanged.
 *   x: rank 4, [.., D]   cos, sin: broadcastable to x's shape with last axis R/2,
 *   R <= D even. Computed in the promoted dtype of x and cos. */
inline mx::array rotate_pairs(const mx::array& x, const mx::array& cos, const mx::array& sin,
                              bool interleaved, mx::StreamOrDevice s = {}) {
  const int half = cos.shape(-1), dim = 2 * half, head = x.shape(3);
  mx::Shape start = {0, 0, 0, 0}, stop = x.shape();
  stop[3] = dim;
  mx::array rotated = mx::slice(x, start, stop, s);
  mx::array x1 = rotated, x2 = rotated;
  if (interleaved) {
    mx::Shape pairs = rotated.shape();
    pairs.back() = half;
    pairs.push_back(2);
    std::vector<mx::array> parts = mx::split(mx::reshape(rotated, pairs, s), 2, 4, s);
    x1 = mx::squeeze(parts[0], 4, s);
    x2 = mx::squeeze(parts[1], 4, s);
  } else {
    std::vector<mx::array> parts = mx::split(rotated, 2, 3, s);
    x1 = parts[0];
    x2 = parts[1];
  }
  mx::array real = mx::subtract(mx::multiply(x1, cos, s), mx::multiply(x2, sin, s), s);
  mx::array imag = mx::add(mx::multiply(x1, sin, s), mx::multiply(x2, cos, s), s);
  mx::Shape out_shape = real.shape();
  out_shape.back() = dim;
  mx::array out = interleaved ? mx::reshape(mx::stack({real, imag}, -1, s), out_shape, s)
                              : mx::concatenate({real, imag}, 3, s);
  if (dim < head) {
    start[3] = dim;
    out = mx::concatenate({out, mx::astype(mx::slice(x, start, x.shape(), s), out.dtype(), s)}, 3, s);
  }
  return out;
}

/** Rows `positions` (any integer shape) of a 2-D [max_positions, R/2]
 * cos/sin cache. Known positions are checked; traced ones are clamped into
 * the cache (docs/architecture.md, "Bad values"). */
inline mx::array cache_rows(const NodeContext& ctx, const mx::array& cache, const mx::array& positions,
                            std::string_view name) {
  auto s = ctx.stream();
  const int rows = cache.shape(0);
  mx::array index = mx::astype(positions, mx::int64, s);
  if (index.size() == 0) return mx::take(cache, index, 0, s);
  if (rows == 0) throw ctx.error(name, " has no positions to index");
  if (!index.is_tracer()) {
    mx::array low = mx::min(index, false, s), high = mx::max(index, false, s);
    mx::eval({low, high});
    const int64_t lowest = low.item<int64_t>(), highest = high.item<int64_t>();
    if (lowest < 0 || highest >= rows) {
      throw ctx.error("position id ", lowest < 0 ? lowest : highest, " out of range for ", name, " with ",
                      rows, " positions");
    }
  } else {
    index = mx::clip(index, mx::array(int64_t{0}), mx::array(int64_t{rows} - 1), s);
  }
  return mx::take(cache, index, 0, s);
}

}  // namespace transmuter
