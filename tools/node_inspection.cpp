#include "node_inspection.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <mlx/mlx.h>

#include "json_out.h"
#include "npy.h"
#include "transmuter/error.h"

namespace mx = mlx::core;

namespace transmuter::cli {

namespace {

std::string json_string(const std::string& s) {
  std::ostringstream out;
  write_json_string(out, s);
  return out.str();
}

std::string json_strings(const std::vector<std::string>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + json_string(values[i]);
  return out + "]";
}

// The dtype as NumPy names it: what the file holds (write_npy widens
// bfloat16 to float32).
std::string numpy_dtype_name(mx::Dtype dtype) {
  if (dtype == mx::bfloat16) return "float32";
  if (dtype == mx::bool_) return "bool";
  std::ostringstream name;
  name << dtype;
  return name.str();
}

std::string file_name(size_t node, size_t output) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%05zu_%zu.npy", node, output);
  return buffer;
}

}  // namespace

ValueDump::ValueDump(std::filesystem::path dir) : dir_(std::move(dir)) {
  std::filesystem::create_directories(dir_);
}

void ValueDump::operator()(NodeRun& run) {
  std::string outputs;
  for (size_t i = 0; i < run.outputs.size(); ++i) {
    const std::string& name = run.output_names[i];
    if (name.empty()) continue;
    const Value& value = run.outputs[i];
    std::string entry = "{\"name\": " + json_string(name);
    if (value.is_tensor()) {
      const mx::array& a = value.tensor();
      const std::string file = file_name(run.index, i);
      try {
        write_npy(dir_ / file, a);
      } catch (const Error& e) {  // a dtype .npy has no name for: listed, the dump goes on
        outputs += (outputs.empty() ? "" : ", ") + entry + ", \"skipped\": " + json_string(e.what()) + "}";
        continue;
      }
      std::string shape = "[";
      for (size_t d = 0; d < a.ndim(); ++d) shape += (d ? ", " : "") + std::to_string(a.shape(d));
      entry += ", \"file\": " + json_string(file) + ", \"shape\": " + shape +
               "], \"dtype\": " + json_string(numpy_dtype_name(a.dtype())) + "}";
    } else {
      entry += ", \"skipped\": " + json_string(value.describe()) + "}";
    }
    outputs += (outputs.empty() ? "" : ", ") + entry;
  }
  nodes_json_ += std::string(nodes_ ? ",\n" : "\n") + "  {\"index\": " + std::to_string(run.index) +
                 ", \"name\": " + json_string(run.name) + ", \"domain\": " + json_string(run.domain) +
                 ", \"op_type\": " + json_string(run.op_type) +
                 ", \"inputs\": " + json_strings(run.input_names) + ", \"outputs\": [" + outputs + "]}";
  ++nodes_;
}

void ValueDump::finish() const {
  const std::filesystem::path index = dir_ / "index.json";
  std::ofstream out(index);
  out << "{\"nodes\": [" << nodes_json_ << "\n]}\n";
  if (!out) throw Error(index.string() + ": cannot write");
}

void NodePerturbation::operator()(NodeRun& run) {
  if (run.name != name_) return;
  seen_ = true;
  for (Value& value : run.outputs) {
    if (!value.is_tensor() || value.is_widened() || !mx::issubdtype(value.tensor().dtype(), mx::floating))
      continue;
    const mx::array& x = value.tensor();
    value = Value(mx::astype(mx::add(mx::multiply(x, mx::array(1.1f)), mx::array(0.1f)), x.dtype()));
    changed_ = true;
  }
}

void NodePerturbation::finish() const {
  if (!seen_) throw Error("--perturb-node: no node named '" + name_ + "' ran");
  if (!changed_) throw Error("--perturb-node: node '" + name_ + "' has no float output to perturb");
}

}  // namespace transmuter::cli
