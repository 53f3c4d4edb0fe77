// `transmuter run --dump-all DIR` and the test-only `--perturb-node NAME`:
// node hooks (RunOptions::node_hook) that write every node's outputs, or
// change one node's, for locating where a model first goes wrong
// (scripts/diff reads the dump beside ONNX Runtime's values).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "transmuter/runtime.h"

namespace transmuter::cli {

/** Writes each node's outputs as DIR/NNNNN_K.npy (node index, output
 * position) as the run goes, and with finish() DIR/index.json: per node its
 * index, name, domain, op type, input names and outputs (name, file, shape,
 * dtype; values that are not tensors are listed with `skipped` and what they
 * are). Evaluates every output: the run is a debugging one. */
class ValueDump {
 public:
  explicit ValueDump(std::filesystem::path dir);
  void operator()(NodeRun& run);
  /** Writes index.json. */
  void finish() const;

 private:
  std::filesystem::path dir_;
  std::string nodes_json_;  // the "nodes" array's entries so far
  size_t nodes_ = 0;
};

/** Test-only: replaces the float outputs of the node named `name` by
 * x * 1.1 + 0.1 (in their own dtype), so that scripts/diff's test has a known
 * first divergence. finish() throws when no node of that name ran or it had
 * no float output. */
class NodePerturbation {
 public:
  explicit NodePerturbation(std::string name) : name_(std::move(name)) {}
  void operator()(NodeRun& run);
  void finish() const;

 private:
  std::string name_;
  bool seen_ = false;
  bool changed_ = false;
};

}  // namespace transmuter::cli
