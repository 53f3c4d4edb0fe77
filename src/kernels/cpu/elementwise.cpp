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
#include <stdexcept>
#include <string>
#include <type_traits>

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

mx::array compare_reference(CompareOp op, const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  switch (op) {
    case CompareOp::kEqual:
      return mx::equal(a, b, s);
    case CompareOp::kLess:
      return mx::less(a, b, s);
    case CompareOp::kLessEqual:
      return mx::less_equal(a, b, s);
    case CompareOp::kGreater:
      return mx::greater(a, b, s);
    case CompareOp::kGreaterEqual:
      return mx::greater_equal(a, b, s);
    case CompareOp::kAnd:
      return mx::logical_and(a, b, s);
    case CompareOp::kOr:
      return mx::logical_or(a, b, s);
  }
  throw std::logic_error("compare_reference: unknown op");
}

// Rows of the loop (cut into pieces of kTaskElements where longer) across the kernel threads:
// row(offsets, out, n) with each operand's element offset at the piece's start and the output's.
template <typename Row>
void for_each_row(const BroadcastLoop& loop, const Row& row) {
  if (loop.inner == 0) return;
  int64_t rows = 1;
  for (int64_t extent : loop.outer) rows *= extent;
  const int64_t pieces = (loop.inner + kTaskElements - 1) / kTaskElements;
  const int64_t piece = (loop.inner + pieces - 1) / pieces;
  const int64_t grain = pieces > 1 ? 1 : std::max<int64_t>(1, kTaskElements / loop.inner);
  const size_t operands = loop.steps.size();
  parallel_for(rows * pieces, grain, [&](int64_t begin, int64_t end) {
    int64_t offsets[kMaxBroadcastOperands];
    for (int64_t item = begin; item < end; ++item) {
      int64_t rest = item / pieces;
      const int64_t start = (item % pieces) * piece;
      const int64_t first = rest * loop.inner + start;
      for (size_t k = 0; k < operands; ++k) offsets[k] = loop.steps[k] ? start : 0;
      for (size_t d = loop.outer.size(); d-- > 0;) {
        const int64_t i = rest % loop.outer[d];
        rest /= loop.outer[d];
        for (size_t k = 0; k < operands; ++k) offsets[k] += i * loop.strides[k][d];
      }
      row(offsets, first, std::min(piece, loop.inner - start));
    }
  });
}

// The output's buffer may be the first operand of its shape (when MLX would donate it): every element
// is read before its own slot is written, and a repeating operand is never the output's shape.
int donor_among(const std::vector<mx::array>& operands, const mx::Shape& shape, mx::Dtype dtype) {
  for (size_t i = 0; i < operands.size(); ++i) {
    if (operands[i].shape() == shape && operands[i].dtype() == dtype) return static_cast<int>(i);
  }
  return -1;
}

bool shapes_broadcast(const std::vector<mx::array>& operands) {
  size_t rank = 0;
  for (const mx::array& a : operands) rank = std::max(rank, a.ndim());
  for (size_t i = 1; i <= rank; ++i) {
    int extent = 1;
    for (const mx::array& a : operands) {
      const int d = i <= a.ndim() ? a.shape(static_cast<int>(a.ndim() - i)) : 1;
      if (d == 1) continue;
      if (extent != 1 && extent != d) return false;
      extent = d;
    }
  }
  return true;
}

// A kernel over broadcast operands: the loop is made from the inputs' shapes when the task is.
class BroadcastKernel : public CpuKernel {
 public:
  BroadcastKernel(mx::Stream stream, Reference reference, int donor)
      : CpuKernel(stream, std::move(reference)), donor_(donor) {}

 protected:
  int donor_of(size_t) const override { return donor_; }
  static std::shared_ptr<const BroadcastLoop> loop_of(const std::vector<mx::array>& in) {
    std::vector<mx::Shape> shapes;
    for (const mx::array& a : in) shapes.push_back(a.shape());
    return std::make_shared<const BroadcastLoop>(broadcast_loop(shapes));
  }
  int donor_;
};

class BinaryKernel : public BroadcastKernel {
 public:
  BinaryKernel(mx::Stream stream, Reference reference, BinaryOp op, int donor)
      : BroadcastKernel(stream, std::move(reference), donor), op_(op) {}
  const char* name() const override { return binary_name(op_); }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const BinaryKernel*>(&other);
    return o != nullptr && o->op_ == op_ && o->donor_ == donor_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    return [loop = loop_of(in), a = in[0].data<float>(), b = in[1].data<float>(), y = out[0].data<float>(),
            op = op_] {
      for_each_row(*loop, [&](const int64_t* at, int64_t first, int64_t n) {
        HWY_DYNAMIC_DISPATCH(BinaryRow)(op, a + at[0], loop->steps[0], b + at[1], loop->steps[1], y + first,
                                        n);
      });
    };
  }

 private:
  BinaryOp op_;
};

const char* compare_name(CompareOp op) {
  switch (op) {
    case CompareOp::kEqual:
      return "transmuter::Equal";
    case CompareOp::kLess:
      return "transmuter::Less";
    case CompareOp::kLessEqual:
      return "transmuter::LessEqual";
    case CompareOp::kGreater:
      return "transmuter::Greater";
    case CompareOp::kGreaterEqual:
      return "transmuter::GreaterEqual";
    case CompareOp::kAnd:
      return "transmuter::LogicalAnd";
    case CompareOp::kOr:
      return "transmuter::LogicalOr";
  }
  return "transmuter::Compare";
}

template <typename T>
bool compare_values(CompareOp op, T a, T b) {
  switch (op) {
    case CompareOp::kEqual:
      return a == b;
    case CompareOp::kLess:
      return a < b;
    case CompareOp::kLessEqual:
      return a <= b;
    case CompareOp::kGreater:
      return a > b;
    case CompareOp::kGreaterEqual:
      return a >= b;
    case CompareOp::kAnd:
      return static_cast<bool>(a) && static_cast<bool>(b);
    case CompareOp::kOr:
      return static_cast<bool>(a) || static_cast<bool>(b);
  }
  return false;
}

class CompareKernel : public BroadcastKernel {
 public:
  CompareKernel(mx::Stream stream, Reference reference, CompareOp op, int donor)
      : BroadcastKernel(stream, std::move(reference), donor), op_(op) {}
  const char* name() const override { return compare_name(op_); }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const CompareKernel*>(&other);
    return o != nullptr && o->op_ == op_ && o->donor_ == donor_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    switch (in[0].dtype()) {
      case mx::float32:
        return task<float>(in, out);
      case mx::int64:
        return task<int64_t>(in, out);
      case mx::int32:
        return task<int32_t>(in, out);
      default:
        return task<bool>(in, out);
    }
  }

 private:
  template <typename T>
  KernelTask task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const {
    return [loop = loop_of(in), a = in[0].data<T>(), b = in[1].data<T>(), y = out[0].data<bool>(), op = op_] {
      for_each_row(*loop, [&](const int64_t* at, int64_t first, int64_t n) {
        const int64_t sa = loop->steps[0] ? 1 : 0, sb = loop->steps[1] ? 1 : 0;
        for (int64_t i = 0; i < n; ++i)
          y[first + i] = compare_values(op, a[at[0] + i * sa], b[at[1] + i * sb]);
      });
    };
  }

  CompareOp op_;
};

class SelectKernel : public BroadcastKernel {
 public:
  using BroadcastKernel::BroadcastKernel;
  const char* name() const override { return "transmuter::Select"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const SelectKernel*>(&other);
    return o != nullptr && o->donor_ == donor_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    switch (in[1].itemsize()) {  // values are moved, not computed: by their width
      case 8:
        return task<uint64_t>(in, out);
      case 4:
        return task<uint32_t>(in, out);
      default:
        return task<uint8_t>(in, out);
    }
  }

 private:
  template <typename T>
  KernelTask task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const {
    return [loop = loop_of(in), c = in[0].data<bool>(), a = in[1].data<T>(), b = in[2].data<T>(),
            y = out[0].data<T>()] {
      for_each_row(*loop, [&](const int64_t* at, int64_t first, int64_t n) {
        const int64_t sc = loop->steps[0] ? 1 : 0, sa = loop->steps[1] ? 1 : 0, sb = loop->steps[2] ? 1 : 0;
        for (int64_t i = 0; i < n; ++i)
          y[first + i] = c[at[0] + i * sc] ? a[at[1] + i * sa] : b[at[2] + i * sb];
      });
    };
  }
};

template <typename From, typename To>
void convert_elements(const From* x, To* y, int64_t count) {
  parallel_for(count, kTaskElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if constexpr (std::is_same_v<To, bool>) {
        y[i] = x[i] != From{0};
      } else {
        y[i] = static_cast<To>(x[i]);
      }
    }
  });
}

class ConvertKernel : public CpuKernel {
 public:
  ConvertKernel(mx::Stream stream, Reference reference, mx::Dtype to)
      : CpuKernel(stream, std::move(reference)), to_(to) {}
  const char* name() const override { return "transmuter::Convert"; }
  // The target type is the kernel's (MLX's merge of equivalent primitives looks at their inputs only).
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const ConvertKernel*>(&other);
    return o != nullptr && o->to_ == to_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    switch (out[0].dtype()) {
      case mx::float32:
        return from<float>(in[0], out[0]);
      case mx::bool_:
        return from<bool>(in[0], out[0]);
      case mx::int64:
        return from<int64_t>(in[0], out[0]);
      default:
        return from<int32_t>(in[0], out[0]);
    }
  }

 private:
  template <typename To>
  static KernelTask from(const mx::array& x, mx::array& y) {
    const auto count = static_cast<int64_t>(x.size());
    To* to = y.data<To>();
    switch (x.dtype()) {
      case mx::float32:
        return [x = x.data<float>(), to, count] { convert_elements(x, to, count); };
      case mx::int64:
        return [x = x.data<int64_t>(), to, count] { convert_elements(x, to, count); };
      case mx::int32:
        return [x = x.data<int32_t>(), to, count] { convert_elements(x, to, count); };
      default:
        return [x = x.data<bool>(), to, count] { convert_elements(x, to, count); };
    }
  }

  mx::Dtype to_;
};

bool is_one_of(mx::Dtype t, std::initializer_list<mx::Dtype> types) {
  for (mx::Dtype u : types) {
    if (t == u) return true;
  }
  return false;
}

}  // namespace

BroadcastLoop broadcast_loop(const std::vector<mx::Shape>& shapes) {
  if (shapes.empty() || shapes.size() > static_cast<size_t>(kMaxBroadcastOperands))
    throw std::invalid_argument("broadcast_loop: 1 to " + std::to_string(kMaxBroadcastOperands) +
                                " operands");
  const size_t operands = shapes.size();
  size_t rank = 0;
  for (const mx::Shape& sh : shapes) rank = std::max(rank, sh.size());
  // Extents padded with leading ones, and each operand's contiguous strides (0 where it repeats).
  std::vector<std::vector<int64_t>> extent(operands, std::vector<int64_t>(rank, 1)), stride = extent;
  std::vector<int64_t> out(rank, 1);
  for (size_t k = 0; k < operands; ++k) {
    std::copy(shapes[k].begin(), shapes[k].end(),
              extent[k].begin() + static_cast<ptrdiff_t>(rank - shapes[k].size()));
    int64_t step = 1;
    for (size_t d = rank; d-- > 0;) {
      if (extent[k][d] != 1) out[d] = extent[k][d];
      stride[k][d] = extent[k][d] == 1 ? 0 : step;
      step *= extent[k][d];
    }
  }
  BroadcastLoop loop;
  loop.strides.assign(operands, {});
  loop.steps.assign(operands, true);
  if (std::find(out.begin(), out.end(), 0) != out.end()) {
    loop.inner = 0;
    return loop;
  }
  // Innermost first: merge a dimension into the one inside it when every operand steps through the pair
  // as through one dimension; drop extents of 1.
  std::vector<int64_t> extents;
  std::vector<std::vector<int64_t>> merged(operands);
  for (size_t d = rank; d-- > 0;) {
    if (out[d] == 1) continue;
    bool mergeable = !extents.empty();
    for (size_t k = 0; k < operands && mergeable; ++k)
      mergeable = stride[k][d] == merged[k].back() * extents.back();
    if (mergeable) {
      extents.back() *= out[d];
      continue;
    }
    extents.push_back(out[d]);
    for (size_t k = 0; k < operands; ++k) merged[k].push_back(stride[k][d]);
  }
  if (extents.empty()) return loop;  // one element
  loop.inner = extents.front();
  loop.outer.assign(extents.rbegin(), extents.rend() - 1);
  for (size_t k = 0; k < operands; ++k) {
    loop.steps[k] = merged[k].front() != 0;
    loop.strides[k].assign(merged[k].rbegin(), merged[k].rend() - 1);
  }
  return loop;
}

bool binary_fits(const mx::array& a, const mx::array& b) {
  return a.dtype() == mx::float32 && b.dtype() == mx::float32 && shapes_broadcast({a, b});
}

mx::array binary(BinaryOp op, const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [op, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{binary_reference(op, in[0], in[1], stream)};
  };
  if (!binary_fits(a, b)) return binary_reference(op, a, b, stream);
  const mx::Shape shape = mx::broadcast_shapes(a.shape(), b.shape());
  const int donor = donor_among({a, b}, shape, mx::float32);
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<BinaryKernel>(kernel_stream, reference, op, donor);
      },
      reference, {a, b}, {shape}, {mx::float32}, stream)[0];
}

bool compare_fits(CompareOp op, const mx::array& a, const mx::array& b) {
  const bool logical = op == CompareOp::kAnd || op == CompareOp::kOr;
  const bool typed =
      logical ? a.dtype() == mx::bool_ : is_one_of(a.dtype(), {mx::float32, mx::int64, mx::int32, mx::bool_});
  return typed && a.dtype() == b.dtype() && shapes_broadcast({a, b});
}

mx::array compare(CompareOp op, const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [op, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{compare_reference(op, in[0], in[1], stream)};
  };
  if (!compare_fits(op, a, b)) return compare_reference(op, a, b, stream);
  const mx::Shape shape = mx::broadcast_shapes(a.shape(), b.shape());
  const int donor = donor_among({a, b}, shape, mx::bool_);
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<CompareKernel>(kernel_stream, reference, op, donor);
      },
      reference, {a, b}, {shape}, {mx::bool_}, stream)[0];
}

bool select_fits(const mx::array& condition, const mx::array& a, const mx::array& b) {
  return condition.dtype() == mx::bool_ && a.dtype() == b.dtype() &&
         is_one_of(a.dtype(), {mx::float32, mx::int64, mx::int32, mx::bool_}) &&
         shapes_broadcast({condition, a, b});
}

mx::array select(const mx::array& condition, const mx::array& a, const mx::array& b, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::where(in[0], in[1], in[2], stream)};
  };
  if (!select_fits(condition, a, b)) return reference({condition, a, b})[0];
  mx::Shape shape = mx::broadcast_shapes(condition.shape(), mx::broadcast_shapes(a.shape(), b.shape()));
  const int donor = donor_among({condition, a, b}, shape, a.dtype());
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<SelectKernel>(kernel_stream, reference, donor);
      },
      reference, {condition, a, b}, {shape}, {a.dtype()}, stream)[0];
}

bool convert_fits(const mx::array& x, mx::Dtype to) {
  const mx::Dtype from = x.dtype();
  if (from == to) return false;
  if (to == mx::float32) return is_one_of(from, {mx::int64, mx::int32, mx::bool_});
  if (to == mx::bool_) return is_one_of(from, {mx::float32, mx::int64, mx::int32});
  return is_one_of(to, {mx::int64, mx::int32}) && is_one_of(from, {mx::int64, mx::int32, mx::bool_});
}

mx::array convert(const mx::array& x, mx::Dtype to, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [to, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::astype(in[0], to, stream)};
  };
  if (!convert_fits(x, to)) return reference({x})[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<ConvertKernel>(kernel_stream, reference, to); },
      reference, {x}, {x.shape()}, {to}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
