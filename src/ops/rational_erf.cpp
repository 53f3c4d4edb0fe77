#include "ops/rational_erf.h"

#include <array>
#include <cmath>

#include "ops/vectorized_exp.h"

namespace transmuter {

namespace {

// Fitted for this project (scripts/fit_rational_erf.py): weighted least
// squares of x * P(u) - erf(x) * Q(u) on u = x^2, x in [0, 4], Q(0) = 1.
// Q has only positive coefficients, so it never vanishes.
constexpr std::array<float, 6> kNumerator = {1.1283790e+00f, 1.9230819e-01f, 5.2981764e-02f,
                                             3.8447063e-03f, 2.8618801e-04f, 2.0272867e-06f};
constexpr std::array<float, 6> kDenominator = {1.0000000e+00f, 5.0376058e-01f, 1.1487953e-01f,
                                               1.5124429e-02f, 1.1810574e-03f, 3.7928556e-05f};

// c[0] + c[1] u + ... by Horner's rule.
template <size_t N>
mx::array horner(const std::array<float, N>& c, const mx::array& u, mx::StreamOrDevice s) {
  mx::array acc = mx::array(c[N - 1]);
  for (size_t i = N - 1; i-- > 0;) acc = mx::add(mx::multiply(acc, u, s), mx::array(c[i]), s);
  return acc;
}

mx::array rational_erf_composed(const mx::array& x, mx::StreamOrDevice s) {
  // Beyond |x| = 4, erf(x) rounds to +-1 in float32; clamping also maps +-inf
  // to +-1 and lets NaN through.
  mx::array xc = mx::clip(x, mx::array(-4.0f), mx::array(4.0f), s);
  mx::array u = mx::multiply(xc, xc, s);
  mx::array y = mx::divide(mx::multiply(xc, horner(kNumerator, u, s), s), horner(kDenominator, u, s), s);
  // Rounding can overshoot by an ulp near +-4; erf is bounded by 1.
  return mx::clip(y, mx::array(-1.0f), mx::array(1.0f), s);
}

// d erf(x) = 2/sqrt(pi) exp(-x^2) dx. The rational function's own derivative
// is less accurate, costs more to store for the backward pass, and is 0 past
// the clamp at |x| = 4.
mx::array erf_derivative(const mx::array& x, mx::StreamOrDevice s) {
  mx::array minus_square = mx::negative(mx::multiply(x, x, s), s);
  return mx::multiply(mx::array(static_cast<float>(M_2_SQRTPI)), exp_upto_88(minus_square, s), s);
}

mx::array rational_erf_f32(const mx::array& x, mx::StreamOrDevice s) {
  auto erf = mx::custom_function(
      [s](const std::vector<mx::array>& in) { return std::vector<mx::array>{rational_erf_composed(in[0], s)}; },
      [s](const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
          const std::vector<mx::array>&) {
        return std::vector<mx::array>{mx::multiply(cotangents[0], erf_derivative(primals[0], s), s)};
      },
      [s](const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents, const std::vector<int>&) {
        return std::vector<mx::array>{mx::multiply(tangents[0], erf_derivative(primals[0], s), s)};
      });
  return erf({x})[0];
}

}  // namespace

mx::array rational_erf(const mx::array& x, mx::StreamOrDevice s) {
  if (!on_cpu_stream(s)) return mx::erf(x, s);
  if (x.dtype() == mx::float32) return rational_erf_f32(x, s);
  if (x.dtype() == mx::float16 || x.dtype() == mx::bfloat16) {
    return mx::astype(rational_erf_f32(mx::astype(x, mx::float32, s), s), x.dtype(), s);
  }
  return mx::erf(x, s);
}

}  // namespace transmuter
