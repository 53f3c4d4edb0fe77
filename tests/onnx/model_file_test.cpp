#include "onnx/model_file.h"

#include <gtest/gtest.h>
#include <mlx/mlx.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <sstream>
#include <thread>

#include "mlx_bridge/buffers.h"
#include "support/expect_error.h"
#include "support/proto_writer.h"
#include "transmuter/error.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

namespace fs = std::filesystem;
using testing::ProtoWriter;
namespace proto = testing::proto;

using testing::error_of;

std::span<const uint8_t> span_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

ModelFile load(const ProtoWriter& model) { return read_model_bytes(span_of(model.data()), ""); }

template <typename T>
std::vector<T> values_of(const mx::array& a) {
  mx::array c = mx::contiguous(a);
  mx::eval(c);
  return std::vector<T>(c.data<T>(), c.data<T>() + c.size());
}

// Y = X + W (W an initializer), Z = Relu(Y); X has a symbolic batch dim.
ProtoWriter small_model() {
  proto::GraphParts g;
  g.name = "main";
  g.nodes = {proto::node("Add", {"X", "W"}, {"Y"}, "add"), proto::node("Relu", {"Y"}, {"Z"}, "relu")};
  g.initializers = {proto::raw_tensor("W", OnnxType::kFloat, {3}, proto::raw({1.f, -2.f, 3.f}))};
  g.inputs = {proto::value_info("X", OnnxType::kFloat, {-1, 3})};
  g.outputs = {proto::value_info("Z", OnnxType::kFloat, {-1, 3})};
  g.value_infos = {proto::value_info("Y", OnnxType::kFloat, {-1, 3})};
  ProtoWriter m = proto::model(proto::graph(g), {{"", 17}, {"com.microsoft", 1}}, 8);
  m.message(14, ProtoWriter().string(1, "author").string(2, "tests"));
  return m;
}

TEST(ModelFile, ParsesModelFieldsGraphAndOpsets) {
  const ModelFile m = load(small_model());
  EXPECT_EQ(m.ir_version, 8);
  EXPECT_EQ(m.producer_name, "proto_writer");
  EXPECT_EQ(m.producer_version, "1.0");
  EXPECT_EQ(m.metadata.at("author"), "tests");
  const Graph& g = *m.graph;
  EXPECT_EQ(g.name, "main");
  EXPECT_EQ(g.opsets.at(""), 17);
  EXPECT_EQ(g.opsets.at("com.microsoft"), 1);
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[0].op_type, "Add");
  EXPECT_EQ(g.nodes[0].name, "add");
  EXPECT_EQ(g.nodes[0].inputs, (std::vector<std::string>{"X", "W"}));
  EXPECT_EQ(g.nodes[0].outputs, (std::vector<std::string>{"Y"}));
  EXPECT_EQ(g.nodes[0].opset, 17);
  ASSERT_EQ(g.inputs.size(), 1u);
  EXPECT_EQ(g.inputs[0].name, "X");
  EXPECT_EQ(g.inputs[0].kind, ValueInfo::Kind::kTensor);
  EXPECT_EQ(g.inputs[0].elem_type, OnnxType::kFloat);
  ASSERT_TRUE(g.inputs[0].has_shape);
  ASSERT_EQ(g.inputs[0].shape.size(), 2u);
  EXPECT_FALSE(g.inputs[0].shape[0].value.has_value());
  EXPECT_EQ(g.inputs[0].shape[0].symbol, "N");
  EXPECT_EQ(g.inputs[0].shape[1].value, 3);
  EXPECT_EQ(g.outputs[0].name, "Z");
  EXPECT_EQ(g.value_info[0].name, "Y");
  EXPECT_EQ(values_of<float>(g.initializers.at("W").tensor()), (std::vector<float>{1, -2, 3}));
}

TEST(ModelFile, AiOnnxDomainIsTheDefaultDomainAndNodesGetTheirDomainsOpset) {
  proto::GraphParts g;
  g.nodes = {proto::node("Relu", {"X"}, {"Y"}, "r", "ai.onnx"),
             proto::node("FastGelu", {"Y"}, {"Z"}, "gelu", "com.microsoft"),
             proto::node("Mystery", {"Z"}, {"Q"}, "m", "org.unknown")};
  g.inputs = {proto::value_info("X", OnnxType::kFloat, {2})};
  g.outputs = {proto::value_info("Q", OnnxType::kFloat, {2})};
  const ModelFile m = load(proto::model(proto::graph(g), {{"ai.onnx", 13}, {"com.microsoft", 1}}));
  EXPECT_EQ(m.graph->opsets.at(""), 13);
  EXPECT_EQ(m.graph->nodes[0].domain, "");
  EXPECT_EQ(m.graph->nodes[0].opset, 13);
  EXPECT_EQ(m.graph->nodes[1].domain, "com.microsoft");
  EXPECT_EQ(m.graph->nodes[1].opset, 1);
  EXPECT_EQ(m.graph->nodes[2].opset, 0) << "a domain the model does not import";
}

// ONNX Runtime's transformer optimizer adds com.microsoft nodes without an
// opset_import for the domain; ORT runs them at version 1, and so do we.
TEST(ModelFile, ComMicrosoftNodesWithoutTheDomainImportedAreVersion1) {
  proto::GraphParts g;
  g.nodes = {proto::node("FastGelu", {"X"}, {"Y"}, "gelu", "com.microsoft"),
             proto::node("Mystery", {"Y"}, {"Z"}, "m", "org.unknown")};
  g.inputs = {proto::value_info("X", OnnxType::kFloat, {2})};
  g.outputs = {proto::value_info("Z", OnnxType::kFloat, {2})};
  const ModelFile m = load(proto::model(proto::graph(g), {{"", 17}}));
  EXPECT_EQ(m.graph->nodes[0].opset, 1);
  EXPECT_EQ(m.graph->nodes[1].opset, 0) << "other domains still need their import";
  EXPECT_EQ(m.graph->opsets.count("com.microsoft"), 0u) << "the model's opsets are reported as written";
}

TEST(ModelFile, InitializersListedAsInputsAreNotInputs) {
  proto::GraphParts g;
  g.nodes = {proto::node("Add", {"X", "W"}, {"Y"})};
  g.initializers = {proto::raw_tensor("W", OnnxType::kFloat, {1}, proto::raw({1.f}))};
  g.inputs = {proto::value_info("X", OnnxType::kFloat, {1}), proto::value_info("W", OnnxType::kFloat, {1})};
  g.outputs = {proto::value_info("Y", OnnxType::kFloat, {1})};
  const ModelFile m = load(proto::model(proto::graph(g), {{"", 3}}, 3));
  ASSERT_EQ(m.graph->inputs.size(), 1u);
  EXPECT_EQ(m.graph->inputs[0].name, "X");
  EXPECT_TRUE(m.graph->initializers.contains("W"));
}

TEST(ModelFile, NodesOutOfOrderAreSorted) {
  proto::GraphParts g;
  g.nodes = {proto::node("Relu", {"Y"}, {"Z"}, "second"), proto::node("Neg", {"X"}, {"Y"}, "first")};
  g.inputs = {proto::value_info("X", OnnxType::kFloat, {1})};
  g.outputs = {proto::value_info("Z", OnnxType::kFloat, {1})};
  const ModelFile m = load(proto::model(proto::graph(g)));
  EXPECT_EQ(m.graph->nodes[0].name, "first");
  EXPECT_EQ(m.graph->nodes[1].name, "second");
}

TEST(ModelFile, EveryAttributeKind) {
  proto::GraphParts branch;
  branch.name = "then";
  branch.nodes = {proto::node("Identity", {"X"}, {"T"}, "inner")};
  branch.outputs = {proto::value_info("T", OnnxType::kFloat, {1})};
  const ProtoWriter sub = proto::graph(branch);

  ProtoWriter tensors_attr;
  tensors_attr.string(1, "tensors").varint(20, 9);
  tensors_attr.message(10, proto::raw_tensor("t0", OnnxType::kInt64, {1}, proto::raw<int64_t>({5})));
  tensors_attr.message(10, proto::raw_tensor("t1", OnnxType::kInt64, {1}, proto::raw<int64_t>({6})));
  ProtoWriter graphs_attr;
  graphs_attr.string(1, "graphs").varint(20, 10).message(11, sub).message(11, sub);
  ProtoWriter typeless_int;  // old producers leave `type` unset
  typeless_int.string(1, "typeless").int64(3, 9);
  ProtoWriter type_proto_attr;
  type_proto_attr.string(1, "tp").varint(20, 13).message(14, proto::tensor_type(OnnxType::kFloat, {1}));

  ProtoWriter node = proto::with_attributes(
      proto::node("Custom", {"X"}, {"Y"}, "all_attrs"),
      {proto::attr_float("f", 0.25f), proto::attr_int("i", -3), proto::attr_string("s", "text"),
       proto::attr_tensor("t", proto::raw_tensor("tv", OnnxType::kFloat, {2}, proto::raw({1.f, 2.f}))),
       proto::attr_graph("g", sub), proto::attr_floats("floats", {1.5f, 2.5f}),
       proto::attr_ints("ints", {1, -2, 3}), proto::attr_strings("strings", {"a", "bc"}), tensors_attr,
       graphs_attr, typeless_int, type_proto_attr, proto::attr_ref("ref", "outer", 2)});
  proto::GraphParts g;
  g.nodes = {node};
  g.inputs = {proto::value_info("X", OnnxType::kFloat, {1})};
  g.outputs = {proto::value_info("Y", OnnxType::kFloat, {1})};
  const ModelFile m = load(proto::model(proto::graph(g), {{"", 11}}));
  const Node& n = m.graph->nodes.at(0);

  EXPECT_EQ(n.find_attribute("f")->type, AttrType::kFloat);
  EXPECT_EQ(n.find_attribute("f")->f, 0.25f);
  EXPECT_EQ(n.find_attribute("i")->type, AttrType::kInt);
  EXPECT_EQ(n.find_attribute("i")->i, -3);
  EXPECT_EQ(n.find_attribute("s")->s, "text");
  EXPECT_EQ(values_of<float>(n.find_attribute("t")->t.tensor()), (std::vector<float>{1, 2}));
  const Attribute* ga = n.find_attribute("g");
  ASSERT_EQ(ga->type, AttrType::kGraph);
  ASSERT_TRUE(ga->g);
  EXPECT_EQ(ga->g->name, "then");
  EXPECT_EQ(ga->g->nodes.at(0).opset, 11) << "subgraphs share the model's opsets";
  EXPECT_EQ(ga->g->opsets.at(""), 11);
  EXPECT_EQ(n.find_attribute("floats")->floats, (std::vector<float>{1.5f, 2.5f}));
  EXPECT_EQ(n.find_attribute("ints")->ints, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(n.find_attribute("strings")->strings, (std::vector<std::string>{"a", "bc"}));
  const Attribute* ta = n.find_attribute("tensors");
  ASSERT_EQ(ta->tensors.size(), 2u);
  EXPECT_EQ(values_of<int64_t>(ta->tensors[1].tensor()), (std::vector<int64_t>{6}));
  EXPECT_EQ(n.find_attribute("graphs")->graphs.size(), 2u);
  EXPECT_EQ(n.find_attribute("typeless")->type, AttrType::kInt);
  EXPECT_EQ(n.find_attribute("typeless")->i, 9);
  EXPECT_EQ(n.find_attribute("tp")->type, AttrType::kTypeProto);
  EXPECT_EQ(n.find_attribute("ref")->ref_attr_name, "outer");
}

TEST(ModelFile, SequenceOptionalAndMapTypes) {
  ProtoWriter seq_type = ProtoWriter().message(4, ProtoWriter().message(1, proto::tensor_type(OnnxType::kInt64, {2})));
  ProtoWriter opt_type = ProtoWriter().message(9, ProtoWriter().message(1, proto::tensor_type(OnnxType::kFloat, {})));
  ProtoWriter map_type = ProtoWriter().message(
      5, ProtoWriter().varint(1, 8).message(2, proto::tensor_type(OnnxType::kFloat, {})));
  proto::GraphParts g;
  g.nodes = {proto::node("Identity", {"S"}, {"S2"})};
  g.inputs = {proto::value_info("S", seq_type), proto::value_info("O", opt_type),
              proto::value_info("M", map_type)};
  g.outputs = {proto::value_info("S2", seq_type)};
  const ModelFile m = load(proto::model(proto::graph(g)));
  const auto& in = m.graph->inputs;
  ASSERT_EQ(in.size(), 3u);
  EXPECT_EQ(in[0].kind, ValueInfo::Kind::kSequence);
  EXPECT_EQ(in[0].elem_type, OnnxType::kInt64);
  ASSERT_EQ(in[0].shape.size(), 1u);
  EXPECT_EQ(in[0].shape[0].value, 2);
  EXPECT_EQ(in[1].kind, ValueInfo::Kind::kOptional);
  EXPECT_EQ(in[1].elem_type, OnnxType::kFloat);
  EXPECT_EQ(in[2].kind, ValueInfo::Kind::kMap);
}

TEST(ModelFile, SparseInitializerIsDensified) {
  ProtoWriter sparse;
  sparse.message(1, proto::raw_tensor("S", OnnxType::kFloat, {1}, proto::raw({4.f})));
  sparse.message(2, proto::raw_tensor("", OnnxType::kInt64, {1}, proto::raw<int64_t>({2})));
  sparse.packed_int64s(3, {3});
  proto::GraphParts parts;
  parts.nodes = {proto::node("Identity", {"S"}, {"Y"})};
  parts.outputs = {proto::value_info("Y", OnnxType::kFloat, {3})};
  ProtoWriter g = proto::graph(parts);
  g.message(15, sparse);
  const ModelFile m = load(proto::model(g));
  EXPECT_EQ(values_of<float>(m.graph->initializers.at("S").tensor()), (std::vector<float>{0, 0, 4}));
}

TEST(ModelFile, ModelLocalFunctionsAreInlined) {
  // custom.AddTwice(x) = x + y + y with attribute-free body.
  ProtoWriter function;
  function.string(1, "AddTwice").string(4, "x").string(4, "y").string(5, "out");
  function.message(7, proto::node("Add", {"x", "y"}, {"tmp"}, "first"));
  function.message(7, proto::node("Add", {"tmp", "y"}, {"out"}, "second"));
  function.message(9, proto::opset("", 14));
  function.string(10, "custom");
  proto::GraphParts g;
  g.nodes = {proto::node("AddTwice", {"A", "B"}, {"C"}, "call", "custom")};
  g.inputs = {proto::value_info("A", OnnxType::kFloat, {1}), proto::value_info("B", OnnxType::kFloat, {1})};
  g.outputs = {proto::value_info("C", OnnxType::kFloat, {1})};
  const ModelFile m =
      load(proto::model(proto::graph(g), {{"", 17}, {"custom", 1}}, 8, {function}));
  const auto& nodes = m.graph->nodes;
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].op_type, "Add");
  EXPECT_EQ(nodes[0].inputs, (std::vector<std::string>{"A", "B"}));
  EXPECT_EQ(nodes[0].opset, 14) << "body nodes use the function's opset_import";
  EXPECT_EQ(nodes[1].inputs.at(0), nodes[0].outputs.at(0));
  EXPECT_EQ(nodes[1].outputs, (std::vector<std::string>{"C"}));
}

TEST(ModelFile, NegativeDimValueIsAnUnknownDim) {
  // Several exporters write a dynamic batch as dim_value: -1.
  ProtoWriter shape;
  shape.message(1, ProtoWriter().int64(1, -1)).message(1, ProtoWriter().int64(1, 3));
  ProtoWriter tensor_type;
  tensor_type.varint(1, static_cast<uint64_t>(OnnxType::kFloat)).message(2, shape);
  proto::GraphParts g;
  g.nodes = {proto::node("Relu", {"X"}, {"Y"})};
  g.inputs = {proto::value_info("X", ProtoWriter().message(1, tensor_type))};
  g.outputs = {proto::value_info("Y", OnnxType::kFloat, {-1, 3})};
  const ModelFile m = load(proto::model(proto::graph(g)));
  const ValueInfo& x = m.graph->inputs.at(0);
  ASSERT_EQ(x.shape.size(), 2u);
  EXPECT_FALSE(x.shape[0].value.has_value());
  EXPECT_TRUE(x.shape[0].symbol.empty());
  EXPECT_EQ(x.shape[1].value, 3);
}

// F0 calls F1 `fanout` times, F1 calls F2 ..., the last runs one Relu: a
// few hundred bytes that expand to fanout^depth nodes.
ProtoWriter function_bomb(int depth, int fanout) {
  std::vector<ProtoWriter> functions;
  for (int level = 0; level < depth; ++level) {
    ProtoWriter f;
    f.string(1, str("F", level)).string(4, "x").string(5, "y");
    if (level + 1 == depth) {
      f.message(7, proto::node("Relu", {"x"}, {"y"}));
    } else {
      std::string in = "x";
      for (int i = 0; i < fanout; ++i) {
        const std::string out = i + 1 == fanout ? "y" : str("t", i);
        f.message(7, proto::node(str("F", level + 1), {in}, {out}, "", "bomb"));
        in = out;
      }
    }
    f.message(9, proto::opset("", 17)).string(10, "bomb");
    functions.push_back(f);
  }
  proto::GraphParts g;
  g.nodes = {proto::node("F0", {"X"}, {"Y"}, "", "bomb")};
  g.inputs = {proto::value_info("X", OnnxType::kFloat, {1})};
  g.outputs = {proto::value_info("Y", OnnxType::kFloat, {1})};
  return proto::model(proto::graph(g), {{"", 17}, {"bomb", 1}}, 8, functions);
}

TEST(ModelFile, FunctionBombIsRefusedBeforeExpanding) {
  const ProtoWriter bomb = function_bomb(16, 4);  // 4^15 nodes
  EXPECT_LT(bomb.data().size(), 2500u);
  const std::string message = error_of([&] { load(bomb); });
  EXPECT_NE(message.find("function 'F0'"), std::string::npos) << message;
  EXPECT_NE(message.find("cap of 4194304"), std::string::npos) << message;
  // A small instance of the same shape still loads: 3^3 Relus.
  EXPECT_EQ(load(function_bomb(4, 3)).graph->nodes.size(), 27u);
}

// -------------------------------------------------------------- bad input

TEST(ModelFile, BadWireTypeNamesThePath) {
  proto::GraphParts g;
  ProtoWriter graph = proto::graph(g);
  graph.tag(5, 6);  // an initializer field with invalid wire type 6
  const std::string message = error_of([&] { load(proto::model(graph)); });
  EXPECT_NE(message.find("<model bytes>: graph: field 5 has invalid wire type 6"), std::string::npos)
      << message;
}

TEST(ModelFile, InitializerErrorNamesTheInitializer) {
  proto::GraphParts g;
  g.initializers = {proto::raw_tensor("a", OnnxType::kFloat, {1}, proto::raw({1.f})),
                    proto::raw_tensor("w", OnnxType::kFloat, {2}, proto::raw({1.f}))};
  const std::string message = error_of([&] { load(proto::model(proto::graph(g))); });
  EXPECT_NE(message.find("graph.initializer[1] 'w': raw_data has 4 bytes, expected 8"), std::string::npos)
      << message;
}

TEST(ModelFile, TruncatedInitializerNamesTheField) {
  // A TensorProto whose raw_data (field 9) declares more bytes than exist:
  // name first, as serializers write it.
  ProtoWriter tensor;
  tensor.int64(1, 4).varint(2, 1).string(8, "w");
  tensor.tag(9, 2).put_varint(16);
  tensor.raw("short");
  ProtoWriter graph;
  graph.message(5, tensor);
  const std::string message = error_of([&] { load(proto::model(graph)); });
  EXPECT_NE(message.find("graph.initializer[0] 'w': truncated length-delimited field 9"),
            std::string::npos)
      << message;
}

TEST(ModelFile, MissingGraphAndUnknownInput) {
  EXPECT_NE(error_of([&] { load(ProtoWriter().int64(1, 8)); }).find("model has no graph"),
            std::string::npos);
  proto::GraphParts g;
  g.nodes = {proto::node("Relu", {"nowhere"}, {"Y"}, "relu")};
  const std::string message = error_of([&] { load(proto::model(proto::graph(g))); });
  EXPECT_NE(message.find("node 'relu' (Relu): input 'nowhere'"), std::string::npos) << message;
}

TEST(ModelFile, DuplicateInitializer) {
  proto::GraphParts g;
  g.initializers = {proto::raw_tensor("w", OnnxType::kFloat, {1}, proto::raw({1.f})),
                    proto::raw_tensor("w", OnnxType::kFloat, {1}, proto::raw({1.f}))};
  EXPECT_NE(error_of([&] { load(proto::model(proto::graph(g))); }).find("duplicate initializer 'w'"),
            std::string::npos);
}

// Every proper prefix of a valid model either parses or throws
// transmuter::Error; any other exception fails. small_model() ends with three
// top-level fields after its graph (two opset_imports, one metadata_props), so
// only the prefixes that end at one of those field boundaries can be valid
// models: at most 3 load, every other cut must be rejected.
TEST(ModelFile, EveryTruncationLoadsOrThrowsAnError) {
  const std::string full = small_model().data();
  size_t loaded = 0, rejected = 0;
  for (size_t length = 0; length < full.size(); ++length) {
    try {
      read_model_bytes(span_of(full.substr(0, length)), "");
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "prefix of " << length << " bytes: non-transmuter exception: " << e.what();
    }
  }
  EXPECT_EQ(loaded + rejected, full.size());
  EXPECT_LE(loaded, 3u);
  EXPECT_NO_THROW(read_model_bytes(span_of(full), ""));
}

// Random bytes and mutations of a valid model: each must load or throw
// transmuter::Error; any other exception, crash or hang fails.
TEST(ModelFile, FuzzRandomAndMutatedInputs) {
  std::mt19937 rng(20240601);
  const std::string seed_model = small_model().data();
  int loaded = 0, rejected = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    std::string input;
    const int mode = iteration % 4;
    if (mode == 0) {
      input.resize(rng() % 256);
      for (char& c : input) c = static_cast<char>(rng());
    } else {
      input = seed_model;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !input.empty(); ++e) {
        const size_t at = rng() % input.size();
        switch (mode) {
          case 1: input[at] = static_cast<char>(rng()); break;
          case 2: input[at] = static_cast<char>(input[at] ^ (1 << (rng() % 8))); break;
          default:
            if (rng() % 2) {
              input.erase(at, 1 + rng() % 8);
            } else {
              input.insert(at, 1, static_cast<char>(rng()));
            }
        }
      }
    }
    try {
      read_model_bytes(span_of(input), "");
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iteration << ": non-transmuter exception: " << e.what();
    }
  }
  EXPECT_EQ(loaded + rejected, 4000);
  EXPECT_GT(rejected, 0);
}

// ------------------------------------------------------------------ files

class ModelFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("transmuter_model_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  fs::path dir_;
};

// The address ranges /proc/self/maps lists for `path`.
std::vector<std::pair<uintptr_t, uintptr_t>> mappings_of(const fs::path& path) {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const std::string canonical = fs::canonical(path).string();
  while (std::getline(maps, line)) {
    if (line.size() < canonical.size() || line.compare(line.size() - canonical.size(), canonical.size(), canonical) != 0) {
      continue;
    }
    std::istringstream fields(line);
    std::string range;
    fields >> range;
    const size_t dash = range.find('-');
    ranges.emplace_back(std::stoull(range.substr(0, dash), nullptr, 16),
                        std::stoull(range.substr(dash + 1), nullptr, 16));
  }
  return ranges;
}

TEST_F(ModelFiles, InitializerAliasesTheFileMapping) {
  // Pad the model with doc_string (field 6) until raw_data is 4-aligned in the file.
  const std::string payload = proto::raw({10.f, 20.f, 30.f, 40.f});
  fs::path path;
  for (int pad = 0; pad < 4; ++pad) {
    proto::GraphParts g;
    g.nodes = {proto::node("Identity", {"W"}, {"Y"})};
    g.initializers = {proto::raw_tensor("W", OnnxType::kFloat, {4}, payload)};
    g.outputs = {proto::value_info("Y", OnnxType::kFloat, {4})};
    ProtoWriter m;
    m.string(6, std::string(static_cast<size_t>(pad), 'd'));
    m.raw(proto::model(proto::graph(g)).data());
    if (m.data().find(payload) % 4 == 0) {
      path = write("model.onnx", m.data());
      break;
    }
  }
  ASSERT_FALSE(path.empty());
  const ModelFile model = read_model_file(path);
  EXPECT_EQ(model.path, path);
  const mx::array& w = model.graph->initializers.at("W").tensor();
  const auto address = reinterpret_cast<uintptr_t>(w.data<void>());
  bool inside = false;
  for (auto [begin, end] : mappings_of(path)) inside |= address >= begin && address < end;
  EXPECT_TRUE(inside) << "initializer data should lie in the mmap of " << path;
  EXPECT_EQ(values_of<float>(w), (std::vector<float>{10, 20, 30, 40}));
}

TEST_F(ModelFiles, LargeMisalignedInitializerIsCopiedOnlyWhenEvaluated) {
  // 128 x 128 floats (64 KiB, the smallest deferred size), padded with
  // doc_string until raw_data is not 4-aligned in the file.
  std::vector<float> values(128 * 128);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) - 48.0f;
  const std::string payload = proto::raw(values);
  fs::path path;
  for (int pad = 0; pad < 4; ++pad) {
    proto::GraphParts g;
    g.inputs = {proto::value_info("X", OnnxType::kFloat, {1, 128})};
    g.nodes = {proto::node("MatMul", {"X", "W"}, {"Y"})};
    g.initializers = {proto::raw_tensor("W", OnnxType::kFloat, {128, 128}, payload)};
    g.outputs = {proto::value_info("Y", OnnxType::kFloat, {1, 128})};
    ProtoWriter m;
    m.string(6, std::string(static_cast<size_t>(pad), 'd'));
    m.raw(proto::model(proto::graph(g)).data());
    if (m.data().find(payload) % 4 != 0) {
      path = write("model.onnx", m.data());
      break;
    }
  }
  ASSERT_FALSE(path.empty());
  {
    const ModelFile model = read_model_file(path);
    const mx::array& w = model.graph->initializers.at("W").tensor();
    const std::optional<std::span<const uint8_t>> bytes = deferred_bytes(w);
    ASSERT_TRUE(bytes.has_value()) << "a misaligned weight is left in the file until evaluated";
    const auto address = reinterpret_cast<uintptr_t>(bytes->data());
    EXPECT_NE(address % 4, 0u);
    bool inside = false;
    for (auto [begin, end] : mappings_of(path)) inside |= address >= begin && address < end;
    EXPECT_TRUE(inside) << "its bytes are read in the mmap of " << path;
    EXPECT_EQ(values_of<float>(w), values);
  }
  // Loaded, the product runs on the weight packed from the file's bytes.
  const Model model = transmuter::load(path.string(), LoadOptions{});
  EXPECT_EQ(model.op_histogram().at("ai.transmuter.PackedMatMul"), 1u);
  const mx::array x = mx::full({1, 128}, 0.5f);
  const mx::array y = run(model, model.params(), {{"X", x}}, {mx::Device::cpu}).tensor("Y");
  const mx::array want = mx::matmul(x, mx::array(values.data(), {128, 128}, mx::float32));
  // Sums of 128 products of halves of integers in [-48, 48]: exact in float32.
  EXPECT_EQ(mx::max(mx::abs(mx::subtract(y, want))).item<float>(), 0.0f);
  EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 1.0f);
}

TEST_F(ModelFiles, ExternalDataNextToTheModel) {
  write("weights.bin", proto::raw({1.f, 2.f}));
  proto::GraphParts g;
  g.nodes = {proto::node("Identity", {"W"}, {"Y"})};
  g.initializers = {proto::external_tensor("W", OnnxType::kFloat, {2}, "weights.bin", 0, 8)};
  g.outputs = {proto::value_info("Y", OnnxType::kFloat, {2})};
  const fs::path path = write("model.onnx", proto::model(proto::graph(g)).data());
  const ModelFile model = read_model_file(path);
  EXPECT_EQ(values_of<float>(model.graph->initializers.at("W").tensor()), (std::vector<float>{1, 2}));
}

TEST_F(ModelFiles, EmptyAndMissingFiles) {
  const fs::path empty = write("empty.onnx", "");
  EXPECT_NE(error_of([&] { read_model_file(empty); }).find("model has no graph"), std::string::npos);
  EXPECT_NE(error_of([&] { read_model_file(dir_ / "missing.onnx"); }).find("cannot open"),
            std::string::npos);
}

// Runs `fn` on another thread and returns the ModelFormatError it throws;
// "timed out" when it blocks (as open() on a FIFO does), so that a
// regression fails the test instead of hanging the suite.
std::string error_within_seconds(std::function<void()> fn, int seconds) {
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> done = result->get_future();
  std::thread([result, fn = std::move(fn)] {
    try {
      fn();
      result->set_value("no error");
    } catch (const ModelFormatError& e) {
      result->set_value(e.what());
    } catch (const std::exception& e) {
      result->set_value(std::string("another exception: ") + e.what());
    }
  }).detach();
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) return "timed out";
  return done.get();
}

// A Unix socket bound at `path` (closed again; the file stays).
void make_socket(const fs::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.string().size(), sizeof(address.sun_path));
  std::strcpy(address.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ::close(fd);
}

TEST_F(ModelFiles, ExternalDataMustBeARegularFile) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo.bin").c_str(), 0600), 0);
  fs::create_directory(dir_ / "folder.bin");
  make_socket(dir_ / "socket.bin");
  for (const auto& [location, kind] : std::vector<std::pair<std::string, std::string>>{
           {"fifo.bin", "is a FIFO"}, {"folder.bin", "is a directory"}, {"socket.bin", "is a socket"}}) {
    proto::GraphParts g;
    g.nodes = {proto::node("Identity", {"W"}, {"Y"})};
    g.initializers = {proto::external_tensor("W", OnnxType::kFloat, {2}, location, 0, 8)};
    g.outputs = {proto::value_info("Y", OnnxType::kFloat, {2})};
    const fs::path path = write("model.onnx", proto::model(proto::graph(g)).data());
    const std::string message = error_within_seconds([path] { read_model_file(path); }, 10);
    EXPECT_NE(message.find(kind), std::string::npos) << message;
    EXPECT_NE(message.find("must be regular files"), std::string::npos) << message;
    EXPECT_NE(message.find("initializer[0] 'W'"), std::string::npos) << message;
  }
}

TEST_F(ModelFiles, ModelFileThatIsAFifoIsRefused) {
  const fs::path fifo = dir_ / "model.onnx";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string message = error_within_seconds([fifo] { read_model_file(fifo); }, 10);
  EXPECT_NE(message.find(fifo.string() + ": is a FIFO"), std::string::npos) << message;
}

TEST_F(ModelFiles, ValueFilesTensorSequenceOptional) {
  ValueInfo tensor_info;
  tensor_info.kind = ValueInfo::Kind::kTensor;
  const fs::path t = write("input_0.pb", proto::raw_tensor("x", OnnxType::kInt32, {2}, proto::raw<int32_t>({3, 4})).data());
  EXPECT_EQ(values_of<int32_t>(read_value_file(t, tensor_info).tensor()), (std::vector<int32_t>{3, 4}));

  ValueInfo seq_info;
  seq_info.kind = ValueInfo::Kind::kSequence;
  ProtoWriter seq;
  seq.string(1, "s").varint(2, 1);
  seq.message(3, proto::raw_tensor("", OnnxType::kFloat, {1}, proto::raw({1.f})));
  seq.message(3, proto::raw_tensor("", OnnxType::kFloat, {2}, proto::raw({2.f, 3.f})));
  const Value s = read_value_file(write("seq.pb", seq.data()), seq_info);
  ASSERT_TRUE(s.is_sequence());
  ASSERT_EQ(s.sequence_items().size(), 2u);
  EXPECT_EQ(values_of<float>(s.sequence_items()[1].tensor()), (std::vector<float>{2, 3}));

  ValueInfo opt_info;
  opt_info.kind = ValueInfo::Kind::kOptional;
  ProtoWriter empty_opt;
  empty_opt.string(1, "o").varint(2, 1);
  EXPECT_TRUE(read_value_file(write("opt0.pb", empty_opt.data()), opt_info).is_none());
  ProtoWriter full_opt;
  full_opt.string(1, "o").varint(2, 1).message(3, proto::raw_tensor("", OnnxType::kInt64, {}, proto::raw<int64_t>({7})));
  EXPECT_EQ(values_of<int64_t>(read_value_file(write("opt1.pb", full_opt.data()), opt_info).tensor()),
            (std::vector<int64_t>{7}));
  ProtoWriter seq_opt;
  seq_opt.string(1, "o").varint(2, 3).message(5, ProtoWriter().varint(2, 1));
  const Value empty_seq = read_value_file(write("opt2.pb", seq_opt.data()), opt_info);
  ASSERT_TRUE(empty_seq.is_sequence());
  EXPECT_TRUE(empty_seq.sequence_items().empty());
}

// Optional: a model written by the onnx Python package, when one is provided.
TEST(ModelFile, ParsesAModelWrittenByOnnxWhenProvided) {
  const char* sample = std::getenv("TRANSMUTER_ONNX_SAMPLE");
  if (sample == nullptr || !fs::exists(sample)) GTEST_SKIP() << "TRANSMUTER_ONNX_SAMPLE not set";
  const ModelFile model = read_model_file(sample);
  EXPECT_GT(model.ir_version, 0);
  EXPECT_FALSE(model.graph->nodes.empty());
  for (const Node& node : model.graph->nodes) EXPECT_FALSE(node.op_type.empty());
}

}  // namespace
}  // namespace transmuter
