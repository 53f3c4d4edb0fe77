// The in-memory graph that the runtime executes: nodes in topological order,
// their attributes already decoded, initializers as MLX arrays. The graph
// knows nothing of operators: runtime/bound_graph.h binds nodes to the registry.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "transmuter/dtype.h"
#include "transmuter/value.h"
#include "transmuter/value_info.h"

namespace transmuter {

struct Graph;

/** AttributeProto.AttributeType, numbered as in onnx.proto. */
enum class AttrType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kInt = 2,
  kString = 3,
  kTensor = 4,
  kGraph = 5,
  kSparseTensor = 11,
  kTypeProto = 13,
  kFloats = 6,
  kInts = 7,
  kStrings = 8,
  kTensors = 9,
  kGraphs = 10,
  kSparseTensors = 12,
  kTypeProtos = 14,
};

/** One decoded node attribute. Only the fields of `type` are meaningful. */
struct Attribute {
  std::string name;
  AttrType type = AttrType::kUndefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Value t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Value> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
  // Set inside a FunctionProto body: take the value of the caller's attribute.
  std::string ref_attr_name;
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;  // "" is the default ONNX domain
  std::vector<std::string> inputs;  // "" marks an omitted optional input
  std::vector<std::string> outputs;
  std::vector<Attribute> attributes;
  int opset = 0;  // opset of `domain` imported by the model

  const Attribute* find_attribute(const std::string& attr_name) const;
  /** "Softmax node 'attn/Softmax' (opset 13)": names the node in messages. */
  std::string label() const;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;  // topological order
  std::vector<ValueInfo> inputs;
  std::vector<ValueInfo> outputs;
  std::vector<ValueInfo> value_info;
  // Initializers (and, in subgraphs, constants local to the subgraph).
  std::map<std::string, Value> initializers;
  // Opset per domain ("" for ai.onnx), shared with subgraphs.
  std::map<std::string, int64_t> opsets;
};

}  // namespace transmuter
