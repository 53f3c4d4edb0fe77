// Moves 2-D convolutions to the channels-last layout (NHWC), where the CPU
// kernels of src/kernels/cpu/conv_nhwc.h run them as packed matrix products
// (group 1) or channel-vectorized loops (depthwise), then lets the layout
// flow through the ops between convolutions so that the transposes between
// two convolutions cancel. ONNX Runtime's NCHWc transformer does the same for
// its layout.
//
// Step 1, each convertible Conv / FusedConv:
//
//        X   W   B                 X
//         \  |  /                  |
//     Conv | FusedConv     =>   Transpose(0,2,3,1)   W' (packed at load)   B
//           |                      \                 |                  /
//           Y                       ai.transmuter ConvNhwc(act, group, out_channels)
//                                                    |
//                                             Transpose(0,3,1,2)
//                                                    |
//                                                    Y
//
// Step 2, repeated until nothing changes, for T = Transpose(0,3,1,2) of a
// channels-last value A (T's other readers keep T):
//
//   Transpose(0,2,3,1)(T)          =>  Identity(A)
//   U(T), U elementwise unary      =>  Transpose(0,3,1,2)(U(A))
//         (QuantizeLinear / DequantizeLinear with per-tensor parameters too)
//   B(T, T2), T2 = Transpose(0,3,1,2)(A2)
//                                  =>  Transpose(0,3,1,2)(B(A, A2))
//   B(T, K), K a constant          =>  Transpose(0,3,1,2)(B(A, K')), K' = K
//                                      padded to rank 4 and transposed
//   QLinearAdd / QLinearMul (com.microsoft, per-tensor parameters) over T and T2 or a constant:
//                                      as B above
//   GlobalAveragePool(T)           =>  Transpose(0,3,1,2)(ai.transmuter GlobalAveragePoolNhwc(A))
//   QLinearGlobalAveragePool(T)    =>  Transpose(0,3,1,2)(QLinearGlobalAveragePool(A, channels_last 1))
//   MaxPool(T) (no Indices)        =>  Transpose(0,3,1,2)(ai.transmuter MaxPoolNhwc(A))
//   Concat(T1, T2, ..., axis 1)    =>  Transpose(0,3,1,2)(Concat(A1, A2, ..., axis 3))
//   Reduce*(T, axes, keepdims 1)   =>  Transpose(0,3,1,2)(Reduce*(A, the axes renumbered))
//
// Transposes nothing reads any more are removed. What remains are the copies
// at the region's borders (the graph input, ops with no channels-last form).
//
// Step 3: ConvNhwc (group 1, no activation) -> Add(., Z) [-> Relu], a ResNet
// or MobileNetV2 block's shortcut, becomes ConvNhwc(X, W', B, Z) [Relu]: the
// residual is added in the GEMM's epilogue.
//
// Step 4: a group-1 ConvNhwc over at most kConvDirectMaxChannels channels (QLinearConvNhwc: at most 4)
// (a stem over RGB) whose input is a Transpose(0,2,3,1) of A reads A itself
// (input_layout "NCHW": its direct kernel reads through strides), and the
// transpose goes when nothing else reads it.
//
// A convolution is converted when: its weight is a float32 4-D initializer,
// its bias absent or a float32 [M] initializer, auto_pad NOTSET or VALID, and
// group is 1 or depthwise (group == M, one input channel per group);
// FusedConv only with Relu, Clip or HardSwish and no Z. The pass runs only when
// the default device at load is the CPU: the packed weights are this CPU's.
#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/cpu/conv_nhwc.h"
#include "mlx_bridge/buffers.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";
const std::vector<int64_t> kToChannelsLast = {0, 2, 3, 1};
const std::vector<int64_t> kToChannelsFirst = {0, 3, 1, 2};
// Names the Identity nodes that replace a pair of transposes that cancel.
constexpr std::string_view kLayoutIdentity = "/cancelled_transposes";

Node transpose_node(const std::string& input, const std::string& output, const std::vector<int64_t>& perm,
                    int64_t onnx_opset) {
  Node t;
  t.op_type = "Transpose";
  t.opset = static_cast<int>(onnx_opset);
  t.name = output + "/Transpose";
  t.inputs = {input};
  t.outputs = {output};
  t.attributes.push_back(ints_attribute("perm", perm));
  return t;
}

// ---- step 1: the convolutions ----

const mx::array* float32_initializer(const Graph& graph, const std::string& name) {
  auto it = graph.initializers.find(name);
  if (it == graph.initializers.end() || !it->second.is_tensor()) return nullptr;
  const mx::array& a = it->second.tensor();
  return a.dtype() == mx::float32 ? &a : nullptr;
}

struct ConvMatch {
  int64_t out_channels = 0;
  bool depthwise = false;
  std::string activation;         // "", "Relu", "Clip", "HardSwish"
  std::vector<float> activation_params;
  std::vector<int64_t> kernel, strides, pads, dilations;
};

std::optional<ConvMatch> match_conv(const Graph& graph, const Node& node) {
  ConvMatch m;
  if (is_onnx_op(node, "Conv")) {
    if (node.inputs.size() > 3) return std::nullopt;
  } else if (node.domain == "com.microsoft" && node.op_type == "FusedConv") {
    if (node.inputs.size() > 3) return std::nullopt;  // Z
    const Attribute* activation = node.find_attribute("activation");
    if (activation == nullptr || activation->type != AttrType::kString) return std::nullopt;
    m.activation = activation->s;
    if (m.activation != "Relu" && m.activation != "HardSwish" && m.activation != "Clip") return std::nullopt;
    if (const Attribute* p = node.find_attribute("activation_params")) m.activation_params = p->floats;
    if (m.activation == "Clip" && m.activation_params.size() != 2) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (node.inputs.size() < 2 || node.outputs.size() != 1) return std::nullopt;
  const mx::array* w = float32_initializer(graph, node.inputs[1]);
  if (w == nullptr || w->ndim() != 4 || w->size() == 0) return std::nullopt;
  if (node.inputs.size() == 3 && !node.inputs[2].empty()) {
    const mx::array* b = float32_initializer(graph, node.inputs[2]);
    if (b == nullptr || b->ndim() != 1 || b->shape(0) != w->shape(0)) return std::nullopt;
  }
  if (const Attribute* pad = node.find_attribute("auto_pad"); pad != nullptr && pad->s != "NOTSET" && pad->s != "VALID") {
    return std::nullopt;
  }
  m.out_channels = w->shape(0);
  const int64_t group = int_attribute_or(node, "group", 1);
  m.depthwise = group != 1;
  if (m.depthwise && (group != m.out_channels || w->shape(1) != 1)) return std::nullopt;
  m.kernel = {w->shape(2), w->shape(3)};
  if (ints_attribute_or(node, "kernel_shape", m.kernel) != m.kernel) return std::nullopt;
  m.strides = ints_attribute_or(node, "strides", {1, 1});
  m.dilations = ints_attribute_or(node, "dilations", {1, 1});
  m.pads = ints_attribute_or(node, "pads", {0, 0, 0, 0});
  if (const Attribute* pad = node.find_attribute("auto_pad"); pad != nullptr && pad->s == "VALID") m.pads = {0, 0, 0, 0};
  if (m.strides.size() != 2 || m.dilations.size() != 2 || m.pads.size() != 4) return std::nullopt;
  auto positive = [](int64_t v) { return v >= 1 && v < (1 << 20); };
  auto non_negative = [](int64_t v) { return v >= 0 && v < (1 << 20); };
  if (!std::all_of(m.strides.begin(), m.strides.end(), positive) ||
      !std::all_of(m.dilations.begin(), m.dilations.end(), positive) ||
      !std::all_of(m.pads.begin(), m.pads.end(), non_negative)) {
    return std::nullopt;
  }
  return m;
}

Node conv_nhwc_node(const Node& conv, const ConvMatch& m, const std::string& x, const std::string& weight,
                    const std::string& y) {
  Node n;
  n.op_type = "ConvNhwc";
  n.domain = kDomain;
  n.opset = 1;
  n.name = (conv.name.empty() ? conv.outputs[0] : conv.name) + "/nhwc";
  n.inputs = {x, weight};
  if (conv.inputs.size() == 3 && !conv.inputs[2].empty()) n.inputs.push_back(conv.inputs[2]);
  n.outputs = {y};
  n.attributes.push_back(ints_attribute("kernel_shape", m.kernel));
  n.attributes.push_back(ints_attribute("strides", m.strides));
  n.attributes.push_back(ints_attribute("pads", m.pads));
  n.attributes.push_back(ints_attribute("dilations", m.dilations));
  n.attributes.push_back(int_attribute("group", m.depthwise ? m.out_channels : 1));
  n.attributes.push_back(int_attribute("out_channels", m.out_channels));
  if (!m.activation.empty()) {
    n.attributes.push_back(string_attribute("activation", m.activation));
    if (!m.activation_params.empty()) n.attributes.push_back(floats_attribute("activation_params", m.activation_params));
  }
  return n;
}

// A weight that winograd_convs will likely transform (3x3, stride 1, dilation 1, group 1, more than
// kConvDirectMaxChannels channels) is packed only when the load materializes its weights
// (deferred_repack): the transform reads the filters themselves, and the packed copy, made, read
// and dropped (a third of ResNet-50's weights), is never made. Only an evaluated weight or a
// deferred copy can wait (a BatchNorm folded in is still an expression).
mx::array packed_weight(const ConvMatch& m, const mx::array& w) {
  const bool winograd_shape = !m.depthwise && m.kernel == std::vector<int64_t>{3, 3} &&
                              m.strides == std::vector<int64_t>{1, 1} &&
                              m.dilations == std::vector<int64_t>{1, 1} && w.ndim() == 4 &&
                              w.shape(1) > kernels::kConvDirectMaxChannels;
  if (!winograd_shape || w.dtype() != mx::float32 || (!w.is_available() && !deferred_bytes(w)))
    return kernels::pack_conv_weight_nhwc(w);
  return deferred_repack(
      w, kernels::packed_conv_weight_shape(w.shape()), mx::float32,
      [](const mx::array& source) { return kernels::pack_conv_weight_nhwc(source); }, release_weight_pages);
}

size_t convert_convolutions(Graph& graph, ValueNames& names, int64_t onnx_opset) {
  const GraphIndex index(graph);  // who reads each weight, before the rewrite
  std::map<std::string, std::string> channels_last_inputs;  // input -> its channels-last copy
  std::map<std::pair<std::string, bool>, std::string> prepared_weights;  // (weight, depthwise) -> its copy
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size());
  size_t converted = 0;
  for (Node& node : graph.nodes) {
    std::optional<ConvMatch> m = match_conv(graph, node);
    if (!m) {
      nodes.push_back(std::move(node));
      continue;
    }
    const std::string& weight_name = node.inputs[1];
    // Convolutions sharing a weight share its prepared copy.
    std::string& prepared = prepared_weights[{weight_name, m->depthwise}];
    if (prepared.empty()) {
      prepared = fresh_initializer_name(graph, weight_name + (m->depthwise ? "/hwc" : "/packed_hwc"));
      const mx::array& w = graph.initializers.at(weight_name).tensor();
      mx::array converted_weight = m->depthwise ? kernels::depthwise_weight_nhwc(w) : packed_weight(*m, w);
      graph.initializers.insert_or_assign(prepared, Value(converted_weight));
    }
    // The stored weight goes at once when this conv alone read it, so that
    // the load's peak holds one layer's weight twice, not the model's.
    const bool read_once = std::count(node.inputs.begin(), node.inputs.end(), weight_name) == 1;
    if (read_once && index.consumers(weight_name).size() == 1 && !index.is_graph_output(weight_name)) {
      drop_weight(graph, weight_name);
    }
    // Convolutions reading the same input share its channels-last copy.
    std::string& x = channels_last_inputs[node.inputs[0]];
    if (x.empty()) {
      x = names.fresh(node.inputs[0] + "/nhwc");
      nodes.push_back(transpose_node(node.inputs[0], x, kToChannelsLast, onnx_opset));
    }
    const std::string y = names.fresh(node.outputs[0] + "/nhwc");
    nodes.push_back(conv_nhwc_node(node, *m, x, prepared, y));
    nodes.push_back(transpose_node(y, node.outputs[0], kToChannelsFirst, onnx_opset));
    ++converted;
  }
  graph.nodes = std::move(nodes);
  return converted;
}

// ---- step 2: moving the transposes back to channels-first past other ops ----

bool is_transpose(const Node& node, const std::vector<int64_t>& perm) {
  if (!is_onnx_op(node, "Transpose") || node.inputs.size() != 1 || node.outputs.size() != 1) return false;
  const Attribute* p = node.find_attribute("perm");
  return p != nullptr && p->ints == perm;
}

bool is_unary_elementwise(const Node& node) {
  static const std::unordered_set<std::string> ops = {
      "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip", "Elu", "Selu", "Celu",
      "Gelu", "Erf", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Softplus", "Softsign", "Mish",
      "Identity", "ThresholdedRelu", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Cast"};
  return node.domain.empty() && ops.contains(node.op_type) && node.outputs.size() == 1;
}

// QuantizeLinear / DequantizeLinear with one scale (and zero point) for the whole tensor: elementwise,
// whatever the layout (the QDQ format's pairs around every convolution).
bool is_per_tensor_quantization(const Graph& graph, const Node& node) {
  if (!node.domain.empty() || (node.op_type != "QuantizeLinear" && node.op_type != "DequantizeLinear") ||
      node.outputs.size() != 1 || node.inputs.size() < 2 || int_attribute_or(node, "block_size", 0) != 0)
    return false;
  return present_inputs_are_scalars(graph, node, {1, 2});
}

// com.microsoft QLinearAdd / QLinearMul with one scale and zero point per operand and for the output:
// elementwise over the two quantized tensors (inputs 0 and 3), whatever the layout.
bool is_per_tensor_qlinear_binary(const Graph& graph, const Node& node) {
  if (node.domain != "com.microsoft" || (node.op_type != "QLinearAdd" && node.op_type != "QLinearMul") ||
      node.outputs.size() != 1 || node.inputs.size() < 7)
    return false;
  return present_inputs_are_scalars(graph, node, {1, 2, 4, 5, 6, 7});
}

bool is_binary_elementwise(const Node& node) {
  static const std::unordered_set<std::string> ops = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum",
                                                      "PRelu"};
  return node.domain.empty() && ops.contains(node.op_type) && node.inputs.size() == 2 && node.outputs.size() == 1;
}

// Where a channels-first transpose of A moved past `moved`: it now reads A and
// writes a fresh channels-last value; returns the transpose of that value back
// into its old output, to go right after it.
Node transpose_back_after(Node& moved, ValueNames& names, int64_t onnx_opset) {
  const std::string output = moved.outputs[0];
  moved.outputs[0] = names.fresh(output + "/nhwc");
  return transpose_node(moved.outputs[0], output, kToChannelsFirst, onnx_opset);
}

// A constant operand of a binary op whose other operand becomes channels-last:
// padded to rank 4 (numpy broadcasting aligns trailing axes) and transposed.
std::optional<std::string> channels_last_constant(Graph& graph, const GraphIndex& index, const std::string& name) {
  std::optional<mx::array> k = index.constant(name);
  if (!k || k->ndim() > 4) return std::nullopt;
  if (k->size() == 1) return name;  // a scalar broadcasts the same in any layout
  mx::Shape shape = k->shape();
  shape.insert(shape.begin(), 4 - shape.size(), 1);
  mx::array moved = mx::contiguous(mx::transpose(mx::reshape(*k, shape), {0, 2, 3, 1}));
  moved.eval();
  const std::string fresh = fresh_initializer_name(graph, name + "/nhwc");
  graph.initializers.insert_or_assign(fresh, Value(moved));
  return fresh;
}

bool is_reduction(const Node& node) {
  static const std::unordered_set<std::string> ops = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                                                      "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare"};
  return node.domain.empty() && ops.contains(node.op_type) && !node.inputs.empty() && node.outputs.size() == 1;
}

// The axes a reduction reads: its attribute (before the opset that made it
// an input: 18, ReduceSum 13) or its constant second input; nullopt when
// they are computed or absent (all axes, or none with noop_with_empty_axes).
std::optional<std::vector<int64_t>> reduction_axes(const Node& node, const GraphIndex& index) {
  if (const Attribute* a = node.find_attribute("axes"); a != nullptr && a->type == AttrType::kInts) return a->ints;
  if (node.inputs.size() < 2 || node.inputs[1].empty()) return std::nullopt;
  std::optional<mx::array> axes = index.constant(node.inputs[1]);
  if (!axes || axes->ndim() != 1 || !mx::issubdtype(axes->dtype(), mx::integer)) return std::nullopt;
  mx::array values = mx::astype(*axes, mx::int64);
  values.eval();
  return std::vector<int64_t>(values.data<int64_t>(), values.data<int64_t>() + values.size());
}

// A reduction over given axes of a rank-4 value that keeps them: its output
// is rank 4 too, so it can run channels-last with the axes renumbered.
bool reduces_rank_four_kept(const Node& node, const GraphIndex& index) {
  if (int_attribute_or(node, "keepdims", 1) != 1) return false;
  std::optional<std::vector<int64_t>> axes = reduction_axes(node, index);
  return axes && !axes->empty() &&
         std::all_of(axes->begin(), axes->end(), [](int64_t a) { return a >= -4 && a < 4; });
}

// Renumbers the axes from NCHW to NHWC (N 0 -> 0, C 1 -> 3, H 2 -> 1, W 3 -> 2).
void remap_reduction_axes(Graph& graph, Node& node, const GraphIndex& index) {
  std::vector<int64_t> axes = *reduction_axes(node, index);
  for (int64_t& a : axes) a = std::array<int64_t, 4>{0, 3, 1, 2}[static_cast<size_t>((a + 4) % 4)];
  for (Attribute& attribute : node.attributes) {
    if (attribute.name == "axes") {
      attribute.ints = axes;
      return;
    }
  }
  const std::string name = fresh_initializer_name(graph, node.inputs[1] + "/nhwc");
  mx::array values(axes.data(), {static_cast<int>(axes.size())}, mx::int64);
  values.eval();
  graph.initializers.insert_or_assign(name, Value(values));
  node.inputs[1] = name;
}

enum class Rewrite { kNone, kCancelled, kMoved };

// One rewrite of step 2 at `node`, a reader of `value` = Transpose(0,3,1,2)(channels_last):
// kCancelled when `node` was the inverse transpose (now an Identity), kMoved when `node`
// now reads channels-last values (its output still to be transposed back), kNone when no
// rewrite applies.
Rewrite rewrite_reader(Graph& graph, const GraphIndex& index, Node& node, const std::string& value,
                       const std::string& channels_last) {
  const auto reads = std::count(node.inputs.begin(), node.inputs.end(), value);
  if (is_transpose(node, kToChannelsLast)) {
    node.op_type = "Identity";
    node.name += kLayoutIdentity;
    node.attributes.clear();
    node.inputs[0] = channels_last;
    return Rewrite::kCancelled;
  }
  if ((is_unary_elementwise(node) || is_per_tensor_quantization(graph, node)) && node.inputs[0] == value &&
      reads == 1) {
    node.inputs[0] = channels_last;
    return Rewrite::kMoved;
  }
  // The operands of an elementwise binary op (inputs 0 and 1, or QLinearAdd's 0 and 3) moved together.
  auto move_operands = [&](std::array<size_t, 2> operands) {
    std::array<std::optional<std::string>, 2> moved;
    for (size_t k = 0; k < 2; ++k) {
      const std::string& in = node.inputs[operands[k]];
      if (in == value) {
        moved[k] = channels_last;
      } else if (std::optional<size_t> p = index.producer(in);
                 p && is_transpose(graph.nodes[*p], kToChannelsFirst)) {
        moved[k] = graph.nodes[*p].inputs[0];
      } else {
        moved[k] = channels_last_constant(graph, index, in);
      }
    }
    if (!moved[0] || !moved[1]) return Rewrite::kNone;
    node.inputs[operands[0]] = *moved[0];
    node.inputs[operands[1]] = *moved[1];
    return Rewrite::kMoved;
  };
  if (is_binary_elementwise(node)) return move_operands({0, 1});
  if (is_per_tensor_qlinear_binary(graph, node)) return move_operands({0, 3});
  if (node.domain == "com.microsoft" && node.op_type == "QLinearGlobalAveragePool" &&
      node.inputs[0] == value && reads == 1 && node.outputs.size() == 1 &&
      int_attribute_or(node, "channels_last", 0) == 0) {
    std::erase_if(node.attributes, [](const Attribute& a) { return a.name == "channels_last"; });
    node.attributes.push_back(int_attribute("channels_last", 1));
    node.inputs[0] = channels_last;
    return Rewrite::kMoved;
  }
  if (is_onnx_op(node, "Concat") && node.outputs.size() == 1) {
    // Every input channels-first through such a transpose, along channels.
    const int64_t axis = int_attribute_or(node, "axis", 0);
    std::vector<std::string> moved;
    for (const std::string& in : node.inputs) {
      std::optional<size_t> p = index.producer(in);
      if (!p || !is_transpose(graph.nodes[*p], kToChannelsFirst)) break;
      moved.push_back(graph.nodes[*p].inputs[0]);
    }
    if ((axis == 1 || axis == -3) && moved.size() == node.inputs.size()) {
      node.inputs = moved;
      for (Attribute& a : node.attributes) {
        if (a.name == "axis") a.i = 3;
      }
      return Rewrite::kMoved;
    }
    return Rewrite::kNone;
  }
  if (is_reduction(node) && reduces_rank_four_kept(node, index)) {
    remap_reduction_axes(graph, node, index);
    node.inputs[0] = channels_last;
    return Rewrite::kMoved;
  }
  // Pools with a channels-last twin (ai.transmuter, same attributes).
  for (const char* pool : {"MaxPool", "GlobalAveragePool"}) {
    if (!is_onnx_op(node, pool) || node.inputs.size() != 1 || node.outputs.size() != 1) continue;
    node.op_type = std::string(pool) + "Nhwc";
    node.domain = kDomain;
    node.opset = 1;
    node.inputs[0] = channels_last;
    return Rewrite::kMoved;
  }
  return Rewrite::kNone;
}

// One sweep of step 2 over the graph: at most one rewrite per channels-first
// transpose, none at a node already rewritten in this sweep (the index, built
// once, is stale around it; the next sweep sees it). The transposes back are
// inserted at the end, each right after the node it follows, so positions hold
// during the sweep. Sweeps until nothing changes cost the longest chain of
// moves times the graph's size; one rewrite per fresh index was quadratic (a
// 6000-node graph took 3.9 s to load).
size_t sink_transposes_once(Graph& graph, ValueNames& names, int64_t onnx_opset) {
  const GraphIndex index(graph);
  std::vector<bool> touched(graph.nodes.size(), false);
  std::vector<std::optional<Node>> after(graph.nodes.size());  // a transpose back to insert after node i
  size_t rewrites = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!is_transpose(graph.nodes[i], kToChannelsFirst)) continue;
    const std::string value = graph.nodes[i].outputs[0];
    const std::string channels_last = graph.nodes[i].inputs[0];
    for (size_t reader : index.consumers(value)) {
      if (touched[reader]) continue;
      const Rewrite r = rewrite_reader(graph, index, graph.nodes[reader], value, channels_last);
      if (r == Rewrite::kNone) continue;
      touched[reader] = true;
      ++rewrites;
      if (r == Rewrite::kMoved) after[reader] = transpose_back_after(graph.nodes[reader], names, onnx_opset);
      break;  // value's readers changed: the index no longer lists them
    }
  }
  if (rewrites == 0) return 0;
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size() + rewrites);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    nodes.push_back(std::move(graph.nodes[i]));
    if (after[i]) nodes.push_back(std::move(*after[i]));
  }
  graph.nodes = std::move(nodes);
  return rewrites;
}

// Points the readers of each Identity that step 2 made at its input, where
// they read it directly (not from inside a subgraph) and it is no graph
// output; the Identity is then unread.
void bypass_identities(Graph& graph) {
  const GraphIndex index(graph);
  for (const Node& identity : graph.nodes) {
    if (!is_onnx_op(identity, "Identity") || !identity.name.ends_with(kLayoutIdentity)) continue;
    const std::string& value = identity.outputs[0];
    if (index.is_graph_output(value)) continue;
    const std::vector<size_t>& readers = index.consumers(value);
    auto direct = [&](size_t r) {
      const Node& node = graph.nodes[r];
      const bool has_subgraph = std::any_of(node.attributes.begin(), node.attributes.end(), [](const Attribute& a) {
        return a.type == AttrType::kGraph || a.type == AttrType::kGraphs;
      });
      return !has_subgraph && std::find(node.inputs.begin(), node.inputs.end(), value) != node.inputs.end();
    };
    if (!std::all_of(readers.begin(), readers.end(), direct)) continue;
    for (size_t r : readers) {
      std::replace(graph.nodes[r].inputs.begin(), graph.nodes[r].inputs.end(), value, identity.inputs[0]);
    }
  }
}

// Removes the transposes (and the Identity nodes step 2 made) that nothing reads.
void remove_unread_layout_nodes(Graph& graph) {
  for (bool changed = true; changed;) {
    const GraphIndex index(graph);
    std::vector<bool> removed(graph.nodes.size(), false);
    changed = false;
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& node = graph.nodes[i];
      const bool layout = is_onnx_op(node, "Transpose") || is_onnx_op(node, "Identity");
      if (layout && node.outputs.size() == 1 && index.consumers(node.outputs[0]).empty() &&
          !index.is_graph_output(node.outputs[0])) {
        removed[i] = changed = true;
      }
    }
    if (changed) erase_nodes(graph, removed);
  }
}

// ---- step 3: residual adds into the convolution's epilogue ----

// ConvNhwc (group 1, no activation) -> Add(., Z) [-> Relu] becomes one
// ConvNhwc with Z as its fourth input [and activation Relu], at the place of
// the last node it replaces (after Z's producer).
size_t fuse_residual_adds(Graph& graph) {
  const GraphIndex index(graph);
  std::vector<bool> removed(graph.nodes.size(), false);
  size_t fused_count = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& conv = graph.nodes[i];
    if (conv.domain != kDomain || conv.op_type != "ConvNhwc" || conv.inputs.size() > 3 ||
        int_attribute_or(conv, "group", 1) != 1 || conv.find_attribute("activation") != nullptr) {
      continue;
    }
    std::optional<size_t> add = sole_consumer(index, conv.outputs[0]);
    if (!add || removed[*add] || !is_onnx_op(graph.nodes[*add], "Add") || graph.nodes[*add].outputs.size() != 1) continue;
    std::optional<std::string> residual = other_input(graph.nodes[*add], conv.outputs[0]);
    if (!residual || *residual == conv.outputs[0] || index.constant(*residual)) continue;
    size_t last = *add;
    std::optional<size_t> relu = sole_consumer(index, graph.nodes[*add].outputs[0]);
    const bool with_relu = relu && is_onnx_op(graph.nodes[*relu], "Relu") && graph.nodes[*relu].outputs.size() == 1;
    if (with_relu) last = *relu;
    Node fused = conv;
    fused.inputs.resize(3);  // an absent bias stays "" before Z
    fused.inputs.push_back(*residual);
    fused.outputs = graph.nodes[last].outputs;
    if (with_relu) {
      fused.attributes.push_back(string_attribute("activation", "Relu"));
      removed[*add] = true;
    }
    graph.nodes[last] = std::move(fused);
    removed[i] = true;
    ++fused_count;
  }
  if (fused_count > 0) erase_nodes(graph, removed);
  return fused_count;
}

// ---- step 4: stems read channels-first input in place ----

size_t read_channels_first_inputs(Graph& graph) {
  const GraphIndex index(graph);
  size_t changed = 0;
  for (Node& conv : graph.nodes) {
    const bool integer = conv.op_type == "QLinearConvNhwc";
    if (conv.domain != kDomain || (conv.op_type != "ConvNhwc" && !integer) ||
        int_attribute_or(conv, "group", 1) != 1)
      continue;
    std::optional<size_t> producer = index.producer(conv.inputs[0]);
    if (!producer || !is_transpose(graph.nodes[*producer], kToChannelsLast)) continue;
    const std::vector<int64_t> kernel = ints_attribute_or(conv, "kernel_shape", {});
    auto packed = graph.initializers.find(conv.inputs[integer ? 2 : 1]);
    if (kernel.size() != 2 || packed == graph.initializers.end() || !packed->second.is_tensor()) continue;
    const int64_t taps = kernel[0] * kernel[1];
    // Float: packed [panels, K, P]. Integer: packed [panels, ceil(K / 4), 128], K = taps * C, so
    // ceil(K / 4) <= taps exactly when C <= 4 (the integer unfold reads such inputs value by value).
    const int64_t depth = packed->second.tensor().shape(1);
    const bool few_channels = integer ? depth <= taps : depth / taps <= kernels::kConvDirectMaxChannels;
    if (!few_channels) continue;
    conv.inputs[0] = graph.nodes[*producer].inputs[0];
    conv.attributes.push_back(string_attribute("input_layout", "NCHW"));
    ++changed;
  }
  return changed;
}

}  // namespace

size_t channels_last_convs(Graph& graph) {
  if (mx::default_device() != mx::Device::cpu) return 0;
  auto onnx = graph.opsets.find("");
  const int64_t onnx_opset = onnx == graph.opsets.end() ? 0 : onnx->second;
  if (onnx_opset < 1) return 0;
  ValueNames names(graph);
  const size_t converted = convert_convolutions(graph, names, onnx_opset);
  // qlinear_convs_nhwc's integer convolutions, converted before, take the same layout moves.
  const auto integer_convolutions = std::count_if(graph.nodes.begin(), graph.nodes.end(), [](const Node& n) {
    return n.domain == kDomain && n.op_type == "QLinearConvNhwc";
  });
  if (converted == 0 && integer_convolutions == 0) return 0;
  while (sink_transposes_once(graph, names, onnx_opset) > 0) {
  }
  bypass_identities(graph);
  remove_unread_layout_nodes(graph);
  fuse_residual_adds(graph);
  if (read_channels_first_inputs(graph) > 0) remove_unread_layout_nodes(graph);
  import_domain(graph, kDomain, 1);
  return converted + static_cast<size_t>(integer_convolutions);  // the convolutions laid out channels-last
}

}  // namespace transmuter
