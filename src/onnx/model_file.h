// Reads an ONNX ModelProto (and conformance-test value files) into our Graph,
// straight from the protobuf wire format over an mmap of the file.
//
// The result is ready to run: model-local functions are inlined, nodes (also
// in subgraphs) are in topological order, every Node::opset is set from the
// model's opset_import for the node's domain, initializers are mx::arrays
// that alias the mapping where dtype and alignment allow (zero-copy).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "graph/graph.h"
#include "transmuter/value.h"

namespace transmuter {

/** A parsed model file. `graph->inputs` lists only the inputs a caller must
 * feed: graph inputs that are also initializers (IR < 4 style) are dropped. */
struct ModelFile {
  std::shared_ptr<Graph> graph;
  int64_t ir_version = 0;
  std::string producer_name;
  std::string producer_version;
  std::map<std::string, std::string> metadata;  // metadata_props
  std::filesystem::path path;                   // the model file ("" for bytes)
};

/** Maps `path` and parses it. External data is resolved next to the file;
 * symlinks there may lead into `link_target_dir` (ExternalDataStore).
 * Throws ModelFormatError (naming the file and field) on malformed input. */
ModelFile read_model_file(const std::filesystem::path& path, const std::filesystem::path& link_target_dir = {});

/** Parses model bytes held by the caller. External data locations resolve
 * inside `base_dir`. Initializers may alias `bytes` without a copy: pass in
 * `keep_alive` whatever owns them; with nullptr, tensors are copied. */
ModelFile read_model_bytes(std::span<const uint8_t> bytes, const std::filesystem::path& base_dir,
                           std::shared_ptr<const void> keep_alive = nullptr);

/** Reads a conformance-test data file (test_data_set_N/input_i.pb): a
 * TensorProto, SequenceProto or OptionalProto, chosen by `declared.kind`
 * (kUnknown: TensorProto). An empty optional gives Value() (none). */
Value read_value_file(const std::filesystem::path& path, const ValueInfo& declared);

}  // namespace transmuter
