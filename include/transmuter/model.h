// Loading an ONNX model: the Model handle and what it declares.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <mlx/array.h>

#include "transmuter/value.h"
#include "transmuter/value_info.h"

namespace transmuter {

namespace hub {
struct HubOptions;
}

namespace mx = mlx::core;

/** Trainable parameters: initializer name -> array. Arrays alias the model
 * file's memory where dtype and alignment allow. */
using Params = std::unordered_map<std::string, mx::array>;

/** The float type a float16/bfloat16 model computes in (LoadOptions::compute_type). */
enum class ComputeType {
  /** float32 when MLX's default device is the CPU when load() runs (as ONNX
   * Runtime's CPU provider effectively computes float16 models: its kernels
   * mostly compute in float, and MLX's CPU float16 kernels are scalar), the
   * model's own types on a GPU. */
  kAuto,
  /** Compute in float32: the compute_in_float32 pass. */
  kFloat32,
  /** Run the graph in the types it is written in; the keep_float32_islands
   * pass still computes normalizations that float16 would overflow in float32. */
  kModel,
};

struct LoadOptions {
  /** Run the load-time rewrites of src/passes/ (e.g. folding BatchNormalization
   * into the Conv before it). They can change params(): turn them off to
   * fine-tune exactly the weights stored in the file. */
  bool run_passes = true;
  /** With run_passes: run only these passes (by name, in the default order;
   * docs/architecture.md lists them). Empty runs every pass. An unknown name
   * throws std::invalid_argument from load(). */
  std::vector<std::string> only_passes = {};
  /** With run_passes, what a graph computing in float16/bfloat16 computes in.
   * Resolved to float32, the compute_in_float32 pass converts the model's
   * float16/bfloat16 initializers and constants to float32 once at load (they
   * take twice the memory, and params() holds them as float32) and its
   * internal values follow; inputs() and outputs() keep the types the file
   * declares (the inputs are cast up on entry, the outputs rounded once on
   * exit). Resolved to the model's types, keep_float32_islands runs instead.
   * Graphs without float16/bfloat16 values are unchanged either way. */
  ComputeType compute_type = ComputeType::kAuto;
  /** Outputs to compute at the last position of their last-but-one axis only: a
   * decoder's logits [batch, sequence, vocabulary], of which generation reads the
   * last position (TextGeneration asks for "logits"). Their declared dimension
   * becomes 1. Where only position-wise nodes follow the product that makes the
   * output (e.g. the lm_head MatMul), the positions are cut before it, which saves
   * its time and memory on a prompt. load() throws Error for a name that is no
   * output, or an output the graph's own nodes also read. */
  std::vector<std::string> last_position_outputs = {};
  /** Outputs that are a Concat of a graph input and new rows (a decoder's
   * presents: past_key_values.N.* with this step's keys or values appended
   * along the sequence axis), to compute as the new rows alone. A caller that
   * keeps its own cache needs no more (TextGeneration's static cache writes the
   * rows into its buffer), and the copy of the whole past into every present,
   * per layer and step, is not made. A name may hold one '*' standing for any
   * text ("present.*.key": every layer's key; "present.*": keys and values). All or nothing: when any named
   * output is not such a Concat, or a name names no output, no output changes; passes_applied() then does not
   * list "new_rows_outputs". Runs with or without run_passes. */
  std::vector<std::string> new_rows_outputs = {};
  /** For an `hf://org/repo` source that names no file: which ONNX file of the
   * repo to load, as transformers.js picks it (hub::onnx_file_candidates:
   * fp32, fp16, q8, int8, uint8, q4, q4f16, bnb4). */
  std::string dtype = "fp32";
  /** Hub settings for hf:// sources (transmuter/hub.h); null takes them all
   * from the environment, as huggingface_hub does. */
  std::shared_ptr<const hub::HubOptions> hub = nullptr;
};

/** A loaded model. Immutable after load: a copy is a cheap handle to the same
 * state, and any number of threads may read it and run it at once. */
class Model {
 public:
  /** Graph inputs the caller feeds (initializers excluded), in model order. */
  const std::vector<ValueInfo>& inputs() const;
  /** Graph outputs, in model order. */
  const std::vector<ValueInfo>& outputs() const;
  /** The initializers, to pass to run() or to differentiate against. */
  const Params& params() const;
  /** Opset imported for `domain` ("" is ai.onnx), or 0. */
  int64_t opset(const std::string& domain = "") const;
  const std::map<std::string, int64_t>& opsets() const;
  int64_t ir_version() const;
  const std::string& producer() const;
  /** Number of nodes of the main graph after load-time passes. */
  size_t node_count() const;
  /** Nodes of the main graph per op type ("Gemm", "com.microsoft.Attention"). */
  std::map<std::string, size_t> op_histogram() const;
  /** Graph inputs that some op reads on the host (a Reshape's shape...): fed
   * as CompileOptions::static_inputs they avoid graph breaks. */
  std::vector<std::string> inputs_read_on_host() const;
  /** Names of the load-time passes that changed the graph. */
  const std::vector<std::string>& passes_applied() const;

  /** Internal state (src/runtime/model_state.h); opaque to users. */
  struct State;
  const State& internal_state() const { return *state_; }
  explicit Model(std::shared_ptr<const State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<const State> state_;
};

/** Loads an ONNX model from a path (the `hf://` hub source comes with the hub
 * client). Throws ModelFormatError for a malformed file and UnsupportedError
 * listing every (domain, op_type, opset) that has no implementation. */
Model load(const std::string& source, const LoadOptions& options = {});

/** Reads a value stored as a serialized TensorProto, SequenceProto or
 * OptionalProto (the .pb files in test_data_set_N of ONNX node tests), as
 * `declared.kind` says (kUnknown: a TensorProto). An empty optional is a
 * `none` Value. Throws ModelFormatError on a malformed file. */
Value load_value_file(const std::string& path, const ValueInfo& declared);

}  // namespace transmuter
