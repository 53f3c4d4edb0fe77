#include "graph/function_inliner.h"

#include <gtest/gtest.h>

#include <set>

#include "support/expect_error.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

Node make_node(std::string op, std::vector<std::string> inputs, std::vector<std::string> outputs,
               std::string name = "", std::string domain = "") {
  Node n;
  n.op_type = std::move(op);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.name = std::move(name);
  n.domain = std::move(domain);
  return n;
}

Attribute int_attr(std::string name, int64_t value) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::kInt;
  a.i = value;
  return a;
}

Attribute ref_attr(std::string name, std::string ref) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::kInt;
  a.ref_attr_name = std::move(ref);
  return a;
}

// local.Scale(x) -> y: t = Mul(x, x) [axis = @alpha]; y = Add(t, x) [axis = @beta]
Function scale_function() {
  Function f;
  f.name = "Scale";
  f.domain = "local";
  f.inputs = {"x"};
  f.outputs = {"y"};
  f.attribute_names = {"alpha"};
  f.attribute_defaults = {int_attr("beta", 7)};
  Node mul = make_node("Mul", {"x", "x"}, {"t"}, "mul");
  mul.attributes = {ref_attr("axis", "alpha")};
  Node add = make_node("Add", {"t", "x"}, {"y"}, "add");
  add.attributes = {ref_attr("axis", "beta")};
  f.nodes = {mul, add};
  return f;
}

using testing::error_of;

TEST(FunctionInliner, ReplacesCallByBodyWithBoundNames) {
  Graph g;
  Node call = make_node("Scale", {"A"}, {"B"}, "call", "local");
  call.attributes = {int_attr("alpha", 3)};
  g.nodes = {make_node("Relu", {"X"}, {"A"}, "pre"), call, make_node("Neg", {"B"}, {"C"}, "post")};
  // A value named like the body's internal "call/t" already exists: the
  // fresh name must avoid it.
  g.nodes[0].outputs.push_back("call/t");
  inline_functions(g, {scale_function()});

  ASSERT_EQ(g.nodes.size(), 4u);
  const Node& mul = g.nodes[1];
  const Node& add = g.nodes[2];
  EXPECT_EQ(mul.op_type, "Mul");
  EXPECT_EQ(mul.name, "call/mul");
  EXPECT_EQ(mul.inputs, (std::vector<std::string>{"A", "A"}));
  ASSERT_EQ(mul.outputs.size(), 1u);
  EXPECT_NE(mul.outputs[0], "t");
  EXPECT_NE(mul.outputs[0], "call/t");
  EXPECT_EQ(add.inputs, (std::vector<std::string>{mul.outputs[0], "A"}));
  EXPECT_EQ(add.outputs, (std::vector<std::string>{"B"}));
  // alpha from the caller, beta from the function's default.
  ASSERT_NE(mul.find_attribute("axis"), nullptr);
  EXPECT_EQ(mul.find_attribute("axis")->i, 3);
  EXPECT_TRUE(mul.find_attribute("axis")->ref_attr_name.empty());
  ASSERT_NE(add.find_attribute("axis"), nullptr);
  EXPECT_EQ(add.find_attribute("axis")->i, 7);
  EXPECT_EQ(g.nodes[3].op_type, "Neg");
}

TEST(FunctionInliner, UnsetAttributeWithoutDefaultIsDropped) {
  Graph g;
  g.nodes = {make_node("Scale", {"A"}, {"B"}, "call", "local")};
  inline_functions(g, {scale_function()});
  EXPECT_EQ(g.nodes[0].find_attribute("axis"), nullptr);
}

TEST(FunctionInliner, TwoCallsGetDistinctInternalNames) {
  Graph g;
  g.nodes = {make_node("Scale", {"A"}, {"B"}, "", "local"), make_node("Scale", {"B"}, {"C"}, "", "local")};
  inline_functions(g, {scale_function()});
  ASSERT_EQ(g.nodes.size(), 4u);
  EXPECT_NE(g.nodes[0].outputs[0], g.nodes[2].outputs[0]);
  EXPECT_EQ(g.nodes[2].inputs[0], "B");
}

TEST(FunctionInliner, MatchesByDomainAndOpType) {
  Graph g;
  g.nodes = {make_node("Scale", {"A"}, {"B"}, "", "")};  // same op_type, other domain
  inline_functions(g, {scale_function()});
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "Scale");
}

TEST(FunctionInliner, FunctionsCallingFunctionsAndAttributeForwarding) {
  // local.Outer(x) -> y = local.Scale(x) [alpha = @gamma]
  Function outer;
  outer.name = "Outer";
  outer.domain = "local";
  outer.inputs = {"x"};
  outer.outputs = {"y"};
  Node inner_call = make_node("Scale", {"x"}, {"y"}, "inner", "local");
  inner_call.attributes = {ref_attr("alpha", "gamma")};
  outer.nodes = {inner_call};
  Graph g;
  Node call = make_node("Outer", {"A"}, {"B"}, "outer", "local");
  call.attributes = {int_attr("gamma", 5)};
  g.nodes = {call};
  inline_functions(g, {outer, scale_function()});
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[0].op_type, "Mul");
  EXPECT_EQ(g.nodes[0].name, "outer/inner/mul");
  EXPECT_EQ(g.nodes[0].find_attribute("axis")->i, 5);
  EXPECT_EQ(g.nodes[1].outputs, (std::vector<std::string>{"B"}));
}

TEST(FunctionInliner, RecursionIsAnError) {
  Function f;
  f.name = "Loop";
  f.domain = "local";
  f.inputs = {"x"};
  f.outputs = {"y"};
  f.nodes = {make_node("Loop", {"x"}, {"y"}, "again", "local")};
  Graph g;
  g.nodes = {make_node("Loop", {"A"}, {"B"}, "call", "local")};
  EXPECT_NE(error_of([&] { inline_functions(g, {f}); }).find("calls itself"), std::string::npos);
}

TEST(FunctionInliner, TooManyInputsIsAnError) {
  Graph g;
  g.nodes = {make_node("Scale", {"A", "extra"}, {"B"}, "call", "local")};
  const std::string message = error_of([&] { inline_functions(g, {scale_function()}); });
  EXPECT_NE(message.find("node 'call' (local.Scale)"), std::string::npos) << message;
}

TEST(FunctionInliner, OmittedOutputsGetFreshNames) {
  Function f = scale_function();
  f.outputs = {"y", "t"};  // expose the intermediate too
  Graph g;
  g.nodes = {make_node("Scale", {"A"}, {"B"}, "call", "local")};
  inline_functions(g, {f});
  EXPECT_FALSE(g.nodes[0].outputs[0].empty());
  EXPECT_NE(g.nodes[0].outputs[0], "t");
}

TEST(FunctionInliner, CallsInsideSubgraphsAreInlined) {
  auto branch = std::make_shared<Graph>();
  branch->nodes = {make_node("Scale", {"A"}, {"B"}, "in_branch", "local")};
  Node if_node = make_node("If", {"cond"}, {"out"}, "if");
  Attribute attr;
  attr.name = "then_branch";
  attr.type = AttrType::kGraph;
  attr.g = branch;
  if_node.attributes = {attr};
  Graph g;
  g.nodes = {if_node};
  inline_functions(g, {scale_function()});
  const Graph& inlined = *g.nodes[0].attributes[0].g;
  ASSERT_EQ(inlined.nodes.size(), 2u);
  EXPECT_EQ(inlined.nodes[0].op_type, "Mul");
}

TEST(FunctionInliner, BodySubgraphsReadRenamedFunctionValues) {
  // local.F(x) -> y: t = Neg(x); y = If(x) with then_branch reading t.
  auto branch = std::make_shared<Graph>();
  branch->nodes = {make_node("Identity", {"t"}, {"branch_out"}, "id")};
  Node if_node = make_node("If", {"x"}, {"y"}, "if");
  Attribute attr;
  attr.name = "then_branch";
  attr.type = AttrType::kGraph;
  attr.g = branch;
  if_node.attributes = {attr};
  Function f;
  f.name = "F";
  f.domain = "local";
  f.inputs = {"x"};
  f.outputs = {"y"};
  f.nodes = {make_node("Neg", {"x"}, {"t"}, "neg"), if_node};
  Graph g;
  g.nodes = {make_node("F", {"A"}, {"B"}, "c1", "local"), make_node("F", {"B"}, {"C"}, "c2", "local")};
  inline_functions(g, {f});
  ASSERT_EQ(g.nodes.size(), 4u);
  const Graph& first_branch = *g.nodes[1].attributes[0].g;
  const Graph& second_branch = *g.nodes[3].attributes[0].g;
  EXPECT_EQ(first_branch.nodes[0].inputs[0], g.nodes[0].outputs[0]);
  EXPECT_EQ(second_branch.nodes[0].inputs[0], g.nodes[2].outputs[0]);
  EXPECT_NE(&first_branch, &second_branch) << "each call gets its own copy of the subgraph";
  EXPECT_EQ(branch->nodes[0].inputs[0], "t") << "the function itself is not modified";
}

TEST(FunctionInliner, MutualRecursionIsAnError) {
  Function f, g;
  f.name = "F";
  g.name = "G";
  for (Function* fn : {&f, &g}) {
    fn->domain = "local";
    fn->inputs = {"x"};
    fn->outputs = {"y"};
  }
  f.nodes = {make_node("G", {"x"}, {"y"}, "to_g", "local")};
  g.nodes = {make_node("F", {"x"}, {"y"}, "to_f", "local")};
  Graph graph;
  graph.nodes = {make_node("F", {"A"}, {"B"}, "call", "local")};
  EXPECT_NE(error_of([&] { inline_functions(graph, {f, g}); }).find("calls itself"), std::string::npos);
}

// `levels` functions F0..F{levels-1}: F_k calls F_{k+1} `fanout` times in a
// chain; the last holds one Relu. One call of F0 expands to fanout^(levels-1)
// nodes.
std::vector<Function> fan_out_functions(int levels, int fanout) {
  std::vector<Function> functions(static_cast<size_t>(levels));
  for (int level = 0; level < levels; ++level) {
    Function& f = functions[static_cast<size_t>(level)];
    f.name = "F" + std::to_string(level);
    f.domain = "local";
    f.inputs = {"x"};
    f.outputs = {"y"};
    if (level + 1 == levels) {
      f.nodes = {make_node("Relu", {"x"}, {"y"}, "relu")};
      continue;
    }
    std::string in = "x";
    for (int i = 0; i < fanout; ++i) {
      const std::string out = i + 1 == fanout ? "y" : "t" + std::to_string(i);
      f.nodes.push_back(make_node("F" + std::to_string(level + 1), {in}, {out}, "", "local"));
      in = out;
    }
  }
  return functions;
}

TEST(FunctionInliner, ExpansionOverTheCapIsRefusedBeforeExpanding) {
  Graph g;
  g.nodes = {make_node("F0", {"A"}, {"B"}, "call", "local")};
  const std::string message = error_of([&] { inline_functions(g, fan_out_functions(16, 4)); });
  EXPECT_NE(message.find("node 'call' (local.F0): inlining function 'F0' would create more than the cap of "
                         "4194304 inlined nodes"),
            std::string::npos)
      << message;
  ASSERT_EQ(g.nodes.size(), 1u) << "refused before anything was expanded";
}

TEST(FunctionInliner, CallsOfEmptyFunctionsHaveACapToo) {
  // No node is ever created, yet 4^15 calls would be expanded.
  std::vector<Function> functions = fan_out_functions(16, 4);
  functions.back().nodes.clear();
  Graph g;
  g.nodes = {make_node("F0", {"A"}, {"B"}, "call", "local")};
  const std::string message = error_of([&] { inline_functions(g, functions); });
  EXPECT_NE(message.find("inlining function 'F0' would expand more than the cap of 4194304 function calls"),
            std::string::npos)
      << message;
}

TEST(FunctionInliner, CapCountsNodesAlreadyCreated) {
  // F0 expands to exactly 2^22 nodes: the cap, one too many after a Relu.
  Graph g;
  g.nodes = {make_node("Relu", {"A"}, {"B"}, "first"), make_node("F0", {"B"}, {"C"}, "call", "local")};
  const std::string message = error_of([&] { inline_functions(g, fan_out_functions(23, 2)); });
  EXPECT_NE(message.find("would create 4194304 nodes, with 1 already created, over the cap of 4194304"),
            std::string::npos)
      << message;
}

TEST(FunctionInliner, NestedCallsExpandToTheCountedNodes) {
  Graph g;
  g.nodes = {make_node("F0", {"A"}, {"B"}, "call", "local")};
  inline_functions(g, fan_out_functions(4, 3));
  ASSERT_EQ(g.nodes.size(), 27u);
  std::set<std::string> outputs;
  for (const Node& node : g.nodes) {
    EXPECT_EQ(node.op_type, "Relu");
    outputs.insert(node.outputs.at(0));
  }
  EXPECT_EQ(outputs.size(), 27u) << "every value is defined once";
  EXPECT_EQ(g.nodes.front().inputs.at(0), "A");
  EXPECT_EQ(g.nodes.back().outputs.at(0), "B");
}

TEST(FunctionInliner, FreshNamesSkipTakenSuffixes) {
  // Unnamed calls all prefix their internal values "Scale/": the names are
  // Scale/t, Scale/t_1, ... and must step over one the graph already uses.
  Graph g;
  g.nodes = {make_node("Relu", {"X"}, {"A0", "Scale/t_2"}, "pre")};
  for (int i = 0; i < 5; ++i) {
    const std::string in = "A" + std::to_string(i), out = "A" + std::to_string(i + 1);
    g.nodes.push_back(make_node("Scale", {in}, {out}, "", "local"));
  }
  inline_functions(g, {scale_function()});
  ASSERT_EQ(g.nodes.size(), 11u);
  std::vector<std::string> internal;
  for (size_t i = 1; i < g.nodes.size(); i += 2) internal.push_back(g.nodes[i].outputs.at(0));
  EXPECT_EQ(internal,
            (std::vector<std::string>{"Scale/t", "Scale/t_1", "Scale/t_3", "Scale/t_4", "Scale/t_5"}));
}

}  // namespace
}  // namespace transmuter
