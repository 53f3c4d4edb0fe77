#include "runtime/host_reads.h"

#include <unordered_set>

#include "graph/subgraphs.h"

namespace transmuter {

ReplayPlan plan_replay(const BoundGraph& bound, const SignatureMemo& memo,
                       const std::vector<bool>& replayable) {
  const Graph& graph = *bound.graph;
  ReplayPlan plan;
  // What the nodes that run (their subgraphs included) and the graph's outputs read.
  std::unordered_set<std::string> read;
  for (const ValueInfo& out : graph.outputs) read.insert(out.name);
  for (size_t n = 0; n < bound.size(); ++n) {
    if (replayable[n] && memo.outputs(n) != nullptr) continue;
    plan.nodes.push_back(n);
    for (std::string& name : node_reads(bound.node(n))) read.insert(std::move(name));
  }
  for (size_t n = 0; n < bound.size(); ++n) {
    const std::vector<Value>* kept = replayable[n] ? memo.outputs(n) : nullptr;
    if (kept == nullptr) continue;
    const Node& node = bound.node(n);
    for (size_t i = 0; i < kept->size(); ++i) {
      if (read.contains(node.outputs[i])) plan.bindings.emplace_back(node.outputs[i], (*kept)[i]);
    }
  }
  return plan;
}

std::shared_ptr<const Replay> SignatureMemoCache::find(const std::string& signature) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->first != signature) continue;
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front().second;
  }
  return nullptr;
}

void SignatureMemoCache::insert(const std::string& signature, std::shared_ptr<const SignatureMemo> memo) {
  ReplayPlan plan = plan_replay(graph_, *memo, replayable_);
  auto replay = std::make_shared<const Replay>(Replay{std::move(memo), std::move(plan)});
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& entry : entries_) {
    if (entry.first == signature) return;  // another thread published it first
  }
  entries_.emplace_front(signature, std::move(replay));
  if (entries_.size() > kCapacity) entries_.pop_back();
}

size_t SignatureMemoCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace transmuter
