#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::floats_attr;
using testing::i64;
using testing::int_attr;
using testing::ints_attr;
using testing::run_domain_op;
using testing::string_attr;
using testing::strings_attr;
using testing::tensor_attr;
using testing::to_doubles;
using testing::to_ints;

const std::string kMl = "ai.onnx.ml";

TEST(LabelEncoder, StringsToIntsWithDefault) {
  Value x = StringTensor{{2, 2}, {"b", "zz", "a", "b"}};
  auto out = run_domain_op(kMl, "LabelEncoder", 2, {x},
                           {strings_attr("keys_strings", {"a", "b"}), ints_attr("values_int64s", {7, 8}),
                            int_attr("default_int64", -5)});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{8, -5, 7, 8}));
}

TEST(LabelEncoder, FloatKeysMatchAnyNanAndLastRepeatWins) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto out = run_domain_op(kMl, "LabelEncoder", 2, {mx::array({1.5f, -nan, 2.f})},
                           {floats_attr("keys_floats", {1.5f, nan, 1.5f}), strings_attr("values_strings", {"x", "n", "y"})});
  EXPECT_EQ(out[0].strings().data, (std::vector<std::string>{"y", "n", "_Unused"}));
}

TEST(LabelEncoder, TensorValuesKeepTheirDtype) {
  auto out = run_domain_op(kMl, "LabelEncoder", 4, {i64({3, 4})},
                           {tensor_attr("keys_tensor", i64({3})),
                            tensor_attr("values_tensor", mx::array({0.25}, mx::float64)),
                            tensor_attr("default_tensor", mx::array({-1.0}, mx::float64))});
  EXPECT_EQ(out[0].tensor().dtype(), mx::float64);
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{0.25, -1}));
}

TEST(LabelEncoder, Opset1MapsBothWaysThroughClasses) {
  auto to_index = run_domain_op(kMl, "LabelEncoder", 1, {Value(StringTensor{{2}, {"b", "q"}})},
                                {strings_attr("classes_strings", {"a", "b"})});
  EXPECT_EQ(to_ints(to_index[0].tensor()), (std::vector<int64_t>{1, -1}));
  auto to_label = run_domain_op(kMl, "LabelEncoder", 1, {i64({0, 9})},
                                {strings_attr("classes_strings", {"a", "b"}), string_attr("default_string", "?")});
  EXPECT_EQ(to_label[0].strings().data, (std::vector<std::string>{"a", "?"}));
}

TEST(LabelEncoder, RejectsMismatchedTables) {
  EXPECT_NE(error_of<OpError>([] {
              run_domain_op(kMl, "LabelEncoder", 2, {i64({1})},
                            {ints_attr("keys_int64s", {1, 2}), ints_attr("values_int64s", {1})});
            }).find("2 keys but 1 values"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] {
              run_domain_op(kMl, "LabelEncoder", 2, {i64({1})},
                            {ints_attr("keys_int64s", {1}), strings_attr("keys_strings", {"a"}),
                             ints_attr("values_int64s", {1})});
            }).find("exactly one of the keys_*"),
            std::string::npos);
}

// One tree: x0 <= 1 ? leaf 0 : (x1 in {3, 4} ? leaf 1 : leaf 2); targets 0, 1, 1.
std::vector<Attribute> tree(int64_t aggregate = 1, int64_t post = 0) {
  return {tensor_attr("nodes_splits", mx::array({1.0f, 0.0f})),
          ints_attr("nodes_featureids", {0, 1}),
          tensor_attr("nodes_modes", mx::astype(mx::array({0, 6}), mx::uint8)),
          ints_attr("nodes_truenodeids", {0, 1}),
          ints_attr("nodes_trueleafs", {1, 1}),
          ints_attr("nodes_falsenodeids", {1, 2}),
          ints_attr("nodes_falseleafs", {0, 1}),
          tensor_attr("membership_values", mx::array({3.f, 4.f, std::nanf("")})),
          ints_attr("leaf_targetids", {0, 1, 1}),
          tensor_attr("leaf_weights", mx::array({10.f, 20.f, 30.f})),
          ints_attr("tree_roots", {0}),
          int_attr("n_targets", 2),
          int_attr("aggregate_function", aggregate),
          int_attr("post_transform", post)};
}

TEST(TreeEnsemble, WalksBranchesAndSetMembership) {
  mx::array x = mx::array({0.5f, 0.f, 2.f, 4.f, 2.f, 5.f}, {3, 2});
  auto out = run_domain_op(kMl, "TreeEnsemble", 5, {x}, tree());
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{10, 0, 0, 20, 0, 30}));
  auto logistic = run_domain_op(kMl, "TreeEnsemble", 5, {mx::array({0.5f, 0.f}, {1, 2})}, tree(1, 2));
  EXPECT_NEAR(to_doubles(logistic[0].tensor())[0], 1 / (1 + std::exp(-10.0)), 1e-6);
}

TEST(TreeEnsemble, RejectsTreesThatPointOutside) {
  auto attrs = tree();
  attrs[3] = ints_attr("nodes_truenodeids", {5, 1});
  EXPECT_NE(error_of<OpError>([&] { run_domain_op(kMl, "TreeEnsemble", 5, {mx::array({0.f, 0.f}, {1, 2})}, attrs); })
                .find("points outside"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] { run_domain_op(kMl, "TreeEnsemble", 5, {mx::array({0.f, 0.f})}, tree()); })
                .find("[N, F]"),
            std::string::npos);
}

TEST(ArrayFeatureExtractor, PicksLastAxisEntriesAndChecksIndices) {
  auto out = run_domain_op(kMl, "ArrayFeatureExtractor", 1, {mx::array({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3}), i64({2, 0})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{2, 2}));
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{3, 1, 6, 4}));
  auto vec = run_domain_op(kMl, "ArrayFeatureExtractor", 1, {mx::array({1.f, 2.f}), i64({1})});
  EXPECT_EQ(vec[0].tensor().shape(), (mx::Shape{1, 1}));
  EXPECT_NE(error_of<OpError>([] { run_domain_op(kMl, "ArrayFeatureExtractor", 1, {mx::array({1.f}), i64({3})}); })
                .find("index 3"),
            std::string::npos);
}

TEST(Binarizer, ThresholdIsStrict) {
  auto out = run_domain_op(kMl, "Binarizer", 1, {mx::array({0.5f, 1.f, 1.5f})}, {float_attr("threshold", 1.f)});
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{0, 0, 1}));
}

}  // namespace
}  // namespace transmuter
