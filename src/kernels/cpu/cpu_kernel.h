// Transmuter's own CPU kernels as MLX primitives.
//
// A kernel is an mx::Primitive whose eval_cpu runs our code (vectorized with
// Highway, threaded with parallel_for) on the stream's thread. Every kernel
// also has a reference: the same function composed of MLX ops. The reference
// gives the kernel its transformations (vjp, jvp: the derivative of the
// composition, evaluated where the gradient is asked for) and runs instead of
// the kernel on non-CPU streams, where MLX's own ops are fast. So a kernel
// changes the speed of a CPU forward pass, never the math of a gradient.
//
// Kernels read row-contiguous inputs: eval_cpu copies any other input (a
// transposed or broadcast view) into a dense temporary first, on the stream's
// thread, so the graph holds one primitive per kernel call. A kernel that reads
// some views through their strides says so (reads_view), and gets them as they are.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <mlx/mlx.h>
#include <mlx/primitives.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

using Reference = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

/** The work of one kernel evaluation: runs later, on the stream's thread. It
 * must capture what it needs by value (raw data pointers of the inputs and
 * outputs stay valid until it has run; the primitive itself may not). */
using KernelTask = std::function<void()>;

class CpuKernel : public mx::Primitive {
 public:
  CpuKernel(mx::Stream stream, Reference reference)
      : mx::Primitive(stream), reference_(std::move(reference)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) final;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) final;
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override;
  std::vector<mx::array> jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override;

  /** The same function as MLX ops (other streams, gradients; tests compare the kernel with it). */
  const Reference& reference() const { return reference_; }

  /** Computes `outputs` (unallocated arrays of the output shapes and types) from `inputs` (evaluated) now,
   * on the calling thread, without MLX's scheduler: a direct run of a compiled plan
   * (src/runtime/direct_run.h). The same buffers, donation and result as eval_cpu. */
  void run_here(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs);

 protected:
  /** The task computing `outputs` (already allocated, row-contiguous or as output_strides says) from
   * `inputs` (row-contiguous, but for those reads_view takes as they are). Called on the thread that
   * evaluates. */
  virtual KernelTask make_task(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) const = 0;

  /** The input whose buffer output `output` may take instead of a new one, or -1. It is taken when
   * MLX would donate it (nothing else holds the input: is_donatable) and it is row-contiguous with
   * the output's type and size; make_task sees that it was by comparing the two data pointers. */
  virtual int donor_of(size_t /*output*/) const { return -1; }

  /** True when make_task reads input `index`, which is not row-contiguous, through its strides as it
   * is (the attention reads the heads of a [B, S, H, D] projection seen as [B, H, S, D]): eval_cpu then
   * makes no dense copy of it. */
  virtual bool reads_view(size_t /*index*/, const mx::array& /*input*/) const { return false; }

  /** The strides output `output` (of `shape`) is written with when not row-contiguous: a permutation of
   * the dense layout (the attention writes [B, H, S, Dv] in [B, S, H, Dv] order, so that the transpose
   * back to [B, S, H * Dv] a graph always makes is row-contiguous and its reshape copies nothing).
   * nullopt: row-contiguous. A donated buffer keeps its input's row-contiguous layout. */
  virtual std::optional<mx::Strides> output_strides(size_t /*output*/, const mx::Shape& /*shape*/) const {
    return std::nullopt;
  }

 private:
  KernelTask prepare(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs,
                     std::vector<mx::array>& temporaries, size_t& new_bytes,
                     const std::function<void()>& before_allocating);

  Reference reference_;
};

/** A CpuKernel whose reference is differentiated with respect to the inputs asked for only, the others
 * held constant. For references that have no derivative with respect to some input (MLX's quantized
 * products throw for the packed weight; indices have none), which CpuKernel's vjp and jvp, taken with
 * respect to every input, would reach. */
class PartiallyDifferentiableKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override;
  std::vector<mx::array> jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override;
};

/** A row-contiguous copy of `in` (evaluated, any layout of 1-, 2-, 4- or 8-byte elements), made now on the
 * calling thread: a direct run's Reshape of a view, without MLX's scheduler. */
mx::array dense_copy_here(const mx::array& in);

/** True when `s` resolves to a CPU stream (own kernels run only there). */
bool is_cpu_stream(mx::StreamOrDevice s);

/** The outputs of `kernel` (made by `make_kernel(stream)`) on a CPU stream, or
 * reference(inputs) on any other stream. `shapes`/`dtypes` describe the
 * outputs and must be what the reference returns. */
std::vector<mx::array> make_cpu_kernel_outputs(
    const std::function<std::shared_ptr<CpuKernel>(mx::Stream)>& make_kernel, const Reference& reference,
    std::vector<mx::array> inputs, std::vector<mx::Shape> shapes, std::vector<mx::Dtype> dtypes,
    mx::StreamOrDevice s);

}  // namespace transmuter::kernels
