#include <gtest/gtest.h>

#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::run_op;
using testing::to_doubles;

TEST(Elementwise, AddBroadcastsNumpyStyle) {
  auto out = run_op("Add", 14, {mx::array({1.f, 2.f, 3.f}, {3, 1}), mx::array({10.f, 20.f}, {1, 2})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{3, 2}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{11, 21, 12, 22, 13, 23}));
}

TEST(Elementwise, AddLegacyBroadcastAlignsAtAxis) {
  // Opset 6: B of shape [3] aligned to axis 0 of A [3, 2].
  auto out = run_op("Add", 6, {mx::zeros({3, 2}), mx::array({1.f, 2.f, 3.f})},
                    {testing::int_attr("broadcast", 1), testing::int_attr("axis", 0)});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{1, 1, 2, 2, 3, 3}));
}

TEST(Elementwise, MissingInputNamesTheNode) {
  try {
    run_op("Add", 14, {mx::array(1.f)});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[Add v7] node 'test_Add'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace transmuter
