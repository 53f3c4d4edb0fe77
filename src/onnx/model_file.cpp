#include "onnx/model_file.h"

#include <set>
#include <utility>

#include "graph/function_inliner.h"
#include "graph/topological_sort.h"
#include "onnx/mapped_file.h"
#include "onnx/tensor.h"
#include "onnx/wire_reader.h"
#include "transmuter/error.h"

namespace transmuter {

namespace fs = std::filesystem;

namespace {

using Opsets = std::map<std::string, int64_t>;
using Bytes = std::span<const uint8_t>;

// "ai.onnx" is the formal name of the default domain, which nodes write "".
std::string normalize_domain(std::string domain) {
  return domain == "ai.onnx" ? std::string() : domain;
}

// Field numbers of each message's `name`, used to label paths before parsing.
constexpr uint32_t kTensorName = 8;
constexpr uint32_t kNodeName = 3;
constexpr uint32_t kAttributeName = 1;
constexpr uint32_t kValueInfoName = 1;
constexpr uint32_t kFunctionName = 1;

// Reads ModelProto and everything below it (onnx/onnx.proto) into our types.
class ModelProtoReader {
 public:
  explicit ModelProtoReader(TensorSource source) : source_(std::move(source)) {}

  ModelFile read_model(Bytes bytes, const MessagePath& path);

 private:
  std::shared_ptr<Graph> read_graph(Bytes bytes, const MessagePath& path, const Opsets& opsets);
  Node read_node(Bytes bytes, const MessagePath& path, const Opsets& opsets);
  Attribute read_attribute(Bytes bytes, const MessagePath& path, const Opsets& opsets);
  ValueInfo read_value_info(Bytes bytes, const MessagePath& path);
  Function read_function(Bytes bytes, const MessagePath& path, const Opsets& model_opsets);

  Value read_tensor_value(Bytes bytes, const MessagePath& parent, std::string_view field,
                          int64_t index = -1) {
    MessagePath path(parent, field, index, peek_string_field(bytes, kTensorName));
    return read_tensor(bytes, path, source_).value;
  }
  Value read_sparse_value(Bytes bytes, const MessagePath& parent, std::string_view field,
                          int64_t index = -1) {
    MessagePath path(parent, field, index);
    return read_sparse_tensor(bytes, path, source_).value;
  }

  TensorSource source_;
};

std::pair<std::string, int64_t> read_opset(Bytes bytes, const MessagePath& path) {
  std::pair<std::string, int64_t> opset{"", 0};
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: opset.first = normalize_domain(reader.string()); break;
      case 2: opset.second = reader.int64(); break;
      default: reader.skip();
    }
  }
  return opset;
}

// ------------------------------------------------------------------ types

// TensorShapeProto.
std::vector<Dim> read_shape(Bytes bytes, const MessagePath& path) {
  std::vector<Dim> shape;
  WireReader reader(bytes, path);
  while (reader.next()) {
    if (reader.field() != 1) {
      reader.skip();
      continue;
    }
    MessagePath dim_path(path, "dim", static_cast<int64_t>(shape.size()));
    Dim dim;
    WireReader dim_reader(reader.bytes(), dim_path);
    while (dim_reader.next()) {
      switch (dim_reader.field()) {
        // Exports write a dynamic batch as dim_value -1: a negative value
        // means unknown, as an absent one does.
        case 1: {
          const int64_t value = dim_reader.int64();
          if (value >= 0) {
            dim.value = value;
          } else {
            dim.value.reset();
          }
          break;
        }
        case 2: dim.symbol = dim_reader.string(); break;
        default: dim_reader.skip();
      }
    }
    shape.push_back(std::move(dim));
  }
  return shape;
}

// TypeProto.Tensor (and SparseTensor, same fields): element type and shape.
void read_tensor_type(Bytes bytes, const MessagePath& path, ValueInfo& out) {
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: out.elem_type = static_cast<OnnxType>(reader.int32()); break;
      case 2: {
        MessagePath shape_path(path, "shape");
        out.shape = read_shape(reader.bytes(), shape_path);
        out.has_shape = true;
        break;
      }
      default: reader.skip();
    }
  }
}

void read_type(Bytes bytes, const MessagePath& path, ValueInfo& out, bool outermost);

// TypeProto.Sequence / Optional / Map: the element type lives in a nested
// TypeProto (field 1; 2 for a map's values). ValueInfo keeps the outer kind
// and the innermost tensor's element type and shape.
void read_nested_type(Bytes bytes, const MessagePath& path, uint32_t type_field, ValueInfo& out) {
  WireReader reader(bytes, path);
  while (reader.next()) {
    if (reader.field() == type_field) {
      MessagePath elem_path(path, "elem_type");
      read_type(reader.bytes(), elem_path, out, false);
    } else {
      reader.skip();
    }
  }
}

void read_type(Bytes bytes, const MessagePath& path, ValueInfo& out, bool outermost) {
  auto set_kind = [&](ValueInfo::Kind kind) {
    if (outermost) out.kind = kind;
  };
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: {
        set_kind(ValueInfo::Kind::kTensor);
        MessagePath sub(path, "tensor_type");
        read_tensor_type(reader.bytes(), sub, out);
        break;
      }
      case 4: {
        set_kind(ValueInfo::Kind::kSequence);
        MessagePath sub(path, "sequence_type");
        read_nested_type(reader.bytes(), sub, 1, out);
        break;
      }
      case 5: {
        set_kind(ValueInfo::Kind::kMap);
        MessagePath sub(path, "map_type");
        read_nested_type(reader.bytes(), sub, 2, out);
        break;
      }
      case 9: {
        set_kind(ValueInfo::Kind::kOptional);
        MessagePath sub(path, "optional_type");
        read_nested_type(reader.bytes(), sub, 1, out);
        break;
      }
      case 8: {  // sparse_tensor_type: the runtime sees dense tensors
        set_kind(ValueInfo::Kind::kTensor);
        MessagePath sub(path, "sparse_tensor_type");
        read_tensor_type(reader.bytes(), sub, out);
        break;
      }
      default: reader.skip();  // opaque_type, denotation
    }
  }
}

ValueInfo ModelProtoReader::read_value_info(Bytes bytes, const MessagePath& path) {
  ValueInfo info;
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: info.name = reader.string(); break;
      case 2: {
        MessagePath type_path(path, "type");
        read_type(reader.bytes(), type_path, info, true);
        break;
      }
      default: reader.skip();
    }
  }
  return info;
}

// ------------------------------------------------------------- attributes

// Infers AttributeProto.type for old producers that leave it unset.
AttrType infer_attribute_type(const Attribute& a, bool has_f, bool has_i, bool has_s) {
  if (a.g) return AttrType::kGraph;
  if (!a.t.is_none()) return AttrType::kTensor;
  if (!a.graphs.empty()) return AttrType::kGraphs;
  if (!a.tensors.empty()) return AttrType::kTensors;
  if (!a.floats.empty()) return AttrType::kFloats;
  if (!a.ints.empty()) return AttrType::kInts;
  if (!a.strings.empty()) return AttrType::kStrings;
  if (has_s) return AttrType::kString;
  if (has_i) return AttrType::kInt;
  if (has_f) return AttrType::kFloat;
  return AttrType::kUndefined;
}

Attribute ModelProtoReader::read_attribute(Bytes bytes, const MessagePath& path,
                                           const Opsets& opsets) {
  Attribute a;
  bool has_type = false, has_f = false, has_i = false, has_s = false;
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: a.name = reader.string(); break;
      case 21: a.ref_attr_name = reader.string(); break;
      case 20: a.type = static_cast<AttrType>(reader.int32()); has_type = true; break;
      case 2: a.f = reader.float32(); has_f = true; break;
      case 3: a.i = reader.int64(); has_i = true; break;
      case 4: a.s = reader.string(); has_s = true; break;
      case 5: a.t = read_tensor_value(reader.bytes(), path, "t"); break;
      case 6: {
        MessagePath sub(path, "g");
        a.g = read_graph(reader.bytes(), sub, opsets);
        break;
      }
      // A sparse tensor attribute (Constant's sparse_value) is kept densified in `t`.
      case 22: a.t = read_sparse_value(reader.bytes(), path, "sparse_tensor"); break;
      case 7: reader.append_floats(a.floats); break;
      case 8: reader.append_int64s(a.ints); break;
      case 9: a.strings.push_back(reader.string()); break;
      case 10: {
        const auto index = static_cast<int64_t>(a.tensors.size());
        a.tensors.push_back(read_tensor_value(reader.bytes(), path, "tensors", index));
        break;
      }
      case 11: {
        MessagePath sub(path, "graphs", static_cast<int64_t>(a.graphs.size()));
        a.graphs.push_back(read_graph(reader.bytes(), sub, opsets));
        break;
      }
      case 23: {
        const auto index = static_cast<int64_t>(a.tensors.size());
        a.tensors.push_back(read_sparse_value(reader.bytes(), path, "sparse_tensors", index));
        break;
      }
      default: reader.skip();  // doc_string, tp, type_protos: type kept, content unused
    }
  }
  if (!has_type || a.type == AttrType::kUndefined) {
    a.type = infer_attribute_type(a, has_f, has_i, has_s);
  }
  if (a.name.empty()) path.fail("attribute has no name");
  return a;
}

// ------------------------------------------------------------ nodes, graphs

Node ModelProtoReader::read_node(Bytes bytes, const MessagePath& path, const Opsets& opsets) {
  Node node;
  std::vector<Bytes> attributes;
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: node.inputs.push_back(reader.string()); break;
      case 2: node.outputs.push_back(reader.string()); break;
      case 3: node.name = reader.string(); break;
      case 4: node.op_type = reader.string(); break;
      case 7: node.domain = normalize_domain(reader.string()); break;
      case 5: attributes.push_back(reader.bytes()); break;
      default: reader.skip();
    }
  }
  if (node.op_type.empty()) path.fail("node has no op_type");
  for (size_t i = 0; i < attributes.size(); ++i) {
    MessagePath sub(path, "attribute", static_cast<int64_t>(i),
                    peek_string_field(attributes[i], kAttributeName));
    node.attributes.push_back(read_attribute(attributes[i], sub, opsets));
  }
  // A domain the model does not import keeps opset 0: the op lookup then
  // reports it as unsupported, naming the node. Except com.microsoft: ONNX
  // Runtime's transformer optimizer writes its contrib ops without importing
  // the domain, and ONNX Runtime runs them at the domain's one version, 1.
  const auto found = opsets.find(node.domain);
  if (found != opsets.end()) node.opset = static_cast<int>(found->second);
  else if (node.domain == "com.microsoft") node.opset = 1;
  return node;
}

std::shared_ptr<Graph> ModelProtoReader::read_graph(Bytes bytes, const MessagePath& path,
                                                    const Opsets& opsets) {
  auto graph = std::make_shared<Graph>();
  graph->opsets = opsets;
  int64_t node_index = 0, initializer_index = 0, sparse_index = 0;
  WireReader reader(bytes, path);
  auto add_initializer = [&](std::string name, Value value, const MessagePath& at) {
    if (name.empty()) at.fail("initializer has no name");
    if (!graph->initializers.emplace(name, std::move(value)).second) {
      at.fail(str("duplicate initializer '", name, "'"));
    }
  };
  while (reader.next()) {
    switch (reader.field()) {
      case 1: {
        const Bytes node = reader.bytes();
        MessagePath sub(path, "node", node_index++, peek_string_field(node, kNodeName));
        graph->nodes.push_back(read_node(node, sub, opsets));
        break;
      }
      case 2: graph->name = reader.string(); break;
      case 5: {
        const Bytes tensor = reader.bytes();
        MessagePath sub(path, "initializer", initializer_index++,
                        peek_string_field(tensor, kTensorName));
        NamedValue decoded = read_tensor(tensor, sub, source_);
        add_initializer(std::move(decoded.name), std::move(decoded.value), sub);
        break;
      }
      case 15: {
        MessagePath sub(path, "sparse_initializer", sparse_index++);
        NamedValue decoded = read_sparse_tensor(reader.bytes(), sub, source_);
        add_initializer(std::move(decoded.name), std::move(decoded.value), sub);
        break;
      }
      case 11: case 12: case 13: {
        const uint32_t field = reader.field();
        std::vector<ValueInfo>& list = field == 11   ? graph->inputs
                                       : field == 12 ? graph->outputs
                                                     : graph->value_info;
        const Bytes info = reader.bytes();
        MessagePath sub(path, field == 11 ? "input" : field == 12 ? "output" : "value_info",
                        static_cast<int64_t>(list.size()), peek_string_field(info, kValueInfoName));
        list.push_back(read_value_info(info, sub));
        break;
      }
      default: reader.skip();
    }
  }
  return graph;
}

// --------------------------------------------------------------- functions

Function ModelProtoReader::read_function(Bytes bytes, const MessagePath& path,
                                         const Opsets& model_opsets) {
  Function function;
  std::vector<Bytes> nodes, attribute_protos;
  Opsets own_opsets;
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: function.name = reader.string(); break;
      case 10: function.domain = normalize_domain(reader.string()); break;
      case 4: function.inputs.push_back(reader.string()); break;
      case 5: function.outputs.push_back(reader.string()); break;
      case 6: function.attribute_names.push_back(reader.string()); break;
      case 11: attribute_protos.push_back(reader.bytes()); break;
      case 7: nodes.push_back(reader.bytes()); break;
      case 9: {
        MessagePath sub(path, "opset_import", static_cast<int64_t>(own_opsets.size()));
        auto [domain, version] = read_opset(reader.bytes(), sub);
        own_opsets[domain] = version;
        break;
      }
      default: reader.skip();
    }
  }
  // The function's own imports decide its body's versions; the model's fill gaps.
  function.opsets = model_opsets;
  for (const auto& [domain, version] : own_opsets) function.opsets[domain] = version;
  for (size_t i = 0; i < attribute_protos.size(); ++i) {
    MessagePath sub(path, "attribute_proto", static_cast<int64_t>(i),
                    peek_string_field(attribute_protos[i], kAttributeName));
    function.attribute_defaults.push_back(
        read_attribute(attribute_protos[i], sub, function.opsets));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    MessagePath sub(path, "node", static_cast<int64_t>(i), peek_string_field(nodes[i], kNodeName));
    function.nodes.push_back(read_node(nodes[i], sub, function.opsets));
  }
  return function;
}

// ------------------------------------------------------------------ model

ModelFile ModelProtoReader::read_model(Bytes bytes, const MessagePath& path) {
  ModelFile model;
  Opsets opsets;
  std::optional<Bytes> graph_bytes;
  std::vector<Bytes> functions;
  int64_t opset_index = 0, metadata_index = 0;
  // The graph and functions are read after the whole message: opset_import
  // (field 8) is serialized after graph (field 7).
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 1: model.ir_version = reader.int64(); break;
      case 2: model.producer_name = reader.string(); break;
      case 3: model.producer_version = reader.string(); break;
      case 7: graph_bytes = reader.bytes(); break;
      case 8: {
        MessagePath sub(path, "opset_import", opset_index++);
        auto [domain, version] = read_opset(reader.bytes(), sub);
        opsets[domain] = version;
        break;
      }
      case 14: {
        MessagePath sub(path, "metadata_props", metadata_index++);
        auto [key, value] = read_string_string_entry(reader.bytes(), sub);
        model.metadata[key] = value;
        break;
      }
      case 25: functions.push_back(reader.bytes()); break;
      default: reader.skip();
    }
  }
  if (!graph_bytes) path.fail("model has no graph");
  // IR version 1-2 models predate opset_import and mean ai.onnx version 1.
  if (opsets.empty()) opsets[""] = 1;

  std::vector<Function> parsed_functions;
  for (size_t i = 0; i < functions.size(); ++i) {
    MessagePath sub(path, "functions", static_cast<int64_t>(i),
                    peek_string_field(functions[i], kFunctionName));
    parsed_functions.push_back(read_function(functions[i], sub, opsets));
  }
  MessagePath graph_path(path, "graph");
  model.graph = read_graph(*graph_bytes, graph_path, opsets);
  Graph& graph = *model.graph;

  // IR < 4 models list initializers among the inputs: those are weights, not
  // values the caller must feed.
  std::erase_if(graph.inputs,
                [&](const ValueInfo& input) { return graph.initializers.contains(input.name); });
  if (!parsed_functions.empty()) inline_functions(graph, parsed_functions);
  topological_sort(graph);
  return model;
}

fs::path folder_of(const fs::path& file) {
  const fs::path parent = file.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// ------------------------------------------------------------ value files

Value read_optional_proto(Bytes bytes, const MessagePath& path, const TensorSource& source);

Value read_sequence_proto(Bytes bytes, const MessagePath& path, const TensorSource& source) {
  Sequence items;
  WireReader reader(bytes, path);
  while (reader.next()) {
    const auto index = static_cast<int64_t>(items.size());
    switch (reader.field()) {
      case 3: {
        const Bytes tensor = reader.bytes();
        MessagePath sub(path, "tensor_values", index, peek_string_field(tensor, kTensorName));
        items.push_back(read_tensor(tensor, sub, source).value);
        break;
      }
      case 4: {
        MessagePath sub(path, "sparse_tensor_values", index);
        items.push_back(read_sparse_tensor(reader.bytes(), sub, source).value);
        break;
      }
      case 5: {
        MessagePath sub(path, "sequence_values", index);
        items.push_back(read_sequence_proto(reader.bytes(), sub, source));
        break;
      }
      case 6: path.fail("map values are not supported");
      case 7: {
        MessagePath sub(path, "optional_values", index);
        items.push_back(read_optional_proto(reader.bytes(), sub, source));
        break;
      }
      default: reader.skip();
    }
  }
  return Value::sequence(std::move(items));
}

Value read_optional_proto(Bytes bytes, const MessagePath& path, const TensorSource& source) {
  Value value;  // no value field: the optional is empty
  WireReader reader(bytes, path);
  while (reader.next()) {
    switch (reader.field()) {
      case 3: {
        const Bytes tensor = reader.bytes();
        MessagePath sub(path, "tensor_value", -1, peek_string_field(tensor, kTensorName));
        value = read_tensor(tensor, sub, source).value;
        break;
      }
      case 4: {
        MessagePath sub(path, "sparse_tensor_value");
        value = read_sparse_tensor(reader.bytes(), sub, source).value;
        break;
      }
      case 5: {
        MessagePath sub(path, "sequence_value");
        value = read_sequence_proto(reader.bytes(), sub, source);
        break;
      }
      case 6: path.fail("map values are not supported");
      case 7: {
        MessagePath sub(path, "optional_value");
        value = read_optional_proto(reader.bytes(), sub, source);
        break;
      }
      default: reader.skip();
    }
  }
  return value;
}

}  // namespace

ModelFile read_model_file(const fs::path& path, const fs::path& link_target_dir) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  ExternalDataStore external(folder_of(path), link_target_dir);
  ModelProtoReader reader(TensorSource{{file, file->aliasable(), /*file_mapping=*/true}, &external});
  MessagePath root(path.string());
  ModelFile model = reader.read_model(file->bytes(), root);
  model.path = path;
  return model;
}

ModelFile read_model_bytes(std::span<const uint8_t> bytes, const fs::path& base_dir,
                           std::shared_ptr<const void> keep_alive) {
  ExternalDataStore external(base_dir);
  ModelProtoReader reader(TensorSource{{std::move(keep_alive), bytes}, &external});
  MessagePath root("<model bytes>");
  return reader.read_model(bytes, root);
}

Value read_value_file(const fs::path& path, const ValueInfo& declared) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  ExternalDataStore external(folder_of(path));
  const TensorSource source{{file, file->aliasable(), /*file_mapping=*/true}, &external};
  MessagePath root(path.string());
  switch (declared.kind) {
    case ValueInfo::Kind::kSequence: return read_sequence_proto(file->bytes(), root, source);
    case ValueInfo::Kind::kOptional: return read_optional_proto(file->bytes(), root, source);
    case ValueInfo::Kind::kMap: root.fail(str("'", declared.name, "' is a map; maps are not supported"));
    case ValueInfo::Kind::kTensor:
    case ValueInfo::Kind::kUnknown: break;
  }
  return read_tensor(file->bytes(), root, source).value;
}

}  // namespace transmuter
