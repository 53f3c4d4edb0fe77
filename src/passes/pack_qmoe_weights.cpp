// Converts the constant expert weights of each com.microsoft QMoE once, at load, into MLX's affine
// layout (one quantized matrix per expert, as pack_matmul_nbits makes for MatMulNBits), so that each
// routed (token, expert) pair runs its expert's packed weight through the quantized GEMV/GEMM
// (kernels::routed_quantized_matmul) instead of a float32 copy of the weights dequantized per call.
//
//   input  router_probs  fcJ_experts_weights (uint8 [E, N, K * bits / 8])  fcJ_scales  [fcJ_zero_points]
//      \        |              |                                                |             |
//       com.microsoft QMoE (k, activation_type, ..., expert_weight_bits, block_size; quant_type int)
//                                               =>
//   input  router_probs  wJ (uint32 [E, N, K * bits / 32])  scalesJ (float32 [E, N, K / group])  [biasesJ]
//      \        |              |                                 |                                 |
//       ai.transmuter PackedQMoE (QMoE's routing and activation attributes; fcJ_bits, fcJ_group_size)
//
//   for J = 1, 2 and (when given) 3; the float experts biases and router_weights pass through.
//   wJ is the weight's bytes read as little-endian uint32 words (both layouts pack the values along K low
//   bits first). group = block_size; a column-wise weight (no block_size) takes the largest of 128, 64, 32
//   dividing K, its one scale per row repeated over the groups. biasesJ = -scale * zp from the unpacked
//   zero points (MLX dequantizes scale * q + bias, ORT (q - zp) * scale: one float32 rounding apart);
//   without zero points (zp = 2^(bits - 1)) no biases are stored: the kernel derives them.
//
// Only where the kernel has the layout: bits 4 or 8 for every projection, block_size 0, 32, 64 or 128
// dividing K, weights, scales and zero points initializers of the shapes the spec gives, quant_type
// "int", weights_prepacked not 1, none of the fp4/fp8 modes' inputs. Other nodes keep the QMoE op. The
// stored weights are dropped once nothing reads them.
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "mlx_bridge/bit_fields.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";
constexpr const char* kMicrosoft = "com.microsoft";

// QMoE's input positions.
constexpr size_t kInput = 0, kRouter = 1, kRouterWeights = 14, kFirstModeInput = 15;
struct ProjectionInputs {
  size_t weights, scales, bias, zero_points;
  const char* name;
};
constexpr ProjectionInputs kProjections[] = {
    {2, 3, 4, 11, "fc1"}, {5, 6, 7, 12, "fc2"}, {8, 9, 10, 13, "fc3"}};

bool is_float(mx::Dtype t) { return t == mx::float32 || t == mx::float16 || t == mx::bfloat16; }

std::string string_attribute_of(const Node& node, const std::string& name, const std::string& fallback) {
  const Attribute* a = node.find_attribute(name);
  return a != nullptr && a->type == AttrType::kString ? a->s : fallback;
}

// One projection's constant weight and what the kernel's layout needs of it.
struct Projection {
  ProjectionInputs inputs;
  int experts = 0, n = 0, k = 0, bits = 0, group = 0, block_size = 0;
};

// The largest group the kernel takes that divides k (0: none).
int group_for(int block_size, int k) {
  if (block_size != 0) return k % block_size == 0 ? block_size : 0;
  for (int group : {128, 64, 32}) {
    if (k % group == 0) return group;
  }
  return 0;
}

// fcJ's weight, scales and zero points when they are initializers the layout can take.
std::optional<Projection> match_projection(const Graph& graph, const Node& node, const ProjectionInputs& in,
                                           int bits, int block_size) {
  const mx::array* w = stored_input(graph, node, in.weights);
  const mx::array* scales = stored_input(graph, node, in.scales);
  if (w == nullptr || scales == nullptr || w->dtype() != mx::uint8 || w->ndim() != 3) return std::nullopt;
  Projection p{in,   w->shape(0), w->shape(1), static_cast<int>(int64_t{w->shape(2)} * 8 / bits),
               bits, 0,           block_size};
  if (p.experts < 1 || p.n < 1 || p.k < 1 || int64_t{p.k} * bits % 32 != 0) return std::nullopt;
  if (int64_t{p.n} * p.k * bits / 32 > (int64_t{1} << 31) - 1) return std::nullopt;
  p.group = group_for(block_size, p.k);
  if (p.group == 0) return std::nullopt;
  const int blocks = block_size > 0 ? p.k / block_size : 1;
  const mx::Shape scale_shape =
      block_size > 0 ? mx::Shape{p.experts, p.n, blocks} : mx::Shape{p.experts, p.n};
  if (!is_float(scales->dtype()) || scales->shape() != scale_shape) return std::nullopt;
  if (has_input(node, in.zero_points)) {
    const mx::array* zp = stored_input(graph, node, in.zero_points);
    const mx::Shape zp_shape = block_size > 0 ? mx::Shape{p.experts, p.n, (blocks * bits + 7) / 8}
                                              : mx::Shape{p.experts, (p.n * bits + 7) / 8};
    if (zp == nullptr || zp->dtype() != mx::uint8 || zp->shape() != zp_shape) return std::nullopt;
  }
  return p;
}

// The node's projections when all of them can be packed.
std::optional<std::vector<Projection>> match_qmoe(const Graph& graph, const Node& node) {
  if (node.domain != kMicrosoft || node.op_type != "QMoE" || node.outputs.size() != 1) return std::nullopt;
  if (string_attribute_of(node, "quant_type", "int") != "int") return std::nullopt;
  if (int_attribute_or(node, "weights_prepacked", -1) == 1) return std::nullopt;
  for (size_t i = kFirstModeInput; i < node.inputs.size(); ++i) {
    if (has_input(node, i)) return std::nullopt;
  }
  const int64_t block_size = int_attribute_or(node, "block_size", 0);
  if (block_size != 0 && block_size != 32 && block_size != 64 && block_size != 128) return std::nullopt;
  const int64_t default_bits = int_attribute_or(node, "expert_weight_bits", 4);
  std::vector<Projection> projections;
  for (const ProjectionInputs& in : kProjections) {
    if (!has_input(node, in.weights)) {
      if (in.weights == kProjections[2].weights) break;  // fc3 is optional
      return std::nullopt;
    }
    const int64_t bits = int_attribute_or(node, std::string(in.name) + "_expert_weight_bits", default_bits);
    if (bits != 4 && bits != 8) return std::nullopt;
    auto p = match_projection(graph, node, in, static_cast<int>(bits), static_cast<int>(block_size));
    if (!p) return std::nullopt;
    projections.push_back(*p);
  }
  // fc1 and fc3 read the hidden size that fc2 writes; all have the same experts.
  const Projection &fc1 = projections[0], &fc2 = projections[1];
  if (fc1.experts != fc2.experts || fc1.k != fc2.n) return std::nullopt;
  if (projections.size() == 3 && (projections[2].experts != fc1.experts || projections[2].k != fc1.k))
    return std::nullopt;
  return projections;
}

// The packed initializers of one projection: w, scales[, biases]; names of the new initializers.
struct PackedNames {
  std::string w, scales, biases;
};

PackedNames pack_projection(Graph& graph, const Node& node, const Projection& p) {
  const int groups = p.k / p.group, blocks = p.block_size > 0 ? p.k / p.block_size : 1;
  const std::string base = node.inputs[p.inputs.weights];
  // A copy, so that the uint32 words are aligned (the weight may alias the file at any offset).
  mx::array w = mx::view(mx::copy(*stored_input(graph, node, p.inputs.weights)), mx::uint32);
  mx::array block_scales = mx::reshape(mx::astype(*stored_input(graph, node, p.inputs.scales), mx::float32),
                                       {p.experts, p.n, blocks});
  // Column-wise: the row's one scale repeated over its groups.
  mx::array scales = mx::copy(mx::broadcast_to(block_scales, {p.experts, p.n, groups}));
  std::optional<mx::array> biases;
  if (has_input(node, p.inputs.zero_points)) {
    mx::array fields = unpack_bit_fields(*stored_input(graph, node, p.inputs.zero_points), p.bits, {});
    mx::array zp = p.block_size > 0
                       ? mx::slice(fields, {0, 0, 0}, {p.experts, p.n, blocks})
                       : mx::reshape(mx::slice(fields, {0, 0}, {p.experts, p.n}), {p.experts, p.n, 1});
    biases = mx::copy(mx::broadcast_to(mx::negative(mx::multiply(block_scales, mx::astype(zp, mx::float32))),
                                       {p.experts, p.n, groups}));
  }
  std::vector<mx::array> made = {w, scales};
  if (biases) made.push_back(*biases);
  mx::eval(made);
  PackedNames names{fresh_initializer_name(graph, base + "/mlx_affine"), "", ""};
  graph.initializers[names.w] = Value(w);
  names.scales = fresh_initializer_name(graph, base + "/mlx_affine_scales");
  graph.initializers[names.scales] = Value(scales);
  if (biases) {
    names.biases = fresh_initializer_name(graph, base + "/mlx_affine_biases");
    graph.initializers[names.biases] = Value(*biases);
  }
  return names;
}

// Attributes of QMoE that PackedQMoE reads as they are (routing and activation).
bool kept_attribute(const std::string& name) {
  for (const char* kept : {"k", "activation_type", "normalize_routing_weights", "use_sparse_mixer",
                           "swiglu_fusion", "activation_alpha", "activation_beta", "swiglu_limit"}) {
    if (name == kept) return true;
  }
  return false;
}

Node packed_node(Graph& graph, const Node& original, const std::vector<Projection>& projections) {
  Node packed;
  packed.op_type = "PackedQMoE";
  packed.domain = kDomain;
  packed.opset = 1;
  packed.name = (original.name.empty() ? original.outputs[0] : original.name) + "/packed";
  packed.outputs = original.outputs;
  packed.inputs = {original.inputs[kInput], original.inputs[kRouter]};
  for (const Attribute& a : original.attributes) {
    if (kept_attribute(a.name)) packed.attributes.push_back(a);
  }
  for (size_t j = 0; j < std::size(kProjections); ++j) {
    const ProjectionInputs& in = kProjections[j];
    const std::string bias = has_input(original, in.bias) ? original.inputs[in.bias] : "";
    if (j >= projections.size()) {
      packed.inputs.insert(packed.inputs.end(), {"", "", "", bias});
      continue;
    }
    const PackedNames names = pack_projection(graph, original, projections[j]);
    packed.inputs.insert(packed.inputs.end(), {names.w, names.scales, names.biases, bias});
    packed.attributes.push_back(int_attribute(std::string(in.name) + "_bits", projections[j].bits));
    packed.attributes.push_back(int_attribute(std::string(in.name) + "_group_size", projections[j].group));
  }
  packed.inputs.push_back(has_input(original, kRouterWeights) ? original.inputs[kRouterWeights] : "");
  while (!packed.inputs.empty() && packed.inputs.back().empty()) packed.inputs.pop_back();
  return packed;
}

}  // namespace

size_t pack_qmoe_weights(Graph& graph) {
  std::vector<std::string> replaced;
  size_t count = 0;
  for (Node& node : graph.nodes) {
    std::optional<std::vector<Projection>> projections = match_qmoe(graph, node);
    if (!projections) continue;
    for (const Projection& p : *projections) {
      for (size_t i : {p.inputs.weights, p.inputs.scales, p.inputs.zero_points}) {
        if (has_input(node, i)) replaced.push_back(node.inputs[i]);
      }
    }
    node = packed_node(graph, node, *projections);
    ++count;
  }
  if (count == 0) return 0;
  drop_unread_weights(graph, replaced);  // the stored weights, giving their file pages back
  import_domain(graph, kDomain, 1);
  return count;
}

}  // namespace transmuter
