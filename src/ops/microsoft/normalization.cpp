// ONNX Runtime's normalization contrib operators (domain com.microsoft,
// version 1): SkipLayerNormalization, SkipSimplifiedLayerNormalization,
// SimplifiedLayerNormalization, EmbedLayerNormalization. ONNX Runtime's
// optimizer fuses transformer blocks into them (and BERT's embeddings into
// the last), and src/passes/fuse_skip_layer_norm.cpp produces the first two.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//
//   sum  = input + skip [+ bias]
//   Skip(LayerNormalization):        output = (sum - mean) / sqrt(var + eps) * gamma [+ beta]
//   Skip(Simplified)LayerNormalization: output = sum / sqrt(mean(sum^2) + eps) * gamma
//   outputs: output, mean, inv_std_var (statistics over the last axis, kept
//   as a size-1 axis), input_skip_bias_sum
//
//   EmbedLayerNormalization(input_ids, [segment_ids], word_embedding,
//       position_embedding, [segment_embedding], gamma, beta, [mask], [position_ids]):
//     sum[b, s]  = word_embedding[input_ids[b, s]] + position_embedding[p(b, s)]
//                  [+ segment_embedding[segment_ids[b, s]]]
//     p(b, s)    = position_ids[b, s] ([B, S]), position_ids[0, s] ([1, S]), or s
//     output     = LayerNorm(sum) * gamma + beta;  embedding_sum = sum
//     mask_index = per batch row, the number of mask entries equal to 1 (int32 [B];
//                  zeros without a mask)
//   Ids are int32, as ONNX Runtime requires; an id outside its table is an error
//   when the ids are known, and is clamped into the table inside a compiled trace.
//
// float32 runs kernels::normalize_last_axis (one pass per row, residual and
// bias included) on CPU streams; float16/bfloat16 are computed in float32 and
// rounded once, as ONNX Runtime does.
#include <numeric>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/layer_norm.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// Input positions of one operator; -1: the operator has no such input.
struct SkipNormLayout {
  int skip, gamma, beta, bias;
};

void check_float(const NodeContext& ctx, const char* name, const mx::array& a) {
  if (!mx::issubdtype(a.dtype(), mx::floating)) throw ctx.error(name, " must be a float tensor, got ", a.dtype());
}

// gamma/beta/bias: 1-D of the hidden size D (the input's last dimension).
std::optional<mx::array> hidden_vector(const NodeContext& ctx, int index, const char* name, int64_t d) {
  if (index < 0 || !ctx.has_input(index)) return std::nullopt;
  const mx::array& v = ctx.input(index);
  check_float(ctx, name, v);
  if (v.ndim() != 1 || v.shape(0) != d) {
    throw ctx.error(name, " must be 1-D of the hidden size ", d, " (the input's last dimension), got shape ",
                    v.shape());
  }
  return v;
}

// True when `from` broadcasts to exactly `to` (numpy rules, `to` unchanged).
bool broadcasts_to(const mx::Shape& from, const mx::Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 1; i <= from.size(); ++i) {
    const int f = from[from.size() - i];
    if (f != 1 && f != to[to.size() - i]) return false;
  }
  return true;
}

mx::array widened(const mx::array& a, mx::StreamOrDevice s) {
  return a.dtype() == mx::float16 || a.dtype() == mx::bfloat16 ? mx::astype(a, mx::float32, s) : a;
}

// Mean and 1/sqrt(var + eps) of `sum` over its last axis (var = mean(sum^2)
// for RMS), for the optional statistics outputs.
std::pair<mx::array, mx::array> last_axis_statistics(const mx::array& sum, bool rms, float epsilon,
                                                     mx::StreamOrDevice s) {
  mx::array mean = mx::mean(sum, -1, true, s);
  mx::array centered = rms ? sum : mx::subtract(sum, mean, s);
  mx::array variance = mx::mean(mx::square(centered, s), -1, true, s);
  return {mean, mx::rsqrt(mx::add(variance, mx::array(epsilon, sum.dtype()), s), s)};
}

OpOutputs skip_normalization(NodeContext& ctx, SkipNormLayout layout, bool rms) {
  const auto s = ctx.stream();
  const mx::array& input = ctx.input(0);
  check_float(ctx, "input", input);
  if (input.ndim() < 1) throw ctx.error("input must have at least one dimension");
  const int64_t d = input.shape().back();
  std::optional<mx::array> skip;
  if (layout.skip >= 0) {
    skip = ctx.input(layout.skip);
    check_float(ctx, "skip", *skip);
    // ONNX Runtime also takes a skip that broadcasts to the input ([1, S, D], [S, D]).
    if (skip->shape() != input.shape()) {
      if (!broadcasts_to(skip->shape(), input.shape())) {
        throw ctx.error("skip ", skip->shape(), " does not broadcast to the input's shape ", input.shape());
      }
      skip = mx::broadcast_to(*skip, input.shape(), s);
    }
  }
  std::optional<mx::array> gamma = hidden_vector(ctx, layout.gamma, "gamma", d);
  if (!gamma) throw ctx.error("gamma is required");
  std::optional<mx::array> beta = hidden_vector(ctx, layout.beta, "beta", d);
  std::optional<mx::array> bias = hidden_vector(ctx, layout.bias, "bias", d);
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);

  auto wide = [&](const std::optional<mx::array>& a) -> std::optional<mx::array> {
    if (!a) return a;
    return widened(*a, s);
  };
  const bool want_sum = ctx.output_requested(3);
  const bool want_stats = ctx.output_requested(1) || ctx.output_requested(2);
  std::vector<mx::array> out = kernels::normalize_last_axis(
      widened(input, s), wide(skip), wide(bias), *wide(gamma), wide(beta),
      {.epsilon = epsilon, .rms = rms, .return_sum = want_sum || want_stats}, s);
  OpOutputs outputs(want_sum ? 4 : want_stats ? 3 : 1);
  outputs[0] = mx::astype(out[0], input.dtype(), s);
  if (want_stats) {
    auto [mean, inv_std] = last_axis_statistics(out[1], rms, epsilon, s);
    outputs[1] = mean;
    outputs[2] = inv_std;
  }
  if (want_sum) outputs[3] = mx::astype(out[1], input.dtype(), s);
  return outputs;
}

OpOutputs skip_layer_normalization(NodeContext& ctx) {
  return skip_normalization(ctx, {.skip = 1, .gamma = 2, .beta = 3, .bias = 4}, false);
}

OpOutputs skip_simplified_layer_normalization(NodeContext& ctx) {
  return skip_normalization(ctx, {.skip = 1, .gamma = 2, .beta = -1, .bias = 3}, true);
}

// SimplifiedLayerNormalization(X, scale): RMS normalization over axes
// [axis, rank); outputs Y and, optionally, inv_std_var.
OpOutputs simplified_layer_normalization(NodeContext& ctx) {
  const auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  check_float(ctx, "X", x);
  const mx::array& scale = ctx.input(1);
  check_float(ctx, "scale", scale);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 1) throw ctx.error("X must have at least one dimension");
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", -1), rank);
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);
  const mx::Shape normalized(x.shape().begin() + axis, x.shape().end());
  if (!broadcasts_to(scale.shape(), normalized)) {
    throw ctx.error("scale ", scale.shape(), " does not broadcast to the normalized dimensions ", normalized);
  }
  if (axis == rank - 1 && scale.ndim() == 1 && !ctx.output_requested(1)) {
    mx::array y = kernels::normalize_last_axis(widened(x, s), std::nullopt, std::nullopt, widened(scale, s),
                                               std::nullopt, {.epsilon = epsilon, .rms = true}, s)[0];
    return {mx::astype(y, x.dtype(), s)};
  }
  std::vector<int> axes(rank - axis);
  std::iota(axes.begin(), axes.end(), axis);
  mx::array xf = widened(x, s);
  mx::array inv_std = mx::rsqrt(
      mx::add(mx::mean(mx::square(xf, s), axes, true, s), mx::array(epsilon, xf.dtype()), s), s);
  mx::array y = mx::multiply(mx::multiply(xf, inv_std, s), widened(scale, s), s);
  return {mx::astype(y, x.dtype(), s), inv_std};
}

// Rows of `table` [V, D] at `ids` (int32 [B, S]): ids must lie in [0, V).
mx::array embedding_rows(const NodeContext& ctx, const mx::array& table, const mx::array& ids, const char* ids_name,
                         const char* table_name) {
  const auto s = ctx.stream();
  const int rows = table.shape(0);
  if (rows == 0) throw ctx.error(table_name, " has no rows");
  mx::array index = ids;
  if (!ids.is_tracer()) {
    mx::array low = mx::min(ids, s), high = mx::max(ids, s);
    mx::eval({low, high});
    const int lowest = low.item<int32_t>(), highest = high.item<int32_t>();
    if (lowest < 0 || highest >= rows) {
      throw ctx.error(ids_name, " holds ", lowest < 0 ? lowest : highest, ", outside ", table_name, "'s ", rows,
                      " rows");
    }
  } else {
    index = mx::clip(ids, mx::array(0, mx::int32), mx::array(rows - 1, mx::int32), s);
  }
  return mx::take(table, index, 0, s);
}

void check_ids(const NodeContext& ctx, const mx::array& ids, const char* name, const mx::Shape& shape) {
  if (ids.dtype() != mx::int32) throw ctx.error(name, " must be int32, got ", ids.dtype());
  if (ids.shape() != shape) throw ctx.error(name, " must have input_ids' shape ", shape, ", got ", ids.shape());
}

void check_table(const NodeContext& ctx, const mx::array& table, const char* name, int64_t hidden) {
  check_float(ctx, name, table);
  if (table.ndim() != 2 || table.shape(1) != hidden) {
    throw ctx.error(name, " must be 2-D [rows, ", hidden, "], got shape ", table.shape());
  }
}

OpOutputs embed_layer_normalization(NodeContext& ctx) {
  const auto s = ctx.stream();
  const mx::array& input_ids = ctx.input(0);
  if (input_ids.dtype() != mx::int32) throw ctx.error("input_ids must be int32, got ", input_ids.dtype());
  if (input_ids.ndim() != 2) throw ctx.error("input_ids must be 2-D [batch, sequence], got shape ", input_ids.shape());
  const int batch = input_ids.shape(0), sequence = input_ids.shape(1);
  const mx::array& word = ctx.input(2);
  check_float(ctx, "word_embedding", word);
  if (word.ndim() != 2) throw ctx.error("word_embedding must be 2-D [vocabulary, hidden], got shape ", word.shape());
  const int64_t hidden = word.shape(1);
  const mx::array& position = ctx.input(3);
  check_table(ctx, position, "position_embedding", hidden);
  std::optional<mx::array> gamma = hidden_vector(ctx, 5, "gamma", hidden);
  std::optional<mx::array> beta = hidden_vector(ctx, 6, "beta", hidden);
  if (!gamma || !beta) throw ctx.error("gamma and beta are required");

  mx::array sum = embedding_rows(ctx, word, input_ids, "input_ids", "word_embedding");
  mx::array positions = mx::broadcast_to(mx::arange(sequence, mx::int32, s), {1, sequence}, s);
  if (std::optional<mx::array> ids = ctx.optional_input(8)) {
    if (ids->dtype() != mx::int32) throw ctx.error("position_ids must be int32, got ", ids->dtype());
    if (ids->shape() != input_ids.shape() && ids->shape() != mx::Shape{1, sequence}) {
      throw ctx.error("position_ids must be [", batch, ", ", sequence, "] or [1, ", sequence, "], got shape ",
                      ids->shape());
    }
    positions = *ids;
  }
  sum = mx::add(sum, embedding_rows(ctx, position, positions, "position_ids", "position_embedding"), s);
  std::optional<mx::array> segment_ids = ctx.optional_input(1), segment_table = ctx.optional_input(4);
  if (segment_ids.has_value() != segment_table.has_value()) {
    throw ctx.error("segment_ids and segment_embedding must be given together");
  }
  if (segment_ids) {
    check_ids(ctx, *segment_ids, "segment_ids", input_ids.shape());
    check_table(ctx, *segment_table, "segment_embedding", hidden);
    sum = mx::add(sum, embedding_rows(ctx, *segment_table, *segment_ids, "segment_ids", "segment_embedding"), s);
  }

  const float epsilon = ctx.attr_float("epsilon", 1e-12f);
  OpOutputs outputs(ctx.output_requested(2) ? 3 : 2);
  outputs[0] = mx::astype(kernels::normalize_last_axis(widened(sum, s), std::nullopt, std::nullopt,
                                                       widened(*gamma, s), widened(*beta, s),
                                                       {.epsilon = epsilon, .rms = false}, s)[0],
                          word.dtype(), s);
  if (std::optional<mx::array> mask = ctx.optional_input(7)) {
    check_ids(ctx, *mask, "mask", input_ids.shape());
    outputs[1] = mx::sum(mx::astype(mx::equal(*mask, mx::array(1, mx::int32), s), mx::int32, s), 1, false, s);
  } else {
    outputs[1] = mx::zeros({batch}, mx::int32, s);
  }
  if (ctx.output_requested(2)) outputs[2] = sum;
  return outputs;
}

}  // namespace

void register_microsoft_normalization(OpRegistry& r) {
  r.add({
      {"SkipLayerNormalization", kMicrosoft, 1, kOpen, skip_layer_normalization, {}, false,
       "gamma, beta, bias 1-D of the hidden size; statistics outputs float32"},
      {"SkipSimplifiedLayerNormalization", kMicrosoft, 1, kOpen, skip_simplified_layer_normalization, {}, false,
       "gamma, bias 1-D of the hidden size; statistics outputs float32"},
      // ONNX Runtime registers it in the default domain (where its optimizer writes
      // it); com.microsoft is accepted too, for hand-made graphs.
      onnxruntime_default_domain({"SimplifiedLayerNormalization", kOnnx, 1, kOpen, simplified_layer_normalization, {},
                                  false, "ONNX Runtime's contrib op in the default domain"}),
      {"SimplifiedLayerNormalization", kMicrosoft, 1, kOpen, simplified_layer_normalization},
      {"EmbedLayerNormalization", kMicrosoft, 1, kOpen, embed_layer_normalization, {}, false,
       "ids int32 (as ONNX Runtime)"},
  });
}

}  // namespace transmuter
