// Runs one registered operator on given inputs, without a model file, for the
// unit tests in tests/ops/.
#pragma once

#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "graph/graph.h"
#include "transmuter/value.h"

namespace transmuter::testing {

/** Attribute builders: int_attr("axis", 1), ints_attr("perm", {1, 0}), ... */
Attribute int_attr(const std::string& name, int64_t v);
Attribute float_attr(const std::string& name, float v);
Attribute string_attr(const std::string& name, const std::string& v);
Attribute ints_attr(const std::string& name, std::vector<int64_t> v);
Attribute floats_attr(const std::string& name, std::vector<float> v);
Attribute strings_attr(const std::string& name, std::vector<std::string> v);
Attribute tensor_attr(const std::string& name, Value v);

/** Runs `op_type` of the default domain at `opset` with the given inputs (a
 * `none` Value marks an omitted optional input) and returns its outputs.
 * Throws like the runtime does (OpError, UnsupportedError). */
std::vector<Value> run_op(const std::string& op_type, int opset, const std::vector<Value>& inputs,
                          const std::vector<Attribute>& attributes = {}, int num_outputs = 1);
/** run_op for an operator of another domain ("ai.onnx.ml", ...). */
std::vector<Value> run_domain_op(const std::string& domain, const std::string& op_type, int opset,
                                 const std::vector<Value>& inputs, const std::vector<Attribute>& attributes = {},
                                 int num_outputs = 1);

/** run_op with the node's memory limit (NodeContext::memory_limit) set to
 * `memory_limit` bytes, as RunOptions::memory_limit sets it. */
std::vector<Value> run_op_with_memory_limit(const std::string& op_type, int opset, const std::vector<Value>& inputs,
                                            const std::vector<Attribute>& attributes, uint64_t memory_limit);

/** Runs the op inside mx::compile: inputs at `traced` positions are the
 * compiled function's arguments (tracers while tracing), the others are
 * captured constants, as host inputs are for the runtime's compiler. */
std::vector<mx::array> run_compiled(const std::string& op_type, int opset, const std::vector<Value>& inputs,
                                    const std::vector<size_t>& traced, const std::vector<Attribute>& attributes = {},
                                    int num_outputs = 1);

/** An int64 tensor; 1-D of v.size() unless `shape` is given. */
mx::array i64(std::vector<int64_t> v, mx::Shape shape = {});
/** 0, 1, 2, ... in `shape` (row-major), cast to `dtype`. */
mx::array iota(mx::Shape shape, mx::Dtype dtype = mx::float32);
/** The first output, as a tensor. */
const mx::array& out0(const std::vector<Value>& outputs);

/** Values of a tensor as doubles/int64 (evaluates it). */
std::vector<double> to_doubles(const mx::array& a);
std::vector<int64_t> to_ints(const mx::array& a);

}  // namespace transmuter::testing
