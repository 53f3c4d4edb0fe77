// ai.onnx.ml operators with ONNX node tests: LabelEncoder, TreeEnsemble,
// ArrayFeatureExtractor, Binarizer. https://onnx.ai/onnx/operators/#ai-onnx-ml
//
// LabelEncoder and TreeEnsemble look values up in tables (hash maps, tree
// walks) on the host: their rows are eager_only. ArrayFeatureExtractor and
// Binarizer are plain MLX ops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"
#include "transmuter/dtype.h"

namespace transmuter {
namespace {

constexpr std::string_view kOnnxMl = "ai.onnx.ml";

// --- LabelEncoder -------------------------------------------------------------------

// One key or value of the mapping. Floats are held as double; NaN keys are
// canonicalized so that every NaN input finds them (the spec: "NaN matches
// any NaN regardless of bit value").
using Label = std::variant<int64_t, double, std::string>;

Label canonical(Label v) {
  if (auto* d = std::get_if<double>(&v); d != nullptr && std::isnan(*d)) *d = std::numeric_limits<double>::quiet_NaN();
  return v;
}

struct LabelOrder {  // total order with all NaNs equal (std::less<double> is not one)
  bool operator()(const Label& a, const Label& b) const {
    if (a.index() != b.index()) return a.index() < b.index();
    if (const auto* x = std::get_if<double>(&a)) {
      const double y = std::get<double>(b);
      if (std::isnan(*x) || std::isnan(y)) return !std::isnan(*x) && std::isnan(y);
      return *x < y;
    }
    return a < b;
  }
};

/** The labels of a tensor attribute (strings, integers or floats). */
std::vector<Label> labels_of_tensor(const NodeContext& ctx, const Value& v, mx::Dtype* dtype) {
  std::vector<Label> out;
  if (v.is_strings()) {
    for (const auto& s : v.strings().data) out.emplace_back(s);
    return out;
  }
  mx::array t = mx::flatten(v.tensor(), mx::Device::cpu);
  if (dtype != nullptr) *dtype = t.dtype();
  if (mx::issubdtype(t.dtype(), mx::floating)) {
    mx::array d = mx::astype(t, mx::float64, mx::Device::cpu);
    mx::eval(d);
    for (size_t i = 0; i < d.size(); ++i) out.emplace_back(d.data<double>()[i]);
  } else if (t.dtype() != mx::bool_) {
    mx::array d = mx::astype(t, mx::int64, mx::Device::cpu);
    mx::eval(d);
    for (size_t i = 0; i < d.size(); ++i) out.emplace_back(d.data<int64_t>()[i]);
  } else {
    throw ctx.error("bool labels are not allowed");
  }
  return out;
}

/** Keys (or values) from whichever of `<prefix>_tensor/_strings/_int64s/_floats`
 * is set; `dtype` receives the element type of the values' tensor form. */
std::vector<Label> labels(const NodeContext& ctx, const std::string& prefix, mx::Dtype& dtype, bool& strings) {
  int set = 0;
  std::vector<Label> out;
  if (ctx.has_attr(prefix + "_tensor")) {
    ++set;
    const Value& v = ctx.attr_tensor(prefix + "_tensor");
    strings = v.is_strings();
    out = labels_of_tensor(ctx, v, &dtype);
  }
  if (ctx.has_attr(prefix + "_strings")) {
    ++set;
    strings = true;
    for (auto& s : ctx.attr_strings(prefix + "_strings")) out.emplace_back(s);
  }
  if (ctx.has_attr(prefix + "_int64s")) {
    ++set;
    dtype = mx::int64;
    for (int64_t i : ctx.attr_ints(prefix + "_int64s")) out.emplace_back(i);
  }
  if (ctx.has_attr(prefix + "_floats")) {
    ++set;
    dtype = mx::float32;
    for (float f : ctx.attr_floats(prefix + "_floats")) out.emplace_back(static_cast<double>(f));
  }
  if (set != 1) throw ctx.error("exactly one of the ", prefix, "_* attributes must be set, got ", set);
  return out;
}

/** The label for inputs not in the map: default_tensor, default_<kind> or the
 * spec's defaults ("_Unused", -1, -0.0). */
Label default_label(const NodeContext& ctx, bool strings, mx::Dtype dtype) {
  if (ctx.has_attr("default_tensor")) {
    std::vector<Label> d = labels_of_tensor(ctx, ctx.attr_tensor("default_tensor"), nullptr);
    if (d.size() != 1) throw ctx.error("default_tensor must hold one value, got ", d.size());
    return d[0];
  }
  if (strings) return ctx.attr_string("default_string", "_Unused");
  if (mx::issubdtype(dtype, mx::floating)) return static_cast<double>(ctx.attr_float("default_float", -0.0f));
  return ctx.attr_int("default_int64", -1);
}

/** Input 0's elements as labels of the keys' kind. */
std::vector<Label> input_labels(const NodeContext& ctx, bool float_keys) {
  const Value& v = ctx.value(0);
  if (v.is_strings()) {
    std::vector<Label> out;
    for (const auto& s : v.strings().data) out.emplace_back(s);
    return out;
  }
  std::vector<Label> out;
  if (float_keys) {
    for (double d : ctx.host_doubles(0)) out.emplace_back(d);
  } else {
    for (int64_t i : ctx.host_ints(0)) out.emplace_back(i);
  }
  return out;
}

std::vector<int64_t> input_shape(const NodeContext& ctx) {
  const Value& v = ctx.value(0);
  if (v.is_strings()) return v.strings().shape;
  const auto& s = ctx.input(0).shape();
  return {s.begin(), s.end()};
}

Value make_labels_tensor(const NodeContext& ctx, const std::vector<Label>& out, const std::vector<int64_t>& shape,
                         bool strings, mx::Dtype dtype) {
  if (strings) {
    std::vector<std::string> data;
    for (const auto& l : out) data.push_back(std::get<std::string>(l));
    return StringTensor{shape, std::move(data)};
  }
  std::vector<double> data;
  for (const auto& l : out) {
    data.push_back(std::holds_alternative<int64_t>(l) ? static_cast<double>(std::get<int64_t>(l)) : std::get<double>(l));
  }
  const mx::Shape mshape = to_shape(ctx, shape);
  if (!mx::issubdtype(dtype, mx::floating)) {
    std::vector<int64_t> ints;
    for (const auto& l : out) ints.push_back(std::get<int64_t>(l));
    mx::array flat(ints.begin(), mx::Shape{static_cast<int>(ints.size())}, mx::int64);
    return mx::astype(mx::reshape(flat, mshape, mx::Device::cpu), dtype, mx::Device::cpu);
  }
  mx::array flat(data.begin(), mx::Shape{static_cast<int>(data.size())}, mx::float64);
  return mx::astype(mx::reshape(flat, mshape, mx::Device::cpu), dtype, mx::Device::cpu);
}

// Opset 1: one list, classes_strings; a string input maps to its index
// (default_int64), an int64 input to the string at that index (default_string).
OpOutputs label_encoder_v1(NodeContext& ctx) {
  const std::vector<std::string> classes = ctx.attr_strings("classes_strings");
  const std::vector<int64_t> shape = input_shape(ctx);
  if (ctx.value(0).is_strings()) {
    std::map<std::string, int64_t> index;
    for (size_t i = 0; i < classes.size(); ++i) index[classes[i]] = static_cast<int64_t>(i);
    std::vector<Label> out;
    const int64_t fallback = ctx.attr_int("default_int64", -1);
    for (const auto& s : ctx.value(0).strings().data) {
      auto hit = index.find(s);
      out.emplace_back(hit == index.end() ? fallback : hit->second);
    }
    return {make_labels_tensor(ctx, out, shape, false, mx::int64)};
  }
  const std::string fallback = ctx.attr_string("default_string", "_Unused");
  std::vector<Label> out;
  for (int64_t i : ctx.host_ints(0)) {
    out.emplace_back(i >= 0 && i < static_cast<int64_t>(classes.size()) ? classes[static_cast<size_t>(i)] : fallback);
  }
  return {make_labels_tensor(ctx, out, shape, true, mx::int64)};
}

// Opset 2+: parallel keys_* and values_* lists (or tensors, opset 4); a key
// repeated keeps its last value.
OpOutputs label_encoder(NodeContext& ctx) {
  mx::Dtype key_dtype = mx::int64, value_dtype = mx::int64;
  bool key_strings = false, value_strings = false;
  const std::vector<Label> keys = labels(ctx, "keys", key_dtype, key_strings);
  const std::vector<Label> values = labels(ctx, "values", value_dtype, value_strings);
  if (keys.size() != values.size()) throw ctx.error("has ", keys.size(), " keys but ", values.size(), " values");
  std::map<Label, Label, LabelOrder> table;
  for (size_t i = 0; i < keys.size(); ++i) table[canonical(keys[i])] = values[i];
  const Label fallback = default_label(ctx, value_strings, value_dtype);
  if (ctx.value(0).is_strings() != key_strings) throw ctx.error("input kind does not match the keys' kind");
  const bool float_keys = !keys.empty() && std::holds_alternative<double>(keys[0]);
  std::vector<Label> out;
  for (const Label& in : input_labels(ctx, float_keys)) {
    auto hit = table.find(canonical(in));
    out.push_back(hit == table.end() ? fallback : hit->second);
  }
  return {make_labels_tensor(ctx, out, input_shape(ctx), value_strings, value_dtype)};
}

// --- TreeEnsemble ---------------------------------------------------------------------

enum class Branch : int64_t { kLeq, kLt, kGte, kGt, kEq, kNeq, kMember };

struct Trees {
  std::vector<double> splits;
  std::vector<int64_t> features, true_ids, false_ids, true_leaf, false_leaf, modes, missing_true;
  std::vector<std::vector<double>> member_sets;  // per node (empty unless kMember)
  std::vector<int64_t> leaf_targets;
  std::vector<double> leaf_weights;
  std::vector<int64_t> roots;
  int64_t n_targets = 0;
};

std::vector<double> tensor_doubles(const NodeContext& ctx, std::string_view name) {
  mx::array t = mx::astype(mx::flatten(ctx.attr_tensor(name).tensor(), mx::Device::cpu), mx::float64, mx::Device::cpu);
  mx::eval(t);
  return {t.data<double>(), t.data<double>() + t.size()};
}

Trees read_trees(const NodeContext& ctx) {
  Trees t;
  t.splits = tensor_doubles(ctx, "nodes_splits");
  t.features = ctx.attr_ints("nodes_featureids");
  t.true_ids = ctx.attr_ints("nodes_truenodeids");
  t.false_ids = ctx.attr_ints("nodes_falsenodeids");
  t.true_leaf = ctx.attr_ints("nodes_trueleafs");
  t.false_leaf = ctx.attr_ints("nodes_falseleafs");
  for (double m : tensor_doubles(ctx, "nodes_modes")) t.modes.push_back(static_cast<int64_t>(m));
  t.missing_true = ctx.attr_ints("nodes_missing_value_tracks_true");
  t.leaf_targets = ctx.attr_ints("leaf_targetids");
  t.leaf_weights = tensor_doubles(ctx, "leaf_weights");
  t.roots = ctx.attr_ints("tree_roots");
  t.n_targets = ctx.required_int("n_targets");
  const size_t nodes = t.splits.size();
  for (auto* v : {&t.features, &t.true_ids, &t.false_ids, &t.true_leaf, &t.false_leaf, &t.modes}) {
    if (v->size() != nodes) throw ctx.error("the nodes_* attributes must all have ", nodes, " entries");
  }
  if (!t.missing_true.empty() && t.missing_true.size() != nodes) throw ctx.error("nodes_missing_value_tracks_true has the wrong length");
  if (t.leaf_targets.size() != t.leaf_weights.size()) throw ctx.error("leaf_targetids and leaf_weights differ in length");
  for (int64_t target : t.leaf_targets) {
    if (target < 0 || target >= t.n_targets) throw ctx.error("leaf target ", target, " is outside [0, ", t.n_targets, ")");
  }
  for (size_t i = 0; i < nodes; ++i) {
    if (t.modes[i] < 0 || t.modes[i] > 6) throw ctx.error("node ", i, " has unknown mode ", t.modes[i]);
    const size_t true_limit = t.true_leaf[i] ? t.leaf_weights.size() : nodes;
    const size_t false_limit = t.false_leaf[i] ? t.leaf_weights.size() : nodes;
    if (t.true_ids[i] < 0 || static_cast<size_t>(t.true_ids[i]) >= true_limit ||
        t.false_ids[i] < 0 || static_cast<size_t>(t.false_ids[i]) >= false_limit) {
      throw ctx.error("node ", i, " points outside the tree");
    }
  }
  // Members of the BRANCH_MEMBER nodes, in node order, each set ended by NaN.
  t.member_sets.resize(nodes);
  std::vector<double> members = ctx.has_attr("membership_values") ? tensor_doubles(ctx, "membership_values")
                                                                   : std::vector<double>{};
  size_t at = 0;
  for (size_t i = 0; i < nodes; ++i) {
    if (t.modes[i] != static_cast<int64_t>(Branch::kMember)) continue;
    if (at >= members.size()) throw ctx.error("membership_values has fewer sets than BRANCH_MEMBER nodes");
    while (at < members.size() && !std::isnan(members[at])) t.member_sets[i].push_back(members[at++]);
    ++at;  // the NaN that ends the set
  }
  return t;
}

bool takes_true_branch(const Trees& t, size_t node, double x) {
  if (std::isnan(x) && !t.missing_true.empty() && t.missing_true[node] != 0) return true;
  const double split = t.splits[node];
  switch (static_cast<Branch>(t.modes[node])) {
    case Branch::kLeq: return x <= split;
    case Branch::kLt: return x < split;
    case Branch::kGte: return x >= split;
    case Branch::kGt: return x > split;
    case Branch::kEq: return x == split;
    case Branch::kNeq: return x != split;
    case Branch::kMember:
      return std::find(t.member_sets[node].begin(), t.member_sets[node].end(), x) != t.member_sets[node].end();
  }
  return false;
}

/** The leaf a row reaches from `root`. A root whose two branches name the same
 * leaf is a one-leaf tree. The walk is bounded by the node count, so a
 * cyclic (hostile) tree is an error, not a hang. */
size_t reach_leaf(const NodeContext& ctx, const Trees& t, int64_t root, const double* row, int64_t n_features) {
  size_t node = static_cast<size_t>(root);
  if (t.true_leaf[node] && t.false_leaf[node] && t.true_ids[node] == t.false_ids[node]) {
    return static_cast<size_t>(t.true_ids[node]);
  }
  for (size_t steps = 0; steps <= t.splits.size(); ++steps) {
    const int64_t feature = t.features[node];
    if (feature < 0 || feature >= n_features) throw ctx.error("node ", node, " reads feature ", feature, " of ", n_features);
    const bool go_true = takes_true_branch(t, node, row[feature]);
    const int64_t next = go_true ? t.true_ids[node] : t.false_ids[node];
    if (go_true ? t.true_leaf[node] : t.false_leaf[node]) return static_cast<size_t>(next);
    node = static_cast<size_t>(next);
  }
  throw ctx.error("tree rooted at node ", root, " has a cycle");
}

void post_transform(const NodeContext& ctx, int64_t kind, double* scores, int64_t n) {
  switch (kind) {
    case 0: return;  // NONE
    case 1:          // SOFTMAX
    case 3: {        // SOFTMAX_ZERO: zeros stay zero and take no share
      double top = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < n; ++i) top = std::max(top, scores[i]);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        scores[i] = (kind == 3 && scores[i] == 0) ? 0 : std::exp(scores[i] - top);
        sum += scores[i];
      }
      for (int64_t i = 0; i < n; ++i) scores[i] = sum > 0 ? scores[i] / sum : 0;
      return;
    }
    case 2:  // LOGISTIC
      for (int64_t i = 0; i < n; ++i) scores[i] = 1 / (1 + std::exp(-scores[i]));
      return;
    case 4: {  // PROBIT: sqrt(2) * erfinv(2p - 1), by Newton steps on erf
      for (int64_t i = 0; i < n; ++i) {
        const double y = 2 * scores[i] - 1;
        if (y <= -1 || y >= 1) {
          scores[i] = y <= -1 ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
          continue;
        }
        double z = 0;
        for (int k = 0; k < 60; ++k) z -= (std::erf(z) - y) / (2 / std::sqrt(M_PI) * std::exp(-z * z));
        scores[i] = std::sqrt(2.0) * z;
      }
      return;
    }
    default: throw ctx.error("post_transform ", kind, " is not one of 0..4");
  }
}

OpOutputs tree_ensemble(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.ndim() != 2) throw ctx.error("input must be [N, F], got rank ", x.ndim());
  const Trees t = read_trees(ctx);
  for (int64_t root : t.roots) {
    if (root < 0 || static_cast<size_t>(root) >= t.splits.size()) throw ctx.error("tree root ", root, " is not a node");
  }
  const int64_t aggregate = ctx.attr_int("aggregate_function", 1);
  if (aggregate < 0 || aggregate > 3) throw ctx.error("aggregate_function ", aggregate, " is not one of 0..3");
  const std::vector<double> data = ctx.host_doubles(0);
  const int64_t rows = x.shape(0), features = x.shape(1);
  const double start = aggregate == 2 ? std::numeric_limits<double>::max()
                       : aggregate == 3 ? std::numeric_limits<double>::lowest() : 0.0;
  std::vector<double> out(static_cast<size_t>(checked_mul(ctx, rows, t.n_targets, "output size")), start);
  for (int64_t r = 0; r < rows; ++r) {
    double* scores = out.data() + r * t.n_targets;
    for (int64_t root : t.roots) {
      const size_t leaf = reach_leaf(ctx, t, root, data.data() + r * features, features);
      double& s = scores[t.leaf_targets[leaf]];
      const double w = t.leaf_weights[leaf];
      s = aggregate == 2 ? std::min(s, w) : aggregate == 3 ? std::max(s, w) : s + w;
    }
    if (aggregate == 0 && !t.roots.empty()) {
      for (int64_t k = 0; k < t.n_targets; ++k) scores[k] /= static_cast<double>(t.roots.size());
    }
    post_transform(ctx, ctx.attr_int("post_transform", 0), scores, t.n_targets);
  }
  mx::array y(out.begin(), to_shape(ctx, {rows, t.n_targets}), mx::float64);
  return {mx::astype(y, x.dtype(), mx::Device::cpu)};
}

// --- ArrayFeatureExtractor / Binarizer ---------------------------------------------------

// Picks entries of the last axis; a 1-D input gives [1, count] (ONNX
// Runtime's shape, which the reference follows). Indices known on the host are
// checked; traced ones are clamped, as Gather does under compile.
OpOutputs array_feature_extractor(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  if (x.ndim() == 0) throw ctx.error("input must have rank >= 1");
  const int last = x.shape(-1);
  auto s = ctx.stream();
  mx::array flat = mx::astype(mx::flatten(indices, s), mx::int32, s);
  if (!indices.is_tracer()) {
    for (int64_t i : ctx.host_ints(1)) {
      if (i < 0 || i >= last) throw ctx.error("index ", i, " is outside [0, ", last, ")");
    }
  }
  flat = mx::clip(flat, mx::array(0), mx::array(std::max(last - 1, 0)), s);
  mx::array picked = mx::take(x, flat, -1, s);
  if (x.ndim() == 1) picked = mx::reshape(picked, {1, static_cast<int>(flat.size())}, s);
  return {picked};
}

OpOutputs binarizer(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  auto s = ctx.stream();
  mx::array threshold = mx::astype(mx::array(static_cast<double>(ctx.attr_float("threshold", 0.0f))), x.dtype(), s);
  return {mx::astype(mx::greater(x, threshold, s), x.dtype(), s)};
}

constexpr std::string_view kTableLookup = "table lookups on the host";

}  // namespace

void register_ml(OpRegistry& r) {
  r.add({
      {"LabelEncoder", kOnnxMl, 1, 1, label_encoder_v1, {}, true, {}, kTableLookup},
      {"LabelEncoder", kOnnxMl, 2, kOpen, label_encoder, {}, true, {}, kTableLookup},
      {"TreeEnsemble", kOnnxMl, 5, kOpen, tree_ensemble, {}, true, {},
       "piecewise constant in the input (tree walks on the host)"},
      {"ArrayFeatureExtractor", kOnnxMl, 1, kOpen, array_feature_extractor, {}, false, "no string tensors"},
      {"Binarizer", kOnnxMl, 1, kOpen, binarizer, {}, false, {}, "piecewise constant (0 or 1)"},
  });
}

}  // namespace transmuter
