// rotate_half_rotary: plain loops (a row of D floats per (batch, head, position); the work is a few
// thousand elements a decode step, so the compiler's vectorization of the baseline target serves).
#include "kernels/cpu/rotary.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {
namespace {

/** One row: y = x * c + rotate_half(x) * s over D = 2h values. */
void rotate_row(const float* x, const float* c, const float* s, float* y, int64_t h) {
  for (int64_t d = 0; d < h; ++d) y[d] = x[d] * c[d] + (-x[d + h]) * s[d];
  for (int64_t d = h; d < 2 * h; ++d) y[d] = x[d] * c[d] + x[d - h] * s[d];
}

class RotateHalfRotaryKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "transmuter::RotateHalfRotary"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const RotateHalfRotaryKernel*>(&other) != nullptr;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* x = in[0].data<float>();
    const float* c = in[1].data<float>();
    const float* s = in[2].data<float>();
    float* y = out[0].data<float>();
    const int64_t batch = in[0].shape(0), heads = in[0].shape(1), positions = in[0].shape(2);
    const int64_t d = in[0].shape(3);
    const bool table_per_batch = in[1].shape(0) != 1, table_per_head = in[1].shape(1) != 1;
    const int64_t table_heads = table_per_head ? heads : 1;
    return [=] {
      const int64_t rows = batch * heads * positions;
      parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)), [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const int64_t p = row % positions, bh = row / positions;
          const int64_t b = bh / heads, h = bh % heads;
          const int64_t table_row =
              ((table_per_batch ? b : 0) * table_heads + (table_per_head ? h : 0)) * positions + p;
          rotate_row(x + row * d, c + table_row * d, s + table_row * d, y + row * d, d / 2);
        }
      });
    };
  }
};

bool table_fits(const mx::array& x, const mx::array& table) {
  return table.dtype() == mx::float32 && table.ndim() == 4 && (table.shape(0) == 1 || table.shape(0) == x.shape(0)) &&
         (table.shape(1) == 1 || table.shape(1) == x.shape(1)) && table.shape(2) == x.shape(2) &&
         table.shape(3) == x.shape(3);
}

}  // namespace

bool rotate_half_rotary_fits(const mx::array& x, const mx::array& cos, const mx::array& sin) {
  return x.dtype() == mx::float32 && x.ndim() == 4 && x.shape(3) % 2 == 0 && table_fits(x, cos) &&
         table_fits(x, sin) && cos.shape() == sin.shape();
}

mx::array rotate_half_rotary_reference(const mx::array& x, const mx::array& cos, const mx::array& sin,
                                       mx::StreamOrDevice s) {
  const int h = x.shape(-1) / 2;
  mx::Shape start(x.ndim(), 0), stop = x.shape();
  stop.back() = h;
  mx::array first = mx::slice(x, start, stop, s);
  start.back() = h;
  stop.back() = 2 * h;
  mx::array second = mx::slice(x, start, stop, s);
  mx::array rotated = mx::concatenate({mx::negative(second, s), first}, -1, s);
  return mx::add(mx::multiply(x, cos, s), mx::multiply(rotated, sin, s), s);
}

mx::array rotate_half_rotary(const mx::array& x, const mx::array& cos, const mx::array& sin,
                             mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{rotate_half_rotary_reference(in[0], in[1], in[2], stream)};
  };
  if (!rotate_half_rotary_fits(x, cos, sin)) return reference({x, cos, sin})[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<RotateHalfRotaryKernel>(kernel_stream, reference); },
      reference, {x, cos, sin}, {x.shape()}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
