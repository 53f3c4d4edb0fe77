// Control flow: If, Loop, Scan. https://onnx.ai/onnx/operators/
//
// Bodies run through NodeContext::run_subgraph in a child scope that sees the
// enclosing graph's names (outer-scope captures). Conditions and trip counts
// are read on the host, so:
//   - If lists its condition in host_inputs: a condition known while tracing
//     (a static input, or computed from shapes) takes one branch inside the
//     compiled segment; a traced condition makes the If a graph break.
//   - Loop is eager_only: its trip count and the condition its body computes
//     are read after every iteration, so it runs per iteration between
//     compiled segments (docs/architecture.md, "Control flow").
//   - Scan has no data-dependent control: its iteration count is a dim of its
//     scan inputs, so it unrolls inside a compiled segment.
// The planner also makes an If or Scan a graph break when a node of its body
// would be one (src/runtime/segments.cpp).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// Value of a one-element boolean (or numeric) tensor read on the host: a
// Loop condition produced by its body.
bool host_condition(const NodeContext& ctx, const Value& v, std::string_view what) {
  if (!v.is_tensor()) throw ctx.error(what, " must be a tensor, got ", v.describe());
  const mx::array& a = v.tensor();
  if (a.size() != 1) throw ctx.error(what, " must hold one value, got ", a.size());
  if (a.is_tracer()) throw ctx.error(what, " is computed from traced data and cannot be read while tracing");
  mx::array b = mx::astype(mx::flatten(a, mx::Device::cpu), mx::bool_, mx::Device::cpu);
  mx::eval(b);
  return b.data<bool>()[0];
}

// True when a declared body output is a sequence, optional or string tensor:
// such If/Loop/Scan outputs cannot cross a compiled boundary.
bool body_outputs_non_tensor(const Node& node) {
  for (const Attribute& attr : node.attributes) {
    if (!attr.g) continue;
    for (const ValueInfo& out : attr.g->outputs) {
      bool string_tensor = out.kind == ValueInfo::Kind::kTensor && out.elem_type == OnnxType::kString;
      if (out.kind == ValueInfo::Kind::kSequence || out.kind == ValueInfo::Kind::kOptional ||
          out.kind == ValueInfo::Kind::kMap || string_tensor) {
        return true;
      }
    }
  }
  return false;
}

// An empty scan output for a Loop or Scan that ran zero iterations: [0] plus
// the body output's declared dims when all are known, else just [0].
mx::array empty_scan_output(const ValueInfo& declared, int axis_position) {
  mx::Shape shape;
  bool known = declared.has_shape;
  for (const Dim& d : declared.shape) {
    known = known && d.value.has_value() && *d.value >= 0;
    if (known) shape.push_back(static_cast<int>(*d.value));
  }
  if (!known) shape.clear();
  shape.insert(shape.begin() + std::min<size_t>(axis_position, shape.size()), 0);
  mx::Dtype dtype = to_mlx_dtype(declared.elem_type).value_or(mx::float32);
  return mx::zeros(shape, dtype);
}

// Stacks per-iteration values along a new `axis` (already normalized for the
// result's rank); every iteration must give the same shape and dtype.
mx::array stack_iterations(const NodeContext& ctx, const std::vector<mx::array>& items, int axis,
                           std::string_view what) {
  for (const mx::array& item : items) {
    if (item.shape() != items.front().shape() || item.dtype() != items.front().dtype()) {
      throw ctx.error(what, " changes shape or dtype between iterations");
    }
  }
  return mx::stack(items, axis, ctx.stream());
}

// --- If ------------------------------------------------------------------------

OpOutputs if_op(NodeContext& ctx) {
  const mx::array& cond = ctx.input(0);
  if (cond.size() != 1) throw ctx.error("cond must hold one value, got ", cond.size());
  bool take_then = ctx.host_int(0) != 0;
  const Graph& branch = ctx.attr_graph(take_then ? "then_branch" : "else_branch");
  std::vector<Value> outputs = ctx.run_subgraph(branch, {});
  if (outputs.size() != ctx.num_outputs()) {
    throw ctx.error(take_then ? "then" : "else", "_branch has ", outputs.size(), " outputs, the node ",
                    ctx.num_outputs());
  }
  return outputs;
}

// --- Loop ------------------------------------------------------------------------

// Body: (iteration_num, cond, carried...) -> (cond, carried..., scan outputs...).
// Node: (M?, cond?, carried...) -> (carried..., scan outputs stacked on axis 0).
OpOutputs loop_op(NodeContext& ctx) {
  const Graph& body = ctx.attr_graph("body");
  if (ctx.num_inputs() < 2) throw ctx.error("needs the inputs M and cond (each may be empty)");
  const size_t carried = ctx.num_inputs() - 2;
  if (body.inputs.size() != carried + 2) {
    throw ctx.error("body takes ", body.inputs.size(), " inputs, expected ", carried + 2,
                    " (iteration_num, cond and ", carried, " loop-carried values)");
  }
  if (body.outputs.size() < carried + 1) {
    throw ctx.error("body has ", body.outputs.size(), " outputs, expected at least ", carried + 1);
  }
  const size_t scans = body.outputs.size() - 1 - carried;
  // An omitted M or cond means "no limit" from that side (spec table).
  const bool has_limit = ctx.has_input(0);
  const int64_t trip_count = has_limit ? ctx.host_int(0) : 0;
  bool cond = ctx.has_input(1) ? ctx.host_int(1) != 0 : true;
  std::vector<Value> state;
  for (size_t i = 0; i < carried; ++i) state.push_back(ctx.value(i + 2));
  std::vector<std::vector<mx::array>> scan_values(scans);

  for (int64_t iteration = 0; cond && (!has_limit || iteration < trip_count); ++iteration) {
    std::vector<Value> body_inputs{mx::array(static_cast<int64_t>(iteration)), mx::array(cond)};
    body_inputs.insert(body_inputs.end(), state.begin(), state.end());
    std::vector<Value> out = ctx.run_subgraph(body, body_inputs);
    cond = host_condition(ctx, out[0], "the body's cond output");
    std::copy(out.begin() + 1, out.begin() + 1 + static_cast<std::ptrdiff_t>(carried), state.begin());
    for (size_t k = 0; k < scans; ++k) {
      const Value& v = out[1 + carried + k];
      if (!v.is_tensor()) throw ctx.error("scan output ", k, " must be a tensor, got ", v.describe());
      scan_values[k].push_back(v.tensor());
    }
  }

  OpOutputs outputs = std::move(state);
  for (size_t k = 0; k < scans; ++k) {
    const ValueInfo& declared = body.outputs[1 + carried + k];
    outputs.push_back(scan_values[k].empty() ? empty_scan_output(declared, 0)
                                             : stack_iterations(ctx, scan_values[k], 0, "a scan output"));
  }
  return outputs;
}

// --- Scan (opset 9+) -------------------------------------------------------------

// Element `index` of `x` along `axis`, with that axis removed.
mx::array slice_at(const mx::array& x, int axis, int index, mx::StreamOrDevice s) {
  mx::Shape start(x.ndim(), 0);
  mx::Shape stop = x.shape();
  start[axis] = index;
  stop[axis] = index + 1;
  return mx::squeeze(mx::slice(x, start, stop, s), axis, s);
}

std::vector<int64_t> attr_per_item(const NodeContext& ctx, std::string_view name, size_t count) {
  std::vector<int64_t> values = ctx.attr_ints(name, std::vector<int64_t>(count, 0));
  if (values.size() != count) throw ctx.error(name, " has ", values.size(), " entries, expected ", count);
  return values;
}

void check_directions(const NodeContext& ctx, std::string_view name, const std::vector<int64_t>& directions) {
  for (int64_t d : directions) {
    if (d != 0 && d != 1) throw ctx.error(name, " holds ", d, "; directions are 0 (forward) or 1 (reverse)");
  }
}

// Body: (state..., scan slices...) -> (state..., scan outputs...).
OpOutputs scan_v9(NodeContext& ctx) {
  const Graph& body = ctx.attr_graph("body");
  const int64_t num_scan_inputs = ctx.required_int("num_scan_inputs");
  if (num_scan_inputs < 1 || num_scan_inputs > static_cast<int64_t>(ctx.num_inputs())) {
    throw ctx.error("num_scan_inputs ", num_scan_inputs, " is outside [1, ", ctx.num_inputs(), "]");
  }
  const size_t scan_inputs = static_cast<size_t>(num_scan_inputs);
  const size_t states = ctx.num_inputs() - scan_inputs;
  if (body.inputs.size() != ctx.num_inputs()) {
    throw ctx.error("body takes ", body.inputs.size(), " inputs, the node gives ", ctx.num_inputs());
  }
  if (body.outputs.size() < states) {
    throw ctx.error("body has fewer outputs than the ", states, " state values");
  }
  const size_t scan_outputs = body.outputs.size() - states;
  std::vector<int64_t> input_axes = attr_per_item(ctx, "scan_input_axes", scan_inputs);
  std::vector<int64_t> input_directions = attr_per_item(ctx, "scan_input_directions", scan_inputs);
  std::vector<int64_t> output_axes = attr_per_item(ctx, "scan_output_axes", scan_outputs);
  std::vector<int64_t> output_directions = attr_per_item(ctx, "scan_output_directions", scan_outputs);
  check_directions(ctx, "scan_input_directions", input_directions);
  check_directions(ctx, "scan_output_directions", output_directions);

  std::vector<mx::array> xs;
  std::vector<int> axes;
  int length = -1;
  for (size_t j = 0; j < scan_inputs; ++j) {
    const mx::array& x = ctx.input(states + j);
    int axis = ctx.normalize_axis(input_axes[j], static_cast<int>(x.ndim()));
    if (x.ndim() == 0) throw ctx.error("scan input ", j, " is a scalar; it needs an axis to scan");
    if (length >= 0 && x.shape(axis) != length) {
      throw ctx.error("scan input ", j, " has ", x.shape(axis), " elements along its scan axis, input 0 has ",
                      length);
    }
    length = x.shape(axis);
    xs.push_back(x);
    axes.push_back(axis);
  }

  std::vector<Value> state;
  for (size_t i = 0; i < states; ++i) state.push_back(ctx.value(i));
  std::vector<std::vector<mx::array>> per_iteration(scan_outputs);
  for (int t = 0; t < length; ++t) {
    std::vector<Value> body_inputs = state;
    for (size_t j = 0; j < scan_inputs; ++j) {
      int index = input_directions[j] == 1 ? length - 1 - t : t;
      body_inputs.push_back(slice_at(xs[j], axes[j], index, ctx.stream()));
    }
    std::vector<Value> out = ctx.run_subgraph(body, body_inputs);
    std::copy(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(states), state.begin());
    for (size_t k = 0; k < scan_outputs; ++k) {
      const Value& v = out[states + k];
      if (!v.is_tensor()) throw ctx.error("scan output ", k, " must be a tensor, got ", v.describe());
      per_iteration[k].push_back(v.tensor());
    }
  }

  OpOutputs outputs = std::move(state);
  for (size_t k = 0; k < scan_outputs; ++k) {
    std::vector<mx::array>& items = per_iteration[k];
    if (items.empty()) {
      outputs.push_back(empty_scan_output(body.outputs[states + k], 0));
      continue;
    }
    // A reverse output is written from the last position to the first.
    if (output_directions[k] == 1) std::reverse(items.begin(), items.end());
    int axis = ctx.normalize_axis(output_axes[k], static_cast<int>(items.front().ndim()) + 1);
    outputs.push_back(stack_iterations(ctx, items, axis, "a scan output"));
  }
  return outputs;
}

// --- Scan (opset 8) --------------------------------------------------------------

// Opset 8: every state and scan input has a leading batch axis, scan inputs
// scan along axis 1, and the optional input 0 (sequence_lens) gives each batch
// entry its own length; scan outputs are zero-padded to the longest.
OpOutputs scan_v8(NodeContext& ctx) {
  const Graph& body = ctx.attr_graph("body");
  const int64_t num_scan_inputs = ctx.required_int("num_scan_inputs");
  if (num_scan_inputs < 1 || num_scan_inputs + 1 > static_cast<int64_t>(ctx.num_inputs())) {
    throw ctx.error("num_scan_inputs ", num_scan_inputs, " is outside [1, ", ctx.num_inputs() - 1, "]");
  }
  const size_t scan_inputs = static_cast<size_t>(num_scan_inputs);
  const size_t states = ctx.num_inputs() - 1 - scan_inputs;
  if (body.inputs.size() != states + scan_inputs) {
    throw ctx.error("body takes ", body.inputs.size(), " inputs, expected ", states + scan_inputs);
  }
  if (body.outputs.size() < states) {
    throw ctx.error("body has fewer outputs than the ", states, " state values");
  }
  const size_t scan_outputs = body.outputs.size() - states;
  std::vector<int64_t> directions = attr_per_item(ctx, "directions", scan_inputs);
  check_directions(ctx, "directions", directions);

  const mx::array& first = ctx.input(1);
  if (first.ndim() == 0) throw ctx.error("inputs need a leading batch axis");
  const int batch = first.shape(0);
  int max_length = -1;
  for (size_t j = 0; j < scan_inputs; ++j) {
    const mx::array& x = ctx.input(1 + states + j);
    if (x.ndim() < 2) throw ctx.error("scan input ", j, " needs a batch and a sequence axis");
    if (max_length >= 0 && x.shape(1) != max_length) throw ctx.error("scan inputs differ in sequence length");
    max_length = x.shape(1);
  }
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    const mx::array& x = ctx.input(i);
    if (x.ndim() == 0 || x.shape(0) != batch) {
      throw ctx.error("input ", i, " does not have batch size ", batch);
    }
  }
  std::vector<int64_t> lengths(batch, max_length);
  if (ctx.has_input(0)) {
    lengths = ctx.host_ints(0);
    if (lengths.size() != static_cast<size_t>(batch)) {
      throw ctx.error("sequence_lens has ", lengths.size(), " entries for batch ", batch);
    }
    for (int64_t n : lengths) {
      if (n < 0 || n > max_length) {
        throw ctx.error("sequence length ", n, " is outside [0, ", max_length, "]");
      }
    }
  }

  std::vector<std::vector<mx::array>> final_states(states), scanned(scan_outputs);
  for (int b = 0; b < batch; ++b) {
    std::vector<Value> state;
    for (size_t i = 0; i < states; ++i) state.push_back(slice_at(ctx.input(1 + i), 0, b, ctx.stream()));
    const int length = static_cast<int>(lengths[b]);
    std::vector<std::vector<mx::array>> per_iteration(scan_outputs);
    for (int t = 0; t < length; ++t) {
      std::vector<Value> body_inputs = state;
      for (size_t j = 0; j < scan_inputs; ++j) {
        mx::array row = slice_at(ctx.input(1 + states + j), 0, b, ctx.stream());
        body_inputs.push_back(slice_at(row, 0, directions[j] == 1 ? length - 1 - t : t, ctx.stream()));
      }
      std::vector<Value> out = ctx.run_subgraph(body, body_inputs);
      std::copy(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(states), state.begin());
      for (size_t k = 0; k < scan_outputs; ++k) per_iteration[k].push_back(out[states + k].tensor());
    }
    for (size_t i = 0; i < states; ++i) final_states[i].push_back(state[i].tensor());
    for (size_t k = 0; k < scan_outputs; ++k) {
      if (per_iteration[k].empty()) {
        throw ctx.error("batch entry ", b, " has length 0; its scan output shape is unknown");
      }
      mx::array seq = stack_iterations(ctx, per_iteration[k], 0, "a scan output");
      if (length < max_length) {
        std::vector<std::pair<int, int>> pad(seq.ndim(), {0, 0});
        pad[0] = {0, max_length - length};
        seq = mx::pad(seq, pad, mx::array(0, seq.dtype()), "constant", ctx.stream());
      }
      scanned[k].push_back(seq);
    }
  }
  OpOutputs outputs;
  for (auto& items : final_states) outputs.push_back(stack_iterations(ctx, items, 0, "a state"));
  for (auto& items : scanned) outputs.push_back(stack_iterations(ctx, items, 0, "a scan output"));
  return outputs;
}

}  // namespace

void register_controlflow(OpRegistry& r) {
  constexpr auto kBodies = body_outputs_non_tensor;
  constexpr std::string_view kScanShapes = "scan outputs must keep one shape across iterations";
  r.add({
      // If 11 lets branches give different shapes, 13 adds sequences, 16 optionals.
      {.op_type = "If", .domain = kOnnx, .since = 1, .until = 10, .fn = if_op, .host_inputs = {0},
       .makes_non_tensor = kBodies},
      {.op_type = "If", .domain = kOnnx, .since = 11, .until = 12, .fn = if_op, .host_inputs = {0},
       .makes_non_tensor = kBodies},
      {.op_type = "If", .domain = kOnnx, .since = 13, .until = 15, .fn = if_op, .host_inputs = {0},
       .makes_non_tensor = kBodies},
      {.op_type = "If", .domain = kOnnx, .since = 16, .until = kOpen, .fn = if_op, .host_inputs = {0},
       .makes_non_tensor = kBodies},
      // Loop is eager_only, so M and cond are not host_inputs although they are
      // read on the host: a static M would not remove the break, only multiply
      // plans. Loop 11 makes M and cond optional in practice and lets scan
      // outputs vary in shape (not here), 13 adds sequences, 16 optionals.
      {.op_type = "Loop", .domain = kOnnx, .since = 1, .until = 10, .fn = loop_op, .eager_only = true,
       .restrictions = kScanShapes, .makes_non_tensor = kBodies},
      {.op_type = "Loop", .domain = kOnnx, .since = 11, .until = 12, .fn = loop_op, .eager_only = true,
       .restrictions = kScanShapes, .makes_non_tensor = kBodies},
      {.op_type = "Loop", .domain = kOnnx, .since = 13, .until = 15, .fn = loop_op, .eager_only = true,
       .restrictions = kScanShapes, .makes_non_tensor = kBodies},
      {.op_type = "Loop", .domain = kOnnx, .since = 16, .until = kOpen, .fn = loop_op, .eager_only = true,
       .restrictions = kScanShapes, .makes_non_tensor = kBodies},
      // Scan 8 batches every input; 9 drops the batch axis and adds per-input
      // axes and directions; 11 allows negative axes.
      {.op_type = "Scan", .domain = kOnnx, .since = 8, .until = 8, .fn = scan_v8, .host_inputs = {0},
       .restrictions = "every batch entry must have a nonzero sequence length", .makes_non_tensor = kBodies},
      {.op_type = "Scan", .domain = kOnnx, .since = 9, .until = 10, .fn = scan_v9,
       .makes_non_tensor = kBodies},
      {.op_type = "Scan", .domain = kOnnx, .since = 11, .until = kOpen, .fn = scan_v9,
       .makes_non_tensor = kBodies},
  });
}

}  // namespace transmuter
