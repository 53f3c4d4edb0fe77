// The operators Transmuter implements, as read-only information (the source of
// docs/operators.md and of `transmuter operators`).
#pragma once

#include <string>
#include <vector>

namespace transmuter {

/** One implementation, valid for op versions [since, until] of its domain. */
struct OperatorInfo {
  std::string domain;  // "ai.onnx", "com.microsoft", ...
  std::string op_type;
  int since = 0;
  int until = 0;  // == since..., or open_ended
  bool open_ended = false;
  /** Inputs read on the host (shapes, axes, pads...): fed from data, they make
   * the op a graph break under compile. */
  std::vector<int> host_inputs;
  /** Always runs eagerly (data-dependent output shapes, non-tensor values). */
  bool eager_only = false;
  /** What the implementation does not cover; empty: the whole spec. */
  std::string restrictions;
  /** Why no gradient flows through the op (integer outputs, random samples...);
   * empty: differentiable on floating-point data. */
  std::string not_differentiable;
};

/** Every implementation, ordered by domain, op_type, since. */
std::vector<OperatorInfo> supported_operators();

}  // namespace transmuter
