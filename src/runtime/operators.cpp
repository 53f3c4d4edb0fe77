#include "transmuter/operators.h"

#include "ops/registry.h"

namespace transmuter {

std::vector<OperatorInfo> supported_operators() {
  std::vector<OperatorInfo> out;
  for (const OpRow* row : builtin_registry().rows()) {
    OperatorInfo info;
    info.domain = row->domain.empty() ? "ai.onnx" : std::string(row->domain);
    info.op_type = row->op_type;
    info.since = row->since;
    info.open_ended = row->until == kOpen;
    info.until = row->until;
    info.host_inputs = row->host_inputs;
    info.eager_only = row->eager_only;
    info.restrictions = row->restrictions;
    info.not_differentiable = row->not_differentiable;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace transmuter
