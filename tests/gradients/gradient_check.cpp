// Gradient check over the ONNX backend node tests (scripts/make_node_tests.py):
// for each case, MLX's vjp through transmuter::run (eager) and through
// transmuter::compile (compiled) is compared with central finite differences
// on a few sampled elements of every floating-point input.
//
// usage: gradient_check --cases DIR [--expected FILE] [--filter REGEX] [--samples N] [--verbose]
//
// The method, per case (its first data set):
// - Inputs differentiated: float32/float64 graph inputs that feed no host
//   input (Reshape's shape, Dropout's ratio...). Host-fed inputs are static
//   inputs of the compiled model, as conformance passes them.
// - Outputs checked: float32/float64 graph outputs that a differentiated input
//   reaches through ops whose registry row has no `not_differentiable` reason.
//   A case whose inputs reach no output is skipped; when a not-differentiable
//   op blocked the way, the skip is counted as such.
// - Loss: L(x) = sum_j w_j y_j with fixed random w_j = +-[0.5, 1.5] (exact in
//   float32); vjp with cotangents w gives dL/dx for all elements at once.
// - Finite differences (on the eager run): for an element x_i, step h =
//   1e-3 max(1, |x_i|) (float64 too: MLX's float64 exp/log are only
//   float32-accurate); D(h) = (L(x + h) - L(x - h)) / 2h, summed per output
//   element in double.
// - Kinks and discontinuities (Relu at 0, Floor, ties in Max...): the point is
//   skipped when D(h) and D(h/2) disagree, or when the one-sided differences
//   over h/2 differ by more than 10% (a slope jump that a central difference
//   straddling it symmetrically would hide). Points whose D(h/2) is within
//   twice its noise bound (below) are skipped too: they say nothing.
// - Tolerance for |vjp - D(h/2)|: 1e-2 * max(|vjp|, |D|), plus the rounding
//   noise of D (32 float32 ulps of every w_j y_j that changed, over the step),
//   plus 1e-6 of the input's largest vjp element. Central differences of
//   float32 functions with h ~ 1e-3 reach 1e-4..1e-3 relative accuracy; a
//   wrong vjp is off by O(1). The vjp must have the input's shape.
// Cases listed in the expected-failures file (grouped by reason, the format of
// tests/onnx_backend/expected_failures.txt) may fail. The last line is
// `N passed, N failed, N skipped` over both modes; the exit status is 1 when an
// unexpected failure occurred.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "expected_failures.h"
#include "graph/graph.h"
#include "onnx/model_file.h"
#include "ops/registry.h"
#include "transmuter/transmuter.h"

namespace fs = std::filesystem;
namespace mx = mlx::core;

namespace transmuter {
namespace {

constexpr double kKinkRtol = 0.1;
constexpr double kNoiseUlps = 32;
// MLX's float64 exp and log on the CPU are only float32-accurate (1.8e-7
// relative measured for exp), so float64 cases get the float32 step and
// tolerances: a float64 step of 1e-5 would turn that error into 1e-2 noise.
constexpr double kStep = 1e-3;
constexpr double kRtol = 1e-2;
constexpr double kUlp = 1.0 / (1 << 23);
// Gradient elements far below the largest one of the same input are rounding
// residue (softmax weights of e^-40, say), compared absolutely.
constexpr double kScaleAtol = 1e-6;

bool is_checked_float(mx::Dtype t) { return t == mx::float32 || t == mx::float64; }

std::vector<double> host_doubles(const mx::array& a) {
  // contiguous: a gradient can be a broadcast (strides 0), which flatten and
  // astype keep as a view.
  mx::Device cpu = mx::Device::cpu;
  mx::array f = mx::contiguous(mx::astype(mx::flatten(a, cpu), mx::float64, cpu), false, cpu);
  mx::eval(f);
  return std::vector<double>(f.data<double>(), f.data<double>() + f.size());
}

/** `a` with element `index` (row-major) set to `value`, same dtype and shape. */
mx::array with_element(const mx::array& a, size_t index, double value) {
  std::vector<double> data = host_doubles(a);
  data[index] = value;
  mx::array flat(data.begin(), {static_cast<int>(data.size())}, mx::float64);
  return mx::reshape(mx::astype(flat, a.dtype(), mx::Device::cpu), a.shape(), mx::Device::cpu);
}

/** x + delta rounded to `dtype`, so that the step actually taken is known. */
double rounded(double x, mx::Dtype dtype) {
  return dtype == mx::float32 ? static_cast<double>(static_cast<float>(x)) : x;
}

// --- which inputs and outputs take part ----------------------------------------

struct Analysis {
  std::string skip;                       // non-empty: do not check this case
  bool blocked_by_trait = false;          // skip caused by a not_differentiable row
  std::vector<std::string> static_inputs;  // graph inputs read on the host
  std::set<std::string> carrying;          // values that carry a gradient
};

std::string domain_of(const Node& node) { return node.domain == "ai.onnx" ? "" : node.domain; }

bool uses_subgraphs(const Node& node) {
  for (const Attribute& a : node.attributes) {
    if (a.g || !a.graphs.empty()) return true;
  }
  return false;
}

/** Propagates "carries a gradient" from `differentiable` inputs through the
 * nodes, stopping at host inputs and at rows marked not differentiable. */
Analysis analyze(const Graph& graph, const Inputs& inputs) {
  Analysis out;
  std::set<std::string> graph_inputs;
  for (const ValueInfo& in : graph.inputs) graph_inputs.insert(in.name);
  std::set<std::string> host_fed;
  std::vector<std::pair<const Node*, const OpRow*>> rows;
  for (const Node& node : graph.nodes) {
    auto opset = graph.opsets.find(domain_of(node));
    const OpRow* row = builtin_registry().find(domain_of(node), node.op_type,
                                               opset == graph.opsets.end() ? node.opset : opset->second);
    if (row == nullptr || uses_subgraphs(node)) {
      out.skip = str("operator not implemented (or has subgraphs): ", node.op_type);
      return out;
    }
    for (int h : row->host_inputs) {
      if (h < static_cast<int>(node.inputs.size()) && graph_inputs.count(node.inputs[h])) {
        host_fed.insert(node.inputs[h]);
      }
    }
    rows.emplace_back(&node, row);
  }
  out.static_inputs.assign(host_fed.begin(), host_fed.end());
  for (const auto& [name, value] : inputs) {
    if (!host_fed.count(name) && value.is_tensor() && is_checked_float(value.tensor().dtype()) &&
        value.tensor().size() > 0) {
      out.carrying.insert(name);
    }
  }
  if (out.carrying.empty()) {
    out.skip = "no float32/float64 input to differentiate";
    return out;
  }
  std::set<std::string> blocked;
  for (const auto& [node, row] : rows) {
    bool fed = false;
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const std::vector<int>& host = row->host_inputs;
      bool read_on_host = std::find(host.begin(), host.end(), static_cast<int>(i)) != host.end();
      fed = fed || (!read_on_host && out.carrying.count(node->inputs[i]));
    }
    if (!fed) continue;
    if (!row->not_differentiable.empty()) {
      blocked.insert(str(node->op_type, ": ", row->not_differentiable));
      continue;
    }
    for (const std::string& o : node->outputs) {
      if (!o.empty()) out.carrying.insert(o);
    }
  }
  // The loss sums tensor outputs: a sequence or optional output has no place in it.
  bool reaches_non_tensor = false;
  for (const ValueInfo& o : graph.outputs) {
    if (o.kind != ValueInfo::Kind::kSequence && o.kind != ValueInfo::Kind::kOptional) continue;
    reaches_non_tensor = reaches_non_tensor || out.carrying.erase(o.name) > 0;
  }
  bool reaches_output = false;
  for (const ValueInfo& o : graph.outputs) reaches_output = reaches_output || out.carrying.count(o.name);
  if (!reaches_output && reaches_non_tensor) {
    out.skip = "differentiated inputs reach only sequence or optional outputs";
  } else if (!reaches_output) {
    out.blocked_by_trait = !blocked.empty();
    out.skip = blocked.empty() ? "no differentiated input reaches an output"
                               : str("not differentiable (", *blocked.begin(), ")");
  }
  return out;
}

// --- the check ------------------------------------------------------------------

enum class Status { kPassed, kFailed, kSkipped };

struct Result {
  Status status = Status::kPassed;
  std::string message;
  int points = 0;
  int kinks = 0;  // points skipped at kinks or in noise
};

/** The loss pieces w_j y_j of one forward run, and the function behind them. */
class Loss {
 public:
  Loss(const Model& model, const Inputs& base, std::vector<std::string> wrt, std::vector<size_t> outputs,
       std::optional<CompiledModel> compiled)
      : model_(model),
        base_(base),
        wrt_(std::move(wrt)),
        outputs_(std::move(outputs)),
        compiled_(std::move(compiled)) {}

  const std::vector<std::string>& wrt() const { return wrt_; }

  /** The selected outputs for the given differentiated inputs. */
  std::vector<mx::array> outputs(const std::vector<mx::array>& xs, bool use_compiled) {
    Inputs in = base_;
    for (size_t k = 0; k < wrt_.size(); ++k) in[wrt_[k]] = xs[k];
    Outputs out = use_compiled ? (*compiled_)(in) : run(model_, model_.params(), in, {mx::Device::cpu});
    std::vector<mx::array> selected;
    for (size_t i : outputs_) selected.push_back(out.values[i].tensor());
    return selected;
  }

  /** Draws the weights for the outputs at the base point; returns why the
   * case cannot be checked (an output not float32/float64, or not finite). */
  std::string set_weights(const std::vector<mx::array>& base_outputs, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> magnitude(0.5f, 1.5f);
    weights_.clear();
    for (const mx::array& y : base_outputs) {
      if (!is_checked_float(y.dtype())) return "an output reached by the inputs is not float32/float64";
      std::vector<double> w(y.size());
      for (double& v : w) v = (rng() % 2 ? 1.0 : -1.0) * magnitude(rng);
      for (double v : host_doubles(y)) {
        if (!std::isfinite(v)) return "non-finite output at the test point";
      }
      weights_.push_back(std::move(w));
    }
    return "";
  }

  std::vector<mx::array> cotangents(const std::vector<mx::array>& base_outputs) const {
    std::vector<mx::array> out;
    for (size_t k = 0; k < weights_.size(); ++k) {
      mx::array w(weights_[k].begin(), base_outputs[k].shape(), mx::float64);
      out.push_back(mx::astype(w, base_outputs[k].dtype(), mx::Device::cpu));
    }
    return out;
  }

  /** w_j y_j for every selected output element, eagerly. */
  std::vector<double> terms(const std::vector<mx::array>& xs) {
    std::vector<double> out;
    std::vector<mx::array> ys = outputs(xs, false);
    for (size_t k = 0; k < ys.size(); ++k) {
      std::vector<double> y = host_doubles(ys[k]);
      for (size_t j = 0; j < y.size(); ++j) out.push_back(weights_[k][j] * y[j]);
    }
    return out;
  }

 private:
  Model model_;
  Inputs base_;
  std::vector<std::string> wrt_;
  std::vector<size_t> outputs_;
  std::optional<CompiledModel> compiled_;
  std::vector<std::vector<double>> weights_;
};

/** Central difference (L(plus) - L(minus)) / (x_plus - x_minus) and the bound
 * on its rounding noise. */
struct Difference {
  double value = 0;
  double noise = 0;
  bool finite = true;
};

Difference difference(const std::vector<double>& plus, const std::vector<double>& minus, double step) {
  Difference d;
  double sum = 0, changed = 0;
  for (size_t j = 0; j < plus.size(); ++j) {
    if (!std::isfinite(plus[j]) || !std::isfinite(minus[j])) d.finite = false;
    sum += plus[j] - minus[j];
    if (plus[j] != minus[j]) changed += std::abs(plus[j]) + std::abs(minus[j]);
  }
  d.value = sum / step;
  d.noise = kNoiseUlps * kUlp * changed / step;
  return d;
}

bool close(double a, double b, double rtol, double atol) {
  return std::abs(a - b) <= atol + rtol * std::max(std::abs(a), std::abs(b));
}

/** One sampled element: the finite difference to compare with, or nullopt at
 * a kink, a discontinuity, where the function is not finite nearby, or where
 * rounding noise swamps the difference. */
std::optional<Difference> finite_difference(Loss& loss, const std::vector<mx::array>& xs, size_t input,
                                            size_t index, const std::vector<double>& at_x) {
  const mx::array& x = xs[input];
  double xi = host_doubles(mx::slice(mx::flatten(x, mx::Device::cpu), {static_cast<int>(index)},
                                     {static_cast<int>(index) + 1}, mx::Device::cpu))[0];
  if (!std::isfinite(xi)) return std::nullopt;
  double h = kStep * std::max(1.0, std::abs(xi));
  auto shifted = [&](double delta, double* actual) {
    double v = rounded(xi + delta, x.dtype());
    *actual = v;
    std::vector<mx::array> moved = xs;
    moved[input] = with_element(x, index, v);
    return loss.terms(moved);
  };
  double p1, m1, p2, m2;
  std::vector<double> plus = shifted(h, &p1), minus = shifted(-h, &m1);
  std::vector<double> plus_half = shifted(h / 2, &p2), minus_half = shifted(-h / 2, &m2);
  Difference wide = difference(plus, minus, p1 - m1);
  Difference narrow = difference(plus_half, minus_half, p2 - m2);
  Difference forward = difference(plus_half, at_x, p2 - xi);
  Difference backward = difference(at_x, minus_half, xi - m2);
  if (!wide.finite || !narrow.finite) return std::nullopt;
  if (!close(wide.value, narrow.value, kRtol, wide.noise + narrow.noise)) return std::nullopt;
  if (!close(forward.value, backward.value, kKinkRtol, forward.noise + backward.noise)) return std::nullopt;
  // A difference within twice its own noise bound says nothing (big
  // reductions to one output, outputs far larger than their change).
  if (narrow.noise > 0 && std::abs(narrow.value) < 2 * narrow.noise) return std::nullopt;
  return narrow;
}

/** A sampled element and its finite difference (nullopt: at a kink). */
struct Point {
  size_t input;
  size_t index;
  std::optional<Difference> fd;
};

/** Samples up to `samples` elements of each differentiated input and takes
 * their finite differences (eagerly, once for both modes). */
std::vector<Point> sample_points(Loss& loss, const std::vector<mx::array>& xs, int samples, uint32_t seed) {
  std::vector<double> at_x = loss.terms(xs);
  std::mt19937 rng(seed);
  std::vector<Point> points;
  for (size_t k = 0; k < xs.size(); ++k) {
    std::vector<size_t> order(xs[k].size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(std::min<size_t>(order.size(), samples));
    for (size_t index : order) points.push_back({k, index, finite_difference(loss, xs, k, index, at_x)});
  }
  return points;
}

/** Compares the vjp of one mode with the sampled finite differences. */
Result compare(Loss& loss, const std::vector<mx::array>& xs, const std::vector<mx::array>& cotangents,
               const std::vector<Point>& points, bool use_compiled) {
  Result result;
  auto fn = [&](const std::vector<mx::array>& in) { return loss.outputs(in, use_compiled); };
  std::vector<std::vector<double>> grads;
  std::vector<double> scales;
  std::vector<mx::array> vjps = mx::vjp(fn, xs, cotangents).second;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (vjps[k].shape() != xs[k].shape()) {
      return {Status::kFailed, str("the vjp for input '", loss.wrt()[k], "' has ", vjps[k].size(),
                                   " elements in another shape than the input's ", xs[k].size())};
    }
    grads.push_back(host_doubles(vjps[k]));
    double largest = 0;
    for (double g : grads.back()) largest = std::max(largest, std::abs(g));
    scales.push_back(kScaleAtol * largest);
  }
  for (const Point& p : points) {
    if (!p.fd) {
      ++result.kinks;
      continue;
    }
    ++result.points;
    double g = grads[p.input][p.index];
    if (!close(g, p.fd->value, kRtol, p.fd->noise + scales[p.input]) && result.status == Status::kPassed) {
      result.status = Status::kFailed;
      result.message = str("input '", loss.wrt()[p.input], "' element ", p.index, ": vjp ", g,
                           ", finite difference ", p.fd->value, " (noise bound ", p.fd->noise, ")");
    }
  }
  if (result.points == 0) {
    return {Status::kSkipped, "every sampled point is at a kink or discontinuity, or in rounding noise"};
  }
  return result;
}

uint32_t seed_of(const std::string& name) { return static_cast<uint32_t>(std::hash<std::string>{}(name)); }

/** Sets up one case and checks it in both modes. */
std::map<std::string, Result> run_case(const fs::path& dir, int samples, bool* blocked_by_trait) {
  std::map<std::string, Result> results;
  auto all = [&](Status s, const std::string& m) {
    for (const char* mode : {"eager", "compiled"}) results[mode] = {s, m};
    return results;
  };
  ModelFile file = read_model_file(dir / "model.onnx");
  const Graph& graph = *file.graph;
  Inputs inputs;
  fs::path set = dir / "test_data_set_0";
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    fs::path path = set / str("input_", i, ".pb");
    if (!fs::exists(path)) continue;
    Value v = read_value_file(path, graph.inputs[i]);
    bool empty_optional = v.is_none() && graph.inputs[i].kind == ValueInfo::Kind::kOptional;
    if (!empty_optional) inputs[graph.inputs[i].name] = v;
  }
  Analysis analysis = analyze(graph, inputs);
  *blocked_by_trait = analysis.blocked_by_trait;
  if (!analysis.skip.empty()) return all(Status::kSkipped, analysis.skip);

  std::vector<std::string> wrt;
  std::vector<mx::array> xs;
  for (const auto& [name, value] : inputs) {
    if (analysis.carrying.count(name)) {
      wrt.push_back(name);
      xs.push_back(value.tensor());
    }
  }
  std::vector<size_t> outputs;
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    if (analysis.carrying.count(graph.outputs[i].name)) outputs.push_back(i);
  }
  Model model = load((dir / "model.onnx").string());
  CompiledModel compiled = compile(model, {}, {analysis.static_inputs, 8, mx::Device::cpu});
  Loss loss(model, inputs, wrt, outputs, compiled);
  uint32_t seed = seed_of(dir.filename().string());
  std::vector<mx::array> base = loss.outputs(xs, false);
  std::string why = loss.set_weights(base, seed);
  if (!why.empty()) return all(Status::kSkipped, why);
  std::vector<Point> points = sample_points(loss, xs, samples, seed);
  for (const char* mode : {"eager", "compiled"}) {
    try {
      results[mode] = compare(loss, xs, loss.cotangents(base), points, std::string(mode) == "compiled");
    } catch (const std::exception& e) {
      results[mode] = {Status::kFailed, e.what()};
    }
  }
  return results;
}

struct Counts {
  int passed = 0, failed = 0, expected_failures = 0, unexpected_passes = 0;
  int skipped = 0, not_differentiable = 0;
  int points = 0, kinks = 0;  // compared, and skipped at kinks or in noise
};

int gradient_check_main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0) throw Error(str("unexpected argument '", key, "'"));
    args[key.substr(2)] = argv[i + 1];
  }
  if (!args.count("cases") || !fs::is_directory(args["cases"])) {
    throw Error(
        "usage: gradient_check --cases DIR [--expected FILE] [--filter REGEX] [--samples N] [--verbose 1]");
  }
  cli::ExpectedFailures expected = cli::ExpectedFailures::read(args.count("expected") ? args["expected"] : "");
  std::regex filter(args.count("filter") ? args["filter"] : ".*");
  int samples = args.count("samples") ? std::stoi(args["samples"]) : 4;
  bool verbose = args.count("verbose") && args["verbose"] != "0";

  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(args["cases"])) {
    if (entry.is_directory() && fs::exists(entry.path() / "model.onnx") &&
        std::regex_search(entry.path().filename().string(), filter)) {
      dirs.push_back(entry.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());

  std::map<std::string, Counts> counts;
  for (const fs::path& dir : dirs) {
    std::string name = dir.filename().string();
    if (verbose) std::cout << "case " << name << std::endl;
    std::map<std::string, Result> results;
    bool blocked = false;
    try {
      results = run_case(dir, samples, &blocked);
    } catch (const std::exception& e) {
      for (const char* mode : {"eager", "compiled"}) results[mode] = {Status::kFailed, e.what()};
    }
    for (auto& [mode, r] : results) {
      Counts& c = counts[mode];
      c.points += r.points;
      c.kinks += r.kinks;
      const std::string* reason = expected.find(name, mode);
      if (r.status == Status::kSkipped) {
        ++c.skipped;
        c.not_differentiable += blocked;
        if (verbose) std::cout << "skip [" << mode << "] " << name << ": " << r.message << "\n";
      } else if (r.status == Status::kFailed && reason) {
        ++c.expected_failures;
        if (verbose) {
          std::cout << "xfail [" << mode << "] " << name << ": " << *reason << " (" << r.message << ")\n";
        }
      } else if (r.status == Status::kFailed) {
        ++c.failed;
        std::cout << "FAIL [" << mode << "] " << name << ": " << r.message << "\n";
      } else if (reason) {
        ++c.unexpected_passes;
        std::cout << "UNEXPECTED PASS [" << mode << "] " << name
                  << " (remove it from the expected failures)\n";
      } else {
        ++c.passed;
        if (verbose) {
          std::cout << "ok [" << mode << "] " << name << " (" << r.points << " points, " << r.kinks
                    << " skipped)\n";
        }
      }
    }
  }
  Counts total;
  for (const auto& [mode, c] : counts) {
    std::cout << mode << ": " << c.passed + c.unexpected_passes << " passed, " << c.failed << " failed, "
              << c.skipped + c.expected_failures << " skipped (" << c.not_differentiable
              << " not differentiable by the registry, " << c.skipped - c.not_differentiable
              << " with no checkable input/output or unimplemented ops, " << c.expected_failures
              << " expected failures, " << c.unexpected_passes << " unexpected passes; " << c.points
              << " points compared, " << c.kinks << " skipped at kinks or in noise)\n";
    total.passed += c.passed + c.unexpected_passes;
    total.failed += c.failed;
    total.skipped += c.skipped + c.expected_failures;
  }
  std::cout << total.passed << " passed, " << total.failed << " failed, " << total.skipped << " skipped\n";
  return total.failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace transmuter

int main(int argc, char** argv) {
  try {
    return transmuter::gradient_check_main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "gradient_check: error: " << e.what() << "\n";
    return 2;
  }
}
