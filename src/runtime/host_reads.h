// Host values that eager runs read again and again with the same inputs'
// shapes. PyTorch exports compute Reshape/Expand/Slice arguments from
// Shape -> Gather -> Unsqueeze -> Concat chains; each host read of such a
// value evaluates a small lazy array, a round trip to MLX's stream thread
// (MiniLM-L3: 62 per run). Those values depend only on the input signature
// (shapes and dtypes), the initializers and the model, so one run per
// signature reads them and later runs replay them (docs/architecture.md,
// "Threads" and "Eager runs").
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ops/node_context.h"
#include "runtime/bound_graph.h"
#include "runtime/compiler.h"
#include "transmuter/value.h"

namespace transmuter {

/** How a run whose signature has a memo goes: the remembered outputs that a node that runs, a subgraph or
 * the graph's outputs read are bound first, and only the other nodes run. Replayed nodes whose outputs
 * only feed other replayed nodes (Constants, Shape -> Gather -> Unsqueeze -> Concat chains: 300 of int8
 * MiniLM-L6's 460 nodes) are not visited at all. */
struct ReplayPlan {
  std::vector<std::pair<std::string, Value>> bindings;
  std::vector<size_t> nodes;  // ascending
};

/** A published memo and the plan of its runs. */
struct Replay {
  std::shared_ptr<const SignatureMemo> memo;
  ReplayPlan plan;
};

/** The plan of runs that replay `memo` over `graph`, whose nodes marked in `replayable` may be replayed. */
ReplayPlan plan_replay(const BoundGraph& graph, const SignatureMemo& memo,
                       const std::vector<bool>& replayable);

/** The model's signature memos (host reads and replayable node outputs), by input signature, least recently
 * used dropped first. Safe to use from many threads: a mutex guards the list,
 * and a published memo is never written again. */
class SignatureMemoCache {
 public:
  static constexpr size_t kCapacity = 16;

  /** `graph` must outlive the cache. */
  explicit SignatureMemoCache(const BoundGraph& graph)
      : graph_(graph),
        rememberable_(signature_determined_inputs(graph)),
        replayable_(signature_determined_nodes(graph)) {}

  /** The memo of `signature` and its plan, or null when none is kept. */
  std::shared_ptr<const Replay> find(const std::string& signature);
  /** Keeps `memo` for `signature`, with its plan (a memo already there stays). */
  void insert(const std::string& signature, std::shared_ptr<const SignatureMemo> memo);
  /** Which inputs of each node may be remembered. */
  const std::vector<std::vector<bool>>& rememberable() const { return rememberable_; }
  /** Which nodes' outputs may be remembered (signature_determined_nodes). */
  const std::vector<bool>& replayable() const { return replayable_; }
  size_t size() const;

 private:
  const BoundGraph& graph_;
  const std::vector<std::vector<bool>> rememberable_;
  const std::vector<bool> replayable_;
  mutable std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const Replay>>> entries_;  // most recent first
};

}  // namespace transmuter
