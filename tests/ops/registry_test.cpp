#include <gtest/gtest.h>

#include "ops/node_context.h"
#include "ops/registry.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

OpOutputs first_impl(NodeContext&) { return {}; }
OpOutputs second_impl(NodeContext&) { return {}; }

OpRegistry two_ranges() {
  OpRegistry r;
  r.add({{"Op", kOnnx, 1, 12, first_impl}, {"Op", kOnnx, 13, kOpen, second_impl}});
  return r;
}

TEST(OpRegistry, PicksTheRangeHoldingTheModelOpset) {
  OpRegistry r = two_ranges();
  EXPECT_EQ(r.find("", "Op", 1)->fn, first_impl);
  EXPECT_EQ(r.find("", "Op", 12)->fn, first_impl);
  EXPECT_EQ(r.find("", "Op", 13)->fn, second_impl);
  EXPECT_EQ(r.find("", "Op", 23)->fn, second_impl);
  EXPECT_EQ(r.find("ai.onnx", "Op", 13)->fn, second_impl);  // long spelling of the default domain
}

TEST(OpRegistry, UnknownOpDomainOrTooOldOpsetIsNotFound) {
  OpRegistry r;
  r.add({"New", kOnnx, 13, kOpen, first_impl});
  EXPECT_EQ(r.find("", "New", 12), nullptr);
  EXPECT_EQ(r.find("", "Missing", 13), nullptr);
  EXPECT_EQ(r.find("com.microsoft", "New", 13), nullptr);
}

TEST(OpRegistry, ClosedRangeDoesNotCoverNewerOpsets) {
  // A row that stops at 12 must not silently serve opset 14, where the op
  // may have changed.
  OpRegistry r;
  r.add({"Op", kOnnx, 1, 12, first_impl});
  EXPECT_EQ(r.find("", "Op", 14), nullptr);
}

TEST(OpRegistry, OverlappingRangesAreRejected) {
  OpRegistry r = two_ranges();
  EXPECT_THROW(r.add({"Op", kOnnx, 12, 14, first_impl}), Error);
  EXPECT_THROW(r.add({"Op", kOnnx, 13, kOpen, first_impl}), Error);
  EXPECT_NO_THROW(r.add({"Op", "com.microsoft", 1, kOpen, first_impl}));
}

TEST(OpRegistry, BuiltinRegistryHasNoGapsForCoreOps) {
  // Every opset from the op's first version to the newest resolves to a row.
  const OpRegistry& r = builtin_registry();
  for (const char* op : {"Add", "Softmax", "Reshape", "Slice", "ReduceSum", "Conv", "MatMul", "Cast", "Gather"}) {
    const OpRow* first = nullptr;
    for (int opset = 1; opset <= 23; ++opset) {
      const OpRow* row = r.find("", op, opset);
      if (row == nullptr) {
        EXPECT_EQ(first, nullptr) << op << " has a gap at opset " << opset;
        continue;
      }
      if (first == nullptr) first = row;
    }
    EXPECT_NE(first, nullptr) << op << " is not registered";
  }
}

}  // namespace
}  // namespace transmuter
