// `transmuter conformance`: runs ONNX backend node test cases
// (<case>/model.onnx + test_data_set_N/{input,output}_i.pb) in up to three
// modes and compares every output with the expected data:
//   eager            tr::run
//   compiled-static  tr::compile with the inputs that feed host inputs
//                    (Reshape's shape...) static, as Shape-derived values are
//                    in real models: the op is traced inside a segment
//   compiled-traced  tr::compile with every input traced: such ops become
//                    graph breaks, which this mode exercises
//
// Tolerance, as onnx.backend.test's runner: |actual - expected| <= atol +
// rtol * |expected| with the case's rtol/atol (data.json; default 1e-3 and
// 1e-7), rtol at least 2^-6 (two ulps) for bfloat16; NaN matches NaN; dtype
// (the ONNX element type, float8/int4... included), shape and strings must
// match exactly.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <regex>
#include <set>

#include <mlx/mlx.h>

#include "cli.h"
#include "expected_failures.h"
#include "transmuter/transmuter.h"

namespace fs = std::filesystem;
namespace mx = mlx::core;

namespace transmuter::cli {

namespace {

struct Tolerance {
  double rtol = 1e-3;
  double atol = 1e-7;
};

// The number after `"key":` in a small JSON object, or `fallback`.
double json_number(const std::string& text, const std::string& key, double fallback) {
  size_t at = text.find("\"" + key + "\"");
  if (at == std::string::npos) return fallback;
  at = text.find(':', at);
  if (at == std::string::npos) return fallback;
  try {
    return std::stod(text.substr(at + 1));
  } catch (const std::exception&) {
    throw Error(str("data.json: '", key, "' is not a number"));
  }
}

// The case's tolerances (data.json beside model.onnx, as onnx's loader reads them).
Tolerance case_tolerance(const fs::path& dir) {
  Tolerance t;
  std::ifstream in(dir / "data.json");
  if (!in) return t;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  t.rtol = json_number(text, "rtol", t.rtol);
  t.atol = json_number(text, "atol", t.atol);
  return t;
}

enum class Status { kPassed, kFailed, kExpectedFailure, kUnexpectedPass, kSkipped };

struct CaseResult {
  std::string name;
  std::string mode;
  Status status;
  std::string message;
};

std::string compare_tensors(const mx::array& actual_in, const mx::array& expected_in, Tolerance tolerance) {
  if (actual_in.dtype() != expected_in.dtype()) {
    return str("dtype ", onnx_type_name(to_onnx_type(actual_in.dtype())), ", expected ",
               onnx_type_name(to_onnx_type(expected_in.dtype())));
  }
  if (actual_in.shape() != expected_in.shape()) {
    std::ostringstream a, e;
    for (int d : actual_in.shape()) a << d << ",";
    for (int d : expected_in.shape()) e << d << ",";
    return str("shape [", a.str(), "], expected [", e.str(), "]");
  }
  if (actual_in.size() == 0) return "";
  if (expected_in.dtype() == mx::bfloat16) tolerance.rtol = std::max(tolerance.rtol, 1.0 / 64);
  const double kRtol = tolerance.rtol, kAtol = tolerance.atol;
  mx::array actual = mx::astype(actual_in, mx::float64, mx::Device::cpu);
  mx::array expected = mx::astype(expected_in, mx::float64, mx::Device::cpu);
  mx::array diff = mx::abs(mx::subtract(actual, expected, mx::Device::cpu), mx::Device::cpu);
  mx::array tol = mx::add(mx::array(kAtol), mx::multiply(mx::array(kRtol), mx::abs(expected, mx::Device::cpu), mx::Device::cpu), mx::Device::cpu);
  mx::array both_nan = mx::logical_and(mx::isnan(actual, mx::Device::cpu), mx::isnan(expected, mx::Device::cpu), mx::Device::cpu);
  // Infinities of the same sign are equal; diff is NaN there.
  mx::array same_inf = mx::logical_and(mx::isinf(expected, mx::Device::cpu), mx::equal(actual, expected, mx::Device::cpu), mx::Device::cpu);
  mx::array ok = mx::logical_or(mx::logical_or(mx::less_equal(diff, tol, mx::Device::cpu), both_nan, mx::Device::cpu), same_inf, mx::Device::cpu);
  mx::array bad = mx::sum(mx::astype(mx::logical_not(ok, mx::Device::cpu), mx::int64, mx::Device::cpu), mx::Device::cpu);
  mx::array worst = mx::max(mx::where(ok, mx::array(0.0), diff, mx::Device::cpu), mx::Device::cpu);
  mx::eval(bad, worst);
  int64_t bad_count = bad.item<int64_t>();
  if (bad_count == 0) return "";
  return str(bad_count, " of ", actual.size(), " values differ (worst |diff| ", worst.item<double>(), ")");
}

std::string compare_values(const Value& actual, const Value& expected, const Tolerance& tolerance) {
  if (actual.kind() != expected.kind()) return str("got ", actual.describe(), ", expected ", expected.describe());
  switch (expected.kind()) {
    case Value::Kind::kNone: return "";
    case Value::Kind::kTensor:
      // float8, int4... are held widened: the element type tells them apart.
      if (actual.element_type() != expected.element_type()) {
        return str("element type ", onnx_type_name(actual.element_type()), ", expected ",
                   onnx_type_name(expected.element_type()));
      }
      return compare_tensors(actual.tensor(), expected.tensor(), tolerance);
    case Value::Kind::kStrings:
      if (actual.strings().shape != expected.strings().shape) return "string tensor shape differs";
      return actual.strings().data == expected.strings().data ? "" : "string values differ";
    case Value::Kind::kSequence: {
      const Sequence& a = actual.sequence_items();
      const Sequence& e = expected.sequence_items();
      if (a.size() != e.size()) return str("sequence of ", a.size(), ", expected ", e.size());
      for (size_t i = 0; i < a.size(); ++i) {
        std::string m = compare_values(a[i], e[i], tolerance);
        if (!m.empty()) return str("sequence item ", i, ": ", m);
      }
      return "";
    }
  }
  return "";
}

std::vector<fs::path> data_sets(const fs::path& dir) {
  std::vector<fs::path> sets;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(entry.path());
  }
  std::sort(sets.begin(), sets.end());
  return sets;
}

// Runs one case in one mode; returns "" on success or the first mismatch.
std::string run_case(const fs::path& dir, const Model& model, const std::string& mode) {
  const std::vector<ValueInfo>& declared_inputs = model.inputs();
  const std::vector<ValueInfo>& declared_outputs = model.outputs();
  std::optional<CompiledModel> compiled;
  const Tolerance tolerance = case_tolerance(dir);
  for (const fs::path& set : data_sets(dir)) {
    Inputs inputs;
    for (size_t i = 0; i < declared_inputs.size(); ++i) {
      fs::path file = set / str("input_", i, ".pb");
      if (!fs::exists(file)) continue;  // trailing optional input left out
      Value v = load_value_file(file.string(), declared_inputs[i]);
      if (!(v.is_none() && declared_inputs[i].kind == ValueInfo::Kind::kOptional)) inputs[declared_inputs[i].name] = v;
    }
    Outputs outputs;
    if (mode == "eager") {
      outputs = run(model, model.params(), inputs, {mx::Device::cpu});
    } else {
      std::vector<std::string> static_inputs;
      if (mode == "compiled-static") static_inputs = model.inputs_read_on_host();
      if (!compiled) compiled = compile(model, {}, {static_inputs, 8, mx::Device::cpu});
      outputs = (*compiled)(inputs);
    }
    std::vector<mx::array> arrays;
    for (const Value& v : outputs.values) {
      if (v.is_tensor()) arrays.push_back(v.tensor());
    }
    mx::eval(arrays);
    for (size_t i = 0; i < declared_outputs.size(); ++i) {
      fs::path file = set / str("output_", i, ".pb");
      if (!fs::exists(file)) continue;
      Value expected = load_value_file(file.string(), declared_outputs[i]);
      std::string m = compare_values(outputs.values[i], expected, tolerance);
      if (!m.empty()) return str(set.filename().string(), " output '", declared_outputs[i].name, "': ", m);
    }
  }
  return "";
}

// (domain, op_type) of every implemented operator, at any version.
const std::set<std::pair<std::string, std::string>>& known_op_types() {
  static const auto known = [] {
    std::set<std::pair<std::string, std::string>> out;
    for (const OperatorInfo& op : supported_operators()) out.insert({op.domain, op.op_type});
    return out;
  }();
  return known;
}

// True when a missing operator has no implementation at any version: the case
// belongs to an operator not built yet (skipped). An op that exists but lacks
// this opset is a failure, not a skip.
bool lacks_op_type(const UnsupportedError& e) {
  for (const MissingOperator& op : e.missing()) {
    if (!known_op_types().count({op.domain, op.op_type})) return true;
  }
  return false;
}

// skip_missing: a case whose operator is not implemented at all is skipped
// (the ONNX node tests cover operators not built yet); otherwise it fails.
CaseResult evaluate(const fs::path& dir, const std::string& mode, const ExpectedFailures& expected,
                    bool skip_missing) {
  CaseResult result{dir.filename().string(), mode, Status::kPassed, ""};
  try {
    Model model = load((dir / "model.onnx").string());
    result.message = run_case(dir, model, mode);
  } catch (const UnsupportedError& e) {
    if (skip_missing && lacks_op_type(e)) {
      result.status = Status::kSkipped;
      result.message = "operator not implemented";
      return result;
    }
    result.message = e.what();
  } catch (const std::exception& e) {
    result.message = e.what();
  }
  const std::string* reason = expected.find(result.name, mode);
  bool failed = !result.message.empty();
  if (reason != nullptr) {
    result.status = failed ? Status::kExpectedFailure : Status::kUnexpectedPass;
    if (failed) result.message = *reason;
  } else {
    result.status = failed ? Status::kFailed : Status::kPassed;
  }
  return result;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out;
}

const char* status_name(Status s) {
  switch (s) {
    case Status::kPassed: return "passed";
    case Status::kFailed: return "failed";
    case Status::kExpectedFailure: return "expected_failure";
    case Status::kUnexpectedPass: return "unexpected_pass";
    case Status::kSkipped: return "skipped";
  }
  return "?";
}

}  // namespace

int conformance_main(const Args& args) {
  std::string cases = args.get("cases", "");
  if (cases.empty() || !fs::is_directory(cases)) {
    throw Error("usage: transmuter conformance --cases DIR [--filter REGEX] [--mode eager|compiled|both] [--json FILE] "
                "[--expected FILE] [--no-skip]");
  }
  std::regex filter(args.get("filter", ".*"));
  std::string mode_arg = args.get("mode", "both");
  std::vector<std::string> modes;
  if (mode_arg == "both") modes = {"eager", "compiled-static", "compiled-traced"};
  else if (mode_arg == "compiled") modes = {"compiled-static", "compiled-traced"};
  else if (mode_arg == "eager" || mode_arg == "compiled-static" || mode_arg == "compiled-traced") modes = {mode_arg};
  else throw Error(str("--mode expects eager, compiled, compiled-static, compiled-traced or both, got '", mode_arg, "'"));
  ExpectedFailures expected = ExpectedFailures::read(args.get("expected", ""));
  bool verbose = args.get("verbose", "0") != "0";
  // --no-skip: every case's operator must exist (suites written for implemented operators).
  const bool skip_missing = !args.has("no-skip");

  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(cases)) {
    if (entry.is_directory() && fs::exists(entry.path() / "model.onnx") &&
        std::regex_search(entry.path().filename().string(), filter)) {
      dirs.push_back(entry.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());

  std::vector<CaseResult> results;
  std::map<std::string, std::map<Status, int>> counts;
  for (const std::string& mode : modes) {
    for (const fs::path& dir : dirs) {
      CaseResult r = evaluate(dir, mode, expected, skip_missing);
      counts[mode][r.status]++;
      if (r.status == Status::kFailed) std::cout << "FAIL [" << mode << "] " << r.name << ": " << r.message << "\n";
      if (r.status == Status::kUnexpectedPass) std::cout << "UNEXPECTED PASS [" << mode << "] " << r.name << " (remove it from the expected failures)\n";
      if (verbose && r.status == Status::kExpectedFailure) std::cout << "xfail [" << mode << "] " << r.name << ": " << r.message << "\n";
      results.push_back(std::move(r));
    }
  }

  if (args.has("json")) {
    std::ofstream out(args.get("json", ""));
    out << "[\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const CaseResult& r = results[i];
      out << "  {\"name\": \"" << r.name << "\", \"mode\": \"" << r.mode << "\", \"status\": \"" << status_name(r.status)
          << "\", \"message\": \"" << json_escape(r.message) << "\"}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    out << "]\n";
  }

  int passed = 0, failed = 0, skipped = 0;
  for (const std::string& mode : modes) {
    auto& c = counts[mode];
    int p = c[Status::kPassed] + c[Status::kUnexpectedPass];
    int f = c[Status::kFailed];
    int s = c[Status::kSkipped] + c[Status::kExpectedFailure];
    std::cout << mode << ": " << p << " passed, " << f << " failed, " << s << " skipped ("
              << c[Status::kExpectedFailure] << " expected failures, " << c[Status::kSkipped]
              << " with operators not implemented, " << c[Status::kUnexpectedPass] << " unexpected passes)\n";
    passed += p;
    failed += f;
    skipped += s;
  }
  std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped\n";
  return failed == 0 ? 0 : 1;
}

}  // namespace transmuter::cli
