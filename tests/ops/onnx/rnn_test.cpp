#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::int_attr;
using testing::run_compiled;
using testing::run_op;
using testing::string_attr;
using testing::to_doubles;

// float32 results of a few steps on values of order 1: a few ulps.
constexpr double kTol = 1e-5;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = kTol) {
  testing::expect_all_near(actual, expected, tol);
}

Attribute strings_attr(const std::string& name, std::vector<std::string> v) {
  Attribute a;
  a.name = name;
  a.type = AttrType::kStrings;
  a.strings = std::move(v);
  return a;
}

mx::array seeded_normal(mx::Shape shape, uint64_t seed, float scale = 0.5f) {
  return mx::multiply(mx::random::normal(shape, mx::float32, 0, 1, mx::random::key(seed)), mx::array(scale));
}

// Slices time steps [0, length) of batch entry b out of X [T, B, I].
mx::array one_sequence(const mx::array& x, int b, int length) {
  return mx::slice(x, {0, b, 0}, {length, b + 1, x.shape(2)});
}

TEST(Rnn, ScalarReluRecurrenceByHand) {
  // H = relu(x * 2 + H_prev * 0.5 + 1 + 0): x = [1, -4, 3] -> 3, -8 + 1.5 + 1 -> 0, 6 + 0 + 1 = 7.
  mx::array x = mx::array({1.f, -4.f, 3.f}, {3, 1, 1});
  mx::array w = mx::array({2.f}, {1, 1, 1});
  mx::array r = mx::array({0.5f}, {1, 1, 1});
  mx::array b = mx::array({1.f, 0.f}, {1, 2});
  auto out =
      run_op("RNN", 14, {x, w, r, b}, {strings_attr("activations", {"Relu"}), int_attr("hidden_size", 1)}, 2);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3, 1, 1, 1}));
  expect_near(to_doubles(out[0].tensor()), {3, 0, 7});
  expect_near(to_doubles(out[1].tensor()), {7});
}

TEST(Rnn, AffineAlphaBetaConsumedInOrder) {
  // Affine takes alpha 2 and beta 1 (the first entries); H = 2 * (x + 0) + 1.
  mx::array x = mx::array({1.f, 2.f}, {2, 1, 1});
  auto out = run_op("RNN", 7, {x, mx::ones({1, 1, 1}), mx::zeros({1, 1, 1})},
                    {strings_attr("activations", {"Affine"}), testing::floats_attr("activation_alpha", {2.f}),
                     testing::floats_attr("activation_beta", {1.f})},
                    2);
  expect_near(to_doubles(out[0].tensor()), {3, 5});
}

// With sequence_lens, each batch entry must equal a run over its own
// sequence alone: Y zero past its end, Y_h and Y_c at its last step, for
// both directions.
TEST(Lstm, SequenceLengthsMatchSeparateRunsInBothDirections) {
  const int T = 4, B = 2, I = 3, H = 2;
  mx::array x = seeded_normal({T, B, I}, 1, 1.0f);
  mx::array w = seeded_normal({2, 4 * H, I}, 2);
  mx::array r = seeded_normal({2, 4 * H, H}, 3);
  mx::array bias = seeded_normal({2, 8 * H}, 4);
  mx::array p = seeded_normal({2, 3 * H}, 5);
  mx::array lens = mx::array({4, 2}, mx::int32);
  std::vector<Attribute> attrs = {string_attr("direction", "bidirectional"), int_attr("hidden_size", H)};
  auto all = run_op("LSTM", 14, {x, w, r, bias, lens, Value(), Value(), p}, attrs, 3);
  auto y = mx::array(all[0].tensor());  // [T, 2, B, H]

  for (int b = 0; b < B; ++b) {
    const int length = b == 0 ? 4 : 2;
    auto alone =
        run_op("LSTM", 14, {one_sequence(x, b, length), w, r, bias, Value(), Value(), Value(), p}, attrs, 3);
    mx::array y_b = mx::slice(y, {0, 0, b, 0}, {length, 2, b + 1, H});
    expect_near(to_doubles(y_b), to_doubles(alone[0].tensor()));
    expect_near(to_doubles(mx::slice(all[1].tensor(), {0, b, 0}, {2, b + 1, H})),
                to_doubles(alone[1].tensor()));
    expect_near(to_doubles(mx::slice(all[2].tensor(), {0, b, 0}, {2, b + 1, H})),
                to_doubles(alone[2].tensor()));
    if (length < T) {
      for (double v : to_doubles(mx::slice(y, {length, 0, b, 0}, {T, 2, b + 1, H}))) EXPECT_EQ(v, 0.0);
    }
  }
}

TEST(Gru, BatchMajorLayoutIsTheTransposeOfTimeMajor) {
  const int T = 3, B = 2, I = 2, H = 3;
  mx::array x = seeded_normal({T, B, I}, 6, 1.0f);
  mx::array w = seeded_normal({1, 3 * H, I}, 7);
  mx::array r = seeded_normal({1, 3 * H, H}, 8);
  mx::array bias = seeded_normal({1, 6 * H}, 9);
  mx::array h0 = seeded_normal({1, B, H}, 10);
  for (int64_t lbr : {0, 1}) {
    std::vector<Attribute> attrs = {int_attr("linear_before_reset", lbr),
                                    string_attr("direction", "reverse")};
    auto time_major = run_op("GRU", 14, {x, w, r, bias, Value(), h0}, attrs, 2);
    attrs.push_back(int_attr("layout", 1));
    auto batch_major =
        run_op("GRU", 14, {mx::transpose(x, {1, 0, 2}), w, r, bias, Value(), mx::transpose(h0, {1, 0, 2})},
               attrs, 2);
    expect_near(to_doubles(batch_major[0].tensor()),
                to_doubles(mx::transpose(time_major[0].tensor(), {2, 0, 1, 3})));
    expect_near(to_doubles(batch_major[1].tensor()),
                to_doubles(mx::transpose(time_major[1].tensor(), {1, 0, 2})));
  }
}

TEST(Gru, TracedSequenceLengthsMatchEager) {
  const int T = 3, B = 3, I = 2, H = 2;
  std::vector<Value> inputs = {seeded_normal({T, B, I}, 11, 1.0f), seeded_normal({2, 3 * H, I}, 12),
                               seeded_normal({2, 3 * H, H}, 13), seeded_normal({2, 6 * H}, 14),
                               mx::array({3, 1, 2}, mx::int32)};
  std::vector<Attribute> attrs = {string_attr("direction", "bidirectional"), float_attr("clip", 0.8f)};
  auto eager = run_op("GRU", 7, inputs, attrs, 2);
  auto compiled = run_compiled("GRU", 7, inputs, {0, 4}, attrs, 2);
  // Fusion may reorder float32 rounding: a few ulps.
  expect_near(to_doubles(compiled[0]), to_doubles(eager[0].tensor()), 1e-6);
  expect_near(to_doubles(compiled[1]), to_doubles(eager[1].tensor()), 1e-6);
}

TEST(Lstm, InputForgetCouplesTheForgetGateToTheInputGate) {
  // One unit, zero recurrence and bias: i = sigmoid(x), f = 1 - i, c = tanh(x).
  mx::array x = mx::array({0.5f, -1.f}, {2, 1, 1});
  mx::array w = mx::ones({1, 4, 1});
  auto out = run_op("LSTM", 7, {x, w, mx::zeros({1, 4, 1})}, {int_attr("input_forget", 1)}, 3);
  auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  double c = 0;
  for (double v : {0.5, -1.0}) c = (1 - sigmoid(v)) * c + sigmoid(v) * std::tanh(v);
  expect_near(to_doubles(out[2].tensor()), {c});
  expect_near(to_doubles(out[1].tensor()), {sigmoid(-1.0) * std::tanh(c)});
}

TEST(Rnn, EmptySequenceKeepsInitialState) {
  mx::array h0 = mx::array({0.25f, -0.5f}, {1, 1, 2});
  auto out =
      run_op("RNN", 14,
             {mx::zeros({0, 1, 3}), mx::ones({1, 2, 3}), mx::ones({1, 2, 2}), Value(), Value(), h0}, {}, 2);
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{0, 1, 1, 2}));
  expect_near(to_doubles(out[1].tensor()), {0.25, -0.5});
}

TEST(Recurrent, BadInputsAreOpErrorsNamingTheNode) {
  mx::array x = mx::zeros({2, 1, 3});
  mx::array w = mx::zeros({1, 4, 3});
  mx::array r = mx::zeros({1, 4, 1});
  auto message = [&](const std::string& op, std::vector<Value> inputs, std::vector<Attribute> attrs) {
    return error_of<OpError>([&] { run_op(op, 14, inputs, attrs, 2); });
  };
  EXPECT_NE(message("LSTM", {mx::zeros({2, 3}), w, r}, {}).find("X must have rank 3"), std::string::npos);
  EXPECT_NE(message("LSTM", {x, mx::zeros({1, 5, 3}), r}, {}).find("W must have shape [1, 4, 3]"),
            std::string::npos);
  EXPECT_NE(message("LSTM", {x, w, r}, {string_attr("direction", "sideways")}).find("direction must be"),
            std::string::npos);
  EXPECT_NE(
      message("LSTM", {x, w, r}, {string_attr("direction", "bidirectional")}).find("W has 1 directions"),
      std::string::npos);
  EXPECT_NE(message("LSTM", {x, w, r}, {int_attr("hidden_size", 3)}).find("hidden_size 3"),
            std::string::npos);
  EXPECT_NE(
      message("LSTM", {x, w, r}, {strings_attr("activations", {"Sigmoid", "Tanh"})}).find("3 per direction"),
      std::string::npos);
  EXPECT_NE(message("RNN", {x, mx::zeros({1, 1, 3}), r}, {strings_attr("activations", {"Swish"})})
                .find("unknown activation 'Swish'"),
            std::string::npos);
  EXPECT_NE(
      message("RNN", {x, mx::zeros({1, 1, 3}), r}, {int_attr("layout", 2)}).find("layout must be 0 or 1"),
      std::string::npos);
  EXPECT_NE(message("GRU", {mx::zeros({2, 1, 3}, mx::int32), w, r}, {}).find("X must be a float tensor"),
            std::string::npos);
  EXPECT_NE(message("RNN",
                    {x, mx::zeros({1, 1, 3}), mx::zeros({1, 1, 1}), mx::zeros({1, 2}),
                     mx::array({1, 2}, mx::int32)},
                    {})
                .find("sequence_lens must have shape [1]"),
            std::string::npos);
  EXPECT_NE(
      message("RNN", {x, mx::zeros({1, 1, 3}), mx::zeros({1, 1, 1}), Value(), mx::array({3}, mx::int32)}, {})
          .find("sequence length 3 outside [0, 2]"),
      std::string::npos);
  // The prefix names the op and node.
  EXPECT_NE(message("LSTM", {mx::zeros({2, 3}), w, r}, {}).find("[LSTM v14]"), std::string::npos);
}

}  // namespace
}  // namespace transmuter
