// Checks the inputs a caller gives against what the model declares.
#pragma once

#include "graph/graph.h"
#include "transmuter/runtime.h"

namespace transmuter {

/** Throws InputError for an unknown name, a missing input, a dtype other than
 * the declared one, or a shape that contradicts a fixed declared dimension. */
void validate_inputs(const Graph& graph, const Inputs& inputs);

}  // namespace transmuter
