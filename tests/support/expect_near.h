// Element-wise comparison of op results with expected values, for the unit
// tests in tests/ops/. Each test file keeps its own default tolerance, with
// the reason it fits that file's ops, and forwards here.
#pragma once

#include <gtest/gtest.h>

#include <vector>

namespace transmuter::testing {

/** EXPECT_NEAR on every element of two equally long vectors, naming the index. */
inline void expect_all_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], tol) << "at " << i;
}

}  // namespace transmuter::testing
