// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); bias_activation picks the best target of the CPU at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/activation.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/activation.h"

#ifndef TRANSMUTER_KERNELS_CPU_ACTIVATION_ARGS
#define TRANSMUTER_KERNELS_CPU_ACTIVATION_ARGS
namespace transmuter::kernels {
// The pointers of one call (outside the per-target namespaces: every target's
// code takes the same struct). x and y hold `d`-long rows; bias is null or d long.
struct ActivationArgs {
  const float* x;
  const float* bias;
  float* y;
  int64_t d;
  Activation activation;
};

// erf(x) ~= x P(x^2) / Q(x^2) on [-4, 4]: the fit of src/ops/rational_erf.cpp
// (scripts/fit_rational_erf.py), max abs error 3.8e-7. Beyond |x| = 4, erf
// rounds to +-1 in float32.
inline constexpr float kErfNumerator[] = {1.1283790e+00f, 1.9230819e-01f, 5.2981764e-02f,
                                          3.8447063e-03f, 2.8618801e-04f, 2.0272867e-06f};
inline constexpr float kErfDenominator[] = {1.0000000e+00f, 5.0376058e-01f, 1.1487953e-01f,
                                            1.5124429e-02f, 1.1810574e-03f, 3.7928556e-05f};
}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V>
V Horner(D d, const float (&c)[6], V u) {
  V acc = hn::Set(d, c[5]);
  for (int i = 4; i >= 0; --i) acc = hn::MulAdd(acc, u, hn::Set(d, c[i]));
  return acc;
}

template <class D, class V>
V Erf(D d, V x) {
  const V xc = hn::Clamp(x, hn::Set(d, -4.0f), hn::Set(d, 4.0f));
  const V u = hn::Mul(xc, xc);
  const V y = hn::Div(hn::Mul(xc, Horner(d, kErfNumerator, u)), Horner(d, kErfDenominator, u));
  // Rounding can overshoot by an ulp near +-4; erf is bounded by 1.
  return hn::Clamp(y, hn::Set(d, -1.0f), hn::Set(d, 1.0f));
}

template <class D, class V>
V Sigmoid(D d, V z) {
  // exp(88) is finite in float32; below z = -88 the result (< 6.1e-39) is off
  // by less than that absolute amount.
  const V e = hn::Exp(d, hn::Min(hn::Neg(z), hn::Set(d, 88.0f)));
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, e));
}

template <Activation A, class D, class V>
V Formula(D d, V z) {
  const V half = hn::Set(d, 0.5f);
  const V one = hn::Set(d, 1.0f);
  if constexpr (A == Activation::kGeluErf) {
    const V cdf = hn::Add(one, Erf(d, hn::Mul(z, hn::Set(d, static_cast<float>(M_SQRT1_2)))));
    return hn::Mul(hn::Mul(half, z), cdf);
  } else if constexpr (A == Activation::kGeluTanh) {
    // sqrt(2/pi) (z + 0.044715 z^3) = z (c0 + c0 0.044715 z^2)
    const float c0 = static_cast<float>(std::sqrt(2.0 / M_PI));
    const V inner = hn::Mul(z, hn::MulAdd(hn::Set(d, c0 * 0.044715f), hn::Mul(z, z), hn::Set(d, c0)));
    return hn::Mul(hn::Mul(half, z), hn::Add(one, hn::Tanh(d, inner)));
  } else if constexpr (A == Activation::kSigmoid) {
    return Sigmoid(d, z);
  } else if constexpr (A == Activation::kSilu) {
    return hn::Mul(z, Sigmoid(d, z));
  } else if constexpr (A == Activation::kTanh) {
    return hn::Tanh(d, z);
  } else {
    static_assert(A == Activation::kErf);
    return Erf(d, z);
  }
}

template <Activation A, class D, class V>
V Activate(D d, V z) {
  if constexpr (A == Activation::kIdentity) {
    return z;
  } else {
    // The clamps in the formulas (Min/Max) would turn NaN into a bound.
    return hn::IfThenElse(hn::IsNaN(z), z, Formula<A>(d, z));
  }
}

// y[i] = f(x[i] + bias[i]) for i < n; bias may be null.
template <Activation A>
void Segment(const float* x, const float* bias, float* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto z = hn::LoadU(d, x + i);
    if (bias != nullptr) z = hn::Add(z, hn::LoadU(d, bias + i));
    hn::StoreU(Activate<A>(d, z), d, y + i);
  }
  if (i == n) return;
  // The tail through a full vector, so that it gets the same math.
  HWY_ALIGN float buffer[HWY_MAX_BYTES / sizeof(float)] = {};
  const size_t rest = static_cast<size_t>(n - i);
  for (size_t k = 0; k < rest; ++k) buffer[k] = x[i + k] + (bias != nullptr ? bias[i + k] : 0.0f);
  hn::Store(Activate<A>(d, hn::Load(d, buffer)), d, buffer);
  std::memcpy(y + i, buffer, rest * sizeof(float));
}

// Elements [begin, end) of the flattened x, cut at row ends when a bias is
// added so that each segment reads the bias from its start.
template <Activation A>
void ActivateElements(const ActivationArgs& a, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end;) {
    const int64_t offset = a.bias != nullptr ? i % a.d : 0;
    const int64_t n = a.bias != nullptr ? std::min(end - i, a.d - offset) : end - i;
    Segment<A>(a.x + i, a.bias != nullptr ? a.bias + offset : nullptr, a.y + i, n);
    i += n;
  }
}

void ActivateRange(const ActivationArgs& a, int64_t begin, int64_t end) {
  switch (a.activation) {
    case Activation::kIdentity:
      return ActivateElements<Activation::kIdentity>(a, begin, end);
    case Activation::kGeluErf:
      return ActivateElements<Activation::kGeluErf>(a, begin, end);
    case Activation::kGeluTanh:
      return ActivateElements<Activation::kGeluTanh>(a, begin, end);
    case Activation::kSigmoid:
      return ActivateElements<Activation::kSigmoid>(a, begin, end);
    case Activation::kSilu:
      return ActivateElements<Activation::kSilu>(a, begin, end);
    case Activation::kErf:
      return ActivateElements<Activation::kErf>(a, begin, end);
    case Activation::kTanh:
      return ActivateElements<Activation::kTanh>(a, begin, end);
  }
}

template <Activation A>
void ActivateRows(float* y, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) Segment<A>(y + r * ld, nullptr, y + r * ld, cols);
}

void ActivateBlock(float* y, int64_t rows, int64_t cols, int64_t ld, Activation activation) {
  switch (activation) {
    case Activation::kIdentity:
      return;
    case Activation::kGeluErf:
      return ActivateRows<Activation::kGeluErf>(y, rows, cols, ld);
    case Activation::kGeluTanh:
      return ActivateRows<Activation::kGeluTanh>(y, rows, cols, ld);
    case Activation::kSigmoid:
      return ActivateRows<Activation::kSigmoid>(y, rows, cols, ld);
    case Activation::kSilu:
      return ActivateRows<Activation::kSilu>(y, rows, cols, ld);
    case Activation::kErf:
      return ActivateRows<Activation::kErf>(y, rows, cols, ld);
    case Activation::kTanh:
      return ActivateRows<Activation::kTanh>(y, rows, cols, ld);
  }
}

// y[r, j] = silu(x[r, j]) * x[r, n + j] for rows [begin, end) of a 2n-wide x.
void SwiGluRows(const float* x, float* y, int64_t n, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = begin; r < end; ++r) {
    const float* gate = x + r * 2 * n;
    const float* up = gate + n;
    float* out = y + r * n;
    Segment<Activation::kSilu>(gate, nullptr, out, n);
    int64_t j = 0;
    for (; j + lanes <= n; j += lanes)
      hn::StoreU(hn::Mul(hn::LoadU(d, out + j), hn::LoadU(d, up + j)), d, out + j);
    for (; j < n; ++j) out[j] *= up[j];
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(ActivateRange);
HWY_EXPORT(ActivateBlock);
HWY_EXPORT(SwiGluRows);

void activate_block(float* y, int64_t rows, int64_t cols, int64_t ld, Activation activation) {
  HWY_DYNAMIC_DISPATCH(ActivateBlock)(y, rows, cols, ld, activation);
}

namespace {

mx::array activation_reference(const mx::array& x, const std::optional<mx::array>& bias,
                               Activation activation, mx::Stream s) {
  const mx::array z = bias ? mx::add(x, *bias, s) : x;
  auto scalar = [&](double v) { return mx::array(v, z.dtype()); };
  switch (activation) {
    case Activation::kIdentity:
      return z;
    case Activation::kGeluErf: {
      mx::array cdf = mx::add(scalar(1), mx::erf(mx::multiply(z, scalar(M_SQRT1_2), s), s), s);
      return mx::multiply(mx::multiply(scalar(0.5), z, s), cdf, s);
    }
    case Activation::kGeluTanh: {
      mx::array cube = mx::multiply(mx::multiply(z, z, s), z, s);
      mx::array inner = mx::add(z, mx::multiply(scalar(0.044715), cube, s), s);
      mx::array t = mx::tanh(mx::multiply(scalar(std::sqrt(2.0 / M_PI)), inner, s), s);
      return mx::multiply(mx::multiply(scalar(0.5), z, s), mx::add(scalar(1), t, s), s);
    }
    case Activation::kSigmoid:
      return mx::sigmoid(z, s);
    case Activation::kSilu:
      return mx::multiply(z, mx::sigmoid(z, s), s);
    case Activation::kErf:
      return mx::erf(z, s);
    case Activation::kTanh:
      return mx::tanh(z, s);
  }
  return z;
}

const char* kernel_name(Activation activation) {
  switch (activation) {
    case Activation::kIdentity:
      return "transmuter::BiasAdd";
    case Activation::kGeluErf:
      return "transmuter::BiasGelu";
    case Activation::kGeluTanh:
      return "transmuter::BiasFastGelu";
    case Activation::kSigmoid:
      return "transmuter::BiasSigmoid";
    case Activation::kSilu:
      return "transmuter::BiasSilu";
    case Activation::kErf:
      return "transmuter::BiasErf";
    case Activation::kTanh:
      return "transmuter::BiasTanh";
  }
  return "transmuter::BiasActivation";
}

class ActivationKernel : public CpuKernel {
 public:
  ActivationKernel(mx::Stream stream, Reference reference, bool has_bias, Activation activation)
      : CpuKernel(stream, std::move(reference)), has_bias_(has_bias), activation_(activation) {}
  const char* name() const override { return kernel_name(activation_); }
  // Elementwise: each element is read before its own slot is written, so y may be x's buffer.
  int donor_of(size_t) const override { return 0; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const ActivationKernel*>(&other);
    return o != nullptr && o->has_bias_ == has_bias_ && o->activation_ == activation_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    ActivationArgs args{};
    args.x = in[0].data<float>();
    args.bias = has_bias_ ? in[1].data<float>() : nullptr;
    args.y = out[0].data<float>();
    args.d = std::max<int64_t>(in[0].shape().back(), 1);
    args.activation = activation_;
    const int64_t count = static_cast<int64_t>(in[0].size());
    return [args, count] {
      // 16K elements a chunk: a few microseconds of work, enough to pay for
      // waking a thread.
      parallel_for(count, 16384, [&](int64_t begin, int64_t end) {
        HWY_DYNAMIC_DISPATCH(ActivateRange)(args, begin, end);
      });
    };
  }

 private:
  bool has_bias_;
  Activation activation_;
};

}  // namespace

bool bias_activation_fits(const mx::array& x, const std::optional<mx::array>& bias) {
  if (x.ndim() == 0 || x.dtype() != mx::float32) return false;
  return !bias || (bias->ndim() == 1 && bias->shape(0) == x.shape().back() && bias->dtype() == mx::float32);
}

mx::array bias_activation(const mx::array& x, const std::optional<mx::array>& bias, Activation activation,
                          mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  const bool has_bias = bias.has_value();
  Reference reference = [has_bias, activation, stream](const std::vector<mx::array>& in) {
    std::optional<mx::array> b;
    if (has_bias) b = in[1];
    return std::vector<mx::array>{activation_reference(in[0], b, activation, stream)};
  };
  std::vector<mx::array> inputs = {x};
  if (bias) inputs.push_back(*bias);
  if (!bias_activation_fits(x, bias)) return reference(inputs)[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<ActivationKernel>(kernel_stream, reference, has_bias, activation);
      },
      reference, inputs, {x.shape()}, {mx::float32}, stream)[0];
}

namespace {

mx::array swiglu_reference(const mx::array& x, mx::StreamOrDevice s) {
  const int n = x.shape(-1) / 2;
  mx::Shape start(x.ndim(), 0), stop = x.shape();
  stop.back() = n;
  mx::array gate = mx::slice(x, start, stop, s);
  start.back() = n;
  stop.back() = 2 * n;
  mx::array up = mx::slice(x, start, stop, s);
  return mx::multiply(mx::multiply(gate, mx::sigmoid(gate, s), s), up, s);
}

class SwiGluKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "transmuter::SwiGlu"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const SwiGluKernel*>(&other) != nullptr;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* x = in[0].data<float>();
    float* y = out[0].data<float>();
    const int64_t n = out[0].shape().back();
    const int64_t rows = n == 0 ? 0 : static_cast<int64_t>(out[0].size()) / n;
    return [x, y, n, rows] {
      // Rows of 16K elements a chunk, as bias_activation's.
      parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)),
                   [&](int64_t begin, int64_t end) {
                     HWY_DYNAMIC_DISPATCH(SwiGluRows)(x, y, n, begin, end);
                   });
    };
  }
};

}  // namespace

mx::array swiglu(const mx::array& x, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{swiglu_reference(in[0], stream)};
  };
  if (x.ndim() == 0 || x.dtype() != mx::float32 || x.shape(-1) % 2 != 0) return reference({x})[0];
  mx::Shape shape = x.shape();
  shape.back() /= 2;
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<SwiGluKernel>(kernel_stream, reference); },
      reference, {x}, {shape}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
