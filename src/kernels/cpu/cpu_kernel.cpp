#include "kernels/cpu/cpu_kernel.h"

#include "kernels/cpu/kernel_lookahead.h"
#include "kernels/cpu/kernel_profile.h"

#include <mlx/allocator.h>
#include <mlx/backend/cpu/encoder.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace transmuter::kernels {

namespace {

// A strided input to copy into a dense temporary inside the kernel's task. It holds raw pointers and
// plain vectors, never an mx::array: an array released by our code on the stream thread while the
// calling thread's libmlx frames release it too is a race that ThreadSanitizer cannot see ordered
// (MLX's reference counts live in the uninstrumented libmlx.so). MLX keeps the view's buffer alive
// until the task has run, and the copy's through the encoder's temporaries.
struct DenseCopy {
  const char* from;
  char* to;
  size_t item;
  std::vector<int64_t> shape, strides;  // in elements
};

// The last two axes of a strided copy: `rows` runs of `cols` elements of type T, read through the
// given element strides. Typed so that a transpose (the NCHW -> NHWC border of a channels-last CNN,
// whose last axis has a large stride) moves one element per load/store, not a memcpy call each.
template <typename T>
void copy_block(const char* from, char* to, int64_t rows, int64_t cols, int64_t row_stride,
                int64_t col_stride) {
  const T* src = reinterpret_cast<const T*>(from);
  T* dst = reinterpret_cast<T*>(to);
  for (int64_t r = 0; r < rows; ++r, dst += cols) {
    const T* row = src + r * row_stride;
    if (col_stride == 1) {
      std::memcpy(dst, row, static_cast<size_t>(cols) * sizeof(T));
    } else {
      for (int64_t c = 0; c < cols; ++c) dst[c] = row[c * col_stride];
    }
  }
}

void copy_block_of(const char* from, char* to, size_t item, int64_t rows, int64_t cols, int64_t row_stride,
                   int64_t col_stride) {
  switch (item) {
    case 1:
      return copy_block<uint8_t>(from, to, rows, cols, row_stride, col_stride);
    case 2:
      return copy_block<uint16_t>(from, to, rows, cols, row_stride, col_stride);
    case 4:
      return copy_block<uint32_t>(from, to, rows, cols, row_stride, col_stride);
    default:  // 8: every MLX element is 1, 2, 4 or 8 bytes (checked in eval_cpu)
      return copy_block<uint64_t>(from, to, rows, cols, row_stride, col_stride);
  }
}

// copy.to (row-contiguous) = copy.from read through its strides: a block of the last two axes at a
// time (an odometer walks the outer ones), so broadcasts and transposes cost a loop, not a call, per
// element.
void copy_row_contiguous(const DenseCopy& copy) {
  const int rank = static_cast<int>(copy.shape.size());
  const size_t item = copy.item;
  if (rank == 0) {
    std::memcpy(copy.to, copy.from, item);
    return;
  }
  int64_t size = 1;
  for (int64_t d : copy.shape) size *= d;
  if (size == 0) return;
  const int64_t cols = copy.shape[rank - 1], col_stride = copy.strides[rank - 1];
  const int64_t rows = rank >= 2 ? copy.shape[rank - 2] : 1;
  const int64_t row_stride = rank >= 2 ? copy.strides[rank - 2] : 0;
  const int outer_axes = std::max(rank - 2, 0);
  const int64_t blocks = size / (rows * cols);
  const int64_t block_bytes = rows * cols * static_cast<int64_t>(item);
  std::vector<int64_t> index(outer_axes, 0);
  int64_t offset = 0;  // elements from the view's first one to the current block
  char* to = copy.to;
  for (int64_t block = 0; block < blocks; ++block, to += block_bytes) {
    copy_block_of(copy.from + offset * static_cast<int64_t>(item), to, item, rows, cols, row_stride,
                  col_stride);
    for (int axis = outer_axes - 1; axis >= 0; --axis) {  // the next block: an odometer over the outer axes
      offset += copy.strides[axis];
      if (++index[axis] < copy.shape[axis]) break;
      offset -= copy.strides[axis] * copy.shape[axis];
      index[axis] = 0;
    }
  }
}

DenseCopy dense_copy_of(const mx::array& in, mx::array& copy) {
  return {in.data<char>(), copy.data<char>(), in.itemsize(),
          std::vector<int64_t>(in.shape().begin(), in.shape().end()),
          std::vector<int64_t>(in.strides().begin(), in.strides().end())};
}

// The flags of a dense array laid out with `strides` (a permutation of the row-contiguous layout, no gaps):
// contiguous, and row- or column-contiguous where the strides are those of either order (axes of size 1
// set aside), as MLX's transpose computes them.
mx::array::Flags permuted_layout_flags(const mx::Shape& shape, const mx::Strides& strides) {
  mx::array::Flags flags{.contiguous = true, .row_contiguous = true, .col_contiguous = true};
  int64_t row = 1, col = 1;
  for (size_t i = shape.size(), j = 0; i-- > 0; ++j) {
    if (shape[i] != 1) {
      flags.row_contiguous = flags.row_contiguous && strides[i] == row;
      row *= shape[i];
    }
    if (shape[j] != 1) {
      flags.col_contiguous = flags.col_contiguous && strides[j] == col;
      col *= shape[j];
    }
  }
  return flags;
}

mx::Strides row_major_strides(const mx::Shape& shape) {
  mx::Strides strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

// MLX's CPU allocator keeps an 8-byte size header in front of a buffer's data, so its arrays start 8
// bytes past a 64-byte line and every 64-byte vector a kernel loads or stores spans two lines. A
// kernel's output (or dense copy) is allocated a line larger and starts on the next line boundary
// (the array's offset into its buffer); `strides` empty: row-major.
void set_line_aligned_data(mx::array& out, mx::Strides strides) {
  constexpr uintptr_t kLine = 64;
  if (strides.empty()) strides = row_major_strides(out.shape());
  const mx::array::Flags flags = permuted_layout_flags(out.shape(), strides);
  mx::allocator::Data data = mx::allocator::malloc(out.nbytes() + kLine);
  const auto raw = reinterpret_cast<uintptr_t>(data.buffer().raw_ptr());
  const auto offset = static_cast<int64_t>((kLine - raw % kLine) % kLine);
  out.set_data(std::move(data), out.size(), std::move(strides), flags, offset);
}

// A row-contiguous array of `in`'s shape and type, allocated, not yet written.
mx::array unwritten_dense_copy(const mx::array& in, const char* who) {
  if (in.itemsize() != 1 && in.itemsize() != 2 && in.itemsize() != 4 && in.itemsize() != 8)
    throw std::logic_error(std::string(who) + ": an input of " + std::to_string(in.itemsize()) +
                           "-byte elements");
  mx::array copy(in.shape(), in.dtype(), nullptr, {});
  set_line_aligned_data(copy, {});
  return copy;
}

// `out` may take `in`'s buffer: nothing else can see `in` afterwards, and the layouts agree.
bool can_take_buffer(const mx::array& in, const mx::array& out) {
  return in.is_donatable() && in.flags().row_contiguous && in.dtype() == out.dtype() &&
         in.shape() == out.shape();
}

}  // namespace

// Allocates `outputs` (or gives them a donor's buffer) and returns the task that computes them; inputs that
// are views are copied into dense temporaries, each appended to `temporaries` (to be held until the task
// has run), inside the task. `new_bytes` gets the bytes allocated.
KernelTask CpuKernel::prepare(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs,
                              std::vector<mx::array>& temporaries, size_t& new_bytes,
                              const std::function<void()>& before_allocating) {
  // Before any copy of the inputs below (a copy is another holder, which would stop the donation).
  std::vector<int> donors(outputs.size(), -1);  // the input whose buffer each output takes, or -1
  new_bytes = 0;
  for (size_t j = 0; j < outputs.size(); ++j) {
    const int donor = donor_of(j);
    if (donor >= 0 && can_take_buffer(inputs[donor], outputs[j]))
      donors[j] = donor;
    else
      new_bytes += outputs[j].nbytes();
  }
  auto needs_copy = [&](size_t index) {
    return !inputs[index].flags().row_contiguous && !reads_view(index, inputs[index]);
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (needs_copy(i)) new_bytes += inputs[i].nbytes();  // its dense copy, below
  }
  if (before_allocating) before_allocating();
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (donors[j] >= 0) {
      outputs[j].copy_shared_buffer(inputs[donors[j]]);
    } else {
      set_line_aligned_data(outputs[j], output_strides(j, outputs[j].shape()).value_or(mx::Strides{}));
    }
  }
  std::vector<mx::array> dense = inputs;
  std::vector<DenseCopy> copies;
  for (size_t i = 0; i < dense.size(); ++i) {
    mx::array& in = dense[i];
    if (!needs_copy(i)) continue;
    mx::array copy = unwritten_dense_copy(in, name());
    copies.push_back(dense_copy_of(in, copy));
    temporaries.push_back(copy);
    in = copy;
  }
  KernelTask task = make_task(dense, outputs);
  if (!copies.empty()) {
    task = [copies = std::move(copies), task = std::move(task)]() {
      for (const DenseCopy& copy : copies) copy_row_contiguous(copy);
      task();
    };
  }
  if (kernel_profile_enabled())
    task = profiled_task(kernel_profile_key(name(), inputs, outputs), std::move(task));
  return task;
}

void CpuKernel::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  // Inputs that are views (transposes, broadcasts) are copied into dense temporaries on the stream's
  // thread, before the kernel's task. Doing it here rather than as an mx::contiguous op per input
  // keeps the graph to one primitive per kernel: a compiled decode step replays ~20 kernels a layer,
  // and each extra primitive costs the calling thread its set-up and bookkeeping.
  auto& encoder = mx::cpu::get_command_encoder(stream());
  std::vector<mx::array> temporaries;
  size_t new_bytes = 0;
  std::shared_ptr<KernelTaskTicket> ticket;
  // Waits before allocating while earlier kernels' outputs fill the look-ahead budget.
  KernelTask task =
      prepare(inputs, outputs, temporaries, new_bytes, [&] { ticket = admit_kernel_task(new_bytes); });
  encoder.add_temporaries(std::move(temporaries));
  task = [task = std::move(task), ticket = std::move(ticket)] {
    task();
    ticket->finish();  // the outputs are written: the evaluating thread may encode the next kernel
  };
  for (const mx::array& in : inputs) encoder.set_input_array(in);
  for (mx::array& out : outputs) encoder.set_output_array(out);
  encoder.dispatch(std::move(task));
}

void CpuKernel::run_here(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  std::vector<mx::array> temporaries;
  size_t new_bytes = 0;
  prepare(inputs, outputs, temporaries, new_bytes, {})();
}

mx::array dense_copy_here(const mx::array& in) {
  mx::array copy = unwritten_dense_copy(in, "dense_copy_here");
  copy_row_contiguous(dense_copy_of(in, copy));
  copy.set_status(mx::array::Status::available);
  return copy;
}

void CpuKernel::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  // make_cpu_kernel_outputs builds kernels on CPU streams only.
  throw std::logic_error(std::string(name()) + ": a Transmuter CPU kernel was scheduled on a GPU stream");
}

std::vector<mx::array> CpuKernel::vjp(const std::vector<mx::array>& primals,
                                      const std::vector<mx::array>& cotangents,
                                      const std::vector<int>& argnums, const std::vector<mx::array>&) {
  auto [outputs, gradients] = mx::vjp(reference_, primals, cotangents);
  std::vector<mx::array> selected;
  for (int i : argnums) selected.push_back(gradients[i]);
  return selected;
}

std::vector<mx::array> CpuKernel::jvp(const std::vector<mx::array>& primals,
                                      const std::vector<mx::array>& tangents,
                                      const std::vector<int>& argnums) {
  // mx::jvp wants a tangent for every primal; those not asked for are zero.
  std::vector<mx::array> all;
  for (const mx::array& p : primals) all.push_back(mx::zeros_like(p));
  for (size_t i = 0; i < argnums.size(); ++i) all[argnums[i]] = tangents[i];
  auto [outputs, output_tangents] = mx::jvp(reference_, primals, all);
  return output_tangents;
}

namespace {

// The inputs at `argnums`.
std::vector<mx::array> selected(const std::vector<mx::array>& primals, const std::vector<int>& argnums) {
  std::vector<mx::array> out;
  for (int i : argnums) out.push_back(primals[i]);
  return out;
}

// `reference` as a function of the inputs at `argnums`, the other primals held.
Reference restricted(const Reference& reference, const std::vector<mx::array>& primals,
                     const std::vector<int>& argnums) {
  return [reference, primals, argnums](const std::vector<mx::array>& in) {
    std::vector<mx::array> all = primals;
    for (size_t i = 0; i < argnums.size(); ++i) all[argnums[i]] = in[i];
    return reference(all);
  };
}

}  // namespace

std::vector<mx::array> PartiallyDifferentiableKernel::vjp(const std::vector<mx::array>& primals,
                                                          const std::vector<mx::array>& cotangents,
                                                          const std::vector<int>& argnums,
                                                          const std::vector<mx::array>&) {
  return mx::vjp(restricted(reference(), primals, argnums), selected(primals, argnums), cotangents).second;
}

std::vector<mx::array> PartiallyDifferentiableKernel::jvp(const std::vector<mx::array>& primals,
                                                          const std::vector<mx::array>& tangents,
                                                          const std::vector<int>& argnums) {
  return mx::jvp(restricted(reference(), primals, argnums), selected(primals, argnums), tangents).second;
}

bool is_cpu_stream(mx::StreamOrDevice s) { return mx::to_stream(s).device == mx::Device::cpu; }

std::vector<mx::array> make_cpu_kernel_outputs(
    const std::function<std::shared_ptr<CpuKernel>(mx::Stream)>& make_kernel, const Reference& reference,
    std::vector<mx::array> inputs, std::vector<mx::Shape> shapes, std::vector<mx::Dtype> dtypes,
    mx::StreamOrDevice s) {
  if (!is_cpu_stream(s)) return reference(inputs);
  const mx::Stream stream = mx::to_stream(s);
  return mx::array::make_arrays(std::move(shapes), dtypes, make_kernel(stream), inputs);
}

}  // namespace transmuter::kernels
