// ONNX Runtime's contrib operators (domain com.microsoft): QLinear*, DynamicQuantizeMatMul, MatMulIntegerToFloat, QuantizeLinear/DequantizeLinear, DynamicQuantizeLSTM.
// Placeholder registration; the operators arrive with issue 7.
#include "ops/registry.h"

namespace transmuter {

void register_microsoft_qlinear(OpRegistry&) {}

}  // namespace transmuter
