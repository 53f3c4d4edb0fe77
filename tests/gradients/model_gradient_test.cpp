// Gradient of a MiniLM-style sentence embedding (mean pooling of BERT's
// last_hidden_state over the attention mask) with respect to every weight of
// tests/models/bert/model.onnx (a tiny random BERT export), eagerly through
// transmuter::run and compiled through transmuter::compile, checked against
// central finite differences on sampled weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "onnx/model_file.h"
#include "runtime/model_state.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

const std::string kModel = std::string(TRANSMUTER_SOURCE_DIR) + "/tests/models/bert/model.onnx";

// Finite differences run the float32 model. The loss sums 2 x 64 pooled
// values of magnitude ~1 with weights in [-1, 1]; each is a few ulps off, so
// L carries ~1e-6 of rounding noise, ~5e-5 once divided by the 2e-2 wide
// central difference: kAtol is 1e-4. A step of 1e-2 max(1, |w|) keeps the
// truncation error (step^2 |L'''| / 6) near 1e-4 relative for the weights of
// a randomly initialized BERT; 2e-2 relative leaves room for both, while a
// wrong vjp is off by O(1).
constexpr double kStep = 1e-2;
constexpr double kRtol = 2e-2;
constexpr double kAtol = 1e-4;

std::vector<double> host_doubles(const mx::array& a) {
  // contiguous: a gradient can be a broadcast (strides 0), which flatten and
  // astype keep as a view.
  mx::Device cpu = mx::Device::cpu;
  mx::array f = mx::contiguous(mx::astype(mx::flatten(a, cpu), mx::float64, cpu), false, cpu);
  mx::eval(f);
  return std::vector<double>(f.data<double>(), f.data<double>() + f.size());
}

struct Encoder {
  Inputs inputs;
  mx::array mask_f32 = mx::array(0.0f);
  mx::array weights = mx::array(0.0f);  // cotangent of the pooled output

  Encoder() {
    // Two sequences of 7 tokens; the second is padded after 4.
    std::vector<int64_t> ids = {101, 7, 42, 999, 5, 300, 102, 101, 88, 13, 102, 0, 0, 0};
    std::vector<int64_t> mask = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
    std::vector<int64_t> types = {0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0};
    inputs["input_ids"] = mx::array(ids.data(), {2, 7}, mx::int64);
    inputs["attention_mask"] = mx::array(mask.data(), {2, 7}, mx::int64);
    inputs["token_type_ids"] = mx::array(types.data(), {2, 7}, mx::int64);
    mask_f32 = mx::astype(inputs["attention_mask"].tensor(), mx::float32);
  }

  /** Mean of last_hidden_state [B, S, H] over the unmasked positions: [B, H]. */
  mx::array pool(const mx::array& hidden) const {
    mx::array m = mx::expand_dims(mask_f32, -1);
    return mx::divide(mx::sum(mx::multiply(hidden, m), 1), mx::sum(m, 1));
  }

  /** sum(pooled * weights), the scalar whose gradient is checked. */
  mx::array loss(const mx::array& hidden) {
    mx::array pooled = pool(hidden);
    if (weights.size() != pooled.size()) {
      weights = mx::random::uniform(-1.0, 1.0, pooled.shape(), mx::float32, mx::random::key(7));
    }
    return mx::sum(mx::multiply(pooled, weights));
  }
};

/** The float weights of `model`, in a fixed order. */
std::vector<std::string> float_param_names(const Model& model) {
  std::vector<std::string> names;
  for (const auto& [name, a] : model.params()) {
    if (mx::issubdtype(a.dtype(), mx::floating)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

/** Indices 0..n-1 for value_and_grad's argnums. */
std::vector<int> all_args(size_t n) {
  std::vector<int> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = static_cast<int>(i);
  return all;
}

class BertGradient : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load(kModel);
    names_ = float_param_names(model_);
    for (const std::string& n : names_) weights_.push_back(model_.params().at(n));
  }

  /** The loss through transmuter::run with `weights` in place of the model's. */
  mx::array eager_loss(const std::vector<mx::array>& weights) {
    Params params = model_.params();
    for (size_t i = 0; i < names_.size(); ++i) params.insert_or_assign(names_[i], weights[i]);
    return encoder_.loss(run(model_, params, encoder_.inputs, {mx::Device::cpu}).tensor("last_hidden_state"));
  }

  Model model_ = Model(nullptr);
  std::vector<std::string> names_;
  std::vector<mx::array> weights_;
  Encoder encoder_;
};

TEST_F(BertGradient, EveryWeightGetsAGradientAndPoolerWeightsGetZero) {
  ASSERT_GT(names_.size(), 10u);
  auto [loss, grads] = mx::value_and_grad([&](const std::vector<mx::array>& w) { return eager_loss(w); },
                                          all_args(names_.size()))(weights_);
  ASSERT_EQ(grads.size(), names_.size());
  for (size_t i = 0; i < names_.size(); ++i) {
    EXPECT_EQ(grads[i].shape(), weights_[i].shape()) << names_[i];
    std::vector<double> g = host_doubles(grads[i]);
    bool finite = std::all_of(g.begin(), g.end(), [](double v) { return std::isfinite(v); });
    bool nonzero = std::any_of(g.begin(), g.end(), [](double v) { return v != 0; });
    EXPECT_TRUE(finite) << names_[i];
    // The pooler (dense + tanh on the first token) feeds pooler_output only.
    bool pooler = names_[i].find("pooler") != std::string::npos;
    EXPECT_EQ(nonzero, !pooler) << names_[i];
  }
}

TEST_F(BertGradient, EagerAndCompiledMatchFiniteDifferences) {
  auto eager = mx::value_and_grad([&](const std::vector<mx::array>& w) { return eager_loss(w); },
                                  all_args(names_.size()));
  auto [loss, grads] = eager(weights_);

  CompiledModel compiled = compile(model_, {}, {.static_inputs = {}, .device = mx::Device::cpu, .params_as_arguments = true});
  auto compiled_loss = [&](const std::vector<mx::array>& w) {
    Params params;
    for (size_t i = 0; i < names_.size(); ++i) params.insert_or_assign(names_[i], w[i]);
    return encoder_.loss(compiled(params, encoder_.inputs).tensor("last_hidden_state"));
  };
  auto [compiled_value, compiled_grads] =
      mx::value_and_grad(compiled_loss, all_args(names_.size()))(weights_);
  EXPECT_EQ(compiled.stats().plans_built, 1u);
  EXPECT_NEAR(compiled_value.item<float>(), loss.item<float>(), 1e-4);

  // Sampled weights: in each tensor, the element of largest gradient and one
  // drawn at random.
  std::mt19937 rng(11);
  int compared = 0;
  for (size_t t = 0; t < names_.size(); ++t) {
    std::vector<double> g = host_doubles(grads[t]);
    std::vector<double> cg = host_doubles(compiled_grads[t]);
    auto by_magnitude = [](double a, double b) { return std::abs(a) < std::abs(b); };
    size_t largest = std::max_element(g.begin(), g.end(), by_magnitude) - g.begin();
    for (size_t index : {largest, static_cast<size_t>(rng() % g.size())}) {
      std::vector<double> w = host_doubles(weights_[t]);
      double h = kStep * std::max(1.0, std::abs(w[index]));
      auto loss_at = [&](double delta) {
        std::vector<double> moved = w;
        moved[index] += delta;
        std::vector<mx::array> ws = weights_;
        mx::array flat(moved.begin(), {static_cast<int>(moved.size())}, mx::float64);
        ws[t] = mx::reshape(mx::astype(flat, weights_[t].dtype()), weights_[t].shape());
        return static_cast<double>(eager_loss(ws).item<float>());
      };
      double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
      double tol = kAtol + kRtol * std::max(std::abs(fd), std::abs(g[index]));
      EXPECT_NEAR(g[index], fd, tol) << names_[t] << "[" << index << "] eager";
      EXPECT_NEAR(cg[index], fd, tol) << names_[t] << "[" << index << "] compiled";
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int>(2 * names_.size()));
}

}  // namespace
}  // namespace transmuter
