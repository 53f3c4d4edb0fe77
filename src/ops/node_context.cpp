#include "ops/node_context.h"

#include <atomic>
#include <limits>

#include "core/memory.h"
#include "ops/registry.h"

namespace transmuter {

NodeContext::NodeContext(const Node& node, std::vector<const Value*> inputs, mx::StreamOrDevice stream,
                         const SubgraphRunner* run_subgraph, const OpRow* row)
    : node_(node), inputs_(std::move(inputs)), stream_(stream), run_subgraph_(run_subgraph), row_(row) {}

uint64_t NodeContext::memory_limit() const { return memory_limit_ != 0 ? memory_limit_ : physical_memory_bytes(); }

std::string NodeContext::prefix() const {
  int version = row_ != nullptr ? row_->since : node_.opset;
  return str("[", node_.op_type, " v", version, "] node '", node_.name, "': ");
}

bool NodeContext::has_input(size_t i) const {
  return i < inputs_.size() && inputs_[i] != nullptr && !inputs_[i]->is_none();
}

const Value& NodeContext::value(size_t i) const {
  static const Value kNone;
  if (i >= inputs_.size() || inputs_[i] == nullptr) return kNone;
  return *inputs_[i];
}

const mx::array& NodeContext::input(size_t i) const {
  if (!has_input(i)) throw error("input ", i, " is required but missing");
  const Value& v = *inputs_[i];
  if (!v.is_tensor()) throw error("input ", i, " must be a tensor, got ", v.describe());
  return v.tensor();
}

std::optional<mx::array> NodeContext::optional_input(size_t i) const {
  if (!has_input(i)) return std::nullopt;
  return input(i);
}

namespace {
// Relaxed: a statistic for tests; one increment per evaluation costs nothing
// beside the evaluation itself.
std::atomic<uint64_t> g_host_read_evaluations{0};

// Reads a host array of any numeric dtype as T. Evaluating here is what makes
// an op a graph break when the array is computed from traced data.
template <typename T>
std::vector<T> read_host(const NodeContext& ctx, size_t i) {
  mx::array a = ctx.input(i);
  if (a.is_tracer()) {
    throw ctx.error("input ", i, " must be known before the run (a shape or constant) but is computed from data");
  }
  mx::Dtype target = std::is_integral_v<T> ? mx::int64 : mx::float64;
  if (a.dtype() != target) a = mx::astype(a, target, mx::Device::cpu);
  a = mx::flatten(a, mx::Device::cpu);
  mx::eval(a);
  g_host_read_evaluations.fetch_add(1, std::memory_order_relaxed);
  const T* data = a.data<T>();
  return std::vector<T>(data, data + a.size());
}
}  // namespace

uint64_t host_read_evaluations() { return g_host_read_evaluations.load(std::memory_order_relaxed); }

template <typename T>
std::vector<T> NodeContext::host_values(size_t i) const {
  const HostReadUse& use = host_reads_;
  if (use.replay != nullptr) {
    const std::vector<T>* known = nullptr;
    if constexpr (std::is_integral_v<T>) {
      known = use.replay->ints(use.node, i);
    } else {
      known = use.replay->doubles(use.node, i);
    }
    if (known != nullptr) return *known;
  }
  std::vector<T> values = read_host<T>(*this, i);
  if (use.record != nullptr && use.rememberable != nullptr && i < use.rememberable->size() &&
      (*use.rememberable)[i]) {
    use.record->remember(use.node, i, values);
  }
  return values;
}

std::vector<int64_t> NodeContext::host_ints(size_t i) const { return host_values<int64_t>(i); }
std::vector<double> NodeContext::host_doubles(size_t i) const { return host_values<double>(i); }

int64_t NodeContext::host_int(size_t i) const {
  auto values = host_ints(i);
  if (values.size() != 1) throw error("input ", i, " must hold one value, got ", values.size());
  return values[0];
}

double NodeContext::host_double(size_t i) const {
  auto values = host_doubles(i);
  if (values.size() != 1) throw error("input ", i, " must hold one value, got ", values.size());
  return values[0];
}

bool NodeContext::output_requested(size_t i) const {
  return i < node_.outputs.size() && !node_.outputs[i].empty();
}

const Attribute* NodeContext::find_attr(std::string_view name, AttrType type) const {
  const Attribute* attr = node_.find_attribute(std::string(name));
  if (attr == nullptr) return nullptr;
  if (attr->type != type) {
    throw error("attribute '", name, "' has type ", static_cast<int>(attr->type), ", expected ",
                static_cast<int>(type));
  }
  return attr;
}

bool NodeContext::has_attr(std::string_view name) const {
  return node_.find_attribute(std::string(name)) != nullptr;
}

int64_t NodeContext::attr_int(std::string_view name, int64_t fallback) const {
  const Attribute* a = find_attr(name, AttrType::kInt);
  return a ? a->i : fallback;
}

int64_t NodeContext::required_int(std::string_view name) const {
  const Attribute* a = find_attr(name, AttrType::kInt);
  if (a == nullptr) throw error("required attribute '", name, "' is missing");
  return a->i;
}

float NodeContext::attr_float(std::string_view name, float fallback) const {
  const Attribute* a = find_attr(name, AttrType::kFloat);
  return a ? a->f : fallback;
}

std::string NodeContext::attr_string(std::string_view name, std::string fallback) const {
  const Attribute* a = find_attr(name, AttrType::kString);
  return a ? a->s : fallback;
}

std::vector<int64_t> NodeContext::attr_ints(std::string_view name, std::vector<int64_t> fallback) const {
  const Attribute* a = find_attr(name, AttrType::kInts);
  return a ? a->ints : fallback;
}

std::vector<float> NodeContext::attr_floats(std::string_view name, std::vector<float> fallback) const {
  const Attribute* a = find_attr(name, AttrType::kFloats);
  return a ? a->floats : fallback;
}

std::vector<std::string> NodeContext::attr_strings(std::string_view name,
                                                   std::vector<std::string> fallback) const {
  const Attribute* a = find_attr(name, AttrType::kStrings);
  return a ? a->strings : fallback;
}

const Value& NodeContext::attr_tensor(std::string_view name) const {
  const Attribute* a = find_attr(name, AttrType::kTensor);
  if (a == nullptr) throw error("required attribute '", name, "' is missing");
  return a->t;
}

const Graph& NodeContext::attr_graph(std::string_view name) const {
  const Attribute* a = find_attr(name, AttrType::kGraph);
  if (a == nullptr || !a->g) throw error("required graph attribute '", name, "' is missing");
  return *a->g;
}

std::vector<Value> NodeContext::run_subgraph(const Graph& body, const std::vector<Value>& inputs) const {
  if (run_subgraph_ == nullptr || !*run_subgraph_) throw error("subgraphs cannot run in this context");
  return (*run_subgraph_)(body, inputs);
}

int NodeContext::normalize_axis(int64_t axis, int rank) const {
  if (axis < -rank || axis >= std::max(rank, 1)) {
    throw error("axis ", axis, " out of range for rank ", rank);
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

int to_int32(const NodeContext& ctx, int64_t value, std::string_view what) {
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    throw ctx.error(what, " ", value, " does not fit in int32");
  }
  return static_cast<int>(value);
}

int64_t checked_add(const NodeContext& ctx, int64_t a, int64_t b, std::string_view what) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) throw ctx.error(what, " ", a, " + ", b, " overflows int64");
  return sum;
}

int64_t checked_mul(const NodeContext& ctx, int64_t a, int64_t b, std::string_view what) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) throw ctx.error(what, " ", a, " * ", b, " overflows int64");
  return product;
}

int64_t checked_product(const NodeContext& ctx, const std::vector<int64_t>& dims, std::string_view what) {
  int64_t product = 1;
  for (int64_t d : dims) product = checked_mul(ctx, product, d, what);
  return product;
}

mx::Shape to_shape(const NodeContext& ctx, const std::vector<int64_t>& dims) {
  if (dims.size() > kMaxRank) throw ctx.error("shape has ", dims.size(), " dims, more than ", kMaxRank);
  mx::Shape shape;
  shape.reserve(dims.size());
  for (int64_t d : dims) {
    if (d < 0 || d > std::numeric_limits<int32_t>::max()) {
      throw ctx.error("dimension ", d, " is negative or exceeds int32");
    }
    shape.push_back(static_cast<int32_t>(d));
  }
  // A product that wraps (65536^4 is 0 in 64 bits) would pass for a small
  // array; the byte size (8 bytes per element at most) must fit as well.
  int64_t bytes = 8;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) {
      std::string listed;
      for (int64_t e : dims) listed += str(listed.empty() ? "" : ", ", e);
      throw ctx.error("shape [", listed, "] has more elements than int64 can count in bytes");
    }
  }
  return shape;
}

}  // namespace transmuter
