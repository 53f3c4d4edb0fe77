#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/dtype.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::float_attr;
using testing::int_attr;
using testing::run_compiled;
using testing::run_op;
using testing::to_doubles;
using testing::to_ints;

const mx::array kData = mx::array({1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f}, {2, 4});

TEST(Dropout, InferenceIsIdentityWithAnAllTrueMask) {
  auto out = run_op("Dropout", 13, {kData, mx::array(0.5f)}, {}, 2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(to_doubles(out[0].tensor()), to_doubles(kData));
  EXPECT_EQ(out[1].tensor().dtype(), mx::bool_);
  EXPECT_EQ(out[1].tensor().shape(), kData.shape());
  EXPECT_EQ(to_ints(out[1].tensor()), std::vector<int64_t>(8, 1));
}

TEST(Dropout, InferenceIsIdentityUnderCompile) {
  auto out = run_compiled("Dropout", 22, {kData, mx::array(0.5f)}, {0}, {}, 2);
  EXPECT_EQ(to_doubles(out[0]), to_doubles(kData));
  EXPECT_EQ(to_ints(out[1]), std::vector<int64_t>(8, 1));
}

TEST(Dropout, MaskTypeFollowsTheOpset) {
  // Opsets 1-9: the mask has the data's type; 10-11: bool.
  auto v7 = run_op("Dropout", 7, {kData}, {float_attr("ratio", 0.3f)}, 2);
  EXPECT_EQ(v7[1].tensor().dtype(), mx::float32);
  auto v6 = run_op("Dropout", 6, {kData}, {int_attr("is_test", 1)}, 1);
  EXPECT_EQ(v6.size(), 1u);
  auto v10 = run_op("Dropout", 10, {kData}, {}, 2);
  EXPECT_EQ(v10[1].tensor().dtype(), mx::bool_);
  EXPECT_EQ(to_doubles(v10[0].tensor()), to_doubles(kData));
}

TEST(Dropout, TrainingWithZeroRatioKeepsEverything) {
  auto out = run_op("Dropout", 22, {kData, mx::array(0.f), mx::array(true)}, {}, 2);
  EXPECT_EQ(to_doubles(out[0].tensor()), to_doubles(kData));
  EXPECT_EQ(to_ints(out[1].tensor()), std::vector<int64_t>(8, 1));
}

TEST(Dropout, TrainingDropsAndRescalesConsistentlyWithTheMask) {
  mx::array data = mx::ones({64, 64});
  auto out = run_op("Dropout", 13, {data, mx::array(0.75f), mx::array(true)}, {int_attr("seed", 3)}, 2);
  std::vector<double> y = to_doubles(out[0].tensor());
  std::vector<int64_t> mask = to_ints(out[1].tensor());
  size_t kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(y[i], mask[i] ? 4.0 : 0.0) << "at " << i;  // kept values scale by 1 / (1 - 0.75)
    kept += mask[i];
  }
  // 4096 draws with p = 0.25: the count is 1024 +- 28 (1 sigma); 8 sigma bounds.
  EXPECT_GT(kept, 800u);
  EXPECT_LT(kept, 1250u);
  // The same seed gives the same mask.
  auto again = run_op("Dropout", 13, {data, mx::array(0.75f), mx::array(true)}, {int_attr("seed", 3)}, 2);
  EXPECT_EQ(to_ints(again[1].tensor()), mask);
}

TEST(Dropout, TrainingRejectsARatioOfOne) {
  try {
    run_op("Dropout", 13, {kData, mx::array(1.f), mx::array(true)});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[Dropout v12] node 'test_Dropout': ratio must be in [0, 1), got 1"),
              std::string::npos)
        << e.what();
  }
}

double mean_of(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / v.size();
}

TEST(RandomGenerators, NormalHasTheRequestedShapeDtypeAndMoments) {
  auto out = run_op("RandomNormal", 1, {},
                    {testing::ints_attr("shape", {100, 100}), float_attr("mean", 5.f),
                     float_attr("scale", 2.f), int_attr("dtype", static_cast<int64_t>(OnnxType::kDouble))});
  mx::array y = out[0].tensor();
  EXPECT_EQ(y.shape(), (mx::Shape{100, 100}));
  EXPECT_EQ(y.dtype(), mx::float64);
  std::vector<double> v = to_doubles(y);
  // 10^4 draws: the sample mean has a standard error of 0.02; 10 of them.
  EXPECT_NEAR(mean_of(v), 5.0, 0.2);
  double var = 0;
  for (double x : v) var += (x - 5.0) * (x - 5.0);
  EXPECT_NEAR(var / v.size(), 4.0, 0.4);
}

TEST(RandomGenerators, UniformLikeStaysInRangeAndSeedsRepeat) {
  mx::array like = mx::zeros({50, 40}, mx::float16);
  std::vector<Attribute> attrs = {float_attr("low", -2.f), float_attr("high", 3.f), float_attr("seed", 7.f)};
  mx::array a = run_op("RandomUniformLike", 22, {like}, attrs)[0].tensor();
  EXPECT_EQ(a.dtype(), mx::float16);
  EXPECT_EQ(a.shape(), like.shape());
  std::vector<double> v = to_doubles(a);
  for (double x : v) {
    ASSERT_GE(x, -2.0);
    ASSERT_LE(x, 3.0);
  }
  EXPECT_NEAR(mean_of(v), 0.5, 0.2);  // 2000 draws, standard error 0.03
  EXPECT_EQ(to_doubles(run_op("RandomUniformLike", 22, {like}, attrs)[0].tensor()), v);
}

TEST(RandomGenerators, BernoulliAndMultinomial) {
  mx::array p = mx::array({0.f, 1.f, 0.f, 1.f});
  mx::array b =
      run_op("Bernoulli", 15, {p}, {int_attr("dtype", static_cast<int64_t>(OnnxType::kInt32))})[0].tensor();
  EXPECT_EQ(b.dtype(), mx::int32);
  EXPECT_EQ(to_ints(b), (std::vector<int64_t>{0, 1, 0, 1}));
  // Class 1 has all the probability mass.
  mx::array logits = mx::log(mx::array({0.f, 1.f, 0.f, 0.f, 0.f, 1.f}, {2, 3}));
  mx::array m =
      run_op("Multinomial", 7, {logits},
             {int_attr("sample_size", 4), int_attr("dtype", static_cast<int64_t>(OnnxType::kInt64))})[0]
          .tensor();
  EXPECT_EQ(m.dtype(), mx::int64);
  EXPECT_EQ(m.shape(), (mx::Shape{2, 4}));
  EXPECT_EQ(to_ints(m), (std::vector<int64_t>{1, 1, 1, 1, 2, 2, 2, 2}));
}

// The node tests of Bernoulli compare NumPy's bits (expected failures); these
// check what ONNX specifies instead: the distribution and the seed.
TEST(RandomGenerators, BernoulliDrawsAtTheGivenRateAndRepeatsWithASeed) {
  mx::array p = mx::full({100, 100}, 0.3f);
  std::vector<Attribute> attrs = {float_attr("seed", 11.f)};
  std::vector<double> v = to_doubles(run_op("Bernoulli", 15, {p}, attrs)[0].tensor());
  for (double x : v) ASSERT_TRUE(x == 0.0 || x == 1.0);
  // 10^4 draws: the rate has a standard error of 0.0046; 8 of them.
  EXPECT_NEAR(mean_of(v), 0.3, 0.037);
  EXPECT_EQ(to_doubles(run_op("Bernoulli", 15, {p}, attrs)[0].tensor()), v);
}

TEST(RandomGenerators, MultinomialFrequenciesFollowTheProbabilities) {
  mx::array logits = mx::log(mx::array({0.2f, 0.8f}, {1, 2}));
  std::vector<int64_t> draws =
      to_ints(run_op("Multinomial", 7, {logits}, {int_attr("sample_size", 5000), float_attr("seed", 5.f)})[0].tensor());
  ASSERT_EQ(draws.size(), 5000u);
  size_t ones = 0;
  for (int64_t d : draws) {
    ASSERT_TRUE(d == 0 || d == 1);
    ones += static_cast<size_t>(d);
  }
  // 5000 draws of class 1 at 0.8: the rate has a standard error of 0.0057; 8 of them.
  EXPECT_NEAR(static_cast<double>(ones) / draws.size(), 0.8, 0.045);
}

TEST(RandomGenerators, RandomNormalNeedsAShape) {
  try {
    run_op("RandomNormal", 22, {});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("required attribute 'shape' is missing"), std::string::npos)
        << e.what();
  }
}

TEST(RandomGenerators, MultinomialSampleSizeBeyondInt32IsAnError) {
  std::string message = testing::error_of<OpError>([] {
    run_op("Multinomial", 7, {mx::zeros({1, 2})}, {int_attr("sample_size", (int64_t{1} << 32) + 1)});
  });
  EXPECT_EQ(message,
            "[Multinomial v7] node 'test_Multinomial': sample_size 4294967297 does not fit in int32");
}

}  // namespace
}  // namespace transmuter
