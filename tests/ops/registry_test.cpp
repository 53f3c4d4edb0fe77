#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <span>
#include <string>

#include "onnx/since_versions.h"
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

namespace transmuter {
namespace {

// Every row of a default-domain op must start at a schema version and end just
// before one (or stay open), rows of one op must not leave gaps, and the last
// must be open: otherwise a model at some opset finds no row, or a row that
// implements the wrong version. That the first row starts at the op's first
// schema version is checked by EveryAiOnnxOperatorIsImplementedFromItsFirstVersion.
std::vector<std::string> version_range_problems(const std::vector<const OpRow*>& rows) {
  std::vector<std::string> problems;
  std::map<std::string, std::vector<const OpRow*>> by_op;
  for (const OpRow* row : rows) {
    if (row->domain.empty() && !row->onnxruntime_default_domain) by_op[std::string(row->op_type)].push_back(row);
  }
  for (const auto& [op, op_rows] : by_op) {
    std::span<const int> versions = onnx_since_versions("", op);
    if (versions.empty()) {
      problems.push_back(str(op, ": no such ai.onnx schema"));
      continue;
    }
    auto is_version = [&](int v) { return std::find(versions.begin(), versions.end(), v) != versions.end(); };
    for (size_t i = 0; i < op_rows.size(); ++i) {
      const OpRow& row = *op_rows[i];
      if (!is_version(row.since)) problems.push_back(str(op, " v", row.since, ": not a schema version"));
      if (row.until != kOpen && !is_version(row.until + 1)) {
        problems.push_back(str(op, " v", row.since, "-", row.until, ": ends before no schema version"));
      }
      if (i + 1 < op_rows.size() && op_rows[i + 1]->since != row.until + 1) {
        problems.push_back(str(op, ": gap after v", row.until));
      }
    }
    if (op_rows.back()->until != kOpen) {
      problems.push_back(str(op, ": newest versions from v", op_rows.back()->until + 1, " have no row"));
    }
  }
  return problems;
}

TEST(OpRegistry, RowsMatchOnnxSchemaSinceVersions) {
  std::vector<std::string> problems = version_range_problems(builtin_registry().rows());
  std::string all;
  for (const std::string& p : problems) all += "\n  " + p;
  EXPECT_TRUE(problems.empty()) << problems.size() << " problem(s):" << all;
}

// Issue 6: every ai.onnx operator of the pinned onnx, from its first schema
// version on (with the test above: every version has exactly one row).
TEST(OpRegistry, EveryAiOnnxOperatorIsImplementedFromItsFirstVersion) {
  std::map<std::string, int> first_row;
  for (const OpRow* row : builtin_registry().rows()) {
    if (!row->domain.empty() || row->onnxruntime_default_domain) continue;
    auto [it, inserted] = first_row.emplace(std::string(row->op_type), row->since);
    if (!inserted) it->second = std::min(it->second, row->since);
  }
  std::string missing, late;
  for (std::string_view op : onnx_schema_ops("")) {
    auto it = first_row.find(std::string(op));
    if (it == first_row.end()) {
      missing += str(" ", op);
    } else if (it->second != onnx_since_versions("", op).front()) {
      late += str(" ", op, " (from v", it->second, ", schema from v", onnx_since_versions("", op).front(), ")");
    }
  }
  EXPECT_EQ(missing, "") << "ai.onnx operators with no row";
  EXPECT_EQ(late, "") << "ai.onnx operators whose oldest versions have no row";
}

TEST(OpRegistry, VersionRangeCheckCatchesMistakes) {
  auto fn = [](NodeContext&) -> OpOutputs { return {}; };
  OpRow starts_off{"Softmax", kOnnx, 12, kOpen, fn};  // 12 is no Softmax version
  OpRow closed{"Softmax", kOnnx, 13, 17, fn};         // 18 is no version, and 13+ stays uncovered
  OpRow first{"Softmax", kOnnx, 1, 10, fn};
  OpRow after_gap{"Softmax", kOnnx, 13, kOpen, fn};   // 11-12 missing
  EXPECT_EQ(version_range_problems({&starts_off}).size(), 1u);
  EXPECT_EQ(version_range_problems({&closed}).size(), 2u);
  EXPECT_EQ(version_range_problems({&first, &after_gap}).size(), 1u);
  OpRow v1{"Softmax", kOnnx, 1, 10, fn}, v11{"Softmax", kOnnx, 11, 12, fn}, v13{"Softmax", kOnnx, 13, kOpen, fn};
  EXPECT_TRUE(version_range_problems({&v1, &v11, &v13}).empty());
}

}  // namespace
}  // namespace transmuter
