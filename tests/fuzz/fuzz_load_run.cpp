// libFuzzer target: a model from bytes, loaded (passes, binding) and run once
// eagerly on the CPU with small inputs filled for its declared shapes. Every
// input must load and run or throw transmuter::Error; any other exception,
// crash, sanitizer report or hang is a finding.
//
// Runs stay fast: inputs are capped at kMaxInputElements (models declaring
// more are skipped), symbolic dims are 2, and RunOptions::memory_limit
// refuses any op output over kMemoryLimit bytes.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include <mlx/mlx.h>

#include "onnx/model_file.h"
#include "runtime/model_state.h"
#include "transmuter/transmuter.h"

namespace {

namespace mx = mlx::core;
using transmuter::Dim;
using transmuter::ValueInfo;

constexpr int64_t kMaxInputElements = 4096;
constexpr int64_t kSymbolicDim = 2;
constexpr uint64_t kMemoryLimit = 64ull << 20;

// The declared shape with symbolic or negative dims set to kSymbolicDim (an
// undeclared shape: a vector of that length); nullopt when the input is over
// kMaxInputElements.
std::optional<mx::Shape> small_shape(const ValueInfo& info) {
  if (!info.has_shape) return mx::Shape{kSymbolicDim};
  mx::Shape shape;
  int64_t count = 1;
  for (const Dim& dim : info.shape) {
    const int64_t n = dim.value && *dim.value >= 0 ? *dim.value : kSymbolicDim;
    if (n > kMaxInputElements) return std::nullopt;
    count *= n;
    if (count > kMaxInputElements) return std::nullopt;
    shape.push_back(static_cast<int32_t>(n));
  }
  return shape;
}

// Inputs holding 0, 1, 2, 0, 1, ...: valid indices for small axes and mostly
// non-zero divisors, so runs get past the first op. nullopt for models with
// inputs we do not fill (strings, sequences, too large).
std::optional<transmuter::Inputs> small_inputs(const transmuter::Model& model) {
  transmuter::Inputs inputs;
  for (const ValueInfo& info : model.inputs()) {
    if (info.kind != ValueInfo::Kind::kTensor) return std::nullopt;
    const std::optional<mx::Dtype> dtype = transmuter::to_mlx_dtype(info.elem_type);
    const std::optional<mx::Shape> shape = small_shape(info);
    if (!dtype || !shape) return std::nullopt;
    int32_t count = 1;
    for (int32_t n : *shape) count *= n;
    mx::array values = mx::remainder(mx::arange(count), mx::array(3));
    inputs.emplace(info.name, mx::reshape(mx::astype(values, *dtype), *shape));
  }
  return inputs;
}

void load_and_run(std::span<const uint8_t> bytes) {
  transmuter::ModelFile file = transmuter::read_model_bytes(bytes, "");
  const transmuter::Model model = transmuter::make_model(file.graph, "<fuzz>");
  const std::optional<transmuter::Inputs> inputs = small_inputs(model);
  if (!inputs) return;
  transmuter::RunOptions options;
  options.device = mx::Device::cpu;
  options.memory_limit = kMemoryLimit;
  const transmuter::Outputs outputs = transmuter::run(model, model.params(), *inputs, options);
  for (const transmuter::Value& value : outputs.values) {
    if (value.is_tensor()) mx::eval(value.tensor());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    load_and_run(std::span<const uint8_t>(data, size));
  } catch (const transmuter::Error&) {
  }
  return 0;
}
