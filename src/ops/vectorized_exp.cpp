#include "ops/vectorized_exp.h"

#include <array>

namespace transmuter {

namespace {

constexpr float kLog2E = 1.44269504088896341f;
// ln 2 split so that k * kLn2High is exact for |k| <= 128.
constexpr float kLn2High = 0.693359375f;
constexpr float kLn2Low = -2.12194440e-4f;
constexpr float kSmallest = -87.33654f;  // ln(2^-126)

// exp(r) = sum r^n / n! for |r| <= ln(2)/2: the n = 8 term is below 2^-24.
constexpr std::array<float, 8> kTaylor = {1.0f,         1.0f,          1.0f / 2,       1.0f / 6,
                                          1.0f / 24,    1.0f / 120,    1.0f / 720,     1.0f / 5040};

mx::array polynomial(const mx::array& r, mx::StreamOrDevice s) {
  mx::array acc = mx::array(kTaylor.back());
  for (size_t i = kTaylor.size() - 1; i-- > 0;) acc = mx::add(mx::multiply(acc, r, s), mx::array(kTaylor[i]), s);
  return acc;
}

// The range-reduced composition. Its derivative through MLX would be the
// polynomial's, slightly less accurate and dearer than y * g.
mx::array exp_composed(const mx::array& x, mx::StreamOrDevice s) {
  // x = k ln2 + r with integer k, so exp(x) = 2^k exp(r); 2^k is built by
  // writing k + 127 into the exponent bits of a float32.
  mx::array xc = mx::maximum(x, mx::array(kSmallest), s);
  mx::array k = mx::round(mx::multiply(xc, mx::array(kLog2E), s), 0, s);
  mx::array r = mx::subtract(mx::subtract(xc, mx::multiply(k, mx::array(kLn2High), s), s),
                             mx::multiply(k, mx::array(kLn2Low), s), s);
  mx::array biased = mx::add(mx::astype(k, mx::int32, s), mx::array(127), s);
  mx::array two_k = mx::view(mx::left_shift(biased, mx::array(23), s), mx::float32, s);
  mx::array y = mx::multiply(polynomial(r, s), two_k, s);
  // Below 2^-126 (incl. -inf) the result is 0; NaN fails the comparison and stays NaN.
  return mx::where(mx::less(x, mx::array(kSmallest), s), mx::array(0.0f), y, s);
}

}  // namespace

bool on_cpu_stream(mx::StreamOrDevice s) { return mx::to_stream(s).device == mx::Device::cpu; }

mx::array exp_upto_88(const mx::array& x, mx::StreamOrDevice s) {
  if (!on_cpu_stream(s)) return mx::exp(x, s);
  // d exp(x) = exp(x) dx: the vjp reuses the forward output. No jvp: MLX's
  // jvp walks the inner graph of a custom function and fails at mx::view.
  auto exp = mx::custom_vjp(
      [s](const std::vector<mx::array>& in) { return std::vector<mx::array>{exp_composed(in[0], s)}; },
      [s](const std::vector<mx::array>&, const std::vector<mx::array>& cotangents,
          const std::vector<mx::array>& outputs) {
        return std::vector<mx::array>{mx::multiply(cotangents[0], outputs[0], s)};
      });
  return exp({x})[0];
}

mx::array softmax_float32(const mx::array& x, const std::vector<int>& axes, mx::StreamOrDevice s) {
  if (!on_cpu_stream(s)) return mx::softmax(x, axes, /*precise=*/true, s);
  mx::array shifted = mx::subtract(x, mx::stop_gradient(mx::max(x, axes, true, s), s), s);
  mx::array e = exp_upto_88(shifted, s);
  return mx::divide(e, mx::sum(e, axes, true, s), s);
}

}  // namespace transmuter
