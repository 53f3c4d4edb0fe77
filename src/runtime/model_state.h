// What a Model holds; shared by the runtime files.
#pragma once

#include <memory>
#include <string>

#include "graph/graph.h"
#include "runtime/bound_graph.h"
#include "runtime/host_reads.h"
#include "runtime/interpreter.h"
#include "transmuter/model.h"

namespace transmuter {

struct Model::State {
  std::shared_ptr<const Graph> graph;  // after load-time passes
  std::unique_ptr<BoundGraph> bound;   // graph bound to the registry
  Params params;
  // The graph's initializers bound once: the enclosing scope of every eager run with the model's own params
  // (binding 327 names a run was 7 % of the eager int8 MobileNetV2's calling thread in perf, its largest
  // user-space item, string hashing and compares besides). Read-only after load.
  Environment initializers;
  int64_t ir_version = 0;
  std::string producer;
  std::string source;
  std::vector<std::string> passes_applied;
  // The one part written after load: host reads remembered by eager runs, per
  // input signature. Internally synchronized (runtime/host_reads.h).
  std::unique_ptr<SignatureMemoCache> host_reads;
};

/** A Model over an already built graph: runs the load-time passes (when
 * `options.run_passes`), binds every node to its registry row
 * (UnsupportedError listing all that have none) and collects the params.
 * `source` names the model in messages. */
Model make_model(std::shared_ptr<Graph> graph, const std::string& source, const LoadOptions& options = {},
                 int64_t ir_version = 0, std::string producer = "");

}  // namespace transmuter
