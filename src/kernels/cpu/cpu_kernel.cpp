#include "kernels/cpu/cpu_kernel.h"

#include <mlx/allocator.h>
#include <mlx/backend/cpu/encoder.h>

#include <stdexcept>
#include <string>

namespace transmuter::kernels {

void CpuKernel::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  for (const mx::array& in : inputs) {
    if (!in.flags().row_contiguous) {
      throw std::logic_error(std::string(name()) + ": kernel input is not row-contiguous");
    }
  }
  for (mx::array& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
  KernelTask task = make_task(inputs, outputs);
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const mx::array& in : inputs) encoder.set_input_array(in);
  for (mx::array& out : outputs) encoder.set_output_array(out);
  encoder.dispatch(std::move(task));
}

void CpuKernel::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  // make_cpu_kernel_outputs builds kernels on CPU streams only.
  throw std::logic_error(std::string(name()) + ": a Transmuter CPU kernel was scheduled on a GPU stream");
}

std::vector<mx::array> CpuKernel::vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                                      const std::vector<int>& argnums, const std::vector<mx::array>&) {
  auto [outputs, gradients] = mx::vjp(reference_, primals, cotangents);
  std::vector<mx::array> selected;
  for (int i : argnums) selected.push_back(gradients[i]);
  return selected;
}

std::vector<mx::array> CpuKernel::jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                                      const std::vector<int>& argnums) {
  // mx::jvp wants a tangent for every primal; those not asked for are zero.
  std::vector<mx::array> all;
  for (const mx::array& p : primals) all.push_back(mx::zeros_like(p));
  for (size_t i = 0; i < argnums.size(); ++i) all[argnums[i]] = tangents[i];
  auto [outputs, output_tangents] = mx::jvp(reference_, primals, all);
  return output_tangents;
}

bool is_cpu_stream(mx::StreamOrDevice s) {
  return mx::to_stream(s).device == mx::Device::cpu;
}

std::vector<mx::array> make_cpu_kernel_outputs(
    const std::function<std::shared_ptr<CpuKernel>(mx::Stream)>& make_kernel, const Reference& reference,
    std::vector<mx::array> inputs, std::vector<mx::Shape> shapes, std::vector<mx::Dtype> dtypes, mx::StreamOrDevice s) {
  if (!is_cpu_stream(s)) return reference(inputs);
  const mx::Stream stream = mx::to_stream(s);
  for (mx::array& in : inputs) in = mx::contiguous(in, false, stream);
  return mx::array::make_arrays(std::move(shapes), dtypes, make_kernel(stream), inputs);
}

}  // namespace transmuter::kernels
