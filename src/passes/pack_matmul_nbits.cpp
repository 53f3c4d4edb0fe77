// Converts the constant weight of each com.microsoft MatMulNBits once, at
// load, into MLX's affine quantized layout, so that the node runs
// mx::quantized_matmul on the packed weight (CPU and GPU streams) instead of
// dequantizing it to float32 on every call.
//
//   A   B (uint8 [N, K / bs, bs * bits / 8])   scales   [zero_points]   [bias]
//    \              |                            |           |            /
//     com.microsoft MatMulNBits (K, N, bits, block_size; no g_idx)
//                   |
//                   Y
//                                   =>
//   A   w (uint32 [N, K * bits / 32])   scales' (float32)   [biases (float32)]   [bias]
//    \              |                        |                   |              /
//     ai.transmuter QuantizedMatMul (K, N, bits, group_size = block_size, accuracy_level)
//                   |
//                   Y
//
//   scales' = scales as float32 [N, K / bs]; biases = -scales' * zp, with zp the
//   unpacked uint8 zero points or the float ones: MLX dequantizes w = scale * q +
//   bias, ORT (q - zp) * scale, one float32 rounding apart. Without zero points
//   (zp = 2^(bits - 1)) no biases are stored: the kernel derives them from the
//   scales, so the weight takes the file's bytes (4-bit, block 32: 0.625 bytes a
//   weight, not 0.75). w is B's bytes read as little-endian uint32 words: both pack the
//   values along K low bits first.
//
// (On CPU streams, from 4 rows of A on, the op dequantizes the packed weight
// per call for the float GEMM: MLX's CPU quantized kernel is scalar.)
//
// Only where MLX has the layout: bits 2, 4 or 8; block_size 32, 64 or 128
// dividing K (no padded last block); B, scales and zero points initializers
// of the shapes the spec gives. Other nodes keep the eager MatMulNBits. A
// weight shared by several nodes is converted once; the stored one is dropped
// once nothing reads it.
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mlx_bridge/bit_fields.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";
constexpr const char* kMicrosoft = "com.microsoft";

struct NBitsMatch {
  size_t node = 0;
  int k = 0, n = 0, bits = 0, block_size = 0;
  std::string b, scales, zero_points;  // zero_points empty: absent
};

bool is_float(mx::Dtype t) { return t == mx::float32 || t == mx::float16 || t == mx::bfloat16; }

std::optional<NBitsMatch> match_nbits(const Graph& graph, size_t i) {
  const Node& node = graph.nodes[i];
  if (node.domain != kMicrosoft || node.op_type != "MatMulNBits" || node.outputs.size() != 1) {
    return std::nullopt;
  }
  if (!has_input(node, 1) || !has_input(node, 2) || has_input(node, 4)) return std::nullopt;
  if (int_attribute_or(node, "weight_prepacked", 0) != 0) return std::nullopt;
  const int64_t k = int_attribute_or(node, "K", 0), n = int_attribute_or(node, "N", 0);
  const int64_t bits = int_attribute_or(node, "bits", 4),
                block_size = int_attribute_or(node, "block_size", 0);
  if (bits != 2 && bits != 4 && bits != 8) return std::nullopt;
  if (block_size != 32 && block_size != 64 && block_size != 128) return std::nullopt;
  if (k < 1 || n < 1 || k % block_size != 0 || k * n > (int64_t{1} << 31) - 1) return std::nullopt;
  NBitsMatch m{i,
               static_cast<int>(k),
               static_cast<int>(n),
               static_cast<int>(bits),
               static_cast<int>(block_size),
               node.inputs[1],
               node.inputs[2],
               has_input(node, 3) ? node.inputs[3] : ""};
  const int blocks = m.k / m.block_size;
  const mx::array* b = stored_initializer(graph, m.b);
  const mx::array* scales = stored_initializer(graph, m.scales);
  if (b == nullptr || b->dtype() != mx::uint8 ||
      b->shape() != mx::Shape{m.n, blocks, m.block_size * m.bits / 8}) {
    return std::nullopt;
  }
  if (scales == nullptr || !is_float(scales->dtype()) || scales->size() != size_t(m.n) * blocks ||
      (scales->ndim() != 1 && scales->shape() != mx::Shape{m.n, blocks})) {
    return std::nullopt;
  }
  if (!m.zero_points.empty()) {
    const mx::array* zp = stored_initializer(graph, m.zero_points);
    if (zp == nullptr) return std::nullopt;
    // Packed uint8 [N, ceil(blocks * bits / 8)], or scales' dtype [N, blocks] (1-D allowed).
    const int columns = zp->dtype() == mx::uint8 ? (blocks * m.bits + 7) / 8 : blocks;
    if ((zp->dtype() != mx::uint8 && zp->dtype() != scales->dtype()) || zp->size() != size_t(m.n) * columns ||
        (zp->ndim() != 1 && zp->shape() != mx::Shape{m.n, columns})) {
      return std::nullopt;
    }
  }
  return m;
}

// The given zero points as float32 [N, blocks].
mx::array zero_points_of(const Graph& graph, const NBitsMatch& m) {
  const int blocks = m.k / m.block_size;
  const mx::array& zp = *stored_initializer(graph, m.zero_points);
  if (zp.dtype() != mx::uint8) return mx::astype(mx::reshape(zp, {m.n, blocks}), mx::float32);
  mx::array fields = unpack_bit_fields(mx::reshape(zp, {m.n, -1}), m.bits, {});
  return mx::astype(mx::slice(fields, {0, 0}, {m.n, blocks}), mx::float32);
}

Node quantized_node(const Node& original, const NBitsMatch& m, const std::string& w,
                    const std::string& scales, const std::string& biases, bool float_zero_points) {
  Node fused;
  fused.op_type = "QuantizedMatMul";
  fused.domain = kDomain;
  fused.opset = 1;
  fused.name = (original.name.empty() ? original.outputs[0] : original.name) + "/quantized";
  fused.inputs = {original.inputs[0], w, scales, biases};  // biases "" : a symmetric weight
  if (has_input(original, 5)) fused.inputs.push_back(original.inputs[5]);
  fused.outputs = original.outputs;
  // accuracy_level 4 keeps ORT's int8 rounding of A (kernels::Activations::int8_per_group), which ORT
  // skips for float zero points.
  const int64_t level = float_zero_points ? 0 : int_attribute_or(original, "accuracy_level", 0);
  fused.attributes = {int_attribute("K", m.k), int_attribute("N", m.n), int_attribute("bits", m.bits),
                      int_attribute("group_size", m.block_size), int_attribute("accuracy_level", level)};
  return fused;
}

}  // namespace

size_t pack_matmul_nbits(Graph& graph) {
  std::vector<NBitsMatch> matches;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (std::optional<NBitsMatch> m = match_nbits(graph, i)) matches.push_back(*m);
  }
  // (B, scales, zero points) -> the converted (w, scales, biases) initializers.
  using Key = std::tuple<std::string, std::string, std::string>;
  std::map<Key, std::tuple<std::string, std::string, std::string>> converted;
  std::vector<std::string> replaced;
  for (const NBitsMatch& m : matches) {
    const Key key{m.b, m.scales, m.zero_points};
    auto it = converted.find(key);
    if (it == converted.end()) {
      const int blocks = m.k / m.block_size;
      // A copy, so that the uint32 words are aligned (B may alias the file at any offset).
      mx::array bytes = mx::copy(mx::reshape(*stored_initializer(graph, m.b), {m.n, m.k * m.bits / 8}));
      mx::array w = mx::view(bytes, mx::uint32);
      mx::array scales =
          mx::astype(mx::reshape(*stored_initializer(graph, m.scales), {m.n, blocks}), mx::float32);
      mx::eval({w, scales});
      const std::string w_name = fresh_initializer_name(graph, m.b + "/mlx_affine");
      graph.initializers[w_name] = Value(w);
      const std::string scales_name = fresh_initializer_name(graph, m.scales + "/mlx_affine");
      graph.initializers[scales_name] = Value(scales);
      std::string biases_name;
      if (!m.zero_points.empty()) {
        mx::array biases = mx::negative(mx::multiply(scales, zero_points_of(graph, m)));
        mx::eval(biases);
        biases_name = fresh_initializer_name(graph, m.b + "/mlx_affine_biases");
        graph.initializers[biases_name] = Value(biases);
      }
      it = converted.emplace(key, std::make_tuple(w_name, scales_name, biases_name)).first;
      for (const std::string& name : {m.b, m.scales, m.zero_points}) {
        if (!name.empty()) replaced.push_back(name);
      }
    }
    const auto& [w_name, scales_name, biases_name] = it->second;
    const bool float_zero_points =
        !m.zero_points.empty() && stored_initializer(graph, m.zero_points)->dtype() != mx::uint8;
    graph.nodes[m.node] =
        quantized_node(graph.nodes[m.node], m, w_name, scales_name, biases_name, float_zero_points);
  }
  // The stored weights go once no node reads them (run_passes would drop
  // them too; dropping them here gives their file pages back).
  if (!matches.empty()) {
    const GraphIndex rewritten(graph);
    for (const std::string& name : replaced) {
      if (graph.initializers.contains(name) && rewritten.consumers(name).empty() &&
          !rewritten.is_graph_output(name)) {
        drop_weight(graph, name);
      }
    }
    import_domain(graph, kDomain, 1);
  }
  return matches.size();
}

}  // namespace transmuter
