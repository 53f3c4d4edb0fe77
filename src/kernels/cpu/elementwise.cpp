// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); the kernels pick the best target of the CPU at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/elementwise.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/partial_vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

template <BinaryOp Op, class D, class V>
V Apply(D /*d*/, V a, V b) {
  if constexpr (Op == BinaryOp::kAdd) return hn::Add(a, b);
  if constexpr (Op == BinaryOp::kSubtract) return hn::Sub(a, b);
  if constexpr (Op == BinaryOp::kMultiply) return hn::Mul(a, b);
  if constexpr (Op == BinaryOp::kDivide) return hn::Div(a, b);
  // MLX's Maximum / Minimum: a if a is NaN or beats b, else b (so a NaN b wins too).
  if constexpr (Op == BinaryOp::kMaximum) return hn::IfThenElse(hn::Or(hn::IsNaN(a), hn::Gt(a, b)), a, b);
  if constexpr (Op == BinaryOp::kMinimum) return hn::IfThenElse(hn::Or(hn::IsNaN(a), hn::Lt(a, b)), a, b);
}

// y[i] = a[i or 0] (op) b[i or 0] for i < n: an operand that does not step repeats its first element.
template <BinaryOp Op>
void RowOf(const float* a, bool a_steps, const float* b, bool b_steps, float* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  auto load = [&](const float* p, bool steps, int64_t i) {
    return steps ? hn::LoadU(d, p + i) : hn::Set(d, *p);
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(Apply<Op>(d, load(a, a_steps, i), load(b, b_steps, i)), d, y + i);
  if (i == n) return;
  // The tail through one partial vector, so that it gets the same math.
  const size_t rest = static_cast<size_t>(n - i);
  const auto va = a_steps ? LoadFirst(d, a + i, rest) : hn::Set(d, *a);
  const auto vb = b_steps ? LoadFirst(d, b + i, rest) : hn::Set(d, *b);
  StoreFirst(Apply<Op>(d, va, vb), d, y + i, rest);
}

void BinaryRow(BinaryOp op, const float* a, bool a_steps, const float* b, bool b_steps, float* y, int64_t n) {
  switch (op) {
    case BinaryOp::kAdd:
      return RowOf<BinaryOp::kAdd>(a, a_steps, b, b_steps, y, n);
    case BinaryOp::kSubtract:
      return RowOf<BinaryOp::kSubtract>(a, a_steps, b, b_steps, y, n);
    case BinaryOp::kMultiply:
      return RowOf<BinaryOp::kMultiply>(a, a_steps, b, b_steps, y, n);
    case BinaryOp::kDivide:
      return RowOf<BinaryOp::kDivide>(a, a_steps, b, b_steps, y, n);
    case BinaryOp::kMaximum:
      return RowOf<BinaryOp::kMaximum>(a, a_steps, b, b_steps, y, n);
    case BinaryOp::kMinimum:
      return RowOf<BinaryOp::kMinimum>(a, a_steps, b, b_steps, y, n);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <memory>
#include <string>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(BinaryRow);

namespace {

// About this many elements a task: a few microseconds, enough to pay for waking a thread.
constexpr int64_t kTaskElements = 16384;

mx::array binary_reference(BinaryOp op, const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  switch (op) {
    case BinaryOp::kAdd:
      return mx::add(a, b, s);
    case BinaryOp::kSubtract:
      return mx::subtract(a, b, s);
    case BinaryOp::kMultiply:
      return mx::multiply(a, b, s);
    case BinaryOp::kDivide:
      return mx::divide(a, b, s);
    case BinaryOp::kMaximum:
      return mx::maximum(a, b, s);
    case BinaryOp::kMinimum:
      return mx::minimum(a, b, s);
  }
  throw std::logic_error("binary_reference: unknown op");
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "transmuter::Add";
    case BinaryOp::kSubtract:
      return "transmuter::Subtract";
    case BinaryOp::kMultiply:
      return "transmuter::Multiply";
    case BinaryOp::kDivide:
      return "transmuter::Divide";
    case BinaryOp::kMaximum:
      return "transmuter::Maximum";
    case BinaryOp::kMinimum:
      return "transmuter::Minimum";
  }
  return "transmuter::Binary";
}

// The element offsets of both operands at the start of row `row` of the loop.
void row_offsets(const BroadcastLoop& loop, int64_t row, int64_t& a, int64_t& b) {
  a = b = 0;
  for (size_t d = loop.outer.size(); d-- > 0;) {
    const int64_t i = row % loop.outer[d];
    row /= loop.outer[d];
    a += i * loop.a_strides[d];
    b += i * loop.b_strides[d];
  }
}

class BinaryKernel : public CpuKernel {
 public:
  BinaryKernel(mx::Stream stream, Reference reference, BinaryOp op, int donor)
      : CpuKernel(stream, std::move(reference)), op_(op), donor_(donor) {}
  const char* name() const override { return binary_name(op_); }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const BinaryKernel*>(&other);
    return o != nullptr && o->op_ == op_ && o->donor_ == donor_;
  }

 protected:
  // Each element reads its own slot of the donor before writing it (or, for a repeated operand, a slot
  // that is the donor's only when the shapes are equal).
  int donor_of(size_t) const override { return donor_; }

  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    auto loop = std::make_shared<const BroadcastLoop>(broadcast_loop(in[0].shape(), in[1].shape()));
    const float* a = in[0].data<float>();
    const float* b = in[1].data<float>();
    float* y = out[0].data<float>();
    const BinaryOp op = op_;
    return [loop, a, b, y, op] { run(*loop, op, a, b, y); };
  }

 private:
  static void run(const BroadcastLoop& loop, BinaryOp op, const float* a, const float* b, float* y) {
    if (loop.inner == 0) return;
    int64_t rows = 1;
    for (int64_t extent : loop.outer) rows *= extent;
    // Rows longer than a task are cut into pieces of kTaskElements.
    const int64_t pieces = (loop.inner + kTaskElements - 1) / kTaskElements;
    const int64_t piece = (loop.inner + pieces - 1) / pieces;
    const int64_t grain = pieces > 1 ? 1 : std::max<int64_t>(1, kTaskElements / loop.inner);
    parallel_for(rows * pieces, grain, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t row = item / pieces;
        const int64_t start = (item % pieces) * piece;
        const int64_t n = std::min(piece, loop.inner - start);
        int64_t ao = 0, bo = 0;
        row_offsets(loop, row, ao, bo);
        if (loop.a_steps) ao += start;
        if (loop.b_steps) bo += start;
        HWY_DYNAMIC_DISPATCH(BinaryRow)(op, a + ao, loop.a_steps, b + bo, loop.b_steps,
                                        y + row * loop.inner + start, n);
      }
    });
  }

  BinaryOp op_;
  int donor_;
};

template <typename From>
void widen(const From* x, float* y, int64_t count) {
  parallel_for(count, kTaskElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = static_cast<float>(x[i]);
  });
}

class ToFloat32Kernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "transmuter::ToFloat32"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const ToFloat32Kernel*>(&other) != nullptr;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const auto count = static_cast<int64_t>(in[0].size());
    float* y = out[0].data<float>();
    if (in[0].dtype() == mx::int64) return [x = in[0].data<int64_t>(), y, count] { widen(x, y, count); };
    if (in[0].dtype() == mx::int32) return [x = in[0].data<int32_t>(), y, count] { widen(x, y, count); };
    return [x = in[0].data<bool>(), y, count] { widen(x, y, count); };
  }
};

}  // namespace

BroadcastLoop broadcast_loop(const mx::Shape& a, const mx::Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  // Extents padded with leading ones, and each operand's contiguous strides (0 where it repeats).
  std::vector<int64_t> ea(rank, 1), eb(rank, 1), out(rank), sa(rank), sb(rank);
  std::copy(a.begin(), a.end(), ea.begin() + static_cast<ptrdiff_t>(rank - a.size()));
  std::copy(b.begin(), b.end(), eb.begin() + static_cast<ptrdiff_t>(rank - b.size()));
  int64_t step_a = 1, step_b = 1;
  for (size_t d = rank; d-- > 0;) {
    out[d] = ea[d] == 1 ? eb[d] : ea[d];
    sa[d] = ea[d] == 1 ? 0 : step_a;
    sb[d] = eb[d] == 1 ? 0 : step_b;
    step_a *= ea[d];
    step_b *= eb[d];
  }
  BroadcastLoop loop;
  if (std::find(out.begin(), out.end(), 0) != out.end()) {
    loop.inner = 0;
    return loop;
  }
  // Innermost first: merge a dimension into the one inside it when both operands step through the pair
  // as through one dimension; drop extents of 1.
  std::vector<int64_t> extents, strides_a, strides_b;
  for (size_t d = rank; d-- > 0;) {
    if (out[d] == 1) continue;
    if (!extents.empty() && sa[d] == strides_a.back() * extents.back() &&
        sb[d] == strides_b.back() * extents.back()) {
      extents.back() *= out[d];
      continue;
    }
    extents.push_back(out[d]);
    strides_a.push_back(sa[d]);
    strides_b.push_back(sb[d]);
  }
  if (extents.empty()) return loop;  // one element
  loop.inner = extents.front();
  loop.a_steps = strides_a.front() != 0;
  loop.b_steps = strides_b.front() != 0;
  loop.outer.assign(extents.rbegin(), extents.rend() - 1);
  loop.a_strides.assign(strides_a.rbegin(), strides_a.rend() - 1);
  loop.b_strides.assign(strides_b.rbegin(), strides_b.rend() - 1);
  return loop;
}

bool binary_fits(const mx::array& a, const mx::array& b) {
  if (a.dtype() != mx::float32 || b.dtype() != mx::float32) return false;
  const size_t rank = std::max(a.ndim(), b.ndim());
  for (size_t i = 1; i <= rank; ++i) {
    const int da = i <= a.ndim() ? a.shape(static_cast<int>(a.ndim() - i)) : 1;
    const int db = i <= b.ndim() ? b.shape(static_cast<int>(b.ndim() - i)) : 1;
    if (da != db && da != 1 && db != 1) return false;
  }
  return true;
}

mx::array binary(BinaryOp op, const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [op, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{binary_reference(op, in[0], in[1], stream)};
  };
  if (!binary_fits(a, b)) return binary_reference(op, a, b, stream);
  const mx::Shape shape = mx::broadcast_shapes(a.shape(), b.shape());
  const int donor = a.shape() == shape ? 0 : b.shape() == shape ? 1 : -1;
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<BinaryKernel>(kernel_stream, reference, op, donor);
      },
      reference, {a, b}, {shape}, {mx::float32}, stream)[0];
}

bool to_float32_fits(const mx::array& x) {
  return x.dtype() == mx::int64 || x.dtype() == mx::int32 || x.dtype() == mx::bool_;
}

mx::array to_float32(const mx::array& x, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::astype(in[0], mx::float32, stream)};
  };
  if (!to_float32_fits(x)) return reference({x})[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<ToFloat32Kernel>(kernel_stream, reference); },
      reference, {x}, {x.shape()}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
