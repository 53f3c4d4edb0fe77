// Runs a float16/bfloat16 graph in float32, keeping the interface the file
// declares (LoadOptions::compute_type resolving to float32; src/runtime/load.cpp).
//
//   x: float16                                   x: float16
//     |                                            |
//     |  W: float16 initializer                  Cast(to=FLOAT)        W': float32 (W converted once)
//     |   |                                        |                    |
//   MatMul       c: Constant float16       =>    MatMul       c': Constant float32
//     |          |                                 |          |
//    Add --------+                                Add --------+
//     |                                            |
//   Cast(to=FLOAT) -> Softmax -> Cast(to=FLOAT16)  Softmax                (both Casts now identities)
//     |                                            |
//     y: float16                                 Cast(to=FLOAT16)
//                                                  |
//                                                  y: float16
//
// - float16/bfloat16 initializers become float32 (the float16 copy is dropped:
//   they take twice the memory, params() holds them as float32); a weight
//   that was read through a Cast to float32 keeps that one float32 copy.
// - Tensor attributes of those types (Constant's value, ConstantOfShape's
//   value) become float32, and so do the type attributes that make them: Cast
//   and EyeLike/Random*/Bernoulli/window ops asking for float16/bfloat16
//   (to, dtype, output_datatype, output_dtype) ask for FLOAT. Subgraphs too.
// - A graph input of float16/bfloat16 type is read through a Cast to FLOAT
//   inserted first; a graph output of such a type is written by a Cast back to
//   its declared type appended at the end (where the output already is a Cast
//   to that type, that Cast stays and internal readers get a float32 copy).
//   inputs() and outputs() are the file's.
// - A Cast(to=FLOAT) whose input is now known to be float32 (element types
//   are propagated from inputs, initializers, Constants, Casts and through
//   type-preserving ops) and that is no graph output is removed.
//
// Applies only when the graph has a float16/bfloat16 input, output,
// initializer, Constant or Cast target, every graph output's type is known
// (declared, or inferred from the rules above) and every input/output of such
// a type is a plain tensor; the default ONNX opset must be >= 6 (Cast's `to`
// an integer). keep_float32_islands is the pass for graphs that run in their
// own types.
#include <mlx/mlx.h>

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "graph/subgraphs.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

namespace mx = mlx::core;

bool is_half(OnnxType t) { return t == OnnxType::kFloat16 || t == OnnxType::kBfloat16; }

bool is_half_tensor(const Value& v) { return v.is_tensor() && !v.is_widened() && is_half(v.element_type()); }

// float32 on the CPU, evaluated: the load-time copy that replaces a half value.
mx::array to_float32(const mx::array& a) {
  mx::array f = mx::astype(a, mx::float32, mx::Device::cpu);
  mx::eval(f);
  return f;
}

// The ops whose outputs all have the element type of their first input.
const std::unordered_set<std::string>& type_preserving_ops() {
  static const std::unordered_set<std::string> ops = {
      // elementwise
      "Abs", "Neg", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid",
      "HardSwish", "Tanh", "Softplus", "Softsign", "Mish", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Reciprocal",
      "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
      "Acosh", "Atanh", "Identity", "Clip", "ThresholdedRelu", "Shrink", "Swish", "Add", "Sub", "Mul", "Div",
      "Pow", "Mod", "Max", "Min", "Mean", "Sum",
      // linear algebra, pooling, normalization
      "MatMul", "Gemm", "Conv", "ConvTranspose", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
      "LpPool", "InstanceNormalization", "GroupNormalization", "RMSNormalization", "LpNormalization",
      "MeanVarianceNormalization", "Softmax", "LogSoftmax", "Hardmax", "Einsum",
      // data movement
      "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Slice", "Gather",
      "GatherElements", "GatherND", "Expand", "Tile", "Pad", "Split", "DepthToSpace", "SpaceToDepth",
      "Resize", "Upsample", "Trilu", "CumSum", "ReverseSequence", "ScatterND", "ScatterElements", "Scatter",
      "Compress",
      // reductions
      "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
      "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
  return ops;
}

// Ops whose first output alone has the type of their first input.
const std::unordered_set<std::string>& first_output_preserving_ops() {
  static const std::unordered_set<std::string> ops = {
      "LayerNormalization", "BatchNormalization", "MaxPool", "Dropout", "TopK",
      // com.microsoft
      "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
      "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd", "Attention", "MultiHeadAttention",
      "GroupQueryAttention", "RotaryEmbedding", "MatMulNBits", "FusedMatMul"};
  return ops;
}

const Attribute* attribute(const Node& node, const char* name, AttrType type) {
  const Attribute* a = node.find_attribute(name);
  return a != nullptr && a->type == type ? a : nullptr;
}

// The type a node's `type_attr` asks for, else `fallback`.
std::optional<OnnxType> type_attribute_or(const Node& node, const char* type_attr,
                                          std::optional<OnnxType> fallback) {
  const Attribute* a = attribute(node, type_attr, AttrType::kInt);
  return a != nullptr ? std::optional<OnnxType>(static_cast<OnnxType>(a->i)) : fallback;
}

bool is_onnx_or_microsoft(const Node& node) {
  return node.domain.empty() || node.domain == "ai.onnx" || node.domain == "com.microsoft";
}

// The element types of the outputs of `node`, given those of its inputs.
void infer_node(const Node& node, std::unordered_map<std::string, OnnxType>& types) {
  auto type_of = [&](size_t i) -> std::optional<OnnxType> {
    if (i >= node.inputs.size() || node.inputs[i].empty()) return std::nullopt;
    auto it = types.find(node.inputs[i]);
    return it == types.end() ? std::nullopt : std::optional<OnnxType>(it->second);
  };
  auto set = [&](size_t i, std::optional<OnnxType> t) {
    if (t && i < node.outputs.size() && !node.outputs[i].empty()) types.try_emplace(node.outputs[i], *t);
  };
  if (!is_onnx_or_microsoft(node)) return;
  const std::string& op = node.op_type;
  if (node.domain == "com.microsoft" && !first_output_preserving_ops().contains(op)) return;
  if (op == "Constant") {
    for (const Attribute& a : node.attributes) {
      if (a.type == AttrType::kTensor && a.t.is_tensor()) set(0, a.t.element_type());
      if (a.type == AttrType::kFloat || a.type == AttrType::kFloats) set(0, OnnxType::kFloat);
      if (a.type == AttrType::kInt || a.type == AttrType::kInts) set(0, OnnxType::kInt64);
    }
  } else if (op == "ConstantOfShape") {
    const Attribute* a = attribute(node, "value", AttrType::kTensor);
    set(0, a != nullptr && a->t.is_tensor() ? a->t.element_type() : OnnxType::kFloat);
  } else if (op == "Cast") {
    set(0, type_attribute_or(node, "to", std::nullopt));
  } else if (op == "CastLike") {
    set(0, type_of(1));
  } else if (op == "EyeLike" || op == "RandomNormalLike" || op == "RandomUniformLike" || op == "Bernoulli") {
    set(0, type_attribute_or(node, "dtype", type_of(0)));
  } else if (op == "RandomNormal" || op == "RandomUniform") {
    set(0, type_attribute_or(node, "dtype", OnnxType::kFloat));
  } else if (op == "Shape" || op == "Size" || op == "NonZero" || op == "ArgMax" || op == "ArgMin") {
    set(0, OnnxType::kInt64);
  } else if (op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" ||
             op == "GreaterOrEqual" || op == "Not" || op == "And" || op == "Or" || op == "Xor" ||
             op == "IsNaN" || op == "IsInf") {
    set(0, OnnxType::kBool);
  } else if (op == "Where") {
    set(0, type_of(1));
  } else if (type_preserving_ops().contains(op)) {
    for (size_t i = 0; i < node.outputs.size(); ++i) set(i, type_of(0));
  } else if (first_output_preserving_ops().contains(op)) {
    set(0, type_of(0));
  }
}

bool declares_tensor_type(const ValueInfo& info) {
  return info.kind == ValueInfo::Kind::kTensor && info.elem_type != OnnxType::kUndefined;
}

bool defines(const Graph& graph, const std::string& name) {
  if (graph.initializers.contains(name)) return true;
  for (const ValueInfo& v : graph.inputs) {
    if (v.name == name) return true;
  }
  for (const Node& node : graph.nodes) {
    if (std::find(node.outputs.begin(), node.outputs.end(), name) != node.outputs.end()) return true;
  }
  return false;
}

// Subgraph attributes are shared between copies of a graph: a pass rewrites
// its own copy.
void for_each_subgraph_mut(Node& node, const std::function<void(Graph&)>& fn) {
  for (Attribute& a : node.attributes) {
    if (a.g) {
      a.g = std::make_shared<Graph>(*a.g);
      fn(*a.g);
    }
    for (auto& g : a.graphs) {
      if (g) {
        g = std::make_shared<Graph>(*g);
        fn(*g);
      }
    }
  }
}

// Replaces reads of `from` by `to` in `node` and in the subgraphs that capture it.
void rename_reads(Node& node, const std::string& from, const std::string& to) {
  std::replace(node.inputs.begin(), node.inputs.end(), from, to);
  bool captured = false;
  for_each_subgraph(node, [&](const Graph& g) {
    const std::vector<std::string> free = free_names(g);
    captured = captured || std::binary_search(free.begin(), free.end(), from);
  });
  if (!captured) return;
  for_each_subgraph_mut(node, [&](Graph& g) {
    if (defines(g, from)) return;
    for (Node& inner : g.nodes) rename_reads(inner, from, to);
  });
}

Node make_cast(const Graph& graph, const std::string& input, const std::string& output, OnnxType to) {
  return cast_node(graph, "compute_in_float32/" + output, input, output, to);
}

bool has_half_tensor_attribute(const Node& node) {
  for (const Attribute& a : node.attributes) {
    if (a.type == AttrType::kTensor && is_half_tensor(a.t)) return true;
    if (a.type == AttrType::kTensors && std::any_of(a.tensors.begin(), a.tensors.end(), is_half_tensor))
      return true;
  }
  return false;
}

// True when `graph` or a subgraph holds a float16/bfloat16 value or makes one.
bool computes_in_half(const Graph& graph) {
  auto half_info = [](const ValueInfo& v) { return is_half(v.elem_type); };
  if (std::any_of(graph.inputs.begin(), graph.inputs.end(), half_info) ||
      std::any_of(graph.outputs.begin(), graph.outputs.end(), half_info)) {
    return true;
  }
  for (const auto& entry : graph.initializers) {
    if (is_half_tensor(entry.second)) return true;
  }
  for (const Node& node : graph.nodes) {
    if (has_half_tensor_attribute(node)) return true;
    if (is_onnx_op(node, "Cast") && is_half(type_attribute_or(node, "to", OnnxType::kUndefined).value()))
      return true;
    bool inner = false;
    for_each_subgraph(node, [&](const Graph& g) { inner = inner || computes_in_half(g); });
    if (inner) return true;
  }
  return false;
}

// Initializers, tensor attributes and type attributes of float16/bfloat16
// become float32 in `graph` and its subgraphs (subgraph inputs and outputs
// too: they are internal values). Nodes in `keep` (interface Casts) stay.
void retype_half(Graph& graph, const std::unordered_set<const Node*>& keep, bool is_main) {
  std::vector<std::string> half_initializers;
  for (const auto& [name, value] : graph.initializers) {
    if (is_half_tensor(value)) half_initializers.push_back(name);
  }
  for (const std::string& name : half_initializers) {
    mx::array converted = to_float32(graph.initializers.at(name).tensor());
    drop_weight(graph, name);  // gives back the float16 copy (file pages or buffer)
    graph.initializers[name] = converted;
  }
  for (Node& node : graph.nodes) {
    for (Attribute& a : node.attributes) {
      if (a.type == AttrType::kTensor && is_half_tensor(a.t)) a.t = to_float32(a.t.tensor());
      if (a.type == AttrType::kTensors) {
        for (Value& t : a.tensors) {
          if (is_half_tensor(t)) t = to_float32(t.tensor());
        }
      }
    }
    if ((node.domain.empty() || node.domain == "ai.onnx") && !keep.contains(&node)) {
      for (Attribute& a : node.attributes) {
        const bool names_type =
            a.name == "to" || a.name == "dtype" || a.name == "output_datatype" || a.name == "output_dtype";
        if (names_type && a.type == AttrType::kInt && is_half(static_cast<OnnxType>(a.i))) {
          a.i = static_cast<int64_t>(OnnxType::kFloat);
        }
      }
    }
    for_each_subgraph_mut(node, [](Graph& g) { retype_half(g, {}, false); });
  }
  if (!is_main) {
    for (auto* infos : {&graph.inputs, &graph.outputs}) {
      for (ValueInfo& v : *infos) {
        if (is_half(v.elem_type)) v.elem_type = OnnxType::kFloat;
      }
    }
  }
  std::unordered_set<std::string> interface;
  if (is_main) {
    for (const auto* infos : {&graph.inputs, &graph.outputs}) {
      for (const ValueInfo& v : *infos) interface.insert(v.name);
    }
  }
  for (ValueInfo& v : graph.value_info) {
    if (is_half(v.elem_type) && !interface.contains(v.name)) v.elem_type = OnnxType::kFloat;
  }
}

// Removes each Cast(to=FLOAT) of a value known to be float32 that is no graph
// output; its readers read its input. Returns the number removed.
size_t remove_identity_casts(Graph& graph) {
  const std::unordered_map<std::string, OnnxType> types = known_element_types(graph);
  std::unordered_set<std::string> outputs;
  for (const ValueInfo& v : graph.outputs) outputs.insert(v.name);
  std::unordered_map<std::string, std::string> renamed;  // removed Cast output -> its input
  std::vector<bool> removed(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& node = graph.nodes[i];
    for (std::string& input : node.inputs) {
      auto it = renamed.find(input);
      if (it != renamed.end()) input = it->second;
    }
    bool has_subgraph = false;
    for_each_subgraph(node, [&](const Graph&) { has_subgraph = true; });
    if (has_subgraph) {
      for (const auto& [from, to] : renamed) rename_reads(node, from, to);
    }
    if (!is_onnx_op(node, "Cast") || node.inputs.size() != 1 || node.outputs.size() != 1) continue;
    if (type_attribute_or(node, "to", OnnxType::kUndefined) != OnnxType::kFloat) continue;
    auto in = types.find(node.inputs[0]);
    if (in == types.end() || in->second != OnnxType::kFloat || outputs.contains(node.outputs[0])) continue;
    renamed[node.outputs[0]] = node.inputs[0];
    removed[i] = true;
  }
  size_t index = 0;
  std::erase_if(graph.nodes, [&](const Node&) { return removed[index++]; });
  return renamed.size();
}

}  // namespace

std::unordered_map<std::string, OnnxType> known_element_types(const Graph& graph) {
  std::unordered_map<std::string, OnnxType> types;
  for (const auto* infos : {&graph.inputs, &graph.outputs, &graph.value_info}) {
    for (const ValueInfo& v : *infos) {
      if (declares_tensor_type(v)) types.try_emplace(v.name, v.elem_type);
    }
  }
  for (const auto& [name, value] : graph.initializers) {
    if (value.is_tensor()) types[name] = value.element_type();
  }
  for (const Node& node : graph.nodes) infer_node(node, types);
  return types;
}

size_t compute_in_float32(Graph& graph) {
  auto opset = graph.opsets.find("");
  if (opset == graph.opsets.end() || opset->second < 6 || !computes_in_half(graph)) return 0;
  const std::unordered_map<std::string, OnnxType> types = known_element_types(graph);
  for (const auto* infos : {&graph.inputs, &graph.outputs}) {
    for (const ValueInfo& v : *infos) {
      if (v.kind != ValueInfo::Kind::kTensor && v.kind != ValueInfo::Kind::kUnknown && is_half(v.elem_type)) {
        return 0;  // a sequence/optional of float16: its interface cannot be kept by a Cast
      }
    }
  }
  // The declared output types, else the inferred ones: the interface to keep.
  std::vector<OnnxType> output_types;
  for (const ValueInfo& v : graph.outputs) {
    if (declares_tensor_type(v)) {
      output_types.push_back(v.elem_type);
      continue;
    }
    auto it = types.find(v.name);
    if (it == types.end()) return 0;
    output_types.push_back(it->second);
  }

  ValueNames names(graph);
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (const std::string& name : graph.nodes[i].outputs) producer[name] = i;
  }
  std::unordered_set<std::string> input_names;
  for (const ValueInfo& v : graph.inputs) input_names.insert(v.name);

  // Outputs: an output that already is a Cast to its type keeps that Cast
  // (Cast from float64 rounds once); any other half output is renamed inside
  // and written by a Cast appended at the end.
  std::vector<size_t> interface_casts;  // node indices
  std::vector<Node> output_casts;
  std::unordered_map<std::string, std::string> output_renames;
  for (size_t k = 0; k < graph.outputs.size(); ++k) {
    const std::string& y = graph.outputs[k].name;
    const OnnxType type = output_types[k];
    if (!is_half(type) || input_names.contains(y) || output_renames.contains(y)) continue;
    auto p = producer.find(y);
    const std::string internal = names.fresh(y + "/float32");
    if (p != producer.end()) {
      const Node& node = graph.nodes[p->second];
      if (is_onnx_op(node, "Cast") && type_attribute_or(node, "to", std::nullopt) == type &&
          node.inputs.size() == 1) {
        interface_casts.push_back(p->second);
      } else {
        output_casts.push_back(make_cast(graph, internal, y, type));
      }
    } else if (graph.initializers.contains(y)) {
      graph.initializers[internal] = graph.initializers.at(y);
      graph.initializers.erase(y);
      output_casts.push_back(make_cast(graph, internal, y, type));
    } else {
      continue;
    }
    output_renames[y] = internal;
  }
  std::unordered_set<std::string> internally_read;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& node = graph.nodes[i];
    for (const std::string& name : node_reads(node)) {
      if (output_renames.contains(name)) internally_read.insert(name);
    }
    const bool keeps_output =
        std::find(interface_casts.begin(), interface_casts.end(), i) != interface_casts.end();
    for (const auto& [from, to] : output_renames) {
      rename_reads(node, from, to);
      if (!keeps_output) std::replace(node.outputs.begin(), node.outputs.end(), from, to);
    }
  }
  // An interface Cast's internal readers read a float32 Cast of its input,
  // placed just before it.
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size() + interface_casts.size());
  std::unordered_set<size_t> kept_indices;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const bool interface_cast =
        std::find(interface_casts.begin(), interface_casts.end(), i) != interface_casts.end();
    if (interface_cast && internally_read.contains(graph.nodes[i].outputs[0])) {
      const std::string& internal = output_renames.at(graph.nodes[i].outputs[0]);
      nodes.push_back(make_cast(graph, graph.nodes[i].inputs[0], internal, OnnxType::kFloat));
    }
    if (interface_cast) kept_indices.insert(nodes.size());
    nodes.push_back(std::move(graph.nodes[i]));
  }
  graph.nodes = std::move(nodes);

  std::unordered_set<const Node*> keep;
  for (size_t i : kept_indices) keep.insert(&graph.nodes[i]);
  retype_half(graph, keep, true);

  // Inputs: read through a Cast to FLOAT.
  std::vector<Node> input_casts;
  for (const ValueInfo& v : graph.inputs) {
    if (v.kind != ValueInfo::Kind::kTensor || !is_half(v.elem_type)) continue;
    const std::string internal = names.fresh(v.name + "/float32");
    bool read = false;
    for (Node& node : graph.nodes) {
      const std::vector<std::string> reads = node_reads(node);
      if (std::find(reads.begin(), reads.end(), v.name) == reads.end()) continue;
      rename_reads(node, v.name, internal);
      read = true;
    }
    if (read) input_casts.push_back(make_cast(graph, v.name, internal, OnnxType::kFloat));
  }

  nodes = std::move(input_casts);
  nodes.reserve(nodes.size() + graph.nodes.size() + output_casts.size());
  for (Node& node : graph.nodes) nodes.push_back(std::move(node));
  for (Node& cast : output_casts) nodes.push_back(std::move(cast));
  graph.nodes = std::move(nodes);
  remove_identity_casts(graph);
  return 1;
}

}  // namespace transmuter
