// ONNX Runtime's contrib operators (domain com.microsoft): Attention, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding.
// Placeholder registration; the operators arrive with issue 7.
#include "ops/registry.h"

namespace transmuter {

void register_microsoft_attention(OpRegistry&) {}

}  // namespace transmuter
