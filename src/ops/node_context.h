// Typed access to the inputs and attributes of the node being executed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

#include "graph/graph.h"
#include "transmuter/error.h"
#include "transmuter/value.h"

namespace transmuter {

struct OpRow;

/** Runs a subgraph (If/Loop/Scan bodies) with the given inputs bound to its
 * declared inputs; names from enclosing scopes stay visible. */
using SubgraphRunner =
    std::function<std::vector<Value>(const Graph& body, const std::vector<Value>& inputs)>;

/** What one eager run learned that depends only on its input signature:
 * host values (NodeContext::host_ints / host_doubles) read by the nodes of one
 * graph, by (node index, input index), and the outputs of nodes determined by
 * the signature alone (shapes, initializers: src/runtime/host_reads.h). The
 * eager runtime keeps one per input signature, so that later runs get them
 * without evaluating the lazy Shape -> Gather -> Concat chains again. One call
 * fills it; afterwards it is only read (by any thread). */
class SignatureMemo {
 public:
  /** The remembered values of (node, input), or nullptr. */
  const std::vector<int64_t>* ints(size_t node, size_t input) const { return find(ints_, node, input); }
  const std::vector<double>* doubles(size_t node, size_t input) const { return find(doubles_, node, input); }
  void remember(size_t node, size_t input, const std::vector<int64_t>& values) { ints_[{node, input}] = values; }
  void remember(size_t node, size_t input, const std::vector<double>& values) { doubles_[{node, input}] = values; }
  size_t size() const { return ints_.size() + doubles_.size(); }
  /** The remembered outputs of a node (evaluated tensors), or nullptr. */
  const std::vector<Value>* outputs(size_t node) const {
    auto it = outputs_.find(node);
    return it == outputs_.end() ? nullptr : &it->second;
  }
  void remember_outputs(size_t node, std::vector<Value> values) { outputs_[node] = std::move(values); }

 private:
  using Key = std::pair<size_t, size_t>;  // node index, input index
  template <typename T>
  static const std::vector<T>* find(const std::map<Key, std::vector<T>>& map, size_t node, size_t input) {
    auto it = map.find(Key{node, input});
    return it == map.end() ? nullptr : &it->second;
  }
  std::map<Key, std::vector<int64_t>> ints_;
  std::map<Key, std::vector<double>> doubles_;
  std::map<size_t, std::vector<Value>> outputs_;
};

/** Where the host reads of one node come from and go to (all null: every
 * read evaluates its input). A read found in `replay` is not evaluated; an
 * evaluated read of an input marked in `rememberable` is stored in `record`. */
struct HostReadUse {
  const SignatureMemo* replay = nullptr;
  SignatureMemo* record = nullptr;
  const std::vector<bool>* rememberable = nullptr;  // by input index of this node
  size_t node = 0;                                  // index of the node in its graph
};

/** Host reads that evaluated an input, since the process started (tests). */
uint64_t host_read_evaluations();

class NodeContext {
 public:
  /** `run_subgraph` (may be null: no subgraphs here) must outlive the
   * context. `row` is the registry row running the node; it names the op
   * version in messages (null: the model's opset is named instead). */
  NodeContext(const Node& node, std::vector<const Value*> inputs, mx::StreamOrDevice stream,
              const SubgraphRunner* run_subgraph, const OpRow* row = nullptr);

  const Node& node() const { return node_; }
  /** The opset of the node's domain imported by the model. */
  int opset() const { return node_.opset; }
  mx::StreamOrDevice stream() const { return stream_; }

  // --- inputs ---------------------------------------------------------------
  /** Number of input slots, including omitted optional ones. */
  size_t num_inputs() const { return inputs_.size(); }
  /** True when input `i` is given (not omitted, not an empty optional). */
  bool has_input(size_t i) const;
  /** Input `i` as a tensor; throws OpError when missing or not a tensor. */
  const mx::array& input(size_t i) const;
  std::optional<mx::array> optional_input(size_t i) const;
  /** Input `i` as any kind of value; an omitted input is `none`. */
  const Value& value(size_t i) const;

  /** Values of a small integer input read on the host (shapes, axes, pads).
   * The op must list `i` in its row's host_inputs. */
  std::vector<int64_t> host_ints(size_t i) const;
  std::vector<double> host_doubles(size_t i) const;
  /** Single value of a scalar (or one-element) host input. */
  int64_t host_int(size_t i) const;
  double host_double(size_t i) const;

  // --- outputs ---------------------------------------------------------------
  size_t num_outputs() const { return node_.outputs.size(); }
  /** True when output `i` exists and has a name (is consumed or reported). */
  bool output_requested(size_t i) const;

  // --- attributes -------------------------------------------------------------
  bool has_attr(std::string_view name) const;
  int64_t attr_int(std::string_view name, int64_t fallback) const;
  float attr_float(std::string_view name, float fallback) const;
  std::string attr_string(std::string_view name, std::string fallback) const;
  std::vector<int64_t> attr_ints(std::string_view name, std::vector<int64_t> fallback = {}) const;
  std::vector<float> attr_floats(std::string_view name, std::vector<float> fallback = {}) const;
  std::vector<std::string> attr_strings(std::string_view name,
                                        std::vector<std::string> fallback = {}) const;
  /** TENSOR attribute; throws OpError when absent. */
  const Value& attr_tensor(std::string_view name) const;
  /** GRAPH attribute; throws OpError when absent. */
  const Graph& attr_graph(std::string_view name) const;
  /** Required int attribute; throws OpError when absent. */
  int64_t required_int(std::string_view name) const;

  /** Runs a subgraph attribute's body. */
  std::vector<Value> run_subgraph(const Graph& body, const std::vector<Value>& inputs) const;

  /** Bytes one tensor (or an MLX working buffer an op can foresee) may take;
   * the interpreter sets it from Run/CompileOptions::memory_limit. */
  uint64_t memory_limit() const;
  void set_memory_limit(uint64_t bytes) { memory_limit_ = bytes; }

  /** Lets host reads use remembered values (HostReadUse); set by the eager
   * interpreter for the nodes of a top-level graph. */
  void set_host_reads(const HostReadUse& use) { host_reads_ = use; }

  /** An OpError whose message starts with `[Op vN] node 'name': `. */
  template <typename... Args>
  OpError error(Args&&... args) const {
    return OpError(str(prefix(), std::forward<Args>(args)...));
  }
  /** "[Softmax v13] node 'attn/Softmax': " */
  std::string prefix() const;

  /** Normalizes a possibly negative axis against `rank`; throws OpError when
   * out of range. */
  int normalize_axis(int64_t axis, int rank) const;

 private:
  const Attribute* find_attr(std::string_view name, AttrType type) const;
  template <typename T>
  std::vector<T> host_values(size_t i) const;

  const Node& node_;
  std::vector<const Value*> inputs_;
  mx::StreamOrDevice stream_;
  const SubgraphRunner* run_subgraph_;
  const OpRow* row_;
  uint64_t memory_limit_ = 0;  // 0: the machine's physical memory
  HostReadUse host_reads_;
};

/** Most dims a shape built from values may have. MLX's CPU backend has no
 * limit, its CUDA kernels take 10 after merging contiguous dims; 64 is far
 * above any real model and keeps a shape tensor of a million ones from
 * becoming a rank-1e6 array. */
inline constexpr size_t kMaxRank = 64;

/** MLX shape from ONNX int64 dims; throws OpError via `ctx` when a dim is
 * negative or exceeds int32, the rank exceeds kMaxRank, or the element count
 * (times 8 bytes) overflows int64. */
mx::Shape to_shape(const NodeContext& ctx, const std::vector<int64_t>& dims);

// Checked arithmetic for shape math: MLX dims, indices and counts are int32,
// so every int64 value from a model passes through one of these. Each throws
// an OpError via `ctx` naming `what` and the offending value instead of
// wrapping.
/** `value` as int32. */
int to_int32(const NodeContext& ctx, int64_t value, std::string_view what);
/** a + b and a * b in int64. */
int64_t checked_add(const NodeContext& ctx, int64_t a, int64_t b, std::string_view what);
int64_t checked_mul(const NodeContext& ctx, int64_t a, int64_t b, std::string_view what);
/** Product of `dims` (1 when empty) in int64. */
int64_t checked_product(const NodeContext& ctx, const std::vector<int64_t>& dims, std::string_view what);

}  // namespace transmuter
