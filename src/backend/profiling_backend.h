// ProfilingBackend: wraps a Backend, forwards every op to it and adds up the wall time and calls
// per op (MatmulForward, AdamWUpdate, ...): `keel bench --profile` shows where a training step's
// time goes with it. Ops are synchronous on the CPU backend, so each op's time is its own.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace keel {

class ProfilingBackend : public Backend {
 public:
  struct OpTime {
    double seconds = 0;
    int64_t calls = 0;
  };
  explicit ProfilingBackend(Backend* inner) : inner_(inner) {}

  const std::map<std::string, OpTime>& times() const { return times_; }
  void Reset() { times_.clear(); }

  std::string Name() const override { return inner_->Name(); }
  std::string Describe() const override { return inner_->Describe(); }
  bool Supports(Op op, Precision p) const override { return inner_->Supports(op, p); }
  void Synchronize() override;
  float* AllocFloats(size_t n) override;
  int32_t* AllocInts(size_t n) override;
  void Free(void* p) override;
  void CopyToDevice(float* dst, const float* host_src, size_t n) override;
  void CopyToHost(float* host_dst, const float* src, size_t n) override;
  void CopyIntsToDevice(int32_t* dst, const int32_t* host_src, size_t n) override;
  void CopyIntsToHost(int32_t* host_dst, const int32_t* src, size_t n) override;
  HostView ViewOnHost(const float* src, size_t n) override;
  void Zero(float* x, size_t n) override;
  void Copy(float* dst, const float* src, size_t n) override;
  void SetPrecision(Precision p) override { inner_->SetPrecision(p); }
  Precision precision() const override { return inner_->precision(); }
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
  void QkLayerNormForward(float* out, float* mean, float* rstd, const float* qkv,
                          const float* q_weight, const float* q_bias, const float* k_weight,
                          const float* k_bias, int N, int C, int NH, float eps,
                          int kv_heads) override;
  void QkLayerNormBackward(float* dqkv, float* dq_weight, float* dq_bias, float* dk_weight,
                           float* dk_bias, const float* dout, const float* qkv,
                           const float* q_weight, const float* k_weight, const float* mean,
                           const float* rstd, int N, int C, int NH, int kv_heads) override;
  void GeluForward(float* out, const float* inp, size_t n) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) override;
  void SwigluForward(float* out, const float* inp, int N, int F) override;
  void SwigluBackward(float* dinp, const float* inp, const float* dout, int N, int F) override;
  void Add(float* out, const float* a, const float* b, size_t n) override;
  void Accumulate(float* dst, const float* src, size_t n) override;
  void Scale(float* x, size_t n, float s) override;
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
  // Times f() under `op`; returns what it returns.
  template <typename F>
  auto Timed(const char* op, F&& f);

  Backend* inner_;
  std::map<std::string, OpTime> times_;
};

}  // namespace keel
