#include <gtest/gtest.h>

#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::float_attr;
using testing::int_attr;
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

}  // namespace
}  // namespace transmuter
