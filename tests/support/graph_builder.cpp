#include "support/graph_builder.h"

#include "passes/pass_manager.h"

namespace transmuter::testing {

Attribute graph_attr(const std::string& name, std::shared_ptr<Graph> body) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kGraph;
  a.g = std::move(body);
  return a;
}

namespace {

ValueInfo tensor_info(const std::string& name, OnnxType type, const std::vector<int64_t>& dims) {
  ValueInfo info;
  info.name = name;
  info.kind = ValueInfo::Kind::kTensor;
  info.elem_type = type;
  info.has_shape = true;
  for (size_t i = 0; i < dims.size(); ++i) {
    Dim d;
    if (dims[i] >= 0) d.value = dims[i];
    else d.symbol = std::to_string(i).insert(0, 1, 'd');  // GCC 12 warns (-Wrestrict) on "d" + string
    info.shape.push_back(d);
  }
  return info;
}

}  // namespace

GraphBuilder& GraphBuilder::input(const std::string& name, OnnxType type, std::vector<int64_t> dims) {
  graph_->inputs.push_back(tensor_info(name, type, dims));
  return *this;
}

GraphBuilder& GraphBuilder::initializer(const std::string& name, mx::array value) {
  graph_->initializers[name] = value;
  return *this;
}

GraphBuilder& GraphBuilder::node(const std::string& op_type, std::vector<std::string> inputs,
                                 std::vector<std::string> outputs, std::vector<Attribute> attributes) {
  Node n;
  n.name = op_type + "_" + std::to_string(graph_->nodes.size());
  n.op_type = op_type;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attributes = std::move(attributes);
  n.opset = static_cast<int>(graph_->opsets[""]);
  graph_->nodes.push_back(std::move(n));
  return *this;
}

GraphBuilder& GraphBuilder::domain_node(const std::string& domain, int64_t version, const std::string& op_type,
                                        std::vector<std::string> inputs, std::vector<std::string> outputs,
                                        std::vector<Attribute> attributes) {
  node(op_type, std::move(inputs), std::move(outputs), std::move(attributes));
  graph_->nodes.back().domain = domain;
  graph_->nodes.back().opset = static_cast<int>(version);
  graph_->opsets[domain] = version;
  return *this;
}

GraphBuilder& GraphBuilder::output(const std::string& name) {
  ValueInfo info;
  info.name = name;
  graph_->outputs.push_back(info);
  return *this;
}

GraphBuilder& GraphBuilder::output(const std::string& name, OnnxType type, std::vector<int64_t> dims) {
  graph_->outputs.push_back(tensor_info(name, type, dims));
  return *this;
}

Model GraphBuilder::build(const LoadOptions& options) const {
  return make_model(std::make_shared<Graph>(*graph_), "test-graph", options);
}

LoadOptions passes_except(const std::string& skipped) {
  LoadOptions options;
  for (const Pass& pass : default_passes()) {
    if (pass.name != skipped) options.only_passes.emplace_back(pass.name);
  }
  return options;
}

size_t op_count(const Model& model, const std::string& op) {
  const auto histogram = model.op_histogram();
  auto it = histogram.find(op);
  return it == histogram.end() ? 0 : it->second;
}

}  // namespace transmuter::testing
