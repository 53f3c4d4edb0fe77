// What a Model holds; shared by the runtime files.
#pragma once

#include <memory>
#include <string>

#include "graph/graph.h"
#include "transmuter/model.h"

namespace transmuter {

struct Model::State {
  std::shared_ptr<Graph> graph;
  Params params;
  int64_t ir_version = 0;
  std::string producer;
  std::string path;
};

/** A Model over an already built graph: binds every node to its registry row
 * (UnsupportedError listing all that have none) and collects the params.
 * `source` names the model in messages. */
Model make_model(std::shared_ptr<Graph> graph, const std::string& source, int64_t ir_version = 0,
                 std::string producer = "");

}  // namespace transmuter
