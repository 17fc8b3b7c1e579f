// OpenBLAS, loaded at run time. keel does not link OpenBLAS: it dlopen()s the OpenMP build at
// KEEL_OPENBLAS_PATH so it can choose the kernel family (OPENBLAS_CORETYPE) before the library
// initialises, and so the choice is logged rather than left to OpenBLAS's CPU detection.
#pragma once

#include <string>

namespace keel::blas {

// Row-major single-precision GEMM, cblas semantics:
//   C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C,  op(X) = X or X^T.
// lda/ldb/ldc are row strides of A, B, C as stored. Runs on OpenBLAS's threads, or on the calling
// thread alone when called from inside an OpenMP parallel region.
void Sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// Sets OpenBLAS's thread count.
void SetNumThreads(int n);

// One line: version, threading, kernel family, and why that family was chosen.
const std::string& Description();

// Loads the library (once, thread-safe). Throws KeelError if it cannot be loaded. The functions
// above call it themselves; calling it early only moves the failure to a predictable place.
void Init();

}  // namespace keel::blas
