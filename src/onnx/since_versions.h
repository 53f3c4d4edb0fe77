// The opset versions at which each ONNX operator schema changed, from the
// pinned onnx package (generated into since_versions.inc). Registry rows are
// checked against it (tests/ops/since_versions_test.cpp).
#pragma once

#include <span>
#include <string_view>
#include <vector>

namespace transmuter {

/** Versions of `op_type` in `domain` ("" or "ai.onnx" for the default
 * domain), ascending; empty when the schema is unknown. */
std::span<const int> onnx_since_versions(std::string_view domain, std::string_view op_type);

/** Every operator of `domain` ("" for the default domain) in the pinned onnx
 * package's schemas, by name. */
std::vector<std::string_view> onnx_schema_ops(std::string_view domain);

}  // namespace transmuter
