// Pieces shared by ONNX Runtime's attention contrib operators: Attention and MultiHeadAttention
// (attention.cpp) and GroupQueryAttention (group_query_attention.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include <mlx/mlx.h>

#include "ops/node_context.h"

namespace transmuter::microsoft_attention {

namespace mx = mlx::core;

inline bool is_attention_float(mx::Dtype t) {
  return t == mx::float32 || t == mx::float16 || t == mx::bfloat16;
}

inline void require_float(const NodeContext& ctx, const mx::array& x, std::string_view name, mx::Dtype like) {
  if (!is_attention_float(x.dtype())) {
    throw ctx.error(name, " must be float32, float16 or bfloat16, got ", x.dtype());
  }
  if (x.dtype() != like) throw ctx.error(name, " has dtype ", x.dtype(), " but the query has ", like);
}

// Input i, which the operator requires; named in the error when it is missing.
inline const mx::array& required_input(const NodeContext& ctx, size_t i, std::string_view name) {
  if (!ctx.has_input(i)) throw ctx.error(name, " (input ", i, ") is required");
  return ctx.input(i);
}

inline mx::array f32(const mx::array& x, mx::StreamOrDevice s) { return mx::astype(x, mx::float32, s); }

// [B, S, N * H] -> [B, N, S, H].
inline mx::array to_heads(const mx::array& x, int heads, mx::StreamOrDevice s) {
  mx::array split = mx::reshape(x, {x.shape(0), x.shape(1), heads, x.shape(2) / heads}, s);
  return mx::transpose(split, {0, 2, 1, 3}, s);
}

// [B, N, S, H] -> [B, S, N * H].
inline mx::array from_heads(const mx::array& x, mx::StreamOrDevice s) {
  return mx::reshape(mx::transpose(x, {0, 2, 1, 3}, s), {x.shape(0), x.shape(2), x.shape(1) * x.shape(3)}, s);
}

// The `scale` attribute, 1 / sqrt(head_size) when absent or 0.
inline float scale_attr(const NodeContext& ctx, int head_size) {
  const float scale = ctx.attr_float("scale", 0.0f);
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
}

inline int positive_heads(const NodeContext& ctx, std::string_view name) {
  const int64_t heads = ctx.required_int(name);
  if (heads <= 0 || heads > std::numeric_limits<int>::max()) {
    throw ctx.error(name, " must be positive, got ", heads);
  }
  return static_cast<int>(heads);
}

}  // namespace transmuter::microsoft_attention
