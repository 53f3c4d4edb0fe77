// Runs each QLinearConv with constant weights (quantize_static's QOperator format) on the float
// convolution kernels, with the integer operator's results: its operands minus their zero points are
// small integers, which float32 multiplies exactly, so the float convolution of the centered operands
// is the integer accumulator itself while every partial sum stays below 2^24 (a requantized layer's
// accumulators are bounded by 255 / multiplier, about 10^5 for calibrated scales).
//
//   x (uint8/int8)  x_scale  x_zp  w  w_scale  w_zp  y_scale  y_zp  [B int32]
//                 \_______________________|________________________/
//                                   QLinearConv                      y = saturate(round((acc + B) * m) +
//                                   y_zp)
//                                        |                           m = x_scale * w_scale / y_scale
//                                        y
//   =>
//   x -> DequantizeLinear(1, x_zp) -> Conv(w - w_zp, float(B)) -> Mul(m) -> QuantizeLinear(1, y_zp) -> y
//
// w - w_zp (per output channel or per tensor) and float(B) are float initializers made once here; m is
// computed in float32 in the operator's order (x_scale * w_scale, then / y_scale), per tensor or
// [1, M, 1...] per output channel; QuantizeLinear with scale 1 rounds half to even and saturates as the
// operator does. The convolution then takes the float passes (channels_last_convs moves the layout
// through the per-tensor DequantizeLinear and QuantizeLinear and the Mul) and kernels, and
// fuse_quantize_dequantize makes the Mul and QuantizeLinear one requantization. Applies when
// w, its scale and zero point, x's and y's scales and zero points and B are initializers (y_zp given,
// so the output type is known), one scale and zero point for x and y; loads for the CPU. The 8-bit weight
// becomes 4 bytes a value, as the float model's.
#include <optional>
#include <string>
#include <vector>

#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

enum Input : size_t { kX, kXScale, kXZero, kW, kWScale, kWZero, kYScale, kYZero, kBias };

bool is_8bit(mx::Dtype t) { return t == mx::int8 || t == mx::uint8; }

// One value, or one per output channel ([M]).
bool per_tensor_or_channel(const mx::array& p, int channels) {
  return p.size() == 1 || (p.ndim() == 1 && p.shape(0) == channels);
}

bool fits(const Graph& graph, const Node& node) {
  if (!is_onnx_op(node, "QLinearConv") || node.outputs.size() != 1 || !has_input(node, kYZero)) return false;
  const mx::array* w = stored_input(graph, node, kW);
  if (w == nullptr || !is_8bit(w->dtype()) || w->ndim() < 3) return false;
  const int channels = w->shape(0);
  for (size_t i : {kXScale, kYScale}) {
    const mx::array* scale = stored_input(graph, node, i);
    if (scale == nullptr || scale->dtype() != mx::float32 || scale->size() != 1) return false;
  }
  for (size_t i : {kXZero, kYZero}) {
    if (!has_input(node, i)) continue;
    const mx::array* zero = stored_input(graph, node, i);
    if (zero == nullptr || !is_8bit(zero->dtype()) || zero->size() != 1) return false;
  }
  const mx::array* w_scale = stored_input(graph, node, kWScale);
  if (w_scale == nullptr || w_scale->dtype() != mx::float32 || !per_tensor_or_channel(*w_scale, channels))
    return false;
  if (has_input(node, kWZero)) {
    const mx::array* w_zero = stored_input(graph, node, kWZero);
    if (w_zero == nullptr || w_zero->dtype() != w->dtype() || !per_tensor_or_channel(*w_zero, channels))
      return false;
  }
  if (has_input(node, kBias)) {
    const mx::array* bias = stored_input(graph, node, kBias);
    if (bias == nullptr || bias->dtype() != mx::int32 || bias->shape() != mx::Shape{channels}) return false;
  }
  return true;
}

// A per-tensor or per-output-channel parameter shaped [M, 1, 1...] against the weight, or a scalar.
mx::array against_weight(const mx::array& p, const mx::array& w) {
  if (p.size() == 1) return mx::reshape(p, {});
  mx::Shape shape(w.ndim(), 1);
  shape[0] = p.shape(0);
  return mx::reshape(p, shape);
}

// The float nodes and initializers replacing one QLinearConv, in order.
std::vector<Node> float_convolution(Graph& graph, ValueNames& names, const Node& q) {
  const mx::array& w = *stored_input(graph, q, kW);
  const std::string base = q.name.empty() ? q.outputs[0] : q.name;
  const int opset = static_cast<int>(graph.opsets.at(""));
  auto constant = [&](const std::string& suffix, mx::array value) {
    return add_initializer(graph, names, base + suffix, std::move(value));
  };
  auto node = [&](const std::string& op, std::vector<std::string> inputs, const std::string& output) {
    Node n;
    n.name = base + "/" + op;
    n.op_type = op;
    n.opset = opset;
    n.inputs = std::move(inputs);
    n.outputs = {output};
    return n;
  };
  std::vector<Node> out;
  // x - x_zp in float32 (exact: 8-bit integers): DequantizeLinear with scale 1.
  const std::string one = constant("/one", mx::array(1.0f));
  const std::string x = names.fresh(base + "/x_centered");
  std::vector<std::string> dequantize_inputs = {q.inputs[kX], one};
  if (has_input(q, kXZero)) dequantize_inputs.push_back(q.inputs[kXZero]);
  out.push_back(node("DequantizeLinear", dequantize_inputs, x));
  mx::array weight = mx::astype(w, mx::float32);
  if (has_input(q, kWZero))
    weight =
        mx::subtract(weight, mx::astype(against_weight(*stored_input(graph, q, kWZero), w), mx::float32));
  std::vector<std::string> conv_inputs = {x, constant("/w_centered", weight)};
  if (has_input(q, kBias))
    conv_inputs.push_back(constant("/bias", mx::astype(*stored_input(graph, q, kBias), mx::float32)));
  const std::string accumulator = names.fresh(base + "/accumulator");
  Node conv = node("Conv", conv_inputs, accumulator);
  conv.attributes =
      q.attributes;  // QLinearConv's are Conv's: auto_pad, dilations, group, kernel_shape, pads, strides
  out.push_back(std::move(conv));
  // m = x_scale * w_scale / y_scale, per output channel [1, M, 1...] or per tensor.
  mx::array multiplier = mx::divide(
      mx::multiply(mx::reshape(*stored_input(graph, q, kXScale), {}), *stored_input(graph, q, kWScale)),
      mx::reshape(*stored_input(graph, q, kYScale), {}));
  if (multiplier.size() == 1) {
    multiplier = mx::reshape(multiplier, {});
  } else {
    mx::Shape shape(w.ndim(), 1);
    shape[1] = static_cast<int>(multiplier.size());
    multiplier = mx::reshape(multiplier, shape);
  }
  const std::string scaled = names.fresh(base + "/scaled");
  out.push_back(node("Mul", {accumulator, constant("/multiplier", multiplier)}, scaled));
  out.push_back(node("QuantizeLinear", {scaled, one, q.inputs[kYZero]}, q.outputs[0]));
  return out;
}

}  // namespace

size_t qlinear_conv_as_conv(Graph& graph) {
  // CPU only: a GPU's float convolution may use Winograd or FFT algorithms, whose sums are not the exact
  // integers (the QLinearConv op keeps its exact integer path there).
  if (mx::default_device() != mx::Device::cpu) return 0;
  std::vector<size_t> matches;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (fits(graph, graph.nodes[i])) matches.push_back(i);
  }
  if (matches.empty()) return 0;
  std::vector<std::string> replaced;
  ValueNames names(graph);
  std::vector<Node> nodes;
  size_t next = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (next < matches.size() && matches[next] == i) {
      ++next;
      const Node& q = graph.nodes[i];
      for (size_t input : {kW, kWZero, kBias}) {
        if (has_input(q, input)) replaced.push_back(q.inputs[input]);
      }
      for (Node& n : float_convolution(graph, names, q)) nodes.push_back(std::move(n));
      continue;
    }
    nodes.push_back(std::move(graph.nodes[i]));
  }
  graph.nodes = std::move(nodes);
  drop_unread_weights(graph, replaced);  // the integer weights, once nothing reads them
  return matches.size();
}

}  // namespace transmuter
