#include "ops/registry.h"

#include <algorithm>

#include "transmuter/error.h"

namespace transmuter {

void OpRegistry::add(std::initializer_list<OpRow> rows) {
  for (const OpRow& row : rows) add(row);
}

void OpRegistry::add(const OpRow& row) {
  if (row.since > row.until || row.fn == nullptr) {
    throw Error(str("[OpRegistry] bad row for ", row.op_type, " v", row.since));
  }
  auto& ranges = rows_[{std::string(row.domain), std::string(row.op_type)}];
  for (const OpRow& other : ranges) {
    if (row.since <= other.until && other.since <= row.until) {
      throw Error(str("[OpRegistry] ", row.op_type, " v", row.since, " overlaps the range registered from v",
                      other.since));
    }
  }
  ranges.push_back(row);
  std::sort(ranges.begin(), ranges.end(), [](const OpRow& a, const OpRow& b) { return a.since < b.since; });
}

const OpRow* OpRegistry::find(std::string_view domain, std::string_view op_type, int64_t opset) const {
  // "ai.onnx" is the long spelling of the default domain.
  if (domain == "ai.onnx") domain = "";
  auto it = rows_.find({std::string(domain), std::string(op_type)});
  if (it == rows_.end()) return nullptr;
  // A node's version is the newest op version not above the model's opset:
  // the row must hold that op version, which lies in [since, opset].
  for (auto row = it->second.rbegin(); row != it->second.rend(); ++row) {
    if (row->since <= opset) return opset <= row->until || row->until == kOpen ? &*row : nullptr;
  }
  return nullptr;
}

std::vector<const OpRow*> OpRegistry::rows() const {
  std::vector<const OpRow*> out;
  for (const auto& [key, ranges] : rows_) {
    for (const OpRow& row : ranges) out.push_back(&row);
  }
  return out;
}

namespace {
OpRegistry make_builtin_registry() {
  OpRegistry registry;
  register_elementwise(registry);
  register_activation(registry);
  register_reduction(registry);
  register_matmul(registry);
  register_conv(registry);
  register_pool(registry);
  register_shape(registry);
  register_indexing(registry);
  register_normalization(registry);
  register_generator(registry);
  register_random(registry);
  register_cast(registry);
  register_controlflow(registry);
  register_sequence(registry);
  register_attention(registry);
  register_text(registry);
  register_ml(registry);
  register_training(registry);
  register_quantization(registry);
  register_rnn(registry);
  register_signal(registry);
  register_detection(registry);
  register_selection(registry);
  register_linalg(registry);
  register_classic_vision(registry);
  register_image(registry);
  register_loss(registry);
  register_resize(registry);
  register_grid(registry);
  register_transmuter_attention(registry);
  register_transmuter_rotary(registry);
  register_transmuter_matmul(registry);
  register_transmuter_activation(registry);
  register_transmuter_conv(registry);
  register_transmuter_indexing(registry);
  register_microsoft_activation(registry);
  register_microsoft_normalization(registry);
  register_microsoft_conv(registry);
  register_microsoft_matmul(registry);
  register_microsoft_attention(registry);
  register_microsoft_quantized_weights(registry);
  register_microsoft_qlinear(registry);
  register_microsoft_moe(registry);
  return registry;
}
}  // namespace

const OpRegistry& builtin_registry() {
  static const OpRegistry registry = make_builtin_registry();
  return registry;
}

}  // namespace transmuter
