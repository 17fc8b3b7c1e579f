// The CUDA backend's own kernels (cuda_kernels.cu), as host functions that launch them on a
// stream. Plain C++ so cuda_backend.cc (compiled by the host compiler) can call them. Every
// reduction runs in a fixed order (fixed chunks, tree sums in shared memory, no float atomics):
// the same inputs give the same bits on the same GPU, as backend.h demands.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace keel::cuda {

// Rows per chunk of the column reductions (parameter gradients summed over rows): each chunk's
// sum is one thread's loop in row order, the chunks are then added in order in double.
constexpr int kColumnChunkRows = 256;
// Elements per block of the whole-array reductions (sum of squares, AdamW's statistics).
constexpr size_t kReduceChunk = size_t{1} << 16;

inline int ColumnChunks(int rows) {
  return (rows + kColumnChunkRows - 1) / kColumnChunkRows;
}
inline size_t ReduceBlocks(size_t n) {
  return (n + kReduceChunk - 1) / kReduceChunk;
}

// Every launcher returns the launch's cudaError_t (cudaGetLastError after it).
cudaError_t ToBf16(uint16_t* dst, const float* src, size_t n, cudaStream_t s);
cudaError_t FillRows(float* c, const float* row, int M, int N, cudaStream_t s);
// dbias (OC) (+)= sum over N rows of dout (N,OC); partial: ColumnChunks(N) * OC doubles.
cudaError_t BiasGrad(float* dbias, const float* dout, int N, int OC, bool accumulate,
                     double* partial, cudaStream_t s);

// *first_bad = the smallest i with ids[i] outside [0, V) (left alone when none); *first_bad must
// hold n before the launch.
cudaError_t FirstOutOfRange(int* first_bad, const int32_t* ids, int n, int V, cudaStream_t s);
cudaError_t EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                             const int32_t* positions, int B, int T, int C, cudaStream_t s);
cudaError_t EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                              const int32_t* positions, int B, int T, int C, cudaStream_t s);

cudaError_t LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                             const float* weight, const float* bias, int N, int C, float eps,
                             cudaStream_t s);
// partial: 2 * ColumnChunks(N) * C doubles.
cudaError_t LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, const float* mean,
                              const float* rstd, int N, int C, double* partial, cudaStream_t s);
cudaError_t RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N,
                           int C, float eps, cudaStream_t s);
// partial: ColumnChunks(N) * C doubles.
cudaError_t RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                            const float* weight, const float* rstd, int N, int C, double* partial,
                            cudaStream_t s);
cudaError_t QkLayerNormForward(float* out, float* mean, float* rstd, const float* qkv,
                               const float* q_weight, const float* q_bias, const float* k_weight,
                               const float* k_bias, int N, int NH, int G, int hs, float eps,
                               cudaStream_t s);
// partial: 2 * ColumnChunks(N * NH) * hs doubles.
cudaError_t QkLayerNormBackward(float* dqkv, float* dq_weight, float* dq_bias, float* dk_weight,
                                float* dk_bias, const float* dout, const float* qkv,
                                const float* q_weight, const float* k_weight, const float* mean,
                                const float* rstd, int N, int NH, int G, int hs, double* partial,
                                cudaStream_t s);

// lowp: round the products' operands to bf16 as the CPU backend does in kBf16.
// row_max: B*NH*T floats of scratch.
cudaError_t AttentionForward(float* out, float* att, const float* qkv, const float* alibi_slopes,
                             int B, int T, int NH, int G, int hs, float* max_logit,
                             const int32_t* doc_start, bool lowp, float* row_max, cudaStream_t s);
// ds: B*NH*T*T floats of scratch.
cudaError_t AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att,
                              int B, int T, int NH, int G, int hs, bool lowp, float* ds,
                              cudaStream_t s);
// sign +1: forward rotation; -1: its transpose (the backward).
cudaError_t Rope(float* qkv, const float* cos_sin, const int32_t* positions, int B, int T, int NH,
                 int G, int hs, int rot, float sign, cudaStream_t s);

cudaError_t GeluForward(float* out, const float* inp, size_t n, cudaStream_t s);
cudaError_t GeluBackward(float* dinp, const float* inp, const float* dout, size_t n,
                         cudaStream_t s);
cudaError_t SwigluForward(float* out, const float* inp, int N, int F, cudaStream_t s);
cudaError_t SwigluBackward(float* dinp, const float* inp, const float* dout, int N, int F,
                           cudaStream_t s);
cudaError_t Add(float* out, const float* a, const float* b, size_t n, cudaStream_t s);
cudaError_t Accumulate(float* dst, const float* src, size_t n, cudaStream_t s);
cudaError_t Scale(float* x, size_t n, float v, cudaStream_t s);

cudaError_t CrossEntropy(float* losses, float* logz, float* logits, const int32_t* targets, int N,
                         int V, int Vp, float dloss, float z_loss, cudaStream_t s);
cudaError_t Softmax(float* probs, const float* logits, int V, float temperature, cudaStream_t s);

// result[0] = sum x^2 (double), zeros[0] = count of x == 0. partial: ReduceBlocks(n) doubles and
// as many counts.
cudaError_t SumSquaresAndZeros(const float* x, size_t n, double* partial_sq,
                               unsigned long long* partial_zeros, double* result,
                               unsigned long long* zeros, cudaStream_t s);
// count[0] = number of NaN/Inf; partial: ReduceBlocks(n) counts.
cudaError_t CountNonFinite(const float* x, size_t n, unsigned long long* partial,
                           unsigned long long* count, cudaStream_t s);

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale;
};
// With stats (partial: 3 * ReduceBlocks(n) doubles, result: 3 doubles = update_sq, param_sq,
// max_v), the pass also measures the update. param_lowp (nullable): the new weights in bf16.
cudaError_t AdamW(float* param, const float* grad, float* m, float* v, size_t n, AdamWArgs a,
                  bool stats, double* partial, double* result, uint16_t* param_lowp,
                  cudaStream_t s);

}  // namespace keel::cuda
