#include "kernels/cpu/concatenate.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

namespace {

// About this many bytes copied a task.
constexpr int64_t kTaskBytes = int64_t{64} << 10;

class ConcatenateKernel : public CpuKernel {
 public:
  ConcatenateKernel(mx::Stream stream, Reference reference, int axis)
      : CpuKernel(stream, std::move(reference)), axis_(axis) {}
  const char* name() const override { return "transmuter::Concatenate"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const ConcatenateKernel*>(&other);
    return o != nullptr && o->axis_ == axis_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    int64_t outer = 1;
    for (int d = 0; d < axis_; ++d) outer *= in[0].shape(d);
    // Each part's block per outer index, and where it starts in the output's.
    std::vector<const char*> sources;
    std::vector<int64_t> bytes, starts;
    int64_t row = 0;
    for (const mx::array& part : in) {
      sources.push_back(part.data<char>());
      bytes.push_back(outer == 0 ? 0 : static_cast<int64_t>(part.nbytes()) / outer);
      starts.push_back(row);
      row += bytes.back();
    }
    return [sources = std::move(sources), bytes = std::move(bytes), starts = std::move(starts), outer, row,
            y = out[0].data<char>()] {
      const auto parts = static_cast<int64_t>(sources.size());
      parallel_for(outer * parts, std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, row / parts)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t item = begin; item < end; ++item) {
                       const int64_t o = item / parts, p = item % parts;
                       std::memcpy(y + o * row + starts[p], sources[p] + o * bytes[p],
                                   static_cast<size_t>(bytes[p]));
                     }
                   });
    };
  }

 private:
  int axis_;
};

}  // namespace

bool concatenate_fits(const std::vector<mx::array>& parts, int axis) {
  if (parts.size() < 2 || axis < 0 || axis >= static_cast<int>(parts[0].ndim())) return false;
  const size_t item = parts[0].itemsize();
  if (item != 1 && item != 2 && item != 4 && item != 8) return false;
  for (const mx::array& p : parts) {
    if (p.dtype() != parts[0].dtype() || p.ndim() != parts[0].ndim()) return false;
    for (int d = 0; d < static_cast<int>(p.ndim()); ++d) {
      if (d != axis && p.shape(d) != parts[0].shape(d)) return false;
    }
  }
  return true;
}

mx::array concatenate(const std::vector<mx::array>& parts, int axis, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [axis, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::concatenate(in, axis, stream)};
  };
  if (!concatenate_fits(parts, axis)) return reference(parts)[0];
  mx::Shape shape = parts[0].shape();
  shape[axis] = 0;
  for (const mx::array& p : parts) shape[axis] += p.shape(axis);
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<ConcatenateKernel>(kernel_stream, reference, axis);
      },
      reference, parts, {shape}, {parts[0].dtype()}, stream)[0];
}

}  // namespace transmuter::kernels
