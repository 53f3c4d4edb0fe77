// An eager run split into its two phases: interpreting the nodes (transmuter::run with lazy outputs) and
// evaluating the graph they built, by MLX's scheduler (mx::eval) or on the calling thread
// (runtime/evaluate_here.h), the two alternating in blocks of 100 runs (call by call, each evaluation
// leaves the threads and caches as the other one wants them least).
//
// usage: eager_phases MODEL NAME=FILE.npy... [--runs N]
// Prints the graph's primitives by name (from one run) and, per evaluation, the median microseconds of
// interpretation, of evaluation and of both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <mlx/mlx.h>
#include <mlx/primitives.h>

#include "npy.h"
#include "runtime/evaluate_here.h"
#include "transmuter/transmuter.h"

namespace mx = mlx::core;
using namespace transmuter;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<mx::array> lazy_outputs(const Model& model, const Inputs& inputs) {
  RunOptions options;
  options.device = mx::Device::cpu;
  options.evaluate_cpu_outputs = false;
  std::vector<mx::array> arrays;
  for (const Value& v : run(model, model.params(), inputs, options).values) {
    if (v.is_tensor()) arrays.push_back(v.tensor());
  }
  return arrays;
}

// The unevaluated primitives of the outputs' graph, by name (one count per primitive, whatever its outputs).
void print_primitives(const std::vector<mx::array>& outputs) {
  std::map<std::string, int> counts;
  std::set<std::uintptr_t> seen;
  std::function<void(const mx::array&)> walk = [&](const mx::array& a) {
    if (a.status() != mx::array::Status::unscheduled || !seen.insert(a.id()).second) return;
    for (const mx::array& s : a.siblings()) seen.insert(s.id());
    counts[const_cast<mx::array&>(a).primitive().name()]++;
    for (const mx::array& in : a.inputs()) walk(in);
  };
  for (const mx::array& out : outputs) walk(out);
  int total = 0;
  for (const auto& [name, count] : counts) {
    std::printf("%6d %s\n", count, name.c_str());
    total += count;
  }
  std::printf("%6d primitives\n", total);
}

struct Phases {
  std::vector<double> interpret, evaluate, both;
};

void time_one_run(const Model& model, const Inputs& inputs, bool here, Phases& phases) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<mx::array> outputs = lazy_outputs(model, inputs);
  const auto t1 = Clock::now();
  if (!here || !evaluate_here(outputs)) mx::eval(outputs);
  const auto t2 = Clock::now();
  phases.interpret.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  phases.evaluate.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  phases.both.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: eager_phases MODEL NAME=FILE.npy... [--runs N]\n");
    return 2;
  }
  Model model = load(argv[1]);
  Inputs inputs;
  int runs = 1000;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
      continue;
    }
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "expected NAME=FILE.npy, got '%s'\n", arg.c_str());
      return 2;
    }
    inputs[arg.substr(0, eq)] = Value(read_npy(arg.substr(eq + 1)));
  }
  std::vector<mx::array> first = lazy_outputs(model, inputs);
  print_primitives(first);
  std::vector<std::string> blockers;
  if (!evaluate_here(first, &blockers)) {
    std::printf("not evaluated here, MLX's primitives:");
    for (const std::string& name : blockers) std::printf(" %s", name.c_str());
    std::printf("\n");
    mx::eval(first);
  }
  Phases mlx, here;
  constexpr int kBlock = 100, kWarmup = 10;
  for (int block = 0; block < 2 * std::max(1, runs / kBlock); ++block) {
    const bool on_calling_thread = block % 2 == 1;
    Phases& phases = on_calling_thread ? here : mlx;
    Phases ignored;
    for (int r = 0; r < kWarmup; ++r) time_one_run(model, inputs, on_calling_thread, ignored);
    for (int r = 0; r < kBlock; ++r) time_one_run(model, inputs, on_calling_thread, phases);
  }
  for (const auto& [name, p] :
       {std::pair<const char*, Phases*>{"mx::eval", &mlx}, {"evaluate_here", &here}}) {
    std::printf("%-14s interpret %7.1f us  evaluate %7.1f us  both %7.1f us\n", name, median(p->interpret),
                median(p->evaluate), median(p->both));
  }
}
