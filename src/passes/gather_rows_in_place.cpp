// Gathers the rows of a table that sits misaligned in its model file from the file's bytes, instead of
// copying the whole table into aligned memory at load.
//
//   T (initializer: a deferred copy)   indices          T/rows (uint8 [R, B]: T's bytes in the file) indices
//               \                     /                              \                                /
//                Gather (axis 0)              =>             ai.transmuter GatherRows
//                      |                                     (to = T's type, row_shape = T's dims past R)
//                      Y                                                      |
//                                                                             Y
//
// The loader wraps a tensor's bytes in place when they are aligned for its type; a float table's
// raw_data lands on a multiple of 4 only by chance (wherever protobuf put it), and a misaligned one of
// 64 KiB or more is copied at the end of the load unless a pass reads it where it lies (mlx_bridge
// deferred_copy). An embedding table is the largest such tensor of a text model (all-MiniLM's 30522 x
// 384 floats, 45 MiB; BERT-base's 90 MiB) and a run reads a few of its rows: as bytes it needs no
// alignment, GatherRows takes the rows asked for and reads them as T's type, and the table's pages are
// read from the file when a run first touches them. Applies when every reader of T is a Gather on axis
// 0 taking T as its data, and T is no graph output; loads for the CPU (deferred copies are CPU-only).
// params() then holds T/rows (uint8, no gradient) instead of T.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mlx_bridge/buffers.h"
#include "passes/node_pattern.h"
#include "passes/pass_manager.h"
#include "transmuter/dtype.h"

namespace transmuter {

namespace {

constexpr const char* kDomain = "ai.transmuter";

bool gathers_rows_of(const Node& node, const std::string& table, int rank) {
  if (!is_onnx_op(node, "Gather") || node.inputs.size() != 2 || node.outputs.size() != 1) return false;
  if (node.inputs[0] != table || node.inputs[1] == table) return false;
  const int64_t axis = int_attribute_or(node, "axis", 0);
  return axis == 0 || axis == -rank;
}

// True when the Gathers on axis 0 of `table` are all that read it.
bool read_only_by_row_gathers(const Graph& graph, const GraphIndex& index, const std::string& table,
                              int rank) {
  const std::vector<size_t>& readers = index.consumers(table);
  if (readers.empty() || index.is_graph_output(table)) return false;
  for (size_t i : readers) {
    if (!gathers_rows_of(graph.nodes[i], table, rank)) return false;
  }
  return true;
}

Node gather_rows_node(const Node& gather, const std::string& rows, OnnxType type,
                      const mx::Shape& table_shape) {
  Node node;
  node.name = gather.name;
  node.op_type = "GatherRows";
  node.domain = kDomain;
  node.opset = 1;
  node.inputs = {rows, gather.inputs[1]};
  node.outputs = gather.outputs;
  node.attributes.push_back(int_attribute("to", static_cast<int64_t>(type)));
  node.attributes.push_back(
      ints_attribute("row_shape", std::vector<int64_t>(table_shape.begin() + 1, table_shape.end())));
  return node;
}

}  // namespace

size_t gather_rows_in_place(Graph& graph) {
  if (mx::default_device() != mx::Device::cpu) return 0;
  const GraphIndex index(graph);
  std::vector<std::string> tables;
  for (const auto& [name, value] : graph.initializers) {
    if (!value.is_tensor() || !deferred_bytes(value.tensor())) continue;
    const mx::array& t = value.tensor();
    if (to_mlx_dtype(value.element_type()) != t.dtype()) continue;  // a narrow type held widened
    if (t.ndim() >= 1 && read_only_by_row_gathers(graph, index, name, static_cast<int>(t.ndim())))
      tables.push_back(name);
  }
  size_t rewritten = 0;
  for (const std::string& name : tables) {
    const Value table = graph.initializers.at(name);
    std::optional<mx::array> rows = deferred_rows_as_bytes(table.tensor());
    if (!rows) continue;
    const std::string rows_name = fresh_initializer_name(graph, name + "/rows");
    graph.initializers[rows_name] = Value(*rows);
    for (size_t i : index.consumers(name)) {
      graph.nodes[i] =
          gather_rows_node(graph.nodes[i], rows_name, table.element_type(), table.tensor().shape());
      ++rewritten;
    }
    graph.initializers.erase(name);  // never copied: its bytes stay in the file, read by the rows
  }
  if (rewritten > 0) import_domain(graph, kDomain, 1);
  return rewritten;
}

}  // namespace transmuter
