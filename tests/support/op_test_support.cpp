#include "support/op_test_support.h"

#include "ops/node_context.h"
#include "ops/registry.h"
#include "passes/node_pattern.h"
#include "transmuter/error.h"

namespace transmuter::testing {

// The passes' attribute builders (src/passes/node_pattern.h), under the
// short names the tests use.
Attribute int_attr(const std::string& name, int64_t v) { return int_attribute(name, v); }
Attribute float_attr(const std::string& name, float v) { return float_attribute(name, v); }
Attribute string_attr(const std::string& name, const std::string& v) { return string_attribute(name, v); }
Attribute ints_attr(const std::string& name, std::vector<int64_t> v) { return ints_attribute(name, std::move(v)); }
Attribute floats_attr(const std::string& name, std::vector<float> v) { return floats_attribute(name, std::move(v)); }
Attribute strings_attr(const std::string& name, std::vector<std::string> v) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kStrings;
  a.strings = std::move(v);
  return a;
}
Attribute tensor_attr(const std::string& name, Value v) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kTensor;
  a.t = std::move(v);
  return a;
}

std::vector<Value> run_op(const std::string& op_type, int opset, const std::vector<Value>& inputs,
                          const std::vector<Attribute>& attributes, int num_outputs) {
  return run_domain_op("", op_type, opset, inputs, attributes, num_outputs);
}

namespace {
// memory_limit 0: the machine's physical memory (NodeContext's default).
std::vector<Value> run_node(const std::string& domain, const std::string& op_type, int opset,
                            const std::vector<Value>& inputs, const std::vector<Attribute>& attributes,
                            int num_outputs, uint64_t memory_limit) {
  Node node;
  node.name = "test_" + op_type;
  node.op_type = op_type;
  node.domain = domain;
  node.opset = opset;
  node.attributes = attributes;
  for (size_t i = 0; i < inputs.size(); ++i) node.inputs.push_back(str("in", i));
  for (int i = 0; i < num_outputs; ++i) node.outputs.push_back(str("out", i));
  const OpRow* row = builtin_registry().find(domain, op_type, opset);
  if (row == nullptr) throw UnsupportedError(str(op_type, " opset ", opset, " is not registered"));
  std::vector<const Value*> ptrs;
  for (const Value& v : inputs) ptrs.push_back(&v);
  NodeContext ctx(node, ptrs, mx::Device::cpu, nullptr, row);
  ctx.set_memory_limit(memory_limit);
  return row->fn(ctx);
}
}  // namespace

std::vector<Value> run_domain_op(const std::string& domain, const std::string& op_type, int opset,
                                 const std::vector<Value>& inputs, const std::vector<Attribute>& attributes,
                                 int num_outputs) {
  return run_node(domain, op_type, opset, inputs, attributes, num_outputs, 0);
}

std::vector<Value> run_op_with_memory_limit(const std::string& op_type, int opset, const std::vector<Value>& inputs,
                                            const std::vector<Attribute>& attributes, uint64_t memory_limit) {
  return run_node("", op_type, opset, inputs, attributes, 1, memory_limit);
}

std::vector<mx::array> run_compiled(const std::string& op_type, int opset, const std::vector<Value>& inputs,
                                    const std::vector<size_t>& traced, const std::vector<Attribute>& attributes,
                                    int num_outputs) {
  std::vector<mx::array> args;
  for (size_t i : traced) args.push_back(inputs[i].tensor());
  auto trace = [&](const std::vector<mx::array>& traced_args) {
    std::vector<Value> in = inputs;
    for (size_t k = 0; k < traced.size(); ++k) in[traced[k]] = traced_args[k];
    std::vector<mx::array> outs;
    for (const Value& v : run_op(op_type, opset, in, attributes, num_outputs)) outs.push_back(v.tensor());
    return outs;
  };
  return mx::compile(trace)(args);
}

mx::array i64(std::vector<int64_t> v, mx::Shape shape) {
  if (shape.empty()) shape = {static_cast<int>(v.size())};
  return mx::array(v.begin(), shape, mx::int64);
}

mx::array iota(mx::Shape shape, mx::Dtype dtype) {
  int n = 1;
  for (int d : shape) n *= d;
  return mx::reshape(mx::astype(mx::arange(n), dtype), shape);
}

const mx::array& out0(const std::vector<Value>& outputs) { return outputs[0].tensor(); }

std::vector<double> to_doubles(const mx::array& a) {
  // contiguous: a broadcast array (a gradient of a broadcast scalar) keeps
  // zero strides through astype, and data() would read past its one element.
  mx::array f = mx::contiguous(mx::astype(mx::flatten(a), mx::float64, mx::Device::cpu), false, mx::Device::cpu);
  mx::eval(f);
  return std::vector<double>(f.data<double>(), f.data<double>() + f.size());
}

std::vector<int64_t> to_ints(const mx::array& a) {
  // contiguous: a broadcast array (a gradient of a broadcast scalar) keeps
  // zero strides through astype, and data() would read past its one element.
  mx::array f = mx::contiguous(mx::astype(mx::flatten(a), mx::int64, mx::Device::cpu), false, mx::Device::cpu);
  mx::eval(f);
  return std::vector<int64_t>(f.data<int64_t>(), f.data<int64_t>() + f.size());
}

}  // namespace transmuter::testing
