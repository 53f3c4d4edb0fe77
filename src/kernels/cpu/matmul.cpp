#include "kernels/cpu/matmul.h"

#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_kernel.h"

namespace transmuter::kernels {

namespace {

class MatvecKernel : public CpuKernel {
 public:
  MatvecKernel(mx::Stream stream, Reference reference, bool transposed_w)
      : CpuKernel(stream, std::move(reference)), transposed_w_(transposed_w) {}
  const char* name() const override { return "transmuter::Matvec"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const float* x = in[0].data<float>();
    const float* w = in[1].data<float>();
    float* y = out[0].data<float>();
    const int rows = in[1].shape(0);
    const int cols = in[1].shape(1);
    // Row-major w [K, N]: y = w^T x. Stored [N, K] (transposed_w): y = w x.
    const int trans = transposed_w_ ? kCblasNoTrans : kCblasTrans;
    return [=] { cblas_sgemv(kCblasRowMajor, trans, rows, cols, 1.0f, w, cols, x, 1, 0.0f, y, 1); };
  }

 private:
  bool transposed_w_;
};

}  // namespace

bool matvec_applies(const mx::array& a, const mx::array& w, mx::StreamOrDevice s) {
  return is_cpu_stream(s) && a.dtype() == mx::float32 && w.dtype() == mx::float32 && a.ndim() >= 1 &&
         w.ndim() == 2 && a.size() == static_cast<size_t>(a.shape(-1)) && a.size() > 0 && w.size() > 0;
}

mx::array matvec(const mx::array& a, const mx::array& w, bool transposed_w, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  Reference reference = [transposed_w, stream](const std::vector<mx::array>& in) {
    mx::array weight = transposed_w ? mx::transpose(in[1], stream) : in[1];
    return std::vector<mx::array>{mx::matmul(in[0], weight, stream)};
  };
  const int k = transposed_w ? w.shape(1) : w.shape(0);
  if (!matvec_applies(a, w, s) || a.shape(-1) != k) return reference({a, w})[0];
  mx::Shape shape = a.shape();
  shape.back() = transposed_w ? w.shape(0) : w.shape(1);
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<MatvecKernel>(kernel_stream, reference, transposed_w); },
      reference, {a, w}, {shape}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
