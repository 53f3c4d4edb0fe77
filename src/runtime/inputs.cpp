#include "runtime/inputs.h"

#include <limits>

#include <mlx/mlx.h>

#include "runtime/interpreter.h"
#include "transmuter/error.h"

namespace transmuter {

namespace {

void check_tensor(const ValueInfo& info, const mx::array& a) {
  if (info.elem_type != OnnxType::kUndefined) {
    auto expected = to_mlx_dtype(info.elem_type);
    if (expected && *expected != a.dtype()) {
      throw InputError(str("input '", info.name, "': expected dtype ", onnx_type_name(info.elem_type),
                           ", got ", onnx_type_name(to_onnx_type(a.dtype()))));
    }
  }
  if (!info.has_shape) return;
  if (info.shape.size() != a.ndim()) {
    throw InputError(str("input '", info.name, "': expected rank ", info.shape.size(), ", got rank ", a.ndim()));
  }
  for (size_t d = 0; d < info.shape.size(); ++d) {
    const Dim& dim = info.shape[d];
    if (!dim.value || *dim.value < 0) continue;  // symbolic or unknown: any size
    if (*dim.value > std::numeric_limits<int32_t>::max()) {
      throw InputError(str("input '", info.name, "': dimension ", d, " is declared ", *dim.value,
                           ", beyond the int32 range of MLX shapes; no input can match it"));
    }
    if (*dim.value != a.shape(static_cast<int>(d))) {
      throw InputError(str("input '", info.name, "': dimension ", d, " must be ", *dim.value, ", got ",
                           a.shape(static_cast<int>(d))));
    }
  }
}

}  // namespace

Inputs validate_inputs(const Graph& graph, const Inputs& inputs) {
  Inputs typed = inputs;
  for (const auto& [name, value] : inputs) {
    bool known = false;
    for (const ValueInfo& info : graph.inputs) known = known || info.name == name;
    if (!known && graph.initializers.count(name) == 0) {
      throw InputError(str("input '", name, "' is not an input of the model"));
    }
  }
  for (const ValueInfo& info : graph.inputs) {
    auto it = inputs.find(info.name);
    if (it == inputs.end()) {
      if (info.kind == ValueInfo::Kind::kOptional) continue;
      throw InputError(str("input '", info.name, "' is required but was not given"));
    }
    if (it->second.is_tensor() && info.kind == ValueInfo::Kind::kTensor) {
      check_tensor(info, it->second.tensor());
      if (it->second.is_widened() && it->second.element_type() != info.elem_type) {
        throw InputError(str("input '", info.name, "': expected dtype ", onnx_type_name(info.elem_type), ", got ",
                             onnx_type_name(it->second.element_type())));
      }
      typed[info.name] = with_declared_type(info, it->second);
    }
  }
  return typed;
}

}  // namespace transmuter
