#include "onnx/external_data.h"

#include <algorithm>

#include "onnx/mapped_file.h"
#include "onnx/wire_reader.h"

namespace transmuter {

namespace {

// Field numbers of onnx.proto3 on the way from a ModelProto to its tensors.
namespace field {
constexpr uint32_t kModelGraph = 7, kModelFunctions = 25;
constexpr uint32_t kGraphNode = 1, kGraphInitializer = 5, kGraphSparseInitializer = 15;
constexpr uint32_t kFunctionNode = 7;
constexpr uint32_t kNodeAttribute = 5;
constexpr uint32_t kAttributeTensor = 5, kAttributeGraph = 6, kAttributeTensors = 10, kAttributeGraphs = 11,
                   kAttributeSparseTensor = 22, kAttributeSparseTensors = 23;
constexpr uint32_t kSparseValues = 1, kSparseIndices = 2;
constexpr uint32_t kTensorExternalData = 13, kTensorDataLocation = 14;
}  // namespace field

constexpr int64_t kExternal = 1;  // TensorProto.DataLocation.EXTERNAL

class LocationCollector {
 public:
  std::vector<std::string> locations;

  void model(std::span<const uint8_t> bytes, const MessagePath& path) {
    WireReader reader(bytes, path);
    while (reader.next()) {
      if (reader.field() == field::kModelGraph) {
        graph(reader.bytes(), MessagePath(path, "graph"));
      } else if (reader.field() == field::kModelFunctions) {
        nodes_of(reader.bytes(), field::kFunctionNode, MessagePath(path, "functions"));
      } else {
        reader.skip();
      }
    }
  }

 private:
  void graph(std::span<const uint8_t> bytes, const MessagePath& path) {
    WireReader reader(bytes, path);
    while (reader.next()) {
      switch (reader.field()) {
        case field::kGraphNode:
          node(reader.bytes(), MessagePath(path, "node"));
          break;
        case field::kGraphInitializer:
          tensor(reader.bytes(), MessagePath(path, "initializer"));
          break;
        case field::kGraphSparseInitializer:
          sparse_tensor(reader.bytes(), MessagePath(path, "sparse_initializer"));
          break;
        default:
          reader.skip();
      }
    }
  }

  // Calls visit(message, path) for every message in field `wanted` of `bytes`.
  template <typename Visit>
  static void each(std::span<const uint8_t> bytes, const MessagePath& path, uint32_t wanted,
                   const char* label, Visit visit) {
    WireReader reader(bytes, path);
    while (reader.next()) {
      if (reader.field() == wanted) {
        visit(reader.bytes(), MessagePath(path, label));
      } else {
        reader.skip();
      }
    }
  }

  void nodes_of(std::span<const uint8_t> bytes, uint32_t node_field, const MessagePath& path) {
    each(bytes, path, node_field, "node", [this](auto message, const MessagePath& at) { node(message, at); });
  }

  void node(std::span<const uint8_t> bytes, const MessagePath& path) {
    each(bytes, path, field::kNodeAttribute, "attribute",
         [this](auto message, const MessagePath& at) { attribute(message, at); });
  }

  void attribute(std::span<const uint8_t> bytes, const MessagePath& path) {
    WireReader reader(bytes, path);
    while (reader.next()) {
      switch (reader.field()) {
        case field::kAttributeTensor:
        case field::kAttributeTensors:
          tensor(reader.bytes(), MessagePath(path, "t"));
          break;
        case field::kAttributeGraph:
        case field::kAttributeGraphs:
          graph(reader.bytes(), MessagePath(path, "g"));
          break;
        case field::kAttributeSparseTensor:
        case field::kAttributeSparseTensors:
          sparse_tensor(reader.bytes(), MessagePath(path, "sparse_tensor"));
          break;
        default:
          reader.skip();
      }
    }
  }

  void sparse_tensor(std::span<const uint8_t> bytes, const MessagePath& path) {
    WireReader reader(bytes, path);
    while (reader.next()) {
      if (reader.field() == field::kSparseValues || reader.field() == field::kSparseIndices) {
        tensor(reader.bytes(), MessagePath(path, "tensor"));
      } else {
        reader.skip();
      }
    }
  }

  void tensor(std::span<const uint8_t> bytes, const MessagePath& path) {
    WireReader reader(bytes, path);
    int64_t data_location = 0;
    std::string location;
    while (reader.next()) {
      if (reader.field() == field::kTensorExternalData) {
        auto [key, value] = read_string_string_entry(reader.bytes(), path);
        if (key == "location") location = value;
      } else if (reader.field() == field::kTensorDataLocation) {
        data_location = reader.int64();
      } else {
        reader.skip();
      }
    }
    if (data_location != kExternal) return;
    if (location.empty()) path.fail("external data has no location");
    if (std::find(locations.begin(), locations.end(), location) == locations.end()) {
      locations.push_back(location);
    }
  }
};

}  // namespace

std::vector<std::string> external_data_locations(std::span<const uint8_t> model_bytes,
                                                 const std::string& file_label) {
  LocationCollector collector;
  collector.model(model_bytes, MessagePath(file_label));
  return collector.locations;
}

std::vector<std::string> external_data_locations(const std::filesystem::path& model_file) {
  std::shared_ptr<MappedFile> file = MappedFile::open(model_file);
  return external_data_locations(file->bytes(), model_file.string());
}

}  // namespace transmuter
