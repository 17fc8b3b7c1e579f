// The CPU backend: fp32 reference implementation of every op in backend.h (llm.c style), with
// OpenMP for the loops and OpenBLAS (loaded at run time, see blas.h) for the matrix products.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace keel {

class CpuBackend : public Backend {
 public:
  // threads <= 0: omp_get_max_threads(). Sets the OpenMP and OpenBLAS thread counts.
  explicit CpuBackend(int threads);

  std::string Name() const override { return "cpu"; }
  std::string Describe() const override;
  bool Supports(Op, Precision) const override { return true; }  // every op in every precision
  void Synchronize() override {}                                // ops finish before they return
  int threads() const { return threads_; }

  float* AllocFloats(size_t n) override;
  int32_t* AllocInts(size_t n) override;
  void Free(void* p) override;
  void CopyToDevice(float* dst, const float* host_src, size_t n) override;
  void CopyToHost(float* host_dst, const float* src, size_t n) override;
  void CopyIntsToDevice(int32_t* dst, const int32_t* host_src, size_t n) override;
  void CopyIntsToHost(int32_t* host_dst, const int32_t* src, size_t n) override;
  // Host memory: the view is the memory itself (zero-copy).
  HostView ViewOnHost(const float* src, size_t n) override { return HostView::ZeroCopy(src, n); }
  void Zero(float* x, size_t n) override;
  void Copy(float* dst, const float* src, size_t n) override;

  void SetPrecision(Precision p) override { precision_ = p; }
  Precision precision() const override { return precision_; }
  uint16_t* AllocHalves(size_t n) override;
  void ToLowPrecision(uint16_t* dst, const float* src, size_t n) override;
  void RoundToStorage(float* x, size_t n) override;

  void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                        int B, int T, int C, int V, const int32_t* positions) override;
  void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                         int T, int C, int V, const int32_t* positions) override;

  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, float eps) override;
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int N, int C) override;

  void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                     int IC, int OC, const uint16_t* weight_lowp,
                     const uint16_t* inp_lowp) override;
  void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                      const float* inp, const float* weight, int N, int IC, int OC,
                      const uint16_t* weight_lowp, bool add_to_dweight,
                      const uint16_t* inp_lowp) override;

  void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                      float eps) override;
  void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int N, int C) override;

  void AttentionForward(float* out, float* att, const float* qkv, const float* alibi_slopes, int B,
                        int T, int C, int NH, float* max_logit, const int32_t* doc_start,
                        int kv_heads) override;
  void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                         int T, int C, int NH, int kv_heads) override;
  void RopeForward(float* qkv, const float* cos_sin, const int32_t* positions, int B, int T, int NH,
                   int kv_heads, int hs, int rot) override;
  void RopeBackward(float* dqkv, const float* cos_sin, const int32_t* positions, int B, int T,
                    int NH, int kv_heads, int hs, int rot) override;

  void GeluForward(float* out, const float* inp, size_t n) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) override;
  void SwigluForward(float* out, const float* inp, int N, int F) override;
  void SwigluBackward(float* dinp, const float* inp, const float* dout, int N, int F) override;
  void Add(float* out, const float* a, const float* b, size_t n) override;
  void Accumulate(float* dst, const float* src, size_t n) override;
  void Scale(float* x, size_t n, float s) override;

  void QkLayerNormForward(float* out, float* mean, float* rstd, const float* qkv,
                          const float* q_weight, const float* q_bias, const float* k_weight,
                          const float* k_bias, int N, int C, int NH, float eps,
                          int kv_heads) override;
  void QkLayerNormBackward(float* dqkv, float* dq_weight, float* dq_bias, float* dk_weight,
                           float* dk_bias, const float* dout, const float* qkv,
                           const float* q_weight, const float* k_weight, const float* mean,
                           const float* rstd, int N, int C, int NH, int kv_heads) override;
  void CrossEntropyForwardBackward(float* losses, float* logz, float* logits,
                                   const int32_t* targets, int N, int V, int Vp, float dloss,
                                   float z_loss) override;
  void Softmax(float* probs, const float* logits, int V, float temperature) override;

  SquaresAndZeros SumSquaresAndZeros(const float* x, size_t n) override;
  size_t CountNonFinite(const float* x, size_t n) override;
  void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int64_t step,
                   AdamWStats* stats, float grad_scale, uint16_t* param_lowp) override;
  void VocabParallelEmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                     const float* wpe, int B, int T, int C, int V, int vocab_start,
                                     int V_local, const int32_t* positions) override;
  void VocabParallelEmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                      const int32_t* tokens, int B, int T, int C, int V,
                                      int vocab_start, int V_local,
                                      const int32_t* positions) override;
  void VocabParallelMax(float* row_max, const float* logits, int N, int V, int vocab_start,
                        int V_local) override;
  void VocabParallelSumExp(float* sums, float* logits, const float* row_max, const int32_t* targets,
                           int N, int V, int vocab_start, int V_local) override;
  void VocabParallelCrossEntropyBackward(float* losses, float* logz, float* logits,
                                         const float* row_max, const float* sums,
                                         const int32_t* targets, int N, int V, int vocab_start,
                                         int V_local, float dloss, float z_loss) override;

 private:
  // OpenBLAS's OpenMP build takes its thread count from omp_get_max_threads() of the calling
  // thread; re-assert ours before a top-level GEMM in case another backend or thread changed it.
  void UseThreads() const;
  // Team size for a loop over `work` elements: 1 for small loops, where waking and joining threads
  // costs more than the loop (and stalls badly when the cores are shared with other processes).
  int ThreadsFor(size_t work) const;
  // The embedding ops' bodies, for the vocabulary slice [vocab_start, vocab_start + V_local).
  void EmbeddingRowsForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                            int B, int T, int C, int vocab_start, int V_local,
                            const int32_t* positions);
  void EmbeddingRowsBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                             int B, int T, int C, int vocab_start, int V_local,
                             const int32_t* positions);

  // The products of the low-precision modes (see backend.h, "mixed precision"):
  // C (M,N) = [C +] op(A) @ op(B) with A, B rounded to precision_ (or given as its bits).
  struct Operand {
    const float* f32 = nullptr;      // fp32 values, rounded here
    const uint16_t* bits = nullptr;  // or already converted (takes precedence)
    size_t n = 0;
  };
  void FillRows(float* C, const float* row, int M, int N) const;
  // C = [C +] op(a) op(b) [+ bias on every row] (bias, nullable, only without accumulate).
  void LowPrecisionGemm(bool trans_a, bool trans_b, int M, int N, int K, Operand a, Operand b,
                        float* C, bool accumulate, const float* bias = nullptr);
  // Whether kBf16 products run on oneDNN's bf16 matmul (else fp32 sgemm of bf16-rounded values).
  bool NativeBf16() const;

  int threads_;
  Precision precision_ = Precision::kFp32;
  // Scratch of the low-precision products, grown as needed and reused (the ops run one at a time).
  std::vector<uint16_t> bits_a_, bits_b_, bits_d_;
  std::vector<float> vals_a_, vals_b_, product_;
};

}  // namespace keel
