// Loading an ONNX model: the Model handle and what it declares.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <mlx/array.h>

#include "transmuter/value_info.h"

namespace transmuter {

namespace mx = mlx::core;
struct Graph;

/** Trainable parameters: initializer name -> array. Arrays alias the model
 * file's memory where dtype and alignment allow. */
using Params = std::unordered_map<std::string, mx::array>;

struct LoadOptions {
  /** Run the load-time rewrites in src/passes/ (fusions such as RMSNorm). */
  bool run_passes = true;
};

/** A loaded model. Cheap to copy (shared, immutable state). */
class Model {
 public:
  /** Graph inputs the caller feeds (initializers excluded), in model order. */
  const std::vector<ValueInfo>& inputs() const;
  /** Graph outputs, in model order. */
  const std::vector<ValueInfo>& outputs() const;
  /** The initializers, to pass to run() or to differentiate against. */
  const Params& params() const;
  /** Opset imported for `domain` ("" is ai.onnx), or 0. */
  int64_t opset(const std::string& domain = "") const;
  const std::map<std::string, int64_t>& opsets() const;
  int64_t ir_version() const;
  const std::string& producer() const;
  /** Number of nodes of the main graph after load-time passes. */
  size_t node_count() const;
  /** The executable graph (internal representation; see src/graph/graph.h). */
  const Graph& graph() const;

  struct State;
  explicit Model(std::shared_ptr<const State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<const State> state_;
};

/** Loads an ONNX model from a path (the `hf://` hub source comes with the hub
 * client). Throws ModelFormatError for a malformed file and UnsupportedError
 * listing every (domain, op_type, opset) that has no implementation. */
Model load(const std::string& source, const LoadOptions& options = {});

}  // namespace transmuter
