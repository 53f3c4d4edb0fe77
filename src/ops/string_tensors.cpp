#include "ops/string_tensors.h"

#include <algorithm>

namespace transmuter {

std::vector<int64_t> broadcast_shapes(const NodeContext& ctx, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b) {
  size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) throw ctx.error("shapes do not broadcast: ", da, " vs ", db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

size_t broadcast_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& index) {
  size_t lead = index.size() - shape.size();
  size_t offset = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    offset = offset * shape[i] + (shape[i] == 1 ? 0 : index[lead + i]);
  }
  return offset;
}

bool next_index(std::vector<int64_t>& index, const std::vector<int64_t>& shape) {
  for (size_t d = shape.size(); d-- > 0;) {
    if (++index[d] < shape[d]) return true;
    index[d] = 0;
  }
  return false;
}

mx::array bool_tensor(const NodeContext& ctx, const std::vector<int64_t>& shape,
                      const std::vector<bool>& flags) {
  const mx::Shape out_shape = to_shape(ctx, shape);
  std::vector<uint8_t> bytes(flags.begin(), flags.end());
  mx::array flat = mx::array(
      bytes.begin(), mx::Shape{to_int32(ctx, static_cast<int64_t>(bytes.size()), "element count")}, mx::uint8);
  return mx::astype(mx::reshape(flat, out_shape, mx::Device::cpu), mx::bool_, mx::Device::cpu);
}

}  // namespace transmuter
