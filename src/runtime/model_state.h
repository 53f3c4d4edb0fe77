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

}  // namespace transmuter
