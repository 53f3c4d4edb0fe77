#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "core/memory.h"
#include "ops/registry.h"
#include "runtime/bound_graph.h"
#include "runtime/interpreter.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

Node add_node(const std::string& a, const std::string& b, const std::string& out) {
  Node node;
  node.name = "add_" + out;
  node.op_type = "Add";
  node.opset = 18;
  node.inputs = {a, b};
  node.outputs = {out};
  return node;
}

TEST(Environment, InnerScopeShadowsAndFallsBackToOuter) {
  Environment outer;
  outer.set("a", mx::array(1.f));
  outer.set("b", mx::array(2.f));
  Environment inner(&outer);
  inner.set("b", mx::array(3.f));
  EXPECT_EQ(testing::to_doubles(inner.find("a")->tensor()), std::vector<double>{1});
  EXPECT_EQ(testing::to_doubles(inner.find("b")->tensor()), std::vector<double>{3});
  EXPECT_EQ(inner.find("c"), nullptr);
}

// Slots: every name of a graph gets one (inputs, initializers, node inputs and outputs, outputs), an
// omitted input none.
TEST(Environment, IndexNamesGivesEachNameOfTheGraphOneSlot) {
  Graph graph;
  graph.inputs.push_back(ValueInfo{"x", ValueInfo::Kind::kTensor, OnnxType::kFloat, false, {}});
  graph.initializers.emplace("w", Value(mx::array(2.f)));
  graph.nodes.push_back(add_node("x", "w", "y"));
  Node clip = add_node("y", "", "z");
  clip.op_type = "Clip";
  graph.nodes.push_back(clip);
  NameSlots slots = index_names(graph);
  EXPECT_EQ(slots.names, (std::vector<std::string>{"x", "w", "y", "z"}));
  EXPECT_EQ(slots.node_inputs, (std::vector<std::vector<int32_t>>{{0, 1}, {2, -1}}));
  EXPECT_EQ(slots.node_outputs, (std::vector<std::vector<int32_t>>{{2}, {3}}));
}

// A scope with slots: a name of the graph is found by name and by slot, through an enclosing scope with the
// same slots; other names are kept by name; an enclosing scope without slots is searched by name.
TEST(Environment, SlotsAndNamesFindTheSameValues) {
  Graph graph;
  graph.nodes.push_back(add_node("a", "b", "c"));
  const NameSlots slots = index_names(graph);
  Environment plain;
  plain.set("a", mx::array(1.f));
  Environment outer(&plain);
  outer.use_slots(slots);
  outer.set("b", mx::array(2.f));
  Environment inner(&outer);
  inner.use_slots(slots);
  inner.set(slots.slot_of.at("c"), mx::array(3.f));
  inner.set("not_in_the_graph", mx::array(4.f));
  for (const auto& [name, want] : std::vector<std::pair<std::string, double>>{{"a", 1}, {"b", 2}, {"c", 3}}) {
    ASSERT_NE(inner.find(name), nullptr) << name;
    EXPECT_EQ(testing::to_doubles(inner.find(name)->tensor()), std::vector<double>{want}) << name;
    EXPECT_EQ(inner.find(slots.slot_of.at(name)), inner.find(name)) << name;
  }
  EXPECT_EQ(testing::to_doubles(inner.find("not_in_the_graph")->tensor()), std::vector<double>{4});
  EXPECT_EQ(outer.find("c"), nullptr);
  EXPECT_EQ(outer.find(slots.slot_of.at("c")), nullptr);
  EXPECT_THROW(inner.use_slots(slots), Error);  // values are bound already
}

TEST(Interpreter, SubgraphSeesOuterNamesAndItsOwnInputs) {
  Graph body;
  body.name = "body";
  body.inputs.push_back(ValueInfo{"i", ValueInfo::Kind::kTensor, OnnxType::kFloat, false, {}});
  body.outputs.push_back(ValueInfo{"o", ValueInfo::Kind::kTensor, OnnxType::kFloat, false, {}});
  body.nodes.push_back(add_node("i", "outer_value", "o"));
  Environment outer;
  outer.set("outer_value", mx::array(10.f));
  std::unique_ptr<BoundGraph> bound = bind_graph(body, builtin_registry(), "test");
  std::vector<Value> out = run_subgraph(*bound, {mx::array(5.f)}, outer, Execution{});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(testing::to_doubles(out[0].tensor()), std::vector<double>{15});
}

TEST(Interpreter, UnboundInputNamesTheNode) {
  Graph graph;
  graph.nodes.push_back(add_node("x", "nowhere", "y"));
  Environment env;
  env.set("x", mx::array(1.f));
  try {
    run_nodes(*bind_graph(graph, builtin_registry(), "test"), 0, 1, env, Execution{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'add_y': input 'nowhere' has no value"), std::string::npos) << e.what();
  }
}

TEST(Interpreter, RefusesAnOutputOverTheMemoryLimitBeforeAllocating) {
  Graph graph;
  graph.nodes.push_back(add_node("x", "x", "y"));
  Environment env;
  env.set("x", mx::zeros({1024}, mx::float32));
  Execution exec;
  exec.memory_limit = 1000;  // the output needs 4096 bytes
  try {
    run_nodes(*bind_graph(graph, builtin_registry(), "test"), 0, 1, env, exec);
    FAIL() << "expected the memory limit to refuse the output";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[Add v7] node 'add_y': output 'y' would need 4096 bytes, over the "
                                         "memory limit of 1000 bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST(Interpreter, CheckedByteCountsDetectOverflow) {
  EXPECT_EQ(checked_nbytes({2, 3}, mx::float32), 24u);
  EXPECT_EQ(checked_nbytes({65536, 65536, 65536, 65536}, mx::float32), std::nullopt);
  EXPECT_EQ(checked_nbytes({-1, 2}, mx::float32), std::nullopt);
}

}  // namespace
}  // namespace transmuter
