// The bias + activation kernel against MLX's precise ops (mx::erf, mx::tanh,
// mx::exp): values for every activation with and without a bias, NaN,
// gradients, compile, and the arguments it hands back to the composition.
#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// Written out independently of the kernel's reference, with MLX's precise ops.
mx::array expected(const mx::array& x, const std::optional<mx::array>& bias, Activation a) {
  mx::array z = bias ? x + *bias : x;
  switch (a) {
    case Activation::kIdentity:
      return z;
    case Activation::kGeluErf:
      return 0.5f * z * (1.0f + mx::erf(z / std::sqrt(2.0f)));
    case Activation::kGeluTanh:
      return 0.5f * z *
             (1.0f + mx::tanh(std::sqrt(2.0f / static_cast<float>(M_PI)) * (z + 0.044715f * z * z * z)));
    case Activation::kSigmoid:
      return 1.0f / (1.0f + mx::exp(-z));
    case Activation::kSilu:
      return z / (1.0f + mx::exp(-z));
    case Activation::kErf:
      return mx::erf(z);
    case Activation::kTanh:
      return mx::tanh(z);
  }
  return z;
}

const char* label(Activation a) {
  switch (a) {
    case Activation::kIdentity:
      return "identity";
    case Activation::kGeluErf:
      return "gelu_erf";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kSigmoid:
      return "sigmoid";
    case Activation::kSilu:
      return "silu";
    case Activation::kErf:
      return "erf";
    case Activation::kTanh:
      return "tanh";
  }
  return "?";
}

constexpr Activation kAll[] = {Activation::kIdentity, Activation::kGeluErf, Activation::kGeluTanh,
                               Activation::kSigmoid,  Activation::kSilu,    Activation::kErf,
                               Activation::kTanh};

// Inputs up to |z| ~ 20 (scale 4, plus the bias). The erf fit's 3.8e-7 gives
// GELU an abs error of 2e-7 |z| (<= 4e-6 here); Tanh (4 ulp), Exp (1 ulp) and
// the float32 rounding of the formula add a few ulps of outputs up to ~20
// (ulp(16) = 1.9e-6). 1e-5 is above both, and far below an error in a formula.
constexpr float kTolerance = 1e-5f;

TEST(ActivationKernel, MatchesPreciseOpsForEveryActivation) {
  // Row lengths below, at and between SIMD widths; enough elements for threads.
  const std::vector<mx::Shape> shapes = {{3, 5}, {1, 1}, {2, 17}, {128, 1536}, {4, 3, 64}, {70000}};
  uint64_t seed = 1;
  for (const mx::Shape& shape : shapes) {
    mx::array x = random_array(shape, seed++, 4.0f);
    mx::array bias = random_array({shape.back()}, seed++);
    for (Activation a : kAll) {
      for (bool with_bias : {false, true}) {
        std::optional<mx::array> b;
        if (with_bias) b = bias;
        mx::array got = bias_activation(x, b, a, mx::Device::cpu);
        EXPECT_EQ(got.shape(), shape);
        EXPECT_LT(max_abs_diff(got, expected(x, b, a)), kTolerance)
            << label(a) << " bias=" << with_bias << " size " << x.size();
      }
    }
  }
}

TEST(ActivationKernel, LimitsAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  mx::array x = mx::array({-inf, -100.0f, -9.0f, 0.0f, 9.0f, 100.0f, inf, nan, 1.0f}, {9});
  for (Activation a : {Activation::kGeluErf, Activation::kGeluTanh, Activation::kSigmoid, Activation::kErf,
                       Activation::kTanh}) {
    mx::array got = bias_activation(x, std::nullopt, a, mx::Device::cpu);
    mx::array want = expected(x, std::nullopt, a);
    // Finite where the precise formula is (GELU at -inf is -inf * 0 there: NaN).
    mx::array finite = mx::isfinite(want);
    mx::array diff = mx::where(finite, mx::abs(got - want), mx::array(0.0f));
    EXPECT_LT(mx::max(diff).item<float>(), kTolerance) << label(a);
    EXPECT_TRUE(std::isnan(mx::slice(got, {7}, {8}).item<float>())) << label(a);
  }
  mx::array sig = bias_activation(x, std::nullopt, Activation::kSigmoid, mx::Device::cpu);
  EXPECT_EQ(mx::slice(sig, {6}, {7}).item<float>(), 1.0f);
  // -z is clamped to 88 before exp: sigmoid(-inf) is 1/(1 + e^88), as documented.
  EXPECT_LT(mx::slice(sig, {0}, {1}).item<float>(), 1e-38f);
}

// Gradients come from the reference composition.
TEST(ActivationKernel, GradientsEqualThoseOfTheComposition) {
  mx::array x = random_array({6, 40}, 11, 2.0f);
  mx::array bias = random_array({40}, 12);
  mx::array weights = random_array({6, 40}, 13);
  for (Activation a : kAll) {
    auto loss_of = [&](bool kernel) {
      return [&, kernel](const std::vector<mx::array>& p) {
        mx::array y = kernel ? bias_activation(p[0], p[1], a, mx::Device::cpu) : expected(p[0], p[1], a);
        return std::vector<mx::array>{mx::sum(y * weights)};
      };
    };
    auto [_, got] = mx::vjp(loss_of(true), {x, bias}, {mx::array(1.0f)});
    auto [__, want] = mx::vjp(loss_of(false), {x, bias}, {mx::array(1.0f)});
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-4f) << label(a) << " input " << i;
  }
}

TEST(ActivationKernel, RunsInsideCompile) {
  mx::array x = random_array({5, 64}, 21);
  mx::array bias = random_array({64}, 22);
  auto f = mx::compile([](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        bias_activation(mx::multiply(in[0], mx::array(2.0f)), in[1], Activation::kGeluErf, mx::Device::cpu)};
  });
  EXPECT_LT(max_abs_diff(f({x, bias})[0], expected(x * 2.0f, bias, Activation::kGeluErf)), kTolerance);
}

// Arguments the kernel does not take run the composition: same values.
TEST(ActivationKernel, OtherDtypesAndBiasShapesUseTheComposition) {
  mx::array x = random_array({3, 16}, 31);
  mx::array bias2d = random_array({3, 16}, 32);
  EXPECT_FALSE(bias_activation_fits(x, bias2d));
  mx::array y = bias_activation(x, bias2d, Activation::kGeluErf, mx::Device::cpu);
  EXPECT_LT(max_abs_diff(y, expected(x, bias2d, Activation::kGeluErf)), kTolerance);

  mx::array half = mx::astype(x, mx::float16);
  EXPECT_FALSE(bias_activation_fits(half, std::nullopt));
  mx::array yh = bias_activation(half, std::nullopt, Activation::kSigmoid, mx::Device::cpu);
  EXPECT_EQ(yh.dtype(), mx::float16);
  EXPECT_LT(max_abs_diff(mx::astype(yh, mx::float32), expected(x, std::nullopt, Activation::kSigmoid)),
            1e-3f);

  mx::array transposed = mx::transpose(random_array({24, 10}, 33));
  mx::array yt = bias_activation(transposed, random_array({24}, 34), Activation::kSilu, mx::Device::cpu);
  EXPECT_LT(max_abs_diff(yt, expected(transposed, random_array({24}, 34), Activation::kSilu)), kTolerance);
}

// SwiGlu against the composition written out: widths around the SIMD width (tails), a view input,
// gradients (those of the composition).
TEST(SwiGluKernel, MatchesTheComposition) {
  auto composed = [](const mx::array& x) {
    const int n = x.shape(-1) / 2;
    mx::array gate = mx::slice(x, {0, 0}, {x.shape(0), n}), up = mx::slice(x, {0, n}, {x.shape(0), 2 * n});
    return mx::multiply(mx::multiply(gate, mx::sigmoid(gate)), up);
  };
  for (int n : {1, 7, 16, 33, 1536}) {
    mx::array x = random_array({5, 2 * n}, static_cast<uint64_t>(n), 3.0f);
    EXPECT_LT(max_abs_diff(swiglu(x, mx::Device::cpu), composed(x)), kTolerance) << "n " << n;
  }
  mx::array view = mx::transpose(random_array({12, 4}, 41));  // [4, 12], strided
  EXPECT_LT(max_abs_diff(swiglu(view, mx::Device::cpu), composed(view)), kTolerance);
  mx::array x = random_array({3, 10}, 42);
  mx::array cotangent = random_array({3, 5}, 43);
  auto [_, got] =
      mx::vjp([](const std::vector<mx::array>& in) { return std::vector{swiglu(in[0], mx::Device::cpu)}; },
              {x}, {cotangent});
  auto [__, want] = mx::vjp([&](const std::vector<mx::array>& in) { return std::vector{composed(in[0])}; },
                            {x}, {cotangent});
  EXPECT_LT(max_abs_diff(got[0], want[0]), 1e-5f);
}

}  // namespace
}  // namespace transmuter::kernels
