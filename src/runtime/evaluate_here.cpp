#include "runtime/evaluate_here.h"

#include <cstdint>
#include <set>
#include <unordered_set>
#include <utility>

#include <mlx/mlx.h>
#include <mlx/primitives.h>

#include "kernels/cpu/cpu_kernel.h"
#include "runtime/view_primitives.h"

namespace transmuter {

namespace {

// One unevaluated primitive (its array; its siblings are its other outputs) and, when it is one, the
// Transmuter kernel that computes it (else a view).
struct Step {
  mx::array array;
  kernels::CpuKernel* kernel = nullptr;
};

// The unevaluated primitives of a graph in an order that computes inputs first, the arrays that others
// are computing and that must be waited for, and what keeps the graph from running here.
struct Plan {
  std::vector<Step> order;
  std::vector<mx::array> in_flight;
  std::set<std::string> blockers;
  bool traced = false;
};

bool unevaluated(const mx::array& a) { return a.status() == mx::array::Status::unscheduled; }

// `a`'s primitive as a Transmuter kernel, or null; what keeps it from running here goes to the plan.
kernels::CpuKernel* check_runs_here(const mx::array& a, Plan& plan) {
  if (a.is_tracer()) plan.traced = true;
  if (!a.has_primitive()) {  // not valid MLX: mx::eval says why
    plan.blockers.insert("(an unevaluated array without a primitive)");
    return nullptr;
  }
  mx::Primitive& primitive = *a.primitive_ptr();  // name() is not const
  auto* kernel = dynamic_cast<kernels::CpuKernel*>(&primitive);
  if (primitive.stream().device != mx::Device::cpu) {
    plan.blockers.insert("(a primitive on a GPU stream)");
  } else if (kernel == nullptr && !is_view(primitive.name())) {
    plan.blockers.insert(primitive.name());
  }
  return kernel;
}

// A depth-first walk from the roots, each primitive once, appended after its inputs.
Plan plan_of(const std::vector<mx::array>& roots) {
  Plan plan;
  std::unordered_set<std::uintptr_t> seen;
  auto first_visit = [&seen](const mx::array& a) {
    if (!seen.insert(a.id()).second) return false;
    for (const mx::array& sibling : a.siblings()) seen.insert(sibling.id());
    return true;
  };
  std::vector<std::pair<mx::array, size_t>> stack;
  for (const mx::array& root : roots) {
    if (!unevaluated(root)) {
      if (!root.is_available()) plan.in_flight.push_back(root);
      continue;
    }
    if (first_visit(root)) stack.emplace_back(root, 0);
    while (!stack.empty()) {
      auto& [a, next] = stack.back();
      if (next < a.inputs().size()) {
        const mx::array& input = a.inputs()[next++];
        if (!unevaluated(input)) {
          if (!input.is_available()) plan.in_flight.push_back(input);
        } else if (first_visit(input)) {
          stack.emplace_back(input, 0);
        }
        continue;
      }
      kernels::CpuKernel* kernel = check_runs_here(a, plan);
      plan.order.push_back({std::move(a), kernel});
      stack.pop_back();
    }
  }
  return plan;
}

// Computes the outputs of the step's primitive now, as MLX's CPU evaluation would, and detaches it from
// the graph (its inputs released, as mx::eval does).
void run_step(Step step) {
  mx::array& a = step.array;
  std::vector<mx::array> outputs = a.outputs();
  mx::Primitive& primitive = a.primitive();
  if (step.kernel != nullptr) {
    step.kernel->run_here(a.inputs(), outputs);
  } else if (needs_contiguous_input(primitive.name()) && !a.inputs()[0].flags().row_contiguous) {
    // A Reshape of a view would copy it on the stream: make it dense here.
    std::vector<mx::array> inputs = a.inputs();
    inputs[0] = kernels::dense_copy_here(inputs[0]);
    primitive.eval_cpu(inputs, outputs);
  } else {
    primitive.eval_cpu(a.inputs(), outputs);
  }
  for (mx::array& out : outputs) out.set_status(mx::array::Status::available);
  a.detach();
}

}  // namespace

bool evaluate_here(const std::vector<mx::array>& arrays, std::vector<std::string>* blockers) {
  Plan plan = plan_of(arrays);
  if (plan.traced) plan.blockers.insert("(an array traced by a function transformation)");
  if (!plan.blockers.empty()) {
    if (blockers != nullptr) blockers->assign(plan.blockers.begin(), plan.blockers.end());
    return false;
  }
  for (mx::array& a : plan.in_flight) a.wait();
  // Each array leaves the plan as it runs: what the graph no longer needs is freed, or donated.
  for (Step& step : plan.order) run_step(std::move(step));
  return true;
}

}  // namespace transmuter
