// ONNX Runtime's contrib RotaryEmbedding (domain com.microsoft, version 1).
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.RotaryEmbedding
//
//   inputs: input [B, S, N * H] or [B, N, S, H], position_ids (one offset p:
//   positions p, p + 1, ..., or [B, S]), cos_cache and sin_cache [M, R/2]
//   for each head, with c = cos_cache[pos], s = sin_cache[pos]:
//     (x1, x2) -> (x1 c - x2 s, x1 s + x2 c)
//   over the first R = rotary_embedding_dim (default H) features, the pairs
//   being the two halves of those features or, interleaved, neighbours. The
//   other features pass unchanged. H is input.shape(2) / num_heads for 3-D
//   inputs, or 2 * cos_cache.shape(1) when num_heads is 0.
//
// Computed in float32 and rounded once for float16/bfloat16, as ONNX
// Runtime's CPU kernel computes float16. The is_packed_batching and scale
// attributes change nothing in that kernel; they are accepted and ignored
// likewise.
#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/onnx/attention_common.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

bool is_attention_float(mx::Dtype t) { return t == mx::float32 || t == mx::float16 || t == mx::bfloat16; }

OpOutputs rotary_embedding(NodeContext& ctx) {
  auto s = ctx.stream();
  const char* names[] = {"input", "position_ids", "cos_cache", "sin_cache"};
  for (size_t i = 0; i < 4; ++i) {
    if (!ctx.has_input(i)) throw ctx.error(names[i], " (input ", i, ") is required");
  }
  const mx::array& input = ctx.input(0);
  const mx::array& ids = ctx.input(1);
  const mx::array& cos_cache = ctx.input(2);
  const mx::array& sin_cache = ctx.input(3);
  if (!is_attention_float(input.dtype())) {
    throw ctx.error("input must be float32, float16 or bfloat16, got ", input.dtype());
  }
  if (!mx::issubdtype(ids.dtype(), mx::integer)) {
    throw ctx.error("position_ids must be an integer tensor, got ", ids.dtype());
  }
  if (cos_cache.ndim() != 2 || sin_cache.shape() != cos_cache.shape()) {
    throw ctx.error("cos_cache ", cos_cache.shape(), " and sin_cache ", sin_cache.shape(),
                    " must be 2-D [max_sequence_length, rotary_dim / 2] of one shape");
  }
  const int64_t heads = ctx.attr_int("num_heads", 0);
  const int64_t dim_attr = ctx.attr_int("rotary_embedding_dim", 0);
  if (heads < 0 || dim_attr < 0) {
    throw ctx.error("num_heads ", heads, " and rotary_embedding_dim ", dim_attr, " must be nonnegative");
  }
  if (dim_attr > 0 && heads == 0) throw ctx.error("rotary_embedding_dim needs the num_heads attribute");

  // x as [B, S, N, H] (3-D input) or [B, N, S, H]; seq_axis is S's axis.
  mx::array x = input;
  int seq_axis = 2;
  if (input.ndim() == 3) {
    const int hidden = input.shape(2);
    const int64_t head_size = heads > 0 ? hidden / heads : 2 * int64_t{cos_cache.shape(1)};
    if (head_size == 0 || hidden % head_size != 0 || (heads > 0 && hidden % heads != 0)) {
      throw ctx.error("input hidden size ", hidden, " does not split into heads of ", head_size,
                      heads > 0 ? " (num_heads)" : " (2 * cos_cache.shape[1])");
    }
    x = mx::reshape(
        input,
        {input.shape(0), input.shape(1), static_cast<int>(hidden / head_size), static_cast<int>(head_size)},
        s);
    seq_axis = 1;
  } else if (input.ndim() != 4) {
    throw ctx.error("input must be 3-D [batch, sequence, hidden] or 4-D [batch, heads, sequence, head], got ",
                    input.shape());
  }
  const int batch = x.shape(0), sequence = x.shape(seq_axis), head_size = x.shape(3);
  const int64_t dim = dim_attr > 0 ? dim_attr : head_size;
  if (dim > head_size || dim % 2 != 0) {
    throw ctx.error("rotary_embedding_dim ", dim, " must be even and at most the head size ", head_size);
  }
  if (cos_cache.shape(1) != dim / 2) {
    throw ctx.error("cos_cache has ", cos_cache.shape(1),
                    " columns, expected rotary_embedding_dim / 2 = ", dim / 2);
  }

  // Positions [B, S].
  mx::array positions = mx::astype(ids, mx::int64, s);
  if (ids.size() == 1) {
    mx::array offset = mx::reshape(positions, {1, 1}, s);
    positions = mx::add(offset, mx::reshape(mx::arange(0, sequence, mx::int64, s), {1, sequence}, s), s);
    positions = mx::broadcast_to(positions, {batch, sequence}, s);
  } else if (ids.shape() != mx::Shape{batch, sequence}) {
    throw ctx.error("position_ids must hold one offset or be [batch, sequence] = [", batch, ", ", sequence,
                    "], got ", ids.shape());
  }
  const int head_axis = seq_axis == 1 ? 2 : 1;
  mx::array cos = mx::expand_dims(
      cache_rows(ctx, mx::astype(cos_cache, mx::float32, s), positions, "cos_cache"), head_axis, s);
  mx::array sin = mx::expand_dims(
      cache_rows(ctx, mx::astype(sin_cache, mx::float32, s), positions, "sin_cache"), head_axis, s);
  const bool interleaved = ctx.attr_int("interleaved", 0) != 0;
  mx::array out = rotate_pairs(mx::astype(x, mx::float32, s), cos, sin, interleaved, s);
  return {mx::astype(mx::reshape(out, input.shape(), s), input.dtype(), s)};
}

}  // namespace

void register_microsoft_rotary_embedding(OpRegistry& r) {
  r.add({
      {.op_type = "RotaryEmbedding",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = rotary_embedding,
       .restrictions =
           "is_packed_batching and scale are ignored (as ONNX Runtime's CPU kernel ignores them)"},
  });
}

}  // namespace transmuter
