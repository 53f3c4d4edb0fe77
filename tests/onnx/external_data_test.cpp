#include "onnx/external_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "onnx/model_file.h"
#include "support/expect_error.h"
#include "support/proto_writer.h"

namespace transmuter {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
namespace proto = testing::proto;

std::span<const uint8_t> bytes_of(const std::string& data) {
  return {reinterpret_cast<const uint8_t*>(data.data()), data.size()};
}

// Y = W (an external tensor), plus an If whose branch holds another external
// initializer and a Constant whose tensor attribute is external too.
std::string model_with_external_tensors() {
  proto::GraphParts branch;
  branch.name = "then";
  branch.nodes = {proto::node("Identity", {"B"}, {"out"})};
  branch.initializers = {proto::external_tensor("B", OnnxType::kFloat, {2}, "branch.bin")};
  branch.outputs = {proto::value_info("out", OnnxType::kFloat, {2})};
  proto::GraphParts g;
  g.nodes = {
      proto::node("Identity", {"W"}, {"Y"}),
      proto::with_attributes(proto::node("If", {"C"}, {"Z"}),
                             {proto::attr_graph("then_branch", proto::graph(branch))}),
      proto::with_attributes(
          proto::node("Constant", {}, {"K"}),
          {proto::attr_tensor("value", proto::external_tensor("", OnnxType::kFloat, {1}, "const.bin"))})};
  g.initializers = {proto::external_tensor("W", OnnxType::kFloat, {2}, "weights.bin", 0, 8),
                    proto::external_tensor("V", OnnxType::kFloat, {2}, "weights.bin", 8, 8),
                    proto::raw_tensor("C", OnnxType::kBool, {}, std::string(1, '\1'))};
  g.outputs = {proto::value_info("Y", OnnxType::kFloat, {2})};
  return proto::model(proto::graph(g)).data();
}

TEST(ExternalDataLocations, EveryExternalTensorOnceInTheOrderFound) {
  const std::string model = model_with_external_tensors();
  EXPECT_EQ(external_data_locations(bytes_of(model), "m.onnx"),
            (std::vector<std::string>{"branch.bin", "const.bin", "weights.bin"}));
}

TEST(ExternalDataLocations, AModelWithoutExternalDataNamesNone) {
  proto::GraphParts g;
  g.nodes = {proto::node("Identity", {"W"}, {"Y"})};
  g.initializers = {proto::raw_tensor("W", OnnxType::kFloat, {1}, proto::raw({1.0f}))};
  const std::string model = proto::model(proto::graph(g)).data();
  EXPECT_TRUE(external_data_locations(bytes_of(model), "m.onnx").empty());
}

TEST(ExternalDataLocations, MalformedFilesAreErrorsNamingThem) {
  const std::string truncated = model_with_external_tensors().substr(0, 40);
  EXPECT_NE(error_of([&] { external_data_locations(bytes_of(truncated), "cut.onnx"); }).find("cut.onnx"),
            std::string::npos);
  proto::GraphParts g;
  testing::ProtoWriter no_location = proto::tensor("W", OnnxType::kFloat, {1});
  no_location.varint(14, 1);
  g.initializers = {no_location};
  const std::string model = proto::model(proto::graph(g)).data();
  EXPECT_NE(error_of([&] { external_data_locations(bytes_of(model), "m.onnx"); }).find("has no location"),
            std::string::npos);
}

// A hub snapshot: model.onnx and its data are symlinks into the repo's blobs/.
class LinkedExternalData : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("transmuter_linked_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "blobs");
    fs::create_directories(root_ / "snapshot" / "onnx");
    fs::create_directories(root_ / "elsewhere");
    const float values[2] = {1, 2};
    std::ofstream(root_ / "blobs" / "data", std::ios::binary).write(reinterpret_cast<const char*>(values), 8);
    std::ofstream(root_ / "elsewhere" / "data", std::ios::binary)
        .write(reinterpret_cast<const char*>(values), 8);
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path model_reading(const std::string& location) {
    proto::GraphParts g;
    g.nodes = {proto::node("Identity", {"W"}, {"Y"})};
    g.initializers = {proto::external_tensor("W", OnnxType::kFloat, {2}, location, 0, 8)};
    g.outputs = {proto::value_info("Y", OnnxType::kFloat, {2})};
    const fs::path path = root_ / "snapshot" / "onnx" / "model.onnx";
    std::ofstream(path, std::ios::binary) << proto::model(proto::graph(g)).data();
    return path;
  }

  fs::path root_;
};

TEST_F(LinkedExternalData, LinksIntoTheNamedFolderAreFollowed) {
  fs::create_symlink("../../blobs/data", root_ / "snapshot" / "onnx" / "model.onnx_data");
  const fs::path model = model_reading("model.onnx_data");
  EXPECT_NE(error_of([&] { read_model_file(model); }).find("outside the model's folder"), std::string::npos);
  EXPECT_EQ(read_model_file(model, root_ / "blobs").graph->initializers.at("W").tensor().size(), 2u);
}

TEST_F(LinkedExternalData, LinksElsewhereAndDotDotLocationsStayRefused) {
  fs::create_symlink("../../elsewhere/data", root_ / "snapshot" / "onnx" / "model.onnx_data");
  const fs::path model = model_reading("model.onnx_data");
  EXPECT_NE(error_of([&] { read_model_file(model, root_ / "blobs"); }).find("outside the model's folder"),
            std::string::npos);
  // The location itself leaves the folder, even though its target is inside blobs/.
  const fs::path escaping = model_reading("../../blobs/data");
  EXPECT_NE(error_of([&] { read_model_file(escaping, root_ / "blobs"); }).find("outside the model's folder"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter
