// ONNX Runtime's contrib operators (domain com.microsoft): MatMulNBits, GatherBlockQuantized.
// Placeholder registration; the operators arrive with issue 7.
#include "ops/registry.h"

namespace transmuter {

void register_microsoft_quantized_weights(OpRegistry&) {}

}  // namespace transmuter
