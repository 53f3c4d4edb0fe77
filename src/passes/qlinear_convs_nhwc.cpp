// Runs each 2-D QLinearConv with constant weights over 8-bit activations (quantize_static's QOperator
// format, or the QDQ format once qdq_convs_as_qlinear made it one) on the integer kernels of
// src/kernels/cpu/qlinear_conv.h, in the channels-last layout:
//
//   x (8-bit)  x_scale  x_zp  w  w_scale  w_zp  y_scale  y_zp  [B int32]
//            \_______________________|__________________________/
//                                QLinearConv
//                                     |
//                                     y
//   =>
//   x -> Transpose(0,2,3,1) -> ai.transmuter QLinearConvNhwc(x', x_zp, W', [sums, zeros], m, y_zp, [B])
//     -> Transpose(0,3,1,2) -> y
//
// W' is the weight prepared once here: group 1, its rows [kH * kW * C, M] packed for the VNNI integer
// GEMM with its zero point (column sums and zeros beside it); depthwise, w - w_zp as int16 [kH, kW, C].
// m = x_scale * w_scale / y_scale in float32, in that order (ONNX Runtime's), one value or [M]. The
// transposes between two convolutions then cancel in channels_last_convs' step 2, which moves the layout
// through QLinearAdd, QLinearGlobalAveragePool and per-tensor QuantizeLinear / DequantizeLinear, so a
// quantized CNN runs on bytes from its first QuantizeLinear to its classifier. The integers are the
// operator's, so the outputs are those of the QLinearConv op exactly.
//
// A com.microsoft QGemm with the same constant operands (B for w, C for B; alpha 1, transA 0, a
// quantized output) becomes the 1x1 convolution over A's rows, between Reshapes to [M, 1, 1, K] and back
// to [M, N]: the classifier of quantize_static's QOperator CNNs, which otherwise widened and centered its
// constant B on every call (a fifth of MobileNetV2's run).
//
// Applies when w (int8 or uint8, [M, C, kH, kW]), its scale and zero point (one value or [M]), x's and
// y's scales and zero points (one value each; x_zp and y_zp 8-bit, x_zp of x's type) and B
// are initializers; group 1 or depthwise (group == C == M, with at most kExactIntegerTerms taps);
// auto_pad NOTSET or VALID. Loads for the CPU with AVX512-VNNI only (kernels::integer_gemm_available):
// elsewhere qlinear_conv_as_conv's float convolutions run faster than the integer reference.
#include <algorithm>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/integer_gemm.h"
#include "kernels/cpu/qlinear_conv.h"
#include "mlx_bridge/buffers.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";
enum Input : size_t { kX, kXScale, kXZero, kW, kWScale, kWZero, kYScale, kYZero, kBias };

bool is_8bit(mx::Dtype t) { return t == mx::int8 || t == mx::uint8; }

bool one_float(const mx::array* a) { return a != nullptr && a->dtype() == mx::float32 && a->size() == 1; }

bool one_or_per_channel(const mx::array* a, int channels) {
  return a != nullptr && (a->size() == 1 || (a->ndim() == 1 && a->shape(0) == channels));
}

struct QConvMatch {
  bool depthwise = false;
  std::vector<int64_t> kernel, strides, pads, dilations;
};

std::optional<QConvMatch> match(const Graph& graph, const Node& node) {
  if (!is_onnx_op(node, "QLinearConv") || node.outputs.size() != 1 || !has_input(node, kXZero) ||
      !has_input(node, kYZero))
    return std::nullopt;
  const mx::array* w = stored_input(graph, node, kW);
  if (w == nullptr || !is_8bit(w->dtype()) || w->ndim() != 4 || w->size() == 0) return std::nullopt;
  const int channels = w->shape(0);
  const mx::array* x_zero = stored_input(graph, node, kXZero);
  const mx::array* y_zero = stored_input(graph, node, kYZero);
  if (x_zero == nullptr || !is_8bit(x_zero->dtype()) || x_zero->size() != 1) return std::nullopt;
  if (y_zero == nullptr || !is_8bit(y_zero->dtype()) || y_zero->size() != 1) return std::nullopt;
  if (!one_float(stored_input(graph, node, kXScale)) || !one_float(stored_input(graph, node, kYScale)))
    return std::nullopt;
  const mx::array* w_scale = stored_input(graph, node, kWScale);
  if (!one_or_per_channel(w_scale, channels) || w_scale->dtype() != mx::float32) return std::nullopt;
  if (has_input(node, kWZero)) {
    const mx::array* w_zero = stored_input(graph, node, kWZero);
    if (!one_or_per_channel(w_zero, channels) || w_zero->dtype() != w->dtype()) return std::nullopt;
  }
  if (has_input(node, kBias)) {
    const mx::array* bias = stored_input(graph, node, kBias);
    if (bias == nullptr || bias->dtype() != mx::int32 || bias->shape() != mx::Shape{channels})
      return std::nullopt;
  }
  const Attribute* auto_pad = node.find_attribute("auto_pad");
  if (auto_pad != nullptr && auto_pad->s != "NOTSET" && auto_pad->s != "VALID") return std::nullopt;
  QConvMatch m;
  const int64_t group = int_attribute_or(node, "group", 1);
  m.depthwise = group != 1;
  m.kernel = {w->shape(2), w->shape(3)};
  if (m.depthwise &&
      (group != channels || w->shape(1) != 1 || m.kernel[0] * m.kernel[1] > kernels::kExactIntegerTerms))
    return std::nullopt;
  if (ints_attribute_or(node, "kernel_shape", m.kernel) != m.kernel) return std::nullopt;
  m.strides = ints_attribute_or(node, "strides", {1, 1});
  m.dilations = ints_attribute_or(node, "dilations", {1, 1});
  m.pads = auto_pad != nullptr && auto_pad->s == "VALID" ? std::vector<int64_t>{0, 0, 0, 0}
                                                         : ints_attribute_or(node, "pads", {0, 0, 0, 0});
  if (m.strides.size() != 2 || m.dilations.size() != 2 || m.pads.size() != 4) return std::nullopt;
  auto in_range = [](int64_t lo) { return [lo](int64_t v) { return v >= lo && v < (1 << 20); }; };
  if (!std::all_of(m.strides.begin(), m.strides.end(), in_range(1)) ||
      !std::all_of(m.dilations.begin(), m.dilations.end(), in_range(1)) ||
      !std::all_of(m.pads.begin(), m.pads.end(), in_range(0)))
    return std::nullopt;
  return m;
}

Node transpose_node(const std::string& input, const std::string& output, std::vector<int64_t> perm,
                    int opset) {
  Node t;
  t.op_type = "Transpose";
  t.opset = opset;
  t.name = output + "/Transpose";
  t.inputs = {input};
  t.outputs = {output};
  t.attributes.push_back(ints_attribute("perm", std::move(perm)));
  return t;
}

// The prepared initializers of one QLinearConv: W' [, sums, zeros] and the multiplier.
struct Prepared {
  std::string weight, column_sums, column_zeros, multiplier;
};

// The operands a QLinearConvNhwc prepares from: w [M, C, kH, kW] and its zero point (absent, one value or
// [M]), the scales of x, w (one value or [M]) and y.
struct ConvOperands {
  mx::array w;
  std::optional<mx::array> w_zero;
  mx::array x_scale, w_scale, y_scale;
  std::optional<mx::array> rows =
      std::nullopt;  // group 1: w's GEMM rows [K, M] when given as such (QGemm's B)
};

// x_scale * w_scale / y_scale in float32, in that order (ONNX Runtime's), one value or one per output
// channel. On the host, as the weights: an MLX evaluation at load is a round trip to the stream's thread.
mx::array multiplier_of(const ConvOperands& c) {
  mx::array keep_x = c.x_scale, keep_w = c.w_scale, keep_y = c.y_scale;
  const float x_scale = host_floats(c.x_scale, keep_x)[0], y_scale = host_floats(c.y_scale, keep_y)[0];
  const std::span<const float> w_scale = host_floats(c.w_scale, keep_w);
  std::vector<float> m(w_scale.size());
  for (size_t i = 0; i < m.size(); ++i) {
    const float product = x_scale * w_scale[i];  // rounded to float32 before the division, as MLX's two ops
    m[i] = product / y_scale;
  }
  return mx::array(m.data(), {static_cast<int>(m.size())}, mx::float32);
}

Prepared prepare(Graph& graph, ValueNames& names, const std::string& base, const ConvOperands& c,
                 bool depthwise) {
  auto constant = [&](const std::string& suffix, mx::array value) {
    return add_initializer(graph, names, base + suffix, std::move(value));
  };
  Prepared p;
  if (depthwise) {
    p.weight = constant("/w_hwc", kernels::qlinear_depthwise_weight(c.w, c.w_zero));
  } else {
    // From the weight's own layout (a filter per output channel): packing transposes it as it goes.
    kernels::PackedIntegerRhs packed =
        c.rows ? kernels::pack_integer_gemm_rhs(*c.rows, c.w_zero)
               : kernels::pack_integer_gemm_rhs_columns(kernels::qlinear_conv_weight_columns(c.w), c.w_zero);
    p.weight = constant("/w_packed", packed.packed);
    p.column_sums = constant("/w_column_sums", packed.column_sums);
    p.column_zeros = constant("/w_column_zeros", packed.column_zeros);
  }
  p.multiplier = constant("/multiplier", multiplier_of(c));
  return p;
}

ConvOperands conv_operands(const Graph& graph, const Node& q) {
  std::optional<mx::array> w_zero;
  if (has_input(q, kWZero)) w_zero = *stored_input(graph, q, kWZero);
  return {*stored_input(graph, q, kW), w_zero, *stored_input(graph, q, kXScale),
          *stored_input(graph, q, kWScale), *stored_input(graph, q, kYScale)};
}

// The node's byte operands beside the prepared ones: x's and y's zero points, the int32 bias ("" for none).
struct ByteOperands {
  std::string x, x_zero, y_zero, bias;
};

Node qlinear_conv_nhwc_node(const std::string& base, const QConvMatch& m, const Prepared& p,
                            const ByteOperands& b, const std::string& y, int64_t out_channels) {
  Node n;
  n.op_type = "QLinearConvNhwc";
  n.domain = kDomain;
  n.opset = 1;
  n.name = base + "/nhwc";
  n.inputs = {b.x, b.x_zero, p.weight, p.column_sums, p.column_zeros, p.multiplier, b.y_zero};
  if (!b.bias.empty()) n.inputs.push_back(b.bias);
  n.outputs = {y};
  n.attributes.push_back(ints_attribute("kernel_shape", m.kernel));
  n.attributes.push_back(ints_attribute("strides", m.strides));
  n.attributes.push_back(ints_attribute("pads", m.pads));
  n.attributes.push_back(ints_attribute("dilations", m.dilations));
  n.attributes.push_back(int_attribute("group", m.depthwise ? out_channels : 1));
  n.attributes.push_back(int_attribute("out_channels", out_channels));
  return n;
}

// ---- QGemm as a 1x1 QLinearConvNhwc ----

enum GemmInput : size_t { kA, kAScale, kAZero, kB, kBScale, kBZero, kC, kGemmYScale, kGemmYZero };

// A QGemm with constant operands and a quantized output is a 1x1 convolution over A's rows: with alpha 1
// its scale alpha * a_scale * b_scale / y_scale is the convolution's multiplier (1 * a_scale is a_scale).
bool qgemm_fits(const Graph& graph, const Node& node) {
  if (node.domain != "com.microsoft" || node.op_type != "QGemm" || node.outputs.size() != 1 ||
      !has_input(node, kAZero) || !has_input(node, kGemmYZero) || int_attribute_or(node, "transA", 0) != 0 ||
      float_attribute_or(node, "alpha", 1.0f) != 1.0f)
    return false;
  const mx::array* b = stored_input(graph, node, kB);
  if (b == nullptr || !is_8bit(b->dtype()) || b->ndim() != 2 || b->size() == 0) return false;
  const int n = int_attribute_or(node, "transB", 0) != 0 ? b->shape(0) : b->shape(1);
  const mx::array* a_zero = stored_input(graph, node, kAZero);
  const mx::array* y_zero = stored_input(graph, node, kGemmYZero);
  if (a_zero == nullptr || !is_8bit(a_zero->dtype()) || a_zero->size() != 1) return false;
  if (y_zero == nullptr || !is_8bit(y_zero->dtype()) || y_zero->size() != 1) return false;
  if (!one_float(stored_input(graph, node, kAScale)) || !one_float(stored_input(graph, node, kGemmYScale)))
    return false;
  const mx::array* b_scale = stored_input(graph, node, kBScale);
  if (!one_or_per_channel(b_scale, n) || b_scale->dtype() != mx::float32) return false;
  if (has_input(node, kBZero)) {
    const mx::array* b_zero = stored_input(graph, node, kBZero);
    if (!one_or_per_channel(b_zero, n) || b_zero->dtype() != b->dtype()) return false;
  }
  if (has_input(node, kC)) {
    const mx::array* c = stored_input(graph, node, kC);
    if (c == nullptr || c->dtype() != mx::int32 || (c->size() != 1 && c->size() != static_cast<size_t>(n)) ||
        (c->ndim() == 2 && c->shape(0) != 1) || c->ndim() > 2)
      return false;
  }
  return true;
}

// A [M, K] -> Reshape [M, 1, 1, K] -> QLinearConvNhwc (1x1, W = B' as [N, K, 1, 1]) -> Reshape [M, N].
std::vector<Node> qgemm_as_convolution(Graph& graph, ValueNames& names, const Node& q, int opset) {
  const std::string base = q.name.empty() ? q.outputs[0] : q.name;
  const mx::Device cpu = mx::Device::cpu;
  const mx::array& b = *stored_input(graph, q, kB);
  const bool transposed = int_attribute_or(q, "transB", 0) != 0;
  const int k = transposed ? b.shape(1) : b.shape(0), n = transposed ? b.shape(0) : b.shape(1);
  // B [K, N] is already the GEMM's rows; a transposed one [N, K] is the 1x1 weight [N, K, 1, 1].
  std::optional<mx::array> rows;
  if (!transposed) rows = b;
  mx::array w = transposed ? mx::reshape(b, {n, k, 1, 1}, cpu) : b;
  std::optional<mx::array> b_zero;
  if (has_input(q, kBZero)) b_zero = *stored_input(graph, q, kBZero);
  const ConvOperands operands{w,
                              b_zero,
                              *stored_input(graph, q, kAScale),
                              *stored_input(graph, q, kBScale),
                              *stored_input(graph, q, kGemmYScale),
                              rows};
  const Prepared p = prepare(graph, names, base, operands, false);
  auto constant = [&](const std::string& suffix, mx::array value) {
    return add_initializer(graph, names, base + suffix, std::move(value));
  };
  auto reshape = [&](const std::string& input, const std::string& output, std::vector<int64_t> shape) {
    Node r;
    r.op_type = "Reshape";
    r.opset = opset;
    r.name = output + "/Reshape";
    r.inputs = {input,
                constant("/shape", mx::array(shape.data(), {static_cast<int>(shape.size())}, mx::int64))};
    r.outputs = {output};
    return r;
  };
  const QConvMatch m{false, {1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}};
  const std::string x = names.fresh(q.inputs[kA] + "/rows_nhwc");
  const std::string y = names.fresh(q.outputs[0] + "/rows_nhwc");
  // C (one value or [N]) as the convolution's bias [N].
  const std::string bias =
      has_input(q, kC)
          ? constant("/bias", mx::broadcast_to(mx::reshape(*stored_input(graph, q, kC), {-1}, cpu), {n}, cpu))
          : std::string();
  Node conv = qlinear_conv_nhwc_node(base, m, p, {x, q.inputs[kAZero], q.inputs[kGemmYZero], bias}, y, n);
  return {reshape(q.inputs[kA], x, {-1, 1, 1, k}), std::move(conv), reshape(y, q.outputs[0], {-1, n})};
}

}  // namespace

size_t qlinear_convs_nhwc(Graph& graph) {
  if (mx::default_device() != mx::Device::cpu || !kernels::integer_gemm_available()) return 0;
  auto onnx = graph.opsets.find("");
  if (onnx == graph.opsets.end() || onnx->second < 1) return 0;
  const int opset = static_cast<int>(onnx->second);
  ValueNames names(graph);
  std::vector<Node> nodes;
  std::vector<std::string> replaced;
  std::map<std::string, std::string> channels_last_inputs;  // input -> its channels-last copy
  size_t converted = 0;
  for (Node& node : graph.nodes) {
    if (qgemm_fits(graph, node)) {
      for (Node& n : qgemm_as_convolution(graph, names, node, opset)) nodes.push_back(std::move(n));
      for (size_t input : {kB, kBZero}) {
        if (has_input(node, input)) replaced.push_back(node.inputs[input]);
      }
      ++converted;
      continue;
    }
    std::optional<QConvMatch> m = match(graph, node);
    if (!m) {
      nodes.push_back(std::move(node));
      continue;
    }
    const int64_t out_channels = stored_input(graph, node, kW)->shape(0);
    const Prepared p = prepare(graph, names, node.name.empty() ? node.outputs[0] : node.name,
                               conv_operands(graph, node), m->depthwise);
    for (size_t input : {kW, kWZero}) {
      if (has_input(node, input)) replaced.push_back(node.inputs[input]);
    }
    // Convolutions reading the same input share its channels-last copy.
    std::string& x = channels_last_inputs[node.inputs[kX]];
    if (x.empty()) {
      x = names.fresh(node.inputs[kX] + "/nhwc");
      nodes.push_back(transpose_node(node.inputs[kX], x, {0, 2, 3, 1}, opset));
    }
    const std::string y = names.fresh(node.outputs[0] + "/nhwc");
    const ByteOperands bytes{x, node.inputs[kXZero], node.inputs[kYZero],
                             has_input(node, kBias) ? node.inputs[kBias] : std::string()};
    nodes.push_back(qlinear_conv_nhwc_node(node.name.empty() ? node.outputs[0] : node.name, *m, p, bytes, y,
                                           out_channels));
    nodes.push_back(transpose_node(y, node.outputs[0], {0, 3, 1, 2}, opset));
    ++converted;
  }
  graph.nodes = std::move(nodes);
  if (converted == 0) return 0;
  drop_unread_weights(graph, replaced);  // the 8-bit weights, once nothing reads them
  import_domain(graph, kDomain, 1);
  return converted;
}

}  // namespace transmuter
