// SwiGlu (ai.transmuter, since 1), made by src/passes/fuse_gated_mlp.cpp:
//
//   Y = silu(X[..., :n]) * X[..., n:]      X [..., 2n] float32 (the gate and up projections side by
//                                          side, one product's output), Y [..., n]
//
// Llama-style MLPs compute Mul(Mul(gate, Sigmoid(gate)), up): three MLX ops and two passes over
// memory a layer, one kernel here (src/kernels/cpu/activation.h).
//
// QuantizeDequantize (ai.transmuter, since 1), made by src/passes/fuse_quantize_dequantize.cpp from the
// QDQ format's QuantizeLinear -> DequantizeLinear pair with one scale and zero point:
//
//   Y = (clip(round(X / scale) + zero_point, low, high) - zero_point) * scale
//
// X and scale float32, zero_point int8/uint8/int16/uint16 (absent: uint8 0), [low, high] its type's
// range; the two operators' arithmetic in one pass (src/kernels/cpu/dynamic_quantize.h).
//
// Requantize (ai.transmuter, since 1), made by the same pass from Mul(V, multiplier) -> QuantizeLinear
// with scale 1 (what qlinear_conv_as_conv writes after a convolution):
//
//   Y = saturate(round(V * multiplier) + zero_point)      multiplier one value or per channel (broadcast),
//                                                         Y of zero_point's type (int8/uint8)
//
// with optional inputs 3 and 4 (dequantize_scale, dequantize_zero_point: the DequantizeLinear that read Y,
// fused by the same pass) Y = (that integer - dequantize_zero_point) * dequantize_scale, float32.
#include <limits>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/dynamic_quantize.h"
#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

OpOutputs swiglu(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.dtype() != mx::float32 || x.ndim() < 1 || x.shape(-1) % 2 != 0) {
    throw ctx.error("X must be float32 with an even last axis [..., 2n], got ", x.dtype(), " ", x.shape());
  }
  return {kernels::swiglu(x, ctx.stream())};
}

template <typename T>
std::pair<float, float> range_of() {
  return {static_cast<float>(std::numeric_limits<T>::min()),
          static_cast<float>(std::numeric_limits<T>::max())};
}

OpOutputs quantize_dequantize(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& x = ctx.input(0);
  const mx::array& scale = ctx.input(1);
  if (x.dtype() != mx::float32 || scale.dtype() != mx::float32 || scale.size() != 1)
    throw ctx.error("X must be float32 and scale one float32, got ", x.dtype(), " and ", scale.dtype(), " ",
                    scale.shape());
  mx::array zero = mx::array(0.0f);
  std::pair<float, float> range = range_of<uint8_t>();
  if (ctx.has_input(2)) {
    const mx::array& z = ctx.input(2);
    if (z.size() != 1) throw ctx.error("zero_point must have one element, got shape ", z.shape());
    if (z.dtype() == mx::int8) {
      range = range_of<int8_t>();
    } else if (z.dtype() == mx::uint16) {
      range = range_of<uint16_t>();
    } else if (z.dtype() == mx::int16) {
      range = range_of<int16_t>();
    } else if (z.dtype() != mx::uint8) {
      throw ctx.error("zero_point must be int8, uint8, int16 or uint16, got ", z.dtype());
    }
    zero = mx::astype(z, mx::float32, s);
  }
  return {kernels::quantize_dequantize(x, scale, zero, range.first, range.second, s)};
}

OpOutputs requantize(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& v = ctx.input(0);
  const mx::array& multiplier = ctx.input(1);
  const mx::array& zero = ctx.input(2);
  if (v.dtype() != mx::float32 || multiplier.dtype() != mx::float32)
    throw ctx.error("V and multiplier must be float32, got ", v.dtype(), " and ", multiplier.dtype());
  if (zero.size() != 1 || (zero.dtype() != mx::uint8 && zero.dtype() != mx::int8))
    throw ctx.error("zero_point must be one int8 or uint8, got ", zero.dtype(), " ", zero.shape());
  bool broadcasts = multiplier.ndim() <= v.ndim();
  for (int i = 1; broadcasts && i <= static_cast<int>(multiplier.ndim()); ++i)
    broadcasts = multiplier.shape(-i) == 1 || multiplier.shape(-i) == v.shape(-i);
  if (!broadcasts)
    throw ctx.error("multiplier of shape ", multiplier.shape(), " does not broadcast to V's ", v.shape());
  std::optional<kernels::Dequantization> then;
  if (ctx.has_input(3)) {  // the DequantizeLinear that read Y, fused by the pass: Y dequantized, float32
    const mx::array& dq_scale = ctx.input(3);
    if (dq_scale.dtype() != mx::float32 || dq_scale.size() != 1)
      throw ctx.error("dequantize_scale must be one float32, got ", dq_scale.dtype(), " ", dq_scale.shape());
    mx::array dq_zero = mx::array(0.0f);
    if (ctx.has_input(4)) {
      const mx::array& z = ctx.input(4);
      if (z.size() != 1 || z.dtype() != zero.dtype())
        throw ctx.error("dequantize_zero_point must be one ", zero.dtype(), ", got ", z.dtype(), " ",
                        z.shape());
      dq_zero = mx::astype(z, mx::float32, s);
    }
    then = kernels::Dequantization{dq_scale, dq_zero};
  }
  return {kernels::requantize(v, multiplier, mx::astype(zero, mx::float32, s), zero.dtype(), s, then)};
}

}  // namespace

void register_transmuter_activation(OpRegistry& r) {
  r.add({
      {"SwiGlu", kTransmuter, 1, kOpen, swiglu},
      {.op_type = "QuantizeDequantize",
       .domain = kTransmuter,
       .since = 1,
       .until = kOpen,
       .fn = quantize_dequantize,
       .restrictions = "float32, one scale and zero point (what the pass produces)"},
      {.op_type = "Requantize",
       .domain = kTransmuter,
       .since = 1,
       .until = kOpen,
       .fn = requantize,
       .restrictions = "float32 V and multiplier, an 8-bit zero point; optional dequantization inputs 3-4"},
  });
}

}  // namespace transmuter
