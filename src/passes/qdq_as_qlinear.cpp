// Turns the QDQ format's quantized convolutions and additions back into the integer operators they stand
// for, as ONNX Runtime's QDQ transformer does before it runs them on its integer kernels (quantize_static's
// default format writes every Conv and Add of a quantized CNN between DequantizeLinear and QuantizeLinear):
//
//   xq  x_scale x_zp      wq (initializer) w_scale w_zp     [bq (int32 initializer) b_scale]
//     \   |    /               \     |     /                        \      /
//   DequantizeLinear         DequantizeLinear                   [DequantizeLinear]
//          \___________________________|___________________________/
//                                    Conv
//                                      |                    =>   QLinearConv(xq, x_scale, x_zp, wq, w_scale,
//                     QuantizeLinear(y_scale, y_zp)                           w_zp, y_scale, y_zp, [bq])
//                                      |
//                                      yq
//
//   aq -> DequantizeLinear(sa, za) \
//                                   Add -> QuantizeLinear(sc, zc) -> cq   =>   com.microsoft QLinearAdd(aq,
//                                   sa,
//   bq -> DequantizeLinear(sb, zb) /                                            za, bq, sb, zb, sc, zc)
//
// and Gemm over the same DequantizeLinears (alpha 1, beta 1, transA 0; the weight's scale per tensor or
// per column of B) before a QuantizeLinear => com.microsoft QGemm (the classifier), which
// qlinear_convs_nhwc runs as a 1x1 integer convolution; GlobalAveragePool likewise => com.microsoft
// QLinearGlobalAveragePool.
//
// qlinear_convs_nhwc then runs the convolutions on bytes, channels-last, and QLinearAdd adds bytes. The
// integer operators round once, at their output, where the QDQ graph computes in float32 between the
// roundings, so an output may differ from the QDQ graph's by a step of its quantization scale where a
// value lies at a rounding boundary (ONNX Runtime's optimized run differs from its unoptimized one the
// same way).
//
// Applies when every scale and zero point is a one-element initializer (w's scale and zero point: one, or
// one per output channel on axis 0) with an 8-bit zero point (QLinearAdd's and the pool's operands and
// results of one type), w an 8-bit initializer [M, C/group, kH, kW], the bias DequantizeLinear's scale
// x_scale * w_scale (the float32 product, per channel or per tensor) and zero point 0, auto_pad NOTSET or
// VALID; the float value between the Conv or Add and its QuantizeLinear read by that QuantizeLinear alone.
// DequantizeLinear nodes nothing reads any more go. Loads for the CPU with AVX512-VNNI only, where the
// integer convolutions run (kernels::integer_gemm_available); elsewhere the QDQ graph keeps its float
// convolutions.
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/integer_gemm.h"
#include "mlx_bridge/buffers.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

bool is_8bit(mx::Dtype t) { return t == mx::int8 || t == mx::uint8; }

// A plain DequantizeLinear / QuantizeLinear of the default domain: no block_size, output_dtype, saturate.
bool plain(const Node& node, const char* op_type) {
  return is_onnx_op(node, op_type) && node.outputs.size() == 1 && node.inputs.size() >= 2 &&
         int_attribute_or(node, "block_size", 0) == 0 && int_attribute_or(node, "output_dtype", 0) == 0 &&
         node.find_attribute("saturate") == nullptr;
}

// The DequantizeLinear producing `value`, or nullptr.
const Node* dequantize_of(const Graph& graph, const GraphIndex& index, const std::string& value) {
  std::optional<size_t> p = index.producer(value);
  if (!p || !plain(graph.nodes[*p], "DequantizeLinear")) return nullptr;
  return &graph.nodes[*p];
}

// Per-tensor parameters of a quantization node: float32 scale and an 8-bit zero point of `zero_type`
// (any 8-bit type when nullopt), both one-element initializers, the zero point present.
bool per_tensor(const Graph& graph, const Node& node, std::optional<mx::Dtype> zero_type) {
  if (node.inputs.size() < 3 || node.inputs[2].empty()) return false;
  const mx::array* scale = scalar_initializer(graph, node.inputs[1]);
  const mx::array* zero = scalar_initializer(graph, node.inputs[2]);
  return scale != nullptr && scale->dtype() == mx::float32 && zero != nullptr && is_8bit(zero->dtype()) &&
         (!zero_type || zero->dtype() == *zero_type);
}

// The QuantizeLinear reading `value` when it alone reads it (and it is no graph output), per tensor.
std::optional<size_t> sole_quantize(const Graph& graph, const GraphIndex& index, const std::string& value) {
  std::optional<size_t> reader = sole_consumer(index, value);
  if (!reader || !plain(graph.nodes[*reader], "QuantizeLinear") || graph.nodes[*reader].inputs[0] != value ||
      !per_tensor(graph, graph.nodes[*reader], std::nullopt))
    return std::nullopt;
  return reader;
}

// The weight's DequantizeLinear: an 8-bit initializer [M, ...], scale float32 one value or [M] on axis 0,
// zero point absent or of w's type with the scale's size.
bool weight_dequantize_fits(const Graph& graph, const Node& dq) {
  const mx::array* w = stored_initializer(graph, dq.inputs[0]);
  const mx::array* scale = stored_initializer(graph, dq.inputs[1]);
  if (w == nullptr || !is_8bit(w->dtype()) || w->ndim() != 4 || scale == nullptr ||
      scale->dtype() != mx::float32)
    return false;
  const bool per_channel = scale->size() != 1;
  if (per_channel &&
      (scale->ndim() != 1 || scale->shape(0) != w->shape(0) || int_attribute_or(dq, "axis", 1) != 0))
    return false;
  if (dq.inputs.size() >= 3 && !dq.inputs[2].empty()) {
    const mx::array* zero = stored_initializer(graph, dq.inputs[2]);
    if (zero == nullptr || zero->dtype() != w->dtype() || zero->size() != scale->size()) return false;
  }
  return true;
}

// The bias's DequantizeLinear: an int32 initializer [M] with scale x_scale * w_scale and zero point 0.
bool bias_dequantize_fits(const Graph& graph, const Node& dq, const mx::array& x_scale,
                          const mx::array& w_scale, int channels) {
  const mx::array* b = stored_initializer(graph, dq.inputs[0]);
  const mx::array* scale = stored_initializer(graph, dq.inputs[1]);
  if (b == nullptr || b->dtype() != mx::int32 || b->shape() != mx::Shape{channels} || scale == nullptr ||
      scale->dtype() != mx::float32 || scale->size() != w_scale.size())
    return false;
  if (scale->size() != 1 && int_attribute_or(dq, "axis", 1) != 0) return false;
  // On the host: an MLX evaluation at load is a round trip to the stream's thread, here two a convolution.
  if (dq.inputs.size() >= 3 && !dq.inputs[2].empty()) {
    const mx::array* zero = stored_initializer(graph, dq.inputs[2]);
    if (zero == nullptr || zero->dtype() != mx::int32) return false;
    mx::array keep = *zero;
    const std::span<const uint8_t> bytes = host_bytes(*zero, /*as_float32=*/false, keep);
    if (std::any_of(bytes.begin(), bytes.end(), [](uint8_t byte) { return byte != 0; })) return false;
  }
  if (x_scale.dtype() != mx::float32 || w_scale.dtype() != mx::float32 || x_scale.size() != 1) return false;
  mx::array keep_x = x_scale, keep_w = w_scale, keep_b = *scale;
  const float x = host_floats(x_scale, keep_x)[0];
  const std::span<const float> w = host_floats(w_scale, keep_w), b_scale = host_floats(*scale, keep_b);
  for (size_t i = 0; i < w_scale.size(); ++i) {
    if (x * w[i] != b_scale[i])
      return false;  // float32 products, as the Conv's DequantizeLinear computes them
  }
  return true;
}

// The integer node replacing `node` (a Conv, Add, Gemm or GlobalAveragePool) and its QuantizeLinear: named as
// `node` (or after the quantized output), writing the QuantizeLinear's output.
Node integer_node(const Node& node, const Node& quantize, const char* op_type, const char* domain, int opset,
                  std::vector<std::string> inputs) {
  Node n;
  n.op_type = op_type;
  n.domain = domain;
  n.opset = opset;
  n.name = node.name.empty() ? quantize.outputs[0] : node.name;
  n.inputs = std::move(inputs);
  n.outputs = quantize.outputs;
  return n;
}

struct Rewrite {
  size_t node;      // the Conv or Add
  size_t quantize;  // its QuantizeLinear
  Node replacement;
};

std::optional<Rewrite> conv_rewrite(const Graph& graph, const GraphIndex& index, size_t i) {
  const Node& conv = graph.nodes[i];
  if (!is_onnx_op(conv, "Conv") || conv.outputs.size() != 1 || conv.inputs.size() < 2) return std::nullopt;
  const Attribute* auto_pad = conv.find_attribute("auto_pad");
  if (auto_pad != nullptr && auto_pad->s != "NOTSET" && auto_pad->s != "VALID") return std::nullopt;
  const Node* x = dequantize_of(graph, index, conv.inputs[0]);
  const Node* w = dequantize_of(graph, index, conv.inputs[1]);
  if (x == nullptr || w == nullptr || !per_tensor(graph, *x, std::nullopt) ||
      !weight_dequantize_fits(graph, *w))
    return std::nullopt;
  const int channels = stored_initializer(graph, w->inputs[0])->shape(0);
  const Node* b = nullptr;
  if (conv.inputs.size() >= 3 && !conv.inputs[2].empty()) {
    b = dequantize_of(graph, index, conv.inputs[2]);
    if (b == nullptr || !bias_dequantize_fits(graph, *b, *scalar_initializer(graph, x->inputs[1]),
                                              *stored_initializer(graph, w->inputs[1]), channels))
      return std::nullopt;
  }
  std::optional<size_t> q = sole_quantize(graph, index, conv.outputs[0]);
  if (!q) return std::nullopt;
  const Node& quantize = graph.nodes[*q];
  const bool w_zero = w->inputs.size() >= 3 && !w->inputs[2].empty();
  Node n = integer_node(conv, quantize, "QLinearConv", "", conv.opset,
                        {x->inputs[0], x->inputs[1], x->inputs[2], w->inputs[0], w->inputs[1],
                         w_zero ? w->inputs[2] : std::string(), quantize.inputs[1], quantize.inputs[2]});
  if (b != nullptr) n.inputs.push_back(b->inputs[0]);
  n.attributes =
      conv.attributes;  // Conv's are QLinearConv's: auto_pad, dilations, group, kernel_shape, pads, strides
  return Rewrite{i, *q, std::move(n)};
}

std::optional<Rewrite> add_rewrite(const Graph& graph, const GraphIndex& index, size_t i) {
  const Node& add = graph.nodes[i];
  if (!is_onnx_op(add, "Add") || add.outputs.size() != 1 || add.inputs.size() != 2) return std::nullopt;
  const Node* a = dequantize_of(graph, index, add.inputs[0]);
  const Node* b = dequantize_of(graph, index, add.inputs[1]);
  if (a == nullptr || b == nullptr || !per_tensor(graph, *a, std::nullopt)) return std::nullopt;
  // QLinearAdd's operands and result have one type.
  const mx::Dtype type = scalar_initializer(graph, a->inputs[2])->dtype();
  if (!per_tensor(graph, *b, type)) return std::nullopt;
  std::optional<size_t> q = sole_quantize(graph, index, add.outputs[0]);
  if (!q || scalar_initializer(graph, graph.nodes[*q].inputs[2])->dtype() != type) return std::nullopt;
  const Node& quantize = graph.nodes[*q];
  Node n = integer_node(add, quantize, "QLinearAdd", "com.microsoft", 1,
                        {a->inputs[0], a->inputs[1], a->inputs[2], b->inputs[0], b->inputs[1], b->inputs[2],
                         quantize.inputs[1], quantize.inputs[2]});
  return Rewrite{i, *q, std::move(n)};
}

// The weight of a Gemm: an 8-bit initializer [N, K] (transB) or [K, N], scale float32 one value or [N] on
// B's N axis, zero point absent or of B's type with the scale's size.
bool gemm_weight_fits(const Graph& graph, const Node& dq, bool trans_b) {
  const mx::array* w = stored_initializer(graph, dq.inputs[0]);
  const mx::array* scale = stored_initializer(graph, dq.inputs[1]);
  if (w == nullptr || !is_8bit(w->dtype()) || w->ndim() != 2 || scale == nullptr ||
      scale->dtype() != mx::float32)
    return false;
  const int n_axis = trans_b ? 0 : 1;
  if (scale->size() != 1 && (scale->ndim() != 1 || scale->shape(0) != w->shape(n_axis) ||
                             int_attribute_or(dq, "axis", 1) != n_axis))
    return false;
  if (dq.inputs.size() >= 3 && !dq.inputs[2].empty()) {
    const mx::array* zero = stored_initializer(graph, dq.inputs[2]);
    if (zero == nullptr || zero->dtype() != w->dtype() || zero->size() != scale->size()) return false;
  }
  return true;
}

// Gemm(DequantizeLinear(a), DequantizeLinear(b), [DequantizeLinear(c)]) -> QuantizeLinear => com.microsoft
// QGemm (alpha 1, beta 1, transA 0): the classifier of a QDQ CNN.
std::optional<Rewrite> gemm_rewrite(const Graph& graph, const GraphIndex& index, size_t i) {
  const Node& gemm = graph.nodes[i];
  if (!is_onnx_op(gemm, "Gemm") || gemm.outputs.size() != 1 || gemm.inputs.size() < 2 ||
      int_attribute_or(gemm, "transA", 0) != 0 || float_attribute_or(gemm, "alpha", 1.0f) != 1.0f ||
      float_attribute_or(gemm, "beta", 1.0f) != 1.0f)
    return std::nullopt;
  const bool trans_b = int_attribute_or(gemm, "transB", 0) != 0;
  const Node* a = dequantize_of(graph, index, gemm.inputs[0]);
  const Node* b = dequantize_of(graph, index, gemm.inputs[1]);
  if (a == nullptr || b == nullptr || !per_tensor(graph, *a, std::nullopt) ||
      !gemm_weight_fits(graph, *b, trans_b))
    return std::nullopt;
  const mx::array& w = *stored_initializer(graph, b->inputs[0]);
  const int n = trans_b ? w.shape(0) : w.shape(1);
  const Node* c = nullptr;
  if (gemm.inputs.size() >= 3 && !gemm.inputs[2].empty()) {
    c = dequantize_of(graph, index, gemm.inputs[2]);
    if (c == nullptr || !bias_dequantize_fits(graph, *c, *scalar_initializer(graph, a->inputs[1]),
                                              *stored_initializer(graph, b->inputs[1]), n))
      return std::nullopt;
  }
  std::optional<size_t> q = sole_quantize(graph, index, gemm.outputs[0]);
  if (!q) return std::nullopt;
  const Node& quantize = graph.nodes[*q];
  const bool b_zero = b->inputs.size() >= 3 && !b->inputs[2].empty();
  Node r = integer_node(gemm, quantize, "QGemm", "com.microsoft", 1,
                        {a->inputs[0], a->inputs[1], a->inputs[2], b->inputs[0], b->inputs[1],
                         b_zero ? b->inputs[2] : std::string(), c != nullptr ? c->inputs[0] : std::string(),
                         quantize.inputs[1], quantize.inputs[2]});
  r.attributes = {int_attribute("transB", trans_b ? 1 : 0)};
  return Rewrite{i, *q, std::move(r)};
}

// GlobalAveragePool(DequantizeLinear(x)) -> QuantizeLinear => com.microsoft QLinearGlobalAveragePool.
std::optional<Rewrite> pool_rewrite(const Graph& graph, const GraphIndex& index, size_t i) {
  const Node& pool = graph.nodes[i];
  if (!is_onnx_op(pool, "GlobalAveragePool") || pool.outputs.size() != 1 || pool.inputs.size() != 1)
    return std::nullopt;
  const Node* x = dequantize_of(graph, index, pool.inputs[0]);
  if (x == nullptr || !per_tensor(graph, *x, std::nullopt)) return std::nullopt;
  std::optional<size_t> q = sole_quantize(graph, index, pool.outputs[0]);
  const mx::Dtype type = scalar_initializer(graph, x->inputs[2])->dtype();
  if (!q || scalar_initializer(graph, graph.nodes[*q].inputs[2])->dtype() != type) return std::nullopt;
  const Node& quantize = graph.nodes[*q];
  Node r = integer_node(pool, quantize, "QLinearGlobalAveragePool", "com.microsoft", 1,
                        {x->inputs[0], x->inputs[1], x->inputs[2], quantize.inputs[1], quantize.inputs[2]});
  r.attributes = {int_attribute("channels_last", 0)};
  return Rewrite{i, *q, std::move(r)};
}

// Removes DequantizeLinear nodes whose output nothing reads any more (the rewrites' operands), repeatedly
// none: they read initializers or activations only.
void drop_unread_dequantizes(Graph& graph) {
  const GraphIndex index(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    removed[i] = plain(node, "DequantizeLinear") && index.consumers(node.outputs[0]).empty() &&
                 !index.is_graph_output(node.outputs[0]);
  }
  erase_nodes(graph, removed);
}

}  // namespace

size_t qdq_as_qlinear(Graph& graph) {
  if (mx::default_device() != mx::Device::cpu || !kernels::integer_gemm_available()) return 0;
  const GraphIndex index(graph);
  std::vector<Rewrite> rewrites;
  std::vector<bool> taken(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    std::optional<Rewrite> r = conv_rewrite(graph, index, i);
    if (!r) r = add_rewrite(graph, index, i);
    if (!r) r = gemm_rewrite(graph, index, i);
    if (!r) r = pool_rewrite(graph, index, i);
    if (!r || taken[r->quantize]) continue;
    taken[r->node] = taken[r->quantize] = true;
    rewrites.push_back(std::move(*r));
  }
  if (rewrites.empty()) return 0;
  // Each integer node takes its QuantizeLinear's place (its output's producer, after everything it reads).
  std::vector<bool> removed(graph.nodes.size(), false);
  for (Rewrite& r : rewrites) {
    removed[r.node] = true;
    graph.nodes[r.quantize] = std::move(r.replacement);
  }
  erase_nodes(graph, removed);
  drop_unread_dequantizes(graph);
  import_domain(graph, "com.microsoft", 1);
  return rewrites.size();
}

}  // namespace transmuter
