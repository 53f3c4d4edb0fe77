#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {

void register_random(OpRegistry& r) { (void)r; }

}  // namespace transmuter
