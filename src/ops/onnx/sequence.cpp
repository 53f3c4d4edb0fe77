// Sequence and optional operators: SequenceEmpty, SequenceConstruct,
// SequenceInsert, SequenceErase, SequenceAt, SequenceLength, SplitToSequence,
// ConcatFromSequence, SequenceMap, Optional, OptionalHasElement,
// OptionalGetElement. https://onnx.ai/onnx/operators/
//
// Sequences are C++ values (a Value of kind sequence holding tensors) and an
// empty optional is a `none` Value; an optional that holds an element is that
// element itself. Neither can cross a compiled boundary, so every op here is
// eager_only and the ones that output a sequence or optional say so
// (makes_non_tensor): their readers run eagerly too. Positions and split sizes
// are read on the host, which an eager op may always do; they are not
// host_inputs, since making them static inputs would remove no graph break.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

bool always(const Node&) { return true; }

const Sequence& sequence_input(const NodeContext& ctx, size_t i) {
  const Value& v = ctx.value(i);
  if (!v.is_sequence()) throw ctx.error("input ", i, " must be a sequence, got ", v.describe());
  return v.sequence_items();
}

// A position read on the host, checked against [-size, size] (insert) or
// [-size, size - 1] (at, erase), negative counting from the back.
size_t host_position(const NodeContext& ctx, size_t input, size_t size, bool one_past_end) {
  int64_t position = ctx.host_int(input);
  const int64_t n = static_cast<int64_t>(size);
  const int64_t high = one_past_end ? n : n - 1;
  if (position < -n || position > high) {
    throw ctx.error("position ", position, " is outside [", -n, ", ", high, "] for a sequence of ", size);
  }
  return static_cast<size_t>(position < 0 ? position + n : position);
}

// All tensors of a sequence share one element type (spec type constraint).
void check_same_dtype(const NodeContext& ctx, const Sequence& items, const mx::array& tensor) {
  for (const Value& item : items) {
    if (item.is_tensor() && item.tensor().dtype() != tensor.dtype()) {
      std::ostringstream have, got;
      have << item.tensor().dtype();
      got << tensor.dtype();
      throw ctx.error("tensor of dtype ", got.str(), " does not match the sequence's ", have.str());
    }
  }
}

// --- construction and access -------------------------------------------------------

OpOutputs sequence_empty(NodeContext&) { return {Value::sequence({})}; }

OpOutputs sequence_construct(NodeContext& ctx) {
  if (ctx.num_inputs() == 0) throw ctx.error("needs at least one tensor");
  Sequence items;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const mx::array& t = ctx.input(i);
    check_same_dtype(ctx, items, t);
    items.push_back(t);
  }
  return {Value::sequence(std::move(items))};
}

OpOutputs sequence_insert(NodeContext& ctx) {
  Sequence items = sequence_input(ctx, 0);
  const mx::array& tensor = ctx.input(1);
  check_same_dtype(ctx, items, tensor);
  size_t at = ctx.has_input(2) ? host_position(ctx, 2, items.size(), true) : items.size();
  items.insert(items.begin() + static_cast<std::ptrdiff_t>(at), tensor);
  return {Value::sequence(std::move(items))};
}

OpOutputs sequence_erase(NodeContext& ctx) {
  Sequence items = sequence_input(ctx, 0);
  if (items.empty()) throw ctx.error("cannot erase from an empty sequence");
  size_t at = ctx.has_input(1) ? host_position(ctx, 1, items.size(), false) : items.size() - 1;
  items.erase(items.begin() + static_cast<std::ptrdiff_t>(at));
  return {Value::sequence(std::move(items))};
}

OpOutputs sequence_at(NodeContext& ctx) {
  const Sequence& items = sequence_input(ctx, 0);
  return {items[host_position(ctx, 1, items.size(), false)]};
}

OpOutputs sequence_length(NodeContext& ctx) {
  return {mx::array(static_cast<int64_t>(sequence_input(ctx, 0).size()))};
}

// --- tensor <-> sequence -------------------------------------------------------------

OpOutputs split_to_sequence(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.ndim() == 0) throw ctx.error("input must have at least one dimension");
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", 0), static_cast<int>(x.ndim()));
  const int64_t dim = x.shape(axis);
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (!ctx.has_input(1)) {
    // No split: pieces of one, with the axis dropped unless keepdims.
    sizes.assign(static_cast<size_t>(dim), 1);
    squeeze = ctx.attr_int("keepdims", 1) == 0;
  } else if (ctx.input(1).ndim() == 0) {
    int64_t chunk = ctx.host_int(1);
    if (chunk <= 0) throw ctx.error("split ", chunk, " must be positive");
    for (int64_t done = 0; done < dim; done += chunk) sizes.push_back(std::min(chunk, dim - done));
  } else {
    if (ctx.input(1).ndim() != 1) throw ctx.error("split must be a scalar or 1-D");
    sizes = ctx.host_ints(1);
    int64_t total = 0;
    for (int64_t s : sizes) {
      if (s < 0 || s > dim) throw ctx.error("split size ", s, " is outside [0, ", dim, "]");
      total += s;
    }
    if (total != dim) throw ctx.error("split sizes sum to ", total, ", the axis has ", dim);
  }
  Sequence items;
  mx::Shape start(x.ndim(), 0);
  mx::Shape stop = x.shape();
  int64_t offset = 0;
  for (int64_t s : sizes) {
    start[axis] = static_cast<int>(offset);
    stop[axis] = static_cast<int>(offset + s);
    mx::array piece = mx::slice(x, start, stop, ctx.stream());
    items.push_back(squeeze ? mx::squeeze(piece, axis, ctx.stream()) : piece);
    offset += s;
  }
  return {Value::sequence(std::move(items))};
}

OpOutputs concat_from_sequence(NodeContext& ctx) {
  const Sequence& items = sequence_input(ctx, 0);
  if (items.empty()) throw ctx.error("cannot concatenate an empty sequence");
  std::vector<mx::array> tensors;
  for (const Value& item : items) {
    if (!item.is_tensor()) throw ctx.error("sequence items must be tensors, got ", item.describe());
    tensors.push_back(item.tensor());
  }
  const bool new_axis = ctx.attr_int("new_axis", 0) == 1;
  const int rank = static_cast<int>(tensors.front().ndim());
  const int axis = ctx.normalize_axis(ctx.required_int("axis"), new_axis ? rank + 1 : rank);
  for (const mx::array& t : tensors) {
    if (static_cast<int>(t.ndim()) != rank) throw ctx.error("sequence items differ in rank");
    if (t.dtype() != tensors.front().dtype()) throw ctx.error("sequence items differ in dtype");
  }
  if (new_axis) return {mx::stack(tensors, axis, ctx.stream())};
  return {mx::concatenate(tensors, axis, ctx.stream())};
}

// --- SequenceMap -------------------------------------------------------------------

// Body input j takes element i of input j when that is a sequence, else the
// whole tensor; body output k, over all i, becomes output sequence k.
OpOutputs sequence_map(NodeContext& ctx) {
  const Graph& body = ctx.attr_graph("body");
  const size_t count = sequence_input(ctx, 0).size();
  if (body.inputs.size() != ctx.num_inputs()) {
    throw ctx.error("body takes ", body.inputs.size(), " inputs, the node gives ", ctx.num_inputs());
  }
  for (size_t j = 1; j < ctx.num_inputs(); ++j) {
    const Value& v = ctx.value(j);
    if (v.is_sequence() && v.sequence_items().size() != count) {
      throw ctx.error("input ", j, " holds ", v.sequence_items().size(), " items, input 0 holds ", count);
    }
  }
  std::vector<Sequence> outputs(body.outputs.size());
  for (size_t i = 0; i < count; ++i) {
    std::vector<Value> body_inputs;
    for (size_t j = 0; j < ctx.num_inputs(); ++j) {
      const Value& v = ctx.value(j);
      body_inputs.push_back(v.is_sequence() ? v.sequence_items()[i] : v);
    }
    std::vector<Value> out = ctx.run_subgraph(body, body_inputs);
    for (size_t k = 0; k < out.size(); ++k) outputs[k].push_back(std::move(out[k]));
  }
  OpOutputs result;
  for (Sequence& items : outputs) result.push_back(Value::sequence(std::move(items)));
  return result;
}

// --- optionals ---------------------------------------------------------------------

// With an input: an optional holding it (the value itself); without: empty.
OpOutputs optional_op(NodeContext& ctx) {
  if (!ctx.has_input(0) && !ctx.has_attr("type")) {
    throw ctx.error("an empty Optional needs the 'type' attribute");
  }
  return {ctx.value(0)};
}

OpOutputs optional_has_element(NodeContext& ctx) { return {mx::array(ctx.has_input(0))}; }

OpOutputs optional_get_element(NodeContext& ctx) {
  if (!ctx.has_input(0)) throw ctx.error("the optional input is empty");
  return {ctx.value(0)};
}

}  // namespace

void register_sequence(OpRegistry& r) {
  r.add({
      {.op_type = "SequenceEmpty", .domain = kOnnx, .since = 11, .until = kOpen, .fn = sequence_empty,
       .eager_only = true, .restrictions = "an empty sequence does not keep its dtype",
       .makes_non_tensor = always},
      {.op_type = "SequenceConstruct", .domain = kOnnx, .since = 11, .until = kOpen, .fn = sequence_construct,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "SequenceInsert", .domain = kOnnx, .since = 11, .until = kOpen, .fn = sequence_insert,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "SequenceErase", .domain = kOnnx, .since = 11, .until = kOpen, .fn = sequence_erase,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "SequenceAt", .domain = kOnnx, .since = 11, .until = kOpen, .fn = sequence_at,
       .eager_only = true},
      {.op_type = "SequenceLength", .domain = kOnnx, .since = 11, .until = kOpen, .fn = sequence_length,
       .eager_only = true, .not_differentiable = "integer output"},
      // 24 adds element types only.
      {.op_type = "SplitToSequence", .domain = kOnnx, .since = 11, .until = 23, .fn = split_to_sequence,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "SplitToSequence", .domain = kOnnx, .since = 24, .until = kOpen, .fn = split_to_sequence,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "ConcatFromSequence", .domain = kOnnx, .since = 11, .until = kOpen,
       .fn = concat_from_sequence, .eager_only = true,
       .restrictions = "an empty sequence is an error (its dtype is not kept)"},
      {.op_type = "SequenceMap", .domain = kOnnx, .since = 17, .until = kOpen, .fn = sequence_map,
       .eager_only = true, .makes_non_tensor = always},
      // 18 lets OptionalHasElement/GetElement take plain tensors and sequences
      // (and an omitted input); 28 adds element types.
      {.op_type = "Optional", .domain = kOnnx, .since = 15, .until = 27, .fn = optional_op,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "Optional", .domain = kOnnx, .since = 28, .until = kOpen, .fn = optional_op,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "OptionalHasElement", .domain = kOnnx, .since = 15, .until = 17, .fn = optional_has_element,
       .eager_only = true, .not_differentiable = "boolean output"},
      {.op_type = "OptionalHasElement", .domain = kOnnx, .since = 18, .until = 27, .fn = optional_has_element,
       .eager_only = true, .not_differentiable = "boolean output"},
      {.op_type = "OptionalHasElement", .domain = kOnnx, .since = 28, .until = kOpen,
       .fn = optional_has_element, .eager_only = true, .not_differentiable = "boolean output"},
      {.op_type = "OptionalGetElement", .domain = kOnnx, .since = 15, .until = 17, .fn = optional_get_element,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "OptionalGetElement", .domain = kOnnx, .since = 18, .until = 27, .fn = optional_get_element,
       .eager_only = true, .makes_non_tensor = always},
      {.op_type = "OptionalGetElement", .domain = kOnnx, .since = 28, .until = kOpen,
       .fn = optional_get_element, .eager_only = true, .makes_non_tensor = always},
  });
}

}  // namespace transmuter
