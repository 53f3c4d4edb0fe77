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

template <typename Index>
void copy_rows(const char* table, int64_t rows, int64_t row_bytes, const Index* indices, int64_t count,
               char* out) {
  parallel_for(count, std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, row_bytes)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t i = begin; i < end; ++i) {
                   int64_t row = std::clamp<int64_t>(static_cast<int64_t>(indices[i]), -rows, rows - 1);
                   if (row < 0) row += rows;
                   std::memcpy(out + i * row_bytes, table + row * row_bytes, static_cast<size_t>(row_bytes));
                 }
               });
}

class TakeRowsKernel : public PartiallyDifferentiableKernel {
 public:
  using PartiallyDifferentiableKernel::PartiallyDifferentiableKernel;
  const char* name() const override { return "transmuter::TakeRows"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const TakeRowsKernel*>(&other) != nullptr;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array& data = in[0];
    const mx::array& indices = in[1];
    const int64_t rows = data.shape(0);
    const auto row_bytes = static_cast<int64_t>(data.nbytes()) / rows;
    const auto count = static_cast<int64_t>(indices.size());
    const char* table = data.data<char>();
    char* y = out[0].data<char>();
    if (indices.dtype() == mx::int64) {
      return [table, rows, row_bytes, index = indices.data<int64_t>(), count, y] {
        copy_rows(table, rows, row_bytes, index, count, y);
      };
    }
    return [table, rows, row_bytes, index = indices.data<int32_t>(), count, y] {
      copy_rows(table, rows, row_bytes, index, count, y);
    };
  }
};

}  // namespace

mx::array take_rows(const mx::array& data, const mx::array& indices, const Reference& reference,
                    mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  const bool fits = is_cpu_stream(stream) && data.ndim() >= 1 && data.shape(0) > 0 &&
                    (indices.dtype() == mx::int64 || indices.dtype() == mx::int32) && indices.size() > 0;
  if (!fits) return reference({data, indices})[0];
  mx::Shape shape = indices.shape();
  shape.insert(shape.end(), data.shape().begin() + 1, data.shape().end());
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<TakeRowsKernel>(kernel_stream, reference); },
      reference, {data, indices}, {shape}, {data.dtype()}, stream)[0];
}

}  // namespace transmuter::kernels
