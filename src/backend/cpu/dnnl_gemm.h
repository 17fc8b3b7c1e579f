// bf16 matrix products through oneDNN (Debian's libdnnl), the CPU backend's --bf16 GEMM: bf16
// operands, fp32 accumulation and output. On this project's AVX512-BF16 CPU (Zen 4) its brgemm
// kernels run at about twice OpenBLAS's sgemm rate (README, "Dependencies"); Debian's OpenBLAS
// 0.3.21 is built without sbgemm, so it has no bf16 GEMM to compare.
#pragma once

#include <cstdint>
#include <string>

namespace keel::dnnl_gemm {

// Row-major, contiguous (leading dimension = columns as stored):
//   C (M,N) = [C +] op(A) (M,K) @ op(B) (K,N) [+ bias (N) on every row],  op(X) = X or X^T,
//   A, B bf16 bits, C and bias fp32 (bias nullable; added inside the product's own pass).
// Runs on omp_get_max_threads() threads (oneDNN shares keel's OpenMP pool). Throws KeelError if
// oneDNN has no bf16 matmul for this CPU (see Available).
void GemmBf16(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, const uint16_t* B,
              float* C, bool accumulate, const float* bias = nullptr);

// Whether oneDNN has a native bf16 matmul here (its implementation uses a bf16 ISA), and a line
// naming the library version and the implementation chosen, for the start-up log.
bool Available();
const std::string& Description();

}  // namespace keel::dnnl_gemm
