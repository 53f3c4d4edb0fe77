// What the fusion passes ask of a graph while they match a subgraph: who
// produces and who reads a value, and the value of a constant (an initializer
// or a Constant node). Built once per match sweep; a pass that rewrites
// nodes rebuilds it before matching again.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <mlx/mlx.h>

#include "graph/graph.h"

namespace transmuter {

namespace mx = mlx::core;

class GraphIndex {
 public:
  explicit GraphIndex(const Graph& graph);

  /** Index of the node producing `value`, or nullopt (graph input, initializer). */
  std::optional<size_t> producer(const std::string& value) const;
  /** Indices of the nodes reading `value` (each once, also through subgraphs). */
  const std::vector<size_t>& consumers(const std::string& value) const;
  /** True when `value` is read by the node `reader` alone and is not a graph
   * output: a fusion that swallows `reader` may drop it. */
  bool read_only_by(const std::string& value, size_t reader) const;
  bool is_graph_output(const std::string& value) const { return graph_outputs_.contains(value); }

  /** The value of an initializer or of a Constant node's value/value_float(s). */
  std::optional<mx::array> constant(const std::string& value) const;
  /** A floating-point constant holding one element, as float. */
  std::optional<float> scalar(const std::string& value) const;

 private:
  const Graph& graph_;
  std::unordered_map<std::string, size_t> producer_;
  std::unordered_map<std::string, std::vector<size_t>> consumers_;
  std::unordered_set<std::string> graph_outputs_;
};

/** The node reading `value` when it alone does and `value` is no graph output. */
std::optional<size_t> sole_consumer(const GraphIndex& index, const std::string& value);

/** An INT / FLOAT attribute of `node`, or `fallback` when absent or of another type. */
int64_t int_attribute_or(const Node& node, const std::string& name, int64_t fallback);
float float_attribute_or(const Node& node, const std::string& name, float fallback);
/** An INTS attribute of `node`, or `fallback` when absent or of another type. */
std::vector<int64_t> ints_attribute_or(const Node& node, const std::string& name,
                                       std::vector<int64_t> fallback);

/** Attributes of the nodes a pass makes. */
Attribute int_attribute(const std::string& name, int64_t value);
Attribute ints_attribute(const std::string& name, std::vector<int64_t> values);
Attribute float_attribute(const std::string& name, float value);
Attribute floats_attribute(const std::string& name, std::vector<float> values);
Attribute string_attribute(const std::string& name, std::string value);

/** True when input `i` of `node` is given (present and not ""). */
bool has_input(const Node& node, size_t i);

/** The initializer `name` as stored (a tensor, not a narrow type held widened), or nullptr. */
const mx::array* stored_initializer(const Graph& graph, const std::string& name);
/** stored_initializer of input `i` of `node`; nullptr when the input is absent or not one. */
const mx::array* stored_input(const Graph& graph, const Node& node, size_t i);
/** stored_initializer when it holds one element (a per-tensor scale or zero point), else nullptr. */
const mx::array* scalar_initializer(const Graph& graph, const std::string& name);
/** Whether each of `node`'s inputs at `indices` that is present is a one-element initializer. */
bool present_inputs_are_scalars(const Graph& graph, const Node& node, std::initializer_list<size_t> indices);

/** `base`, or `base_1`, `base_2`... : the first name no initializer has. */
std::string fresh_initializer_name(const Graph& graph, const std::string& base);

/** New value names for a pass's nodes: `base`, or `base_1`, `base_2`... the
 * first that no input, output, initializer or node of the graph or of its
 * subgraphs names, nor any name this source gave before. The names are
 * collected once, so a pass asking for many costs one walk of the graph. */
class ValueNames {
 public:
  explicit ValueNames(const Graph& graph);
  std::string fresh(const std::string& base);
  /** Marks `name` taken (one the pass made by other means, e.g. an initializer). */
  void reserve(const std::string& name) { used_.insert(name); }

 private:
  std::unordered_set<std::string> used_;
};

/** Gives back the model file's pages under `w` (a weight aliasing the file,
 * or a deferred copy not made yet) once a preparation has read them: they
 * refault from the file should anything read them again. Anything else
 * stays. */
void release_weight_pages(const mx::array& w);

/** Erases the initializer `name` (a weight a pass replaced by a prepared copy,
 * which nothing reads any more) and gives its memory back: the file pages
 * that preparing it read when it aliases the model file (they refault from
 * the file should anything read them again), else its buffer (MLX's cache is
 * cleared so the next preparation does not hold both). */
void drop_weight(Graph& graph, const std::string& name);

/** drop_weight of each of `names` that is still an initializer and that no node reads and no graph output
 * names any more (the weights a pass replaced by prepared copies). */
void drop_unread_weights(Graph& graph, const std::vector<std::string>& names);

/** Evaluates `value` and stores it as a new initializer named fresh_initializer_name(base), reserved in
 * `names`; returns the name. */
std::string add_initializer(Graph& graph, ValueNames& names, const std::string& base, mx::array value);

/** True for `op_type` of the default ONNX domain. */
bool is_onnx_op(const Node& node, std::string_view op_type);

/** For a node with two inputs one of which is `one`: the other (nullopt when
 * `one` is not among them or the node has another arity). */
std::optional<std::string> other_input(const Node& node, const std::string& one);

/** |value - expected| <= tolerance * |expected|. */
bool near(std::optional<float> value, float expected, float tolerance = 1e-5f);

/** Removes the nodes marked in `removed`, then the Constant nodes whose
 * outputs nothing reads any more (those a fusion swallowed). */
void erase_nodes(Graph& graph, const std::vector<bool>& removed);

/** Declares `domain` at `version` in graph.opsets unless it is imported. */
void import_domain(Graph& graph, const std::string& domain, int64_t version);

/** A default-domain Cast(input) -> output to `to`, at the graph's opset, named `name`. */
Node cast_node(const Graph& graph, const std::string& name, const std::string& input, const std::string& output,
               OnnxType to);

}  // namespace transmuter
