// The CBLAS entry points the kernels call. The build links OpenBLAS ahead of
// MLX (CMakeLists.txt, ctest blas_is_openblas), so these resolve to it;
// declared here rather than through <cblas.h>, whose location differs between
// the OpenBLAS variants Debian ships.
#pragma once

extern "C" {
enum TransmuterCblasOrder { kCblasRowMajor = 101 };
enum TransmuterCblasTranspose { kCblasNoTrans = 111, kCblasTrans = 112 };

void cblas_sgemv(int order, int trans, int m, int n, float alpha, const float* a, int lda, const float* x, int incx,
                 float beta, float* y, int incy);
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc);
}
