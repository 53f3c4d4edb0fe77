// ONNX Runtime's weight-only quantization contrib operators (domain
// com.microsoft, version 1): MatMulNBits and GatherBlockQuantized, what
// onnxruntime.quantization's MatMulNBitsQuantizer (and onnxruntime-genai's
// int4 exports) turn MatMul and embedding Gather weights into.
// https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
//
// MatMulNBits(A [..., K], B [N, k_blocks, blob] uint8, scales [N, k_blocks] or
//             [N * k_blocks], zero_points?, g_idx? [K] int32, bias? [N]) -> Y [..., N]
//   k_blocks = ceil(K / block_size), blob = block_size * bits / 8. Each block of
//   B's row n packs `bits`-bit integers q along K, low bits first.
//   W[n, k] = (q[n, k] - zp[n, b]) * scale[n, b], b = g_idx[k] or k / block_size;
//   zp: packed uint8 [N, ceil(k_blocks * bits / 8)] (same packing as B), or
//   unpacked, of scales' dtype, [N, k_blocks]; absent: 2^(bits - 1).
//   Y = A W^T + bias.
// GatherBlockQuantized(data, indices, scales, zero_points?) -> output
//   Gather of `data` along gather_axis, dequantized blockwise along
//   quantize_axis: output = (data - zp) * scale, of scales' dtype. uint8 data
//   packs 8 / bits values per byte along the last axis (bits 2, 4, 8; the
//   default bits is 4); int4/uint4 data has no packing. An index outside
//   [-s, s) gives a slice of zeros (ORT 1.31's schema says so; ONNX Gather
//   would fail). float8/float4 data has no zero point: output = data * scale,
//   a scales dimension of 1 broadcasts on axes other than quantize_axis, and
//   block_size 0 is one block over the whole quantize_axis.
//
// Also ai.transmuter QuantizedMatMul, what src/passes/pack_matmul_nbits.cpp
// turns a MatMulNBits with constant weights into (MLX's packed layout).
//
// Everything is computed in float32 from the exact integer differences, and
// rounded once to float16/bfloat16 where A or scales are half precision, as
// ONNX Runtime's CPU kernels do. accuracy_level 4 rounds A to int8 per block
// first, as ORT's CPU kernel does there
// (kernels::int8_group_rounded): the greedy tokens of onnxruntime-genai's int4
// and int8 CPU builds, which ask for level 4, then follow ORT's; the other
// levels compute in float32 (ORT's CPU kernel has no float16 or bfloat16 path).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/quantized_matmul.h"
#include "mlx_bridge/bit_fields.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

bool is_float_dtype(mx::Dtype t) { return t == mx::float32 || t == mx::float16 || t == mx::bfloat16; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Throws an OpError naming the input and the accepted shapes unless `t` has
// shape `a` (or `b`).
void require_shape(const NodeContext& ctx, const char* name, const mx::array& t, const mx::Shape& a,
                   const std::optional<mx::Shape>& b = std::nullopt) {
  if (t.shape() == a || (b && t.shape() == *b)) return;
  if (b) throw ctx.error(name, " must have shape ", a, " or ", *b, ", got ", t.shape());
  throw ctx.error(name, " must have shape ", a, ", got ", t.shape());
}

// --- MatMulNBits ---------------------------------------------------------------------

struct NBitsShape {
  int k, n, bits, block_size, k_blocks, blob_size;
  bool int8_activations;  // int8_activations_of the node
};

// Whether ORT's CPU kernel quantizes A to int8 per block: accuracy_level 4 (its "int8 compute"), which
// ORT 1.31 honours for 2, 4 and 8 bits alike, on the weights it pre-packs: zero points uint8 or absent,
// no g_idx (measured against its outputs: scripts/contrib_cases/quantized_weights.py).
bool int8_activations_of(int64_t accuracy_level, const std::optional<mx::array>& zero_points,
                         bool has_g_idx) {
  return accuracy_level == 4 && !has_g_idx && (!zero_points || zero_points->dtype() == mx::uint8);
}

NBitsShape nbits_shape(const NodeContext& ctx) {
  const int64_t k = ctx.required_int("K"), n = ctx.required_int("N");
  const int64_t bits = ctx.attr_int("bits", 4), block_size = ctx.required_int("block_size");
  if (k < 1 || n < 1) throw ctx.error("attributes K and N must be positive, got K=", k, ", N=", n);
  if (bits != 2 && bits != 4 && bits != 8) throw ctx.error("bits must be 2, 4 or 8, got ", bits);
  if (block_size < 16 || !is_power_of_two(block_size)) {
    throw ctx.error("block_size must be a power of 2 and >= 16, got ", block_size);
  }
  const int64_t accuracy_level = ctx.attr_int("accuracy_level", 0);
  if (accuracy_level < 0 || accuracy_level > 4) {
    throw ctx.error("accuracy_level must be 0..4, got ", accuracy_level);
  }
  if (ctx.attr_int("weight_prepacked", 0) != 0) {
    throw ctx.error("weight_prepacked=", ctx.attr_int("weight_prepacked", 0),
                    " (a CUDA-specific layout of B) is not supported; only 0");
  }
  const int64_t k_blocks = ceil_div(k, block_size);
  to_int32(ctx, checked_mul(ctx, n, checked_mul(ctx, k_blocks, block_size, "K padded to blocks"), "N * K"),
           "N * K");
  return {static_cast<int>(k),
          static_cast<int>(n),
          static_cast<int>(bits),
          static_cast<int>(block_size),
          static_cast<int>(k_blocks),
          static_cast<int>(block_size * bits / 8),
          int8_activations_of(accuracy_level, ctx.optional_input(3), ctx.has_input(4))};
}

// The block index of each k in [0, K): g_idx[:K] (checked in [0, k_blocks)
// when its values are known, clamped when traced).
mx::array group_index(const NodeContext& ctx, const mx::array& g_idx, const NBitsShape& d) {
  const auto s = ctx.stream();
  if (g_idx.dtype() != mx::int32) throw ctx.error("g_idx must be int32, got ", g_idx.dtype());
  require_shape(ctx, "g_idx", g_idx, {d.k}, mx::Shape{d.k_blocks * d.block_size});
  mx::array index = mx::slice(g_idx, {0}, {d.k}, s);
  if (!index.is_tracer()) {
    mx::array low = mx::min(index, false, s), high = mx::max(index, false, s);
    mx::eval({low, high});
    const int lowest = low.item<int32_t>(), highest = high.item<int32_t>();
    if (lowest < 0 || highest >= d.k_blocks) {
      throw ctx.error("g_idx value ", lowest < 0 ? lowest : highest, " out of range [0, ", d.k_blocks, ")");
    }
    return index;
  }
  return mx::clip(index, mx::array(0), mx::array(d.k_blocks - 1), s);
}

// W = (q - zp) * scale as float32 [N, K], from the checked inputs.
mx::array dequantized_weight(const NodeContext& ctx, const NBitsShape& d, mx::Dtype t) {
  const auto s = ctx.stream();
  const mx::array& b = ctx.input(1);
  if (b.dtype() != mx::uint8) throw ctx.error("B must be uint8, got ", b.dtype());
  require_shape(ctx, "B", b, {d.n, d.k_blocks, d.blob_size});
  const mx::array& scales = ctx.input(2);
  if (scales.dtype() != t) throw ctx.error("scales must have A's dtype ", t, ", got ", scales.dtype());
  require_shape(ctx, "scales", scales, {d.n, d.k_blocks}, mx::Shape{d.n * d.k_blocks});
  mx::array scale = mx::astype(mx::reshape(scales, {d.n, d.k_blocks}, s), mx::float32, s);

  mx::array zero_point = mx::array(static_cast<float>(1 << (d.bits - 1)));
  if (std::optional<mx::array> zp = ctx.optional_input(3)) {
    if (zp->dtype() == mx::uint8) {
      const int packed = static_cast<int>(ceil_div(int64_t{d.k_blocks} * d.bits, 8));
      require_shape(ctx, "zero_points (packed uint8)", *zp, {d.n, packed}, mx::Shape{d.n * packed});
      mx::array fields = unpack_bit_fields(mx::reshape(*zp, {d.n, packed}, s), d.bits, s);
      zero_point = mx::astype(mx::slice(fields, {0, 0}, {d.n, d.k_blocks}, s), mx::float32, s);
    } else {
      if (zp->dtype() != t) {
        throw ctx.error("zero_points must be uint8 or A's dtype ", t, ", got ", zp->dtype());
      }
      require_shape(ctx, "zero_points", *zp, {d.n, d.k_blocks}, mx::Shape{d.n * d.k_blocks});
      zero_point = mx::astype(mx::reshape(*zp, {d.n, d.k_blocks}, s), mx::float32, s);
    }
  }

  mx::array q = mx::astype(unpack_bit_fields(mx::reshape(b, {d.n, d.k_blocks * d.blob_size}, s), d.bits, s),
                           mx::float32, s);  // [N, k_blocks * block_size]
  if (std::optional<mx::array> g_idx = ctx.optional_input(4)) {
    mx::array index = group_index(ctx, *g_idx, d);
    if (zero_point.ndim() == 2) zero_point = mx::take(zero_point, index, 1, s);
    mx::array w = mx::subtract(mx::slice(q, {0, 0}, {d.n, d.k}, s), zero_point, s);
    return mx::multiply(w, mx::take(scale, index, 1, s), s);
  }
  if (zero_point.ndim() == 2) zero_point = mx::expand_dims(zero_point, -1, s);
  mx::array blocks = mx::reshape(q, {d.n, d.k_blocks, d.block_size}, s);
  mx::array w = mx::multiply(mx::subtract(blocks, zero_point, s), mx::expand_dims(scale, -1, s), s);
  return mx::slice(mx::reshape(w, {d.n, d.k_blocks * d.block_size}, s), {0, 0}, {d.n, d.k}, s);
}

OpOutputs matmul_nbits(NodeContext& ctx) {
  const auto s = ctx.stream();
  const NBitsShape d = nbits_shape(ctx);
  const mx::array& a = ctx.input(0);
  if (!is_float_dtype(a.dtype())) throw ctx.error("A must be float32, float16 or bfloat16, got ", a.dtype());
  if (a.ndim() < 1 || a.shape(-1) != d.k) {
    throw ctx.error("A's last dimension must be K=", d.k, ", got shape ", a.shape());
  }
  std::optional<mx::array> bias = ctx.optional_input(5);
  if (bias) {
    if (bias->dtype() != a.dtype()) {
      throw ctx.error("bias must have A's dtype ", a.dtype(), ", got ", bias->dtype());
    }
    require_shape(ctx, "bias", *bias, {d.n});
  }
  mx::array w = dequantized_weight(ctx, d, a.dtype());
  mx::array x = mx::astype(a, mx::float32, s);
  if (d.int8_activations) x = kernels::int8_group_rounded(x, d.block_size, s);
  mx::array y = mx::matmul(x, mx::transpose(w, s), s);
  if (bias) y = mx::add(y, mx::astype(*bias, mx::float32, s), s);
  return {mx::astype(y, a.dtype(), s)};
}

// Rows of A from which QuantizedMatMul dequantizes on CPU streams for the layouts
// the own kernel does not take (below: MLX's quantized kernel).
constexpr int kQuantizedCpuRowsLimit = 4;

// scale * q + bias as float32 [N, K] from QuantizedMatMul's checked inputs:
// w's uint32 words hold the values low bits first, like little-endian bytes.
mx::array affine_dequantized(const NodeContext& ctx, const mx::array& biases, int k, int n, int bits,
                             int group_size) {
  const auto s = ctx.stream();
  mx::array q = mx::astype(unpack_bit_fields(mx::view(ctx.input(1), mx::uint8, s), bits, s), mx::float32, s);
  q = mx::reshape(q, {n, k / group_size, group_size}, s);
  mx::array w =
      mx::add(mx::multiply(q, mx::expand_dims(ctx.input(2), -1, s), s), mx::expand_dims(biases, -1, s), s);
  return mx::reshape(w, {n, k}, s);
}

// ai.transmuter QuantizedMatMul(A [..., K], w uint32 [N, K * bits / 32],
//   scales, biases? float32 [N, K / group_size], bias? [N]) -> Y [..., N]:
// MatMulNBits with its constant weight in MLX's affine layout (w = scale * q +
// bias, bias = -scale * zp; without biases, zp = 2^(bits - 1), MatMulNBits'
// default, and the biases are not stored), made once at load by
// src/passes/pack_matmul_nbits.cpp; mx::quantized_matmul never expands the
// weight. float16/bfloat16 A is computed in float32 and rounded once;
// accuracy_level (MatMulNBits', default 0) 4 rounds A to int8 per group first.
OpOutputs quantized_matmul(NodeContext& ctx) {
  const auto s = ctx.stream();
  const int k = to_int32(ctx, ctx.required_int("K"), "K"), n = to_int32(ctx, ctx.required_int("N"), "N");
  const int bits = static_cast<int>(ctx.required_int("bits"));
  const int group_size = static_cast<int>(ctx.required_int("group_size"));
  if ((bits != 2 && bits != 4 && bits != 8) || (group_size != 32 && group_size != 64 && group_size != 128) ||
      k < 1 || n < 1 || k % group_size != 0) {
    throw ctx.error("unsupported layout: K=", k, ", N=", n, ", bits=", bits, ", group_size=", group_size);
  }
  const mx::array& a = ctx.input(0);
  if (!is_float_dtype(a.dtype())) throw ctx.error("A must be float32, float16 or bfloat16, got ", a.dtype());
  if (a.ndim() < 1 || a.shape(-1) != k) {
    throw ctx.error("A's last dimension must be K=", k, ", got shape ", a.shape());
  }
  const mx::array& w = ctx.input(1);
  if (w.dtype() != mx::uint32) throw ctx.error("w must be uint32, got ", w.dtype());
  require_shape(ctx, "w", w, {n, k / 32 * bits});
  for (size_t i : {2, 3}) {
    if (!ctx.has_input(i)) continue;  // absent biases: a symmetric weight
    const mx::array& t = ctx.input(i);
    const char* name = i == 2 ? "scales" : "biases";
    if (t.dtype() != mx::float32) throw ctx.error(name, " must be float32, got ", t.dtype());
    require_shape(ctx, name, t, {n, k / group_size});
  }
  if (!ctx.has_input(2)) throw ctx.error("scales (input 2) is required");
  const mx::array& scales = ctx.input(2);
  std::optional<mx::array> stored_biases = ctx.optional_input(3);
  std::optional<mx::array> bias = ctx.optional_input(4);
  if (bias) {
    if (bias->dtype() != a.dtype()) {
      throw ctx.error("bias must have A's dtype ", a.dtype(), ", got ", bias->dtype());
    }
    require_shape(ctx, "bias", *bias, {n});
  }
  const int64_t accuracy_level = ctx.attr_int("accuracy_level", 0);
  // The pass keeps MatMulNBits' accuracy_level only where ORT quantizes A (no float zero points).
  const kernels::Activations activations = int8_activations_of(accuracy_level, std::nullopt, false)
                                               ? kernels::Activations::int8_per_group
                                               : kernels::Activations::float32;
  mx::array x = mx::astype(a, mx::float32, s);
  // On CPU streams 4 and 8 bits run the own kernel (kernels/cpu/quantized_matmul.h:
  // a GEMV streaming the packed weight, blocks dequantized into the float GEMM
  // for more rows; docs/quantized_performance.md). MLX's CPU quantized matmul,
  // left for 2 bits, is scalar: from a few rows on, dequantizing this call's
  // weight (transiently) and running the float GEMM is faster. Measured with
  // K = N = 2048, 4 bits, against the eager MatMulNBits: 2.6 against 12 ms at
  // 1 row, 5.8 against 12 at 2; at 32 rows the quantized kernel took 4.7x the
  // eager time, this branch the same. The stored weight stays packed either
  // way; GPU streams always run MLX's quantized kernel.
  const bool cpu = kernels::is_cpu_stream(s);
  mx::array y = x;
  if (cpu && kernels::quantized_matmul_fits(x, w, scales, stored_biases, group_size, bits, s)) {
    y = kernels::quantized_matmul(x, w, scales, stored_biases, group_size, bits, s,
                                  activations);  // x's axes kept
  } else {
    if (activations == kernels::Activations::int8_per_group)
      x = kernels::int8_group_rounded(x, group_size, s);
    const mx::array biases = stored_biases ? *stored_biases : kernels::symmetric_biases(scales, bits, s);
    mx::Shape out_shape = a.shape();
    out_shape.back() = n;
    x = mx::reshape(x, {-1, k}, s);
    y = cpu && x.shape(0) >= kQuantizedCpuRowsLimit
            ? mx::matmul(x, mx::transpose(affine_dequantized(ctx, biases, k, n, bits, group_size), s), s)
            : mx::quantized_matmul(x, w, scales, biases, true, group_size, bits, "affine", s);
    y = mx::reshape(y, out_shape, s);
  }
  if (bias) y = mx::add(y, mx::astype(*bias, mx::float32, s), s);
  return {mx::astype(y, a.dtype(), s)};
}

// --- GatherBlockQuantized ------------------------------------------------------------

bool is_small_float(OnnxType t) {
  switch (t) {
    case OnnxType::kFloat8E4M3FN:
    case OnnxType::kFloat8E4M3FNUZ:
    case OnnxType::kFloat8E5M2:
    case OnnxType::kFloat8E5M2FNUZ:
    case OnnxType::kFloat4E2M1:
      return true;
    default:
      return false;
  }
}

// `t` with the axis `axis` replaced by `count` axes of size 1 (a scales
// dimension of 1 broadcast over gathered indices).
mx::array replace_axis_by_ones(const mx::array& t, int axis, int count, mx::StreamOrDevice s) {
  mx::Shape shape(t.shape().begin(), t.shape().begin() + axis);
  shape.insert(shape.end(), count, 1);
  shape.insert(shape.end(), t.shape().begin() + axis + 1, t.shape().end());
  return mx::reshape(t, shape, s);
}

OpOutputs gather_block_quantized(NodeContext& ctx) {
  const auto s = ctx.stream();
  const Value& data_value = ctx.value(0);
  const mx::array& data = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  const mx::array& scales = ctx.input(2);
  const OnnxType type = data_value.element_type();
  const bool small_float = is_small_float(type);
  if (type != OnnxType::kUint8 && type != OnnxType::kInt4 && type != OnnxType::kUint4 && !small_float) {
    throw ctx.error("data must be uint8, int4, uint4, float8 or float4, got ", onnx_type_name(type));
  }
  if (indices.dtype() != mx::int32 && indices.dtype() != mx::int64) {
    throw ctx.error("indices must be int32 or int64, got ", indices.dtype());
  }
  if (!is_float_dtype(scales.dtype())) {
    throw ctx.error("scales must be float32, float16 or bfloat16, got ", scales.dtype());
  }
  const int r = static_cast<int>(data.ndim());
  if (r < 1) throw ctx.error("data must have rank >= 1, got a scalar");
  const int gather_axis = ctx.normalize_axis(ctx.attr_int("gather_axis", 0), r);
  const int quantize_axis = ctx.normalize_axis(ctx.attr_int("quantize_axis", 1), r);
  const int64_t block_attr = ctx.attr_int("block_size", 128);
  if (!(block_attr >= 16 && is_power_of_two(block_attr)) && !(small_float && block_attr == 0)) {
    throw ctx.error("block_size must be a power of 2 and >= 16",
                    small_float ? " (or 0 for float8/float4 data)" : "", ", got ", block_attr);
  }
  const int64_t bits = ctx.attr_int("bits", 4);
  int per_byte = 1;  // values packed in one byte of uint8 data
  if (type == OnnxType::kUint8) {
    if (bits != 2 && bits != 4 && bits != 8) {
      throw ctx.error("bits must be 2, 4 or 8 for uint8 data, got ", bits);
    }
    per_byte = static_cast<int>(8 / bits);
    if (gather_axis != 0) throw ctx.error("gather_axis must be 0 for uint8 data, got ", gather_axis);
    if (quantize_axis != r - 1 || quantize_axis == gather_axis) {
      throw ctx.error(
          "quantize_axis must be the last axis of uint8 data (and differ from gather_axis 0), got ",
          quantize_axis, " for rank ", r);
    }
  } else if (!small_float && bits != 4) {
    throw ctx.error("bits must be 4 for ", onnx_type_name(type), " data, got ", bits);
  }

  // Logical (unpacked) dimensions of data, and the scales they need.
  mx::Shape logical = data.shape();
  logical[quantize_axis] =
      to_int32(ctx, int64_t{logical[quantize_axis]} * per_byte, "unpacked quantize_axis size");
  const int block_size = block_attr == 0 ? std::max(logical[quantize_axis], 1)
                                         : static_cast<int>(std::min<int64_t>(block_attr, 1 << 30));
  const int blocks = static_cast<int>(ceil_div(logical[quantize_axis], block_size));
  if (static_cast<int>(scales.ndim()) != r) {
    throw ctx.error("scales must have data's rank ", r, ", got shape ", scales.shape());
  }
  for (int i = 0; i < r; ++i) {
    const int want = i == quantize_axis ? blocks : logical[i];
    const bool broadcast = small_float && i != quantize_axis && scales.shape(i) == 1;
    if (scales.shape(i) != want && !broadcast) {
      throw ctx.error("scales shape ", scales.shape(), " does not match data shape ", data.shape(), ": axis ",
                      i, " must be ", want, i == quantize_axis ? " (blocks along quantize_axis)" : "");
    }
  }
  std::optional<mx::array> zero_points = ctx.optional_input(3);
  if (zero_points) {
    if (small_float) throw ctx.error("zero_points must not be given for ", onnx_type_name(type), " data");
    if (ctx.value(3).element_type() != type) {
      throw ctx.error("zero_points must have data's type ", onnx_type_name(type), ", got ",
                      onnx_type_name(ctx.value(3).element_type()));
    }
    mx::Shape want = scales.shape();
    want[quantize_axis] = static_cast<int>(ceil_div(want[quantize_axis], per_byte));
    require_shape(ctx, "zero_points", *zero_points, want);
  }

  // Output: data.shape[:g] + indices.shape + logical[g + 1:].
  const int q = static_cast<int>(indices.ndim());
  mx::Shape out_shape(logical.begin(), logical.begin() + gather_axis);
  out_shape.insert(out_shape.end(), indices.shape().begin(), indices.shape().end());
  out_shape.insert(out_shape.end(), logical.begin() + gather_axis + 1, logical.end());
  const int size = data.shape(gather_axis);
  if (size == 0 || indices.size() == 0) return {mx::zeros(out_shape, scales.dtype(), s)};

  // Out-of-range indices read row 0 and are zeroed at the end.
  mx::array index = mx::astype(indices, mx::int64, s);
  mx::array valid = mx::logical_and(mx::greater_equal(index, mx::array(-int64_t{size}), s),
                                    mx::less(index, mx::array(int64_t{size}), s), s);
  index = mx::where(valid,
                    mx::where(mx::less(index, mx::array(int64_t{0}), s),
                              mx::add(index, mx::array(int64_t{size}), s), index, s),
                    mx::array(int64_t{0}), s);

  // The quantize axis in the output, or -1 when it is the gathered axis.
  const int out_qaxis = quantize_axis < gather_axis   ? quantize_axis
                        : quantize_axis > gather_axis ? quantize_axis + q - 1
                                                      : -1;
  // A per-block tensor (scales, zero points) gathered like data and widened
  // to one value per element along the quantize axis.
  auto per_element = [&](const mx::array& t, bool packed) {
    mx::array g = out_qaxis < 0 ? mx::take(t, mx::floor_divide(index, mx::array(int64_t{block_size}), s),
                                           gather_axis, s)
                  : (t.shape(gather_axis) == 1 && size != 1) ? replace_axis_by_ones(t, gather_axis, q, s)
                                                             : mx::take(t, index, gather_axis, s);
    if (out_qaxis < 0) return g;
    if (packed) {
      g = unpack_bit_fields(g, static_cast<int>(bits), s);
      mx::Shape end = g.shape();
      end[out_qaxis] = blocks;
      g = mx::slice(g, mx::Shape(g.ndim(), 0), end, s);
    }
    g = mx::repeat(g, block_size, out_qaxis, s);
    mx::Shape end = g.shape();
    end[out_qaxis] = logical[quantize_axis];
    return mx::slice(g, mx::Shape(g.ndim(), 0), end, s);
  };

  mx::array gathered = mx::take(data, index, gather_axis, s);
  mx::array scale = mx::astype(per_element(scales, false), mx::float32, s);
  mx::array out = mx::array(0.0f);
  if (small_float) {
    out = mx::multiply(mx::astype(gathered, mx::float32, s), scale, s);
  } else {
    if (per_byte > 1) gathered = unpack_bit_fields(gathered, static_cast<int>(bits), s);
    mx::array values = mx::astype(gathered, mx::int32, s);
    mx::array zero_point = mx::array(type == OnnxType::kUint8 ? int32_t{1} << (bits - 1) : int32_t{0});
    if (zero_points) zero_point = mx::astype(per_element(*zero_points, per_byte > 1), mx::int32, s);
    out = mx::multiply(mx::astype(mx::subtract(values, zero_point, s), mx::float32, s), scale, s);
  }
  mx::Shape valid_shape(gather_axis, 1);
  valid_shape.insert(valid_shape.end(), indices.shape().begin(), indices.shape().end());
  valid_shape.insert(valid_shape.end(), r - gather_axis - 1, 1);
  out = mx::where(mx::reshape(valid, valid_shape, s), out, mx::array(0.0f), s);
  return {mx::astype(out, scales.dtype(), s)};
}

}  // namespace

void register_microsoft_quantized_weights(OpRegistry& r) {
  r.add({
      {.op_type = "MatMulNBits",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = matmul_nbits,
       .restrictions = "weight_prepacked 0 only; accuracy_level 4 rounds A to int8 per block (as ORT's CPU "
                       "kernel), other levels float32"},
      // Made by src/passes/pack_matmul_nbits.cpp from MatMulNBits.
      {.op_type = "QuantizedMatMul",
       .domain = kTransmuter,
       .since = 1,
       .until = kOpen,
       .fn = quantized_matmul,
       .restrictions = "bits 2/4/8, group_size 32/64/128 dividing K (what the pass produces)"},
      {.op_type = "GatherBlockQuantized",
       .domain = kMicrosoft,
       .since = 1,
       .until = kOpen,
       .fn = gather_block_quantized,
       .restrictions = "out-of-range indices give zeros (as ONNX Runtime 1.31)",
       .sets_element_types = true},
  });
}

}  // namespace transmuter
