// ONNX Runtime's contrib operators (domain com.microsoft): FusedMatMul.
// Placeholder registration; the operators arrive with issue 7.
#include "ops/registry.h"

namespace transmuter {

void register_microsoft_matmul(OpRegistry&) {}

}  // namespace transmuter
