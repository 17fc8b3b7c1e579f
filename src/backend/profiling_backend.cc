#include "backend/profiling_backend.h"

#include <chrono>
#include <type_traits>

namespace keel {

template <typename F>
auto ProfilingBackend::Timed(const char* op, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  auto record = [&] {
    OpTime& t = times_[op];
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++t.calls;
  };
  if constexpr (std::is_void_v<decltype(f())>) {
    f();
    record();
  } else {
    auto r = f();
    record();
    return r;
  }
}

float* ProfilingBackend::AllocFloats(size_t n) {
  return Timed("AllocFloats", [&] { return inner_->AllocFloats(n); });
}
int32_t* ProfilingBackend::AllocInts(size_t n) {
  return Timed("AllocInts", [&] { return inner_->AllocInts(n); });
}
void ProfilingBackend::Free(void* p) {
  Timed("Free", [&] { inner_->Free(p); });
}
void ProfilingBackend::CopyToDevice(float* dst, const float* src, size_t n) {
  Timed("CopyToDevice", [&] { inner_->CopyToDevice(dst, src, n); });
}
void ProfilingBackend::CopyToHost(float* dst, const float* src, size_t n) {
  Timed("CopyToHost", [&] { inner_->CopyToHost(dst, src, n); });
}
HostView ProfilingBackend::ViewOnHost(const float* src, size_t n) {
  HostView v;
  Timed("ViewOnHost", [&] { v = inner_->ViewOnHost(src, n); });
  return v;
}
void ProfilingBackend::Synchronize() {
  Timed("Synchronize", [&] { inner_->Synchronize(); });
}
void ProfilingBackend::CopyIntsToDevice(int32_t* dst, const int32_t* src, size_t n) {
  Timed("CopyIntsToDevice", [&] { inner_->CopyIntsToDevice(dst, src, n); });
}
void ProfilingBackend::CopyIntsToHost(int32_t* dst, const int32_t* src, size_t n) {
  Timed("CopyIntsToHost", [&] { inner_->CopyIntsToHost(dst, src, n); });
}
void ProfilingBackend::Zero(float* x, size_t n) {
  Timed("Zero", [&] { inner_->Zero(x, n); });
}
void ProfilingBackend::Copy(float* dst, const float* src, size_t n) {
  Timed("Copy", [&] { inner_->Copy(dst, src, n); });
}
uint16_t* ProfilingBackend::AllocHalves(size_t n) {
  return Timed("AllocHalves", [&] { return inner_->AllocHalves(n); });
}
void ProfilingBackend::ToLowPrecision(uint16_t* dst, const float* src, size_t n) {
  Timed("ToLowPrecision", [&] { inner_->ToLowPrecision(dst, src, n); });
}
void ProfilingBackend::RoundToStorage(float* x, size_t n) {
  Timed("RoundToStorage", [&] { inner_->RoundToStorage(x, n); });
}
void ProfilingBackend::EmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                        const float* wpe, int B, int T, int C, int V,
                                        const int32_t* positions) {
  Timed("EmbeddingForward",
        [&] { inner_->EmbeddingForward(out, tokens, wte, wpe, B, T, C, V, positions); });
}
void ProfilingBackend::EmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                         const int32_t* tokens, int B, int T, int C, int V,
                                         const int32_t* positions) {
  Timed("EmbeddingBackward",
        [&] { inner_->EmbeddingBackward(dwte, dwpe, dout, tokens, B, T, C, V, positions); });
}
void ProfilingBackend::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                        const float* weight, const float* bias, int N, int C,
                                        float eps) {
  Timed("LayerNormForward",
        [&] { inner_->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps); });
}
void ProfilingBackend::LayerNormBackward(float* dinp, float* dweight, float* dbias,
                                         const float* dout, const float* inp, const float* weight,
                                         const float* mean, const float* rstd, int N, int C) {
  Timed("LayerNormBackward", [&] {
    inner_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  });
}
void ProfilingBackend::MatmulForward(float* out, const float* inp, const float* weight,
                                     const float* bias, int N, int IC, int OC,
                                     const uint16_t* weight_lowp, const uint16_t* inp_lowp) {
  Timed("MatmulForward",
        [&] { inner_->MatmulForward(out, inp, weight, bias, N, IC, OC, weight_lowp, inp_lowp); });
}
void ProfilingBackend::MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* inp, const float* weight, int N, int IC, int OC,
                                      const uint16_t* weight_lowp, bool add_to_dweight,
                                      const uint16_t* inp_lowp) {
  Timed("MatmulBackward", [&] {
    inner_->MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, weight_lowp,
                           add_to_dweight, inp_lowp);
  });
}
void ProfilingBackend::RmsNormForward(float* out, float* rstd, const float* inp,
                                      const float* weight, int N, int C, float eps) {
  Timed("RmsNormForward", [&] { inner_->RmsNormForward(out, rstd, inp, weight, N, C, eps); });
}
void ProfilingBackend::RmsNormBackward(float* dinp, float* dweight, const float* dout,
                                       const float* inp, const float* weight, const float* rstd,
                                       int N, int C) {
  Timed("RmsNormBackward",
        [&] { inner_->RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C); });
}
void ProfilingBackend::AttentionForward(float* out, float* att, const float* qkv,
                                        const float* alibi_slopes, int B, int T, int C, int NH,
                                        float* max_logit, const int32_t* doc_start, int kv_heads) {
  Timed("AttentionForward", [&] {
    inner_->AttentionForward(out, att, qkv, alibi_slopes, B, T, C, NH, max_logit, doc_start,
                             kv_heads);
  });
}
void ProfilingBackend::AttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                         const float* att, int B, int T, int C, int NH,
                                         int kv_heads) {
  Timed("AttentionBackward",
        [&] { inner_->AttentionBackward(dqkv, dout, qkv, att, B, T, C, NH, kv_heads); });
}
void ProfilingBackend::RopeForward(float* qkv, const float* cos_sin, const int32_t* positions,
                                   int B, int T, int NH, int kv_heads, int hs, int rot) {
  Timed("RopeForward",
        [&] { inner_->RopeForward(qkv, cos_sin, positions, B, T, NH, kv_heads, hs, rot); });
}
void ProfilingBackend::RopeBackward(float* dqkv, const float* cos_sin, const int32_t* positions,
                                    int B, int T, int NH, int kv_heads, int hs, int rot) {
  Timed("RopeBackward",
        [&] { inner_->RopeBackward(dqkv, cos_sin, positions, B, T, NH, kv_heads, hs, rot); });
}
void ProfilingBackend::QkLayerNormForward(float* out, float* mean, float* rstd, const float* qkv,
                                          const float* q_weight, const float* q_bias,
                                          const float* k_weight, const float* k_bias, int N, int C,
                                          int NH, float eps, int kv_heads) {
  Timed("QkLayerNormForward", [&] {
    inner_->QkLayerNormForward(out, mean, rstd, qkv, q_weight, q_bias, k_weight, k_bias, N, C, NH,
                               eps, kv_heads);
  });
}
void ProfilingBackend::QkLayerNormBackward(float* dqkv, float* dq_weight, float* dq_bias,
                                           float* dk_weight, float* dk_bias, const float* dout,
                                           const float* qkv, const float* q_weight,
                                           const float* k_weight, const float* mean,
                                           const float* rstd, int N, int C, int NH, int kv_heads) {
  Timed("QkLayerNormBackward", [&] {
    inner_->QkLayerNormBackward(dqkv, dq_weight, dq_bias, dk_weight, dk_bias, dout, qkv, q_weight,
                                k_weight, mean, rstd, N, C, NH, kv_heads);
  });
}
void ProfilingBackend::SwigluForward(float* out, const float* inp, int N, int F) {
  Timed("SwigluForward", [&] { inner_->SwigluForward(out, inp, N, F); });
}
void ProfilingBackend::SwigluBackward(float* dinp, const float* inp, const float* dout, int N,
                                      int F) {
  Timed("SwigluBackward", [&] { inner_->SwigluBackward(dinp, inp, dout, N, F); });
}
void ProfilingBackend::GeluForward(float* out, const float* inp, size_t n) {
  Timed("GeluForward", [&] { inner_->GeluForward(out, inp, n); });
}
void ProfilingBackend::GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  Timed("GeluBackward", [&] { inner_->GeluBackward(dinp, inp, dout, n); });
}
void ProfilingBackend::Add(float* out, const float* a, const float* b, size_t n) {
  Timed("Add", [&] { inner_->Add(out, a, b, n); });
}
void ProfilingBackend::Accumulate(float* dst, const float* src, size_t n) {
  Timed("Accumulate", [&] { inner_->Accumulate(dst, src, n); });
}
void ProfilingBackend::Scale(float* x, size_t n, float s) {
  Timed("Scale", [&] { inner_->Scale(x, n, s); });
}
void ProfilingBackend::CrossEntropyForwardBackward(float* losses, float* logz, float* logits,
                                                   const int32_t* targets, int N, int V, int Vp,
                                                   float dloss, float z_loss) {
  Timed("CrossEntropyForwardBackward", [&] {
    inner_->CrossEntropyForwardBackward(losses, logz, logits, targets, N, V, Vp, dloss, z_loss);
  });
}
void ProfilingBackend::Softmax(float* probs, const float* logits, int V, float temperature) {
  Timed("Softmax", [&] { inner_->Softmax(probs, logits, V, temperature); });
}
Backend::SquaresAndZeros ProfilingBackend::SumSquaresAndZeros(const float* x, size_t n) {
  return Timed("SumSquaresAndZeros", [&] { return inner_->SumSquaresAndZeros(x, n); });
}
size_t ProfilingBackend::CountNonFinite(const float* x, size_t n) {
  return Timed("CountNonFinite", [&] { return inner_->CountNonFinite(x, n); });
}
void ProfilingBackend::AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n,
                                   float lr, float beta1, float beta2, float eps,
                                   float weight_decay, int64_t step, AdamWStats* stats,
                                   float grad_scale, uint16_t* param_lowp) {
  Timed("AdamWUpdate", [&] {
    inner_->AdamWUpdate(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step, stats,
                        grad_scale, param_lowp);
  });
}

void ProfilingBackend::VocabParallelEmbeddingForward(float* out, const int32_t* tokens,
                                                     const float* wte, const float* wpe, int B,
                                                     int T, int C, int V, int vocab_start,
                                                     int V_local, const int32_t* positions) {
  Timed("VocabParallelEmbeddingForward", [&] {
    inner_->VocabParallelEmbeddingForward(out, tokens, wte, wpe, B, T, C, V, vocab_start, V_local,
                                          positions);
  });
}
void ProfilingBackend::VocabParallelEmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                                      const int32_t* tokens, int B, int T, int C,
                                                      int V, int vocab_start, int V_local,
                                                      const int32_t* positions) {
  Timed("VocabParallelEmbeddingBackward", [&] {
    inner_->VocabParallelEmbeddingBackward(dwte, dwpe, dout, tokens, B, T, C, V, vocab_start,
                                           V_local, positions);
  });
}
void ProfilingBackend::VocabParallelMax(float* row_max, const float* logits, int N, int V,
                                        int vocab_start, int V_local) {
  Timed("VocabParallelMax",
        [&] { inner_->VocabParallelMax(row_max, logits, N, V, vocab_start, V_local); });
}
void ProfilingBackend::VocabParallelSumExp(float* sums, float* logits, const float* row_max,
                                           const int32_t* targets, int N, int V, int vocab_start,
                                           int V_local) {
  Timed("VocabParallelSumExp", [&] {
    inner_->VocabParallelSumExp(sums, logits, row_max, targets, N, V, vocab_start, V_local);
  });
}
void ProfilingBackend::VocabParallelCrossEntropyBackward(float* losses, float* logz, float* logits,
                                                         const float* row_max, const float* sums,
                                                         const int32_t* targets, int N, int V,
                                                         int vocab_start, int V_local, float dloss,
                                                         float z_loss) {
  Timed("VocabParallelCrossEntropyBackward", [&] {
    inner_->VocabParallelCrossEntropyBackward(losses, logz, logits, row_max, sums, targets, N, V,
                                              vocab_start, V_local, dloss, z_loss);
  });
}

}  // namespace keel
