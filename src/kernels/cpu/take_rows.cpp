#include "kernels/cpu/take_rows.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

namespace {

// Rows of about this many bytes per task.
constexpr int64_t kTaskBytes = int64_t{16} << 10;

// The gather as `outer` blocks of `rows` rows of row_bytes each (axis 0: one block).
struct RowLayout {
  int64_t outer, rows, row_bytes;
};

template <typename Index>
void copy_rows(const char* table, const RowLayout& l, const Index* indices, int64_t count, char* out) {
  parallel_for(l.outer * count, std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, l.row_bytes)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t item = begin; item < end; ++item) {
                   const int64_t o = item / count, i = item % count;
                   int64_t row = std::clamp<int64_t>(static_cast<int64_t>(indices[i]), -l.rows, l.rows - 1);
                   if (row < 0) row += l.rows;
                   std::memcpy(out + item * l.row_bytes, table + (o * l.rows + row) * l.row_bytes,
                               static_cast<size_t>(l.row_bytes));
                 }
               });
}

class TakeRowsKernel : public PartiallyDifferentiableKernel {
 public:
  TakeRowsKernel(mx::Stream stream, Reference reference, int axis)
      : PartiallyDifferentiableKernel(stream, std::move(reference)), axis_(axis) {}
  const char* name() const override { return "transmuter::TakeRows"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const TakeRowsKernel*>(&other);
    return o != nullptr && o->axis_ == axis_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array& data = in[0];
    const mx::array& indices = in[1];
    RowLayout layout{1, data.shape(axis_), 0};
    for (int d = 0; d < axis_; ++d) layout.outer *= data.shape(d);
    layout.row_bytes = static_cast<int64_t>(data.nbytes()) / (layout.outer * layout.rows);
    const auto count = static_cast<int64_t>(indices.size());
    const char* table = data.data<char>();
    char* y = out[0].data<char>();
    if (indices.dtype() == mx::int64) {
      return [table, layout, index = indices.data<int64_t>(), count, y] {
        copy_rows(table, layout, index, count, y);
      };
    }
    return [table, layout, index = indices.data<int32_t>(), count, y] {
      copy_rows(table, layout, index, count, y);
    };
  }

 private:
  int axis_;
};

}  // namespace

mx::array take_rows(const mx::array& data, const mx::array& indices, const Reference& reference,
                    mx::StreamOrDevice s, int axis) {
  const mx::Stream stream = mx::to_stream(s);
  const bool fits = is_cpu_stream(stream) && axis >= 0 && axis < static_cast<int>(data.ndim()) &&
                    data.size() > 0 && (indices.dtype() == mx::int64 || indices.dtype() == mx::int32) &&
                    indices.size() > 0;
  if (!fits) return reference({data, indices})[0];
  mx::Shape shape(data.shape().begin(), data.shape().begin() + axis);
  shape.insert(shape.end(), indices.shape().begin(), indices.shape().end());
  shape.insert(shape.end(), data.shape().begin() + axis + 1, data.shape().end());
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<TakeRowsKernel>(kernel_stream, reference, axis);
      },
      reference, {data, indices}, {shape}, {data.dtype()}, stream)[0];
}

}  // namespace transmuter::kernels
