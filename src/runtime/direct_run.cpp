#include "runtime/direct_run.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include <mlx/mlx.h>
#include <mlx/primitives.h>

#include "kernels/cpu/cpu_kernel.h"
#include "runtime/view_primitives.h"

namespace transmuter {

struct DirectRun::Tape {
  struct Step {
    std::shared_ptr<mx::Primitive> primitive;
    kernels::CpuKernel* kernel = nullptr;  // the primitive as a Transmuter kernel, or null: a view
    bool contiguous_input = false;         // a Reshape or View: its input is made row-contiguous first
    std::vector<size_t> inputs;            // slots
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    std::vector<size_t> outputs;   // slots
    std::vector<size_t> released;  // slots this step reads last (none of the run's results)
  };
  size_t arguments = 0;                                 // slots 0 .. arguments - 1
  std::vector<mx::Shape> argument_shapes;               // the recorded call's
  std::vector<mx::Dtype> argument_dtypes;
  std::vector<std::pair<size_t, mx::array>> constants;  // evaluated: inputs and folded primitives
  std::vector<Step> steps;
  std::vector<size_t> results;  // the slot of each output
  size_t slots = 0;
};

namespace {

// Builds the tape by a depth-first walk from the outputs, each array once.
class Recorder {
 public:
  Recorder(const std::vector<mx::array>& args, DirectRun::Tape& tape) : tape_(tape) {
    for (const mx::array& a : args) slot_of_.emplace(a.id(), slot_of_.size());
    tape_.arguments = args.size();
    tape_.slots = args.size();
  }

  // Walks the graph of `root`; a primitive that depends on the arguments and is neither a kernel nor a
  // view is named in `blockers` (the walk goes on, so that all of them are named).
  void visit(const mx::array& root) {
    std::vector<std::pair<mx::array, size_t>> stack = {{root, 0}};
    while (!stack.empty()) {
      auto& [a, next] = stack.back();
      if (slot_of_.count(a.id())) {
        stack.pop_back();
        continue;
      }
      if (a.has_primitive() && next < a.inputs().size()) {
        const mx::array input = a.inputs()[next++];
        stack.emplace_back(input, 0);
        continue;
      }
      const mx::array done = a;
      stack.pop_back();
      add(done);
    }
  }

  std::vector<mx::array> folded;   // primitives of constants alone, evaluated once the walk is done
  std::set<std::string> blockers;  // the primitives that need MLX's scheduler

 private:
  void add(const mx::array& a) {
    if (!a.has_primitive()) {  // a constant: an initializer, a captured host value
      add_constant(a);
      return;
    }
    bool depends = false;
    for (const mx::array& in : a.inputs()) depends = depends || !is_constant(slot_of_.at(in.id()));
    if (!depends) {
      for (const mx::array& out : a.outputs()) {
        add_constant(out);
        folded.push_back(out);
      }
      return;
    }
    DirectRun::Tape::Step step;
    step.primitive = a.primitive_ptr();
    step.kernel = dynamic_cast<kernels::CpuKernel*>(step.primitive.get());
    const std::string name = a.primitive().name();
    if (step.kernel == nullptr && !is_view(name)) blockers.insert(name);
    step.contiguous_input = needs_contiguous_input(name);
    for (const mx::array& in : a.inputs()) step.inputs.push_back(slot_of_.at(in.id()));
    for (const mx::array& out : a.outputs()) {
      step.shapes.push_back(out.shape());
      step.dtypes.push_back(out.dtype());
      step.outputs.push_back(new_slot(out));
    }
    tape_.steps.push_back(std::move(step));
  }

  size_t new_slot(const mx::array& a) {
    const size_t slot = tape_.slots++;
    slot_of_.emplace(a.id(), slot);
    return slot;
  }

  bool is_constant(size_t slot) const { return slot < constant_.size() && constant_[slot]; }

  void add_constant(const mx::array& a) {
    const size_t slot = new_slot(a);
    tape_.constants.emplace_back(slot, a);
    constant_.resize(tape_.slots, false);
    constant_[slot] = true;
  }

  DirectRun::Tape& tape_;
  std::unordered_map<std::uintptr_t, size_t> slot_of_;
  std::vector<bool> constant_;  // by slot

 public:
  size_t slot(const mx::array& a) const { return slot_of_.at(a.id()); }
};

// Each step's `released`: the slots of earlier steps' outputs it is the last to read, unless they are
// results (arguments and constants stay held by the caller and the tape).
void mark_last_reads(DirectRun::Tape& tape) {
  std::vector<std::optional<size_t>> last(tape.slots);
  for (size_t s = 0; s < tape.steps.size(); ++s) {
    for (size_t slot : tape.steps[s].inputs) last[slot] = s;
  }
  for (size_t slot : tape.results) last[slot].reset();
  for (const DirectRun::Tape::Step& step : tape.steps) {
    for (size_t slot : step.outputs) {
      if (last[slot]) tape.steps[*last[slot]].released.push_back(slot);
    }
  }
}

// The arguments computed: a caller may pass lazy arrays (or ones an async_eval is computing), which the
// kernels would otherwise read unwritten.
void wait_for(const std::vector<mx::array>& args) {
  std::vector<mx::array> lazy;
  for (const mx::array& a : args) {
    if (a.status() == mx::array::Status::unscheduled) lazy.push_back(a);
  }
  if (!lazy.empty()) mx::eval(lazy);
  for (mx::array a : args) {  // a handle: waiting marks the shared array available
    if (a.status() != mx::array::Status::available) a.wait();
  }
}

}  // namespace

std::optional<DirectRun> DirectRun::record(const std::vector<mx::array>& args,
                                           const std::vector<mx::array>& outputs,
                                           std::vector<std::string>* blockers) {
  auto tape = std::make_shared<Tape>();
  Recorder recorder(args, *tape);
  for (const mx::array& out : outputs) recorder.visit(out);
  if (!recorder.blockers.empty()) {
    if (blockers != nullptr) blockers->assign(recorder.blockers.begin(), recorder.blockers.end());
    return std::nullopt;
  }
  for (const mx::array& out : outputs) tape->results.push_back(recorder.slot(out));
  for (const mx::array& a : args) {
    tape->argument_shapes.push_back(a.shape());
    tape->argument_dtypes.push_back(a.dtype());
  }
  if (!recorder.folded.empty()) mx::eval(recorder.folded);
  mark_last_reads(*tape);
  return DirectRun(std::move(tape));
}

std::vector<mx::array> DirectRun::own_handles(const std::vector<mx::array>& args) {
  wait_for(args);
  std::vector<mx::array> own;
  own.reserve(args.size());
  for (const mx::array& a : args) {
    mx::array handle(a.shape(), a.dtype(), nullptr, {});
    handle.copy_shared_buffer(a);
    handle.set_status(mx::array::Status::available);
    own.push_back(std::move(handle));
  }
  return own;
}

size_t DirectRun::steps() const { return tape_->steps.size(); }

bool DirectRun::accepts(const std::vector<mx::array>& args) const {
  if (args.size() != tape_->argument_shapes.size()) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].shape() != tape_->argument_shapes[i] || args[i].dtype() != tape_->argument_dtypes[i])
      return false;
  }
  return true;
}

std::vector<mx::array> DirectRun::operator()(const std::vector<mx::array>& args) const {
  const Tape& tape = *tape_;
  wait_for(args);
  std::vector<std::optional<mx::array>> slots(tape.slots);
  for (size_t i = 0; i < args.size(); ++i) slots[i] = args[i];
  for (const auto& [slot, value] : tape.constants) slots[slot] = value;
  std::vector<mx::array> inputs;
  for (const Tape::Step& step : tape.steps) {
    inputs.clear();
    for (size_t slot : step.inputs) {
      inputs.push_back(*slots[slot]);
    }
    // Released slots give up their arrays before the step, so that a kernel may take an input's buffer
    // (CpuKernel::donor_of) where nothing else holds it.
    for (size_t slot : step.released) slots[slot].reset();
    if (step.contiguous_input && !inputs[0].flags().row_contiguous) {
      inputs[0] = kernels::dense_copy_here(inputs[0]);  // here: mx::contiguous would go through the stream
    }
    std::vector<mx::array> outputs;
    for (size_t j = 0; j < step.shapes.size(); ++j)
      outputs.emplace_back(step.shapes[j], step.dtypes[j], nullptr, std::vector<mx::array>{});
    if (step.kernel != nullptr) {
      step.kernel->run_here(inputs, outputs);
    } else {
      step.primitive->eval_cpu(inputs, outputs);
    }
    for (size_t j = 0; j < outputs.size(); ++j) {
      outputs[j].set_status(mx::array::Status::available);
      slots[step.outputs[j]] = std::move(outputs[j]);
    }
  }
  std::vector<mx::array> results;
  results.reserve(tape.results.size());
  for (size_t slot : tape.results) results.push_back(*slots[slot]);
  return results;
}

}  // namespace transmuter
