#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::run_domain_op;
using testing::string_attr;
using testing::to_doubles;

const std::string kTraining = "ai.onnx.preview.training";

// Double-precision formulas of the spec, one element at a time.
TEST(Momentum, FirstStepUsesBetaOneThenBeta) {
  const double r = 0.1, alpha = 0.9, beta = 0.5, x = 1, g = 2, v = 3;
  for (int64_t t : {0, 4}) {
    auto out = run_domain_op(kTraining, "Momentum", 1,
                             {mx::array(static_cast<float>(r)), mx::array(t), mx::array({1.f}), mx::array({2.f}),
                              mx::array({3.f})},
                             {float_attr("alpha", alpha), float_attr("beta", beta), string_attr("mode", "nesterov"),
                              float_attr("norm_coefficient", 0.f)},
                             2);
    const double v_new = alpha * v + (t > 0 ? beta : 1.0) * g;
    EXPECT_NEAR(to_doubles(out[1].tensor())[0], v_new, 1e-6);
    EXPECT_NEAR(to_doubles(out[0].tensor())[0], x - r * (g + alpha * v_new), 1e-6);
  }
}

TEST(Adam, BiasCorrectionAfterTheFirstStep) {
  const double r = 0.1, alpha = 0.9, beta = 0.99, eps = 1e-6, x = 1, g = 0.5, v = 0.2, h = 0.3;
  auto out = run_domain_op(kTraining, "Adam", 1,
                           {mx::array(0.1f), mx::array(int64_t{3}), mx::array({1.f}), mx::array({0.5f}),
                            mx::array({0.2f}), mx::array({0.3f})},
                           {float_attr("alpha", alpha), float_attr("beta", beta), float_attr("epsilon", eps)}, 3);
  const double v_new = alpha * v + (1 - alpha) * g, h_new = beta * h + (1 - beta) * g * g;
  const double rate = r * std::sqrt(1 - std::pow(beta, 3)) / (1 - std::pow(alpha, 3));
  EXPECT_NEAR(to_doubles(out[0].tensor())[0], x - rate * v_new / (std::sqrt(h_new) + eps), 1e-5);
  EXPECT_NEAR(to_doubles(out[1].tensor())[0], v_new, 1e-6);
  EXPECT_NEAR(to_doubles(out[2].tensor())[0], h_new, 1e-6);
}

TEST(Adagrad, UpdatesEveryTensorOfTheGroup) {
  auto out = run_domain_op(kTraining, "Adagrad", 1,
                           {mx::array(1.f), mx::array(int64_t{0}), mx::array({1.f}), mx::array({2.f}),
                            mx::array({3.f}), mx::array({4.f}), mx::array({0.f}), mx::array({0.f})},
                           {float_attr("epsilon", 0.f)}, 4);
  // g / sqrt(g^2) = 1: each X moves by exactly the rate.
  EXPECT_NEAR(to_doubles(out[0].tensor())[0], 0, 1e-6);
  EXPECT_NEAR(to_doubles(out[1].tensor())[0], 1, 1e-6);
  EXPECT_NEAR(to_doubles(out[2].tensor())[0], 9, 1e-6);
  EXPECT_NEAR(to_doubles(out[3].tensor())[0], 16, 1e-6);
}

TEST(Optimizers, RejectUnevenInputListsAndUnknownModes) {
  EXPECT_NE(error_of<OpError>([] {
              run_domain_op(kTraining, "Adam", 1, {mx::array(1.f), mx::array(int64_t{0}), mx::array({1.f})});
            }).find("equal lists"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] {
              run_domain_op(kTraining, "Momentum", 1,
                            {mx::array(1.f), mx::array(int64_t{0}), mx::array({1.f}), mx::array({1.f}),
                             mx::array({1.f})},
                            {string_attr("mode", "heavy-ball")}, 2);
            }).find("mode"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter
