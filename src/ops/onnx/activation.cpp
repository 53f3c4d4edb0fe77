#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {

void register_activation(OpRegistry& r) { (void)r; }

}  // namespace transmuter
