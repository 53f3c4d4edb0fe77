// The operator registry: (domain, op_type) -> version ranges -> implementation.
//
// Each family file (src/ops/onnx/<family>.cpp) exposes register_<family>() that
// adds one row per operator version range. Registering an overlapping range
// twice is an error, so a copy-paste slip is caught at start-up.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "transmuter/value.h"

namespace transmuter {

class NodeContext;

using OpOutputs = std::vector<Value>;
using OpFn = OpOutputs (*)(NodeContext&);

inline constexpr int kOpen = std::numeric_limits<int>::max();
inline constexpr std::string_view kOnnx = "";
inline constexpr std::string_view kMicrosoft = "com.microsoft";
// Transmuter's own ops, made by load-time passes (src/ops/transmuter/).
inline constexpr std::string_view kTransmuter = "ai.transmuter";

/** One implementation, valid for opsets [since, until] of its domain. */
struct OpRow {
  std::string_view op_type;
  std::string_view domain;
  int since;
  int until;
  OpFn fn;
  // Inputs whose values the op reads on the host (shapes, axes, pads, k...).
  // When one of them is computed from traced data, the op is a graph break.
  std::vector<int> host_inputs = {};
  // True when the op must always run eagerly (data-dependent output shape,
  // or it consumes/produces sequences, strings, optionals).
  bool eager_only = false;
  // What the implementation does not cover (dtypes, attribute values), for
  // docs/operators.md. Empty: the whole spec of these versions.
  std::string_view restrictions = {};
  // Why MLX's vjp gives no meaningful gradient through this op (integer or
  // boolean outputs, random samples, values computed on the host), for
  // docs/operators.md and the gradient check (tests/gradients/). Empty: every
  // floating-point output is differentiable with respect to every
  // floating-point input (almost everywhere).
  std::string_view not_differentiable = {};
  // The outputs depend only on the inputs' shapes (Shape, Size): they are
  // known on the host while tracing, unless an input's shape depends on data.
  bool reads_only_shapes = false;
  // True for the nodes of this op whose outputs may be a string tensor,
  // sequence or optional although the op is not eager_only (Cast to STRING).
  // Such outputs cannot cross a compiled boundary. Null: always tensors.
  bool (*makes_non_tensor)(const Node& node) = nullptr;
  // The op sets the ONNX element type of its outputs itself (Cast to int4,
  // QuantizeLinear to float8, DequantizeLinear from them). For other rows the
  // interpreter carries a narrow type held widened (float8 as float32...) from
  // the inputs to outputs of the same MLX dtype: ONNX lets such types only
  // into ops that move data (Identity, Reshape, Transpose, Pad, If...).
  bool sets_element_types = false;
  // ONNX Runtime's contrib op that ORT registers in the default domain at versions
  // where ONNX has no such schema (SimplifiedLayerNormalization, LayerNormalization
  // before opset 17); its optimizer writes them into exports. Exempt from the
  // checks against ONNX's schema versions.
  bool onnxruntime_default_domain = false;
};

/** `row`, marked as ONNX Runtime's contrib op in the default domain. */
inline OpRow onnxruntime_default_domain(OpRow row) {
  row.onnxruntime_default_domain = true;
  return row;
}

class OpRegistry {
 public:
  /** Adds rows; throws transmuter::Error if a range overlaps an existing one. */
  void add(std::initializer_list<OpRow> rows);
  void add(const OpRow& row);

  /** The row whose range holds `opset`, or nullptr. */
  const OpRow* find(std::string_view domain, std::string_view op_type, int64_t opset) const;

  /** Every row, ordered by domain, op_type, since. */
  std::vector<const OpRow*> rows() const;

 private:
  std::map<std::pair<std::string, std::string>, std::vector<OpRow>> rows_;
};

/** The registry with every built-in operator, built once on first use. */
const OpRegistry& builtin_registry();

// One per family file; register_all() in registry.cpp calls each once.
void register_elementwise(OpRegistry& registry);
void register_activation(OpRegistry& registry);
void register_reduction(OpRegistry& registry);
void register_matmul(OpRegistry& registry);
void register_conv(OpRegistry& registry);
void register_pool(OpRegistry& registry);
void register_shape(OpRegistry& registry);
void register_indexing(OpRegistry& registry);
void register_normalization(OpRegistry& registry);
void register_generator(OpRegistry& registry);
void register_random(OpRegistry& registry);
void register_cast(OpRegistry& registry);
void register_controlflow(OpRegistry& registry);
void register_sequence(OpRegistry& registry);
void register_attention(OpRegistry& registry);
void register_text(OpRegistry& registry);
void register_ml(OpRegistry& registry);
void register_training(OpRegistry& registry);
void register_quantization(OpRegistry& registry);
void register_rnn(OpRegistry& registry);
void register_signal(OpRegistry& registry);
void register_detection(OpRegistry& registry);
void register_selection(OpRegistry& registry);
void register_linalg(OpRegistry& registry);
void register_classic_vision(OpRegistry& registry);
void register_image(OpRegistry& registry);
void register_loss(OpRegistry& registry);
void register_resize(OpRegistry& registry);
void register_grid(OpRegistry& registry);
void register_transmuter_attention(OpRegistry& registry);
void register_transmuter_rotary(OpRegistry& registry);
void register_transmuter_matmul(OpRegistry& registry);
void register_transmuter_activation(OpRegistry& registry);
void register_transmuter_conv(OpRegistry& registry);
void register_transmuter_indexing(OpRegistry& registry);
// com.microsoft (ONNX Runtime's contrib operators), src/ops/microsoft/<family>.cpp.
void register_microsoft_activation(OpRegistry& registry);
void register_microsoft_normalization(OpRegistry& registry);
void register_microsoft_conv(OpRegistry& registry);
void register_microsoft_matmul(OpRegistry& registry);
void register_microsoft_attention(OpRegistry& registry);
// Called by register_microsoft_attention (src/ops/microsoft/group_query_attention.cpp,
// rotary_embedding.cpp).
void register_microsoft_group_query_attention(OpRegistry& registry);
void register_microsoft_rotary_embedding(OpRegistry& registry);
void register_microsoft_quantized_weights(OpRegistry& registry);
void register_microsoft_qlinear(OpRegistry& registry);
// Called by register_microsoft_qlinear (src/ops/microsoft/qlinear_matmul.cpp).
void register_microsoft_qlinear_matmul(OpRegistry& registry);
void register_microsoft_moe(OpRegistry& registry);

}  // namespace transmuter
