// GatherRows (ai.transmuter, since 1), made by src/passes/gather_rows_in_place.cpp:
//
//   Y = Gather(T, indices, axis = 0)      for a table T held as its rows' bytes:
//
//   inputs      0 rows      uint8 [R, B]: row r holds the B bytes of T[r] (little-endian elements)
//               1 indices   int32 / int64, any shape (negative ones count from the end)
//   attributes  to          T's element type (an ONNX TensorProto type number)
//               row_shape   T's shape past its first axis (B = its element count x the type's size)
//   output      Y           `to`, [indices..., row_shape...]
//
// A table whose bytes sit misaligned in the model file cannot be wrapped as a float array; as bytes it
// can. Gathering the bytes of the rows asked for and reading them as `to` (mx::view of the freshly
// gathered, aligned rows) replaces a copy of the whole table at load (all-MiniLM's embedding table:
// 30522 x 384 floats, 45 MiB, for a handful of rows per run). The gather's index checks are Gather's.
#include <cstdint>
#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/onnx/indexing.h"
#include "ops/registry.h"
#include "transmuter/dtype.h"

namespace transmuter {
namespace {

OpOutputs gather_rows(NodeContext& ctx) {
  const mx::array& rows = ctx.input(0);
  const mx::array& indices = ctx.input(1);
  if (rows.dtype() != mx::uint8 || rows.ndim() != 2) {
    throw ctx.error("rows must be uint8 [R, B] (each row's bytes), got ", rows.dtype(), " of rank ",
                    rows.ndim());
  }
  const auto to = static_cast<OnnxType>(ctx.required_int("to"));
  const std::optional<mx::Dtype> dtype = to_mlx_dtype(to);
  if (!dtype || dtype->size() == 0)
    throw ctx.error("'to' names no element type a row can hold: ", static_cast<int>(to));
  const std::vector<int64_t> row_shape = ctx.attr_ints("row_shape");
  int64_t row_elements = 1;
  for (int64_t d : row_shape) {
    if (d < 0) throw ctx.error("row_shape has a negative dimension");
    row_elements *= d;
  }
  if (row_elements * static_cast<int64_t>(dtype->size()) != rows.shape(1)) {
    throw ctx.error("row_shape holds ", row_elements, " elements of ", onnx_type_name(to), ", ",
                    row_elements * dtype->size(), " bytes, but each row has ", rows.shape(1));
  }
  mx::array bytes = checked_gather(ctx, rows, indices, 0);  // [indices..., B], freshly laid out
  mx::Shape shape = indices.shape();
  for (int64_t d : row_shape) shape.push_back(static_cast<int>(d));
  if (row_elements == 0) return {mx::zeros(shape, *dtype, ctx.stream())};
  return {mx::reshape(mx::view(bytes, *dtype, ctx.stream()), shape, ctx.stream())};
}

}  // namespace

void register_transmuter_indexing(OpRegistry& r) {
  r.add({
      {"GatherRows",
       kTransmuter,
       1,
       kOpen,
       gather_rows,
       {},
       false,
       {},
       "the table is bytes (uint8): no gradient reaches it; the indices are integers"},
  });
}

}  // namespace transmuter
