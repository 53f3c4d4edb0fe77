// Where each row of a [..., n] score tensor finds its row of an additive mask
// that broadcasts against it ([B, 1, 1, n] or [B, 1, S, n] against [B, H, S,
// n]), by index math instead of a materialized broadcast.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

class MaskRows {
 public:
  static constexpr int kMaxRank = 8;

  /** The row map of a row-contiguous `mask` against `scores`, or nullopt when
   * the mask does not broadcast to scores with its own last axis equal to
   * scores' (rank above scores', a size that is neither 1 nor equal, a last
   * axis of 1, or more than kMaxRank axes). */
  static std::optional<MaskRows> of(const mx::Shape& scores, const mx::Shape& mask) {
    const int rank = static_cast<int>(scores.size());
    const int mask_rank = static_cast<int>(mask.size());
    if (rank < 1 || rank > kMaxRank || mask_rank < 1 || mask_rank > rank) return std::nullopt;
    if (mask.back() != scores.back()) return std::nullopt;
    MaskRows rows;
    rows.row_axes_ = rank - 1;
    // Walk from the last row axis outwards; the mask's axes align at the end.
    int64_t mask_stride = mask.back();
    for (int axis = rank - 2; axis >= 0; --axis) {
      const int mask_axis = axis - (rank - mask_rank);
      const int64_t size = scores[axis];
      const int64_t mask_size = mask_axis >= 0 ? mask[mask_axis] : 1;
      if (mask_size != size && mask_size != 1) return std::nullopt;
      rows.sizes_[axis] = size;
      rows.strides_[axis] = mask_size == 1 ? 0 : mask_stride;
      mask_stride *= mask_size;
    }
    return rows;
  }

  /** The element offset of the mask row that applies to score row `row`. */
  int64_t offset(int64_t row) const {
    int64_t at = 0;
    for (int axis = row_axes_ - 1; axis >= 0; --axis) {
      at += (row % sizes_[axis]) * strides_[axis];
      row /= sizes_[axis];
    }
    return at;
  }

 private:
  int row_axes_ = 0;
  std::array<int64_t, kMaxRank> sizes_{};
  std::array<int64_t, kMaxRank> strides_{};
};

}  // namespace transmuter::kernels
