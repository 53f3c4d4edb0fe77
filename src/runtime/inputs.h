// Checks the inputs a caller gives against what the model declares.
#pragma once

#include "graph/graph.h"
#include "transmuter/runtime.h"

namespace transmuter {

/** Throws InputError for an unknown name, a missing input, a dtype other than
 * the declared one, or a shape that contradicts a fixed declared dimension.
 * Returns the inputs with the narrow element types the graph declares
 * (an int8 array given for an int4 input holds int4 values). */
Inputs validate_inputs(const Graph& graph, const Inputs& inputs);

}  // namespace transmuter
