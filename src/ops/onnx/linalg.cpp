// Linear algebra: Det.
// https://onnx.ai/onnx/operators/onnx__Det.html
#include <mlx/linalg.h>
#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// Determinants of the square matrices in the last two dims of [*, M, M].
// MLX's linalg runs on the CPU only, so this op always uses a CPU stream;
// half-precision inputs are computed in float32.
OpOutputs det(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 2 || x.shape(rank - 1) != x.shape(rank - 2)) {
    throw ctx.error("input must be [*, M, M] (square matrices in the last two dims), got rank ", rank);
  }
  if (!mx::issubdtype(x.dtype(), mx::floating))
    throw ctx.error("input must be a float tensor, got ", x.dtype());
  const mx::Dtype compute = x.dtype() == mx::float64 ? mx::float64 : mx::float32;
  mx::array d = mx::linalg::det(mx::astype(x, compute, mx::Device::cpu), mx::Device::cpu);
  return {mx::astype(d, x.dtype(), ctx.stream())};
}

}  // namespace

void register_linalg(OpRegistry& r) {
  r.add({
      {.op_type = "Det", .domain = kOnnx, .since = 11, .until = 21, .fn = det},
      {.op_type = "Det", .domain = kOnnx, .since = 22, .until = kOpen, .fn = det},  // v22: bfloat16
  });
}

}  // namespace transmuter
