#include "graph/topological_sort.h"

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

Node make_node(std::string name, std::vector<std::string> inputs, std::vector<std::string> outputs) {
  Node n;
  n.name = std::move(name);
  n.op_type = "Op";
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

ValueInfo input(std::string name) {
  ValueInfo v;
  v.name = std::move(name);
  return v;
}

std::vector<std::string> names(const Graph& g) {
  std::vector<std::string> out;
  for (const Node& n : g.nodes) out.push_back(n.name);
  return out;
}

using testing::error_of;

TEST(TopologicalSort, OrdersProducersFirst) {
  Graph g;
  g.inputs = {input("x")};
  g.nodes = {make_node("c", {"b_out"}, {"c_out"}), make_node("b", {"a_out", "x"}, {"b_out"}),
             make_node("a", {"x"}, {"a_out"})};
  topological_sort(g);
  EXPECT_EQ(names(g), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(TopologicalSort, KeepsAValidOrderAndIndependentNodesInPlace) {
  Graph g;
  g.inputs = {input("x")};
  g.initializers["w"] = Value();
  g.nodes = {make_node("p", {"x"}, {"p_out"}), make_node("q", {"w"}, {"q_out"}),
             make_node("r", {"q_out", "p_out", ""}, {"r_out"})};
  topological_sort(g);
  EXPECT_EQ(names(g), (std::vector<std::string>{"p", "q", "r"}));
}

TEST(TopologicalSort, MissingInputNamesNodeAndValue) {
  Graph g;
  g.name = "main";
  g.nodes = {make_node("relu", {"ghost"}, {"y"})};
  const std::string message = error_of([&] { topological_sort(g); });
  EXPECT_NE(message.find("graph 'main': node 'relu' (Op): input 'ghost' is produced by no node"),
            std::string::npos)
      << message;
}

TEST(TopologicalSort, CycleIsReported) {
  Graph g;
  g.inputs = {input("x")};
  g.nodes = {make_node("start", {"x"}, {"s"}), make_node("a", {"s", "b_out"}, {"a_out"}),
             make_node("b", {"a_out"}, {"b_out"}), make_node("after", {"b_out"}, {"z"})};
  const std::string message = error_of([&] { topological_sort(g); });
  EXPECT_NE(message.find("is in a cycle"), std::string::npos) << message;
  const bool names_cycle_node = message.find("node 'a'") != std::string::npos &&
                                message.find("node 'b'") != std::string::npos;
  EXPECT_TRUE(names_cycle_node) << message;
}

TEST(TopologicalSort, SelfLoopIsACycle) {
  Graph g;
  g.nodes = {make_node("loop", {"y"}, {"y"})};
  EXPECT_NE(error_of([&] { topological_sort(g); }).find("cycle"), std::string::npos);
}

TEST(TopologicalSort, TwoProducersOfOneValue) {
  Graph g;
  g.inputs = {input("x")};
  g.nodes = {make_node("a", {"x"}, {"y"}), make_node("b", {"x"}, {"y"})};
  EXPECT_NE(error_of([&] { topological_sort(g); }).find("value 'y' is produced by both node 'a'"),
            std::string::npos);
}

TEST(TopologicalSort, SubgraphOuterValuesOrderTheOwner) {
  // The If node's branch reads `late`, produced after the If in the list.
  auto branch = std::make_shared<Graph>();
  branch->nodes = {make_node("use", {"late"}, {"branch_out"}), make_node("first", {"cond"}, {"unused"})};
  Node if_node = make_node("if", {"cond"}, {"out"});
  Attribute then_branch;
  then_branch.name = "then_branch";
  then_branch.type = AttrType::kGraph;
  then_branch.g = branch;
  if_node.attributes.push_back(then_branch);
  Graph g;
  g.inputs = {input("cond")};
  g.nodes = {if_node, make_node("producer", {"cond"}, {"late"})};
  topological_sort(g);
  EXPECT_EQ(names(g), (std::vector<std::string>{"producer", "if"}));
  EXPECT_EQ(names(*branch), (std::vector<std::string>{"use", "first"}));
}

TEST(TopologicalSort, SubgraphNodesAreSortedAndMissingOuterValuesReported) {
  auto body = std::make_shared<Graph>();
  body->name = "body";
  body->inputs = {input("i")};
  body->nodes = {make_node("second", {"t"}, {"o"}), make_node("first", {"i", "x"}, {"t"})};
  Node loop = make_node("loop", {"x"}, {"y"});
  Attribute attr;
  attr.name = "body";
  attr.type = AttrType::kGraph;
  attr.g = body;
  loop.attributes.push_back(attr);
  Graph g;
  g.inputs = {input("x")};
  g.nodes = {loop};
  topological_sort(g);
  EXPECT_EQ(names(*body), (std::vector<std::string>{"first", "second"}));

  body->nodes.push_back(make_node("bad", {"nowhere"}, {"z"}));
  const std::string message = error_of([&] { topological_sort(g); });
  EXPECT_NE(message.find("node 'loop' (Op): input 'nowhere'"), std::string::npos) << message;
}

}  // namespace
}  // namespace transmuter
