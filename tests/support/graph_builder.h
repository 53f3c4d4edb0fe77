// Builds small graphs in C++ for runtime tests, without model files.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "runtime/model_state.h"

namespace transmuter::testing {

/** A GRAPH attribute holding `body` (a subgraph: If branch, Loop/Scan body). */
Attribute graph_attr(const std::string& name, std::shared_ptr<Graph> body);

class GraphBuilder {
 public:
  explicit GraphBuilder(int64_t opset = 18) : graph_(std::make_shared<Graph>()) { graph_->opsets[""] = opset; }

  /** Declares a tensor input; dims < 0 are symbolic ("d0", "d1", ...). */
  GraphBuilder& input(const std::string& name, OnnxType type, std::vector<int64_t> dims);
  GraphBuilder& initializer(const std::string& name, mx::array value);
  GraphBuilder& node(const std::string& op_type, std::vector<std::string> inputs, std::vector<std::string> outputs,
                     std::vector<Attribute> attributes = {});
  /** A node of another domain than ONNX's, imported at `version`. */
  GraphBuilder& domain_node(const std::string& domain, int64_t version, const std::string& op_type,
                            std::vector<std::string> inputs, std::vector<std::string> outputs,
                            std::vector<Attribute> attributes = {});
  GraphBuilder& output(const std::string& name);
  /** An output declared with a type and shape (dims < 0 symbolic, as for inputs). */
  GraphBuilder& output(const std::string& name, OnnxType type, std::vector<int64_t> dims);

  /** The graph built so far, e.g. as an If/Loop/Scan body (graph_attr). */
  std::shared_ptr<Graph> graph() const { return std::make_shared<Graph>(*graph_); }

  /** The Model (ops resolved against the built-in registry). */
  Model build(const LoadOptions& options = {}) const;

 private:
  std::shared_ptr<Graph> graph_;
};

/** Load options running every default pass except `skipped` (a pass test that
 * checks another pass's rewrite in isolation). */
LoadOptions passes_except(const std::string& skipped);

/** How many nodes of `op` (as Model::op_histogram names it: "domain.Type" outside the default domain) the
 * loaded model has. */
size_t op_count(const Model& model, const std::string& op);

}  // namespace transmuter::testing
