// Backend: the operations a transformer needs, each with its forward and backward, behind one
// interface so the CPU (fp32 reference) and CUDA backends share one model description
// (llama.cpp/ggml style). Pointers passed to ops are memory owned by the backend (host memory for
// the CPU backend, device memory for CUDA); the model never dereferences them itself.
//
// Conventions
// - Row-major. N = B*T rows (tokens), C = hidden size, V = real vocab, Vp = padded vocab.
// - Every backward ACCUMULATES (+=) into every gradient it writes (parameter and activation
//   gradients alike). Callers zero gradient buffers before a backward pass; this makes gradient
//   accumulation over micro-batches and residual fan-out free.
// - Ops are deterministic: the same inputs give the same bits for the same thread count.
// - Ops may run asynchronously, in the order they were issued (a CUDA stream). The host sees their
//   results only through CopyToHost, CopyIntsToHost and ViewOnHost, which wait for every op issued
//   before them, or after Synchronize(). Call Synchronize() before handing backend memory to
//   anything outside the backend (a collective, a checkpoint writer) and before timing a step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/precision.h"

namespace keel {

// Every op of Backend, for Backend::Supports (ggml's supports_op): a backend that lacks one says
// so, and a run whose config needs it stops at open naming the op and the setting.
enum class Op {
  kToLowPrecision,
  kRoundToStorage,
  kEmbeddingForward,
  kEmbeddingBackward,
  kLayerNormForward,
  kLayerNormBackward,
  kRmsNormForward,
  kRmsNormBackward,
  kMatmulForward,
  kMatmulBackward,
  kAttentionForward,
  kAttentionBackward,
  kQkLayerNormForward,
  kQkLayerNormBackward,
  kRopeForward,
  kRopeBackward,
  kGeluForward,
  kGeluBackward,
  kSwigluForward,
  kSwigluBackward,
  kAdd,
  kAccumulate,
  kScale,
  kCrossEntropyForwardBackward,
  kSoftmax,
  kSumSquaresAndZeros,
  kCountNonFinite,
  kAdamWUpdate,
  kVocabParallelEmbeddingForward,
  kVocabParallelEmbeddingBackward,
  kVocabParallelMax,
  kVocabParallelSumExp,
  kVocabParallelCrossEntropyBackward,
};
inline constexpr int kNumOps = static_cast<int>(Op::kVocabParallelCrossEntropyBackward) + 1;
// The op's method name ("RopeForward").
const char* OpName(Op op);

// A read-only host copy of n floats of backend memory (Backend::ViewOnHost). A backend whose
// memory is host memory may hand out the memory itself (zero_copy()): then the view is valid only
// while no op writes there. Otherwise the view owns a staging copy.
class HostView {
 public:
  HostView() = default;
  static HostView ZeroCopy(const float* p, size_t n) {
    HostView h;
    h.data_ = p, h.size_ = n, h.zero_copy_ = true;
    return h;
  }
  static HostView Owned(std::vector<float> v) {
    HostView h;
    h.owned_ = std::move(v);  // a vector's move keeps its buffer, so data_ stays valid
    h.data_ = h.owned_.data(), h.size_ = h.owned_.size();
    return h;
  }
  HostView(HostView&&) = default;
  HostView& operator=(HostView&&) = default;
  HostView(const HostView&) = delete;
  HostView& operator=(const HostView&) = delete;

  const float* data() const { return data_; }
  size_t size() const { return size_; }
  bool zero_copy() const { return zero_copy_; }

 private:
  std::vector<float> owned_;
  const float* data_ = nullptr;
  size_t size_ = 0;
  bool zero_copy_ = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string Name() const = 0;
  // One-line description for the start-up log (BLAS library, kernel family, threads...).
  virtual std::string Describe() const = 0;
  // Whether this backend implements `op` in precision `p` (the precision SetPrecision would set).
  virtual bool Supports(Op op, Precision p) const = 0;
  // Waits until every op issued so far has finished (see Conventions). A no-op on the CPU, whose
  // ops finish before they return.
  virtual void Synchronize() = 0;

  // ---- memory -----------------------------------------------------------------------------
  virtual float* AllocFloats(size_t n) = 0;  // zero-initialised
  virtual int32_t* AllocInts(size_t n) = 0;  // zero-initialised
  virtual void Free(void* p) = 0;
  virtual void CopyToDevice(float* dst, const float* host_src, size_t n) = 0;
  virtual void CopyToHost(float* host_dst, const float* src, size_t n) = 0;
  virtual void CopyIntsToDevice(int32_t* dst, const int32_t* host_src, size_t n) = 0;
  // Device ints back to the host (the backend-generic tests read index buffers back with it).
  virtual void CopyIntsToHost(int32_t* host_dst, const int32_t* src, size_t n) = 0;
  // The n floats at `src` as host memory, after every op issued before (as CopyToHost). The
  // default copies; a backend whose memory is host memory returns HostView::ZeroCopy(src, n), so
  // a checkpoint save writes the weights without a staging copy of the whole model.
  virtual HostView ViewOnHost(const float* src, size_t n) {
    std::vector<float> v(n);
    CopyToHost(v.data(), src, n);
    return HostView::Owned(std::move(v));
  }
  virtual void Zero(float* x, size_t n) = 0;
  virtual void Copy(float* dst, const float* src, size_t n) = 0;  // device to device

  // ---- mixed precision ----------------------------------------------------------------------
  // The precision of the matrix products (MatmulForward/Backward and attention's two products):
  //   kFp32  everything fp32 (the default);
  //   kBf16  operands rounded to bf16, products accumulated and written in fp32;
  //   kFp16  operands rounded to fp16, accumulated in fp32, every output the op writes (activation
  //          or activation gradient) rounded to fp16, so values past 65504 become inf as in fp16
  //          storage; each weight-gradient contribution is rounded to fp16 before it is added to
  //          the fp32 gradient. The CPU has no fp16 arithmetic: this emulates its range and
  //          rounding faithfully, at fp32 speed.
  // LayerNorm, softmax, cross-entropy, GELU and the optimizer compute in fp32 in every mode.
  virtual void SetPrecision(Precision p) = 0;
  virtual Precision precision() const = 0;
  virtual uint16_t* AllocHalves(size_t n) = 0;  // zero-initialised 16-bit storage
  // dst = src converted to the current precision's 16-bit format (kBf16 or kFp16 bits): the
  // compute copy of the weights that the products read (pass it as a matmul's weight_lowp).
  virtual void ToLowPrecision(uint16_t* dst, const float* src, size_t n) = 0;
  // kFp16: x = fp16(x) in place (an activation stored in fp16). A no-op in kFp32 and kBf16, whose
  // activations outside the products stay fp32 (the residual stream and LayerNorm statistics).
  virtual void RoundToStorage(float* x, size_t n) = 0;

  // ---- embeddings -------------------------------------------------------------------------
  // out[b,t,:] = wte[tokens[b,t],:] + (wpe ? wpe[pos(b,t),:] : 0)   out (N,C), tokens (N)
  // pos(b,t) = positions[b,t] if positions (N) is given (ids restarted per document), else t.
  // wte has V rows (the padded vocabulary). A token outside [0, V) throws KeelError (Internal)
  // before anything is read or written: the training loop checks its inputs first, so only a
  // caller that skipped that check gets here, and it gets an error, never a wild memory access.
  virtual void EmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                const float* wpe, int B, int T, int C, int V,
                                const int32_t* positions = nullptr) = 0;
  // dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[pos(b,t),:] += dout[b,t,:] (dwpe may be null)
  // dwte has V rows; tokens are checked as in EmbeddingForward.
  virtual void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                 int B, int T, int C, int V,
                                 const int32_t* positions = nullptr) = 0;

  // ---- layer norm ---------------------------------------------------------------------------
  // y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), var biased.   x,y (N,C); mean,rstd (N)
  virtual void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int N, int C,
                                float eps) = 0;
  // dx += rstd * (dy*w - mean(dy*w) - xhat * mean(dy*w*xhat)); dw += sum dy*xhat; db += sum dy
  virtual void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int N, int C) = 0;

  // ---- RMSNorm (Zhang & Sennrich 2019; Llama) ------------------------------------------------
  // y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).   x,y (N,C); rstd (N)
  virtual void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N,
                              int C, float eps) = 0;
  // xhat = x * rstd:  dx += rstd * (dy*w - xhat * mean(dy*w*xhat));  dw += sum_rows dy*xhat
  virtual void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, const float* rstd, int N, int C) = 0;

  // ---- linear layer -----------------------------------------------------------------------
  // out (N,OC) = inp (N,IC) @ weight(OC,IC)^T + bias(OC); bias may be null. Overwrites out.
  // weight_lowp, nullable: `weight` already converted by ToLowPrecision (used in kBf16/kFp16 so
  // the weights are converted once per update, not at every product). inp_lowp, nullable: the
  // same for `inp` (a model keeps a matmul input's 16-bit copy from forward to backward).
  virtual void MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                             int N, int IC, int OC, const uint16_t* weight_lowp = nullptr,
                             const uint16_t* inp_lowp = nullptr) = 0;
  // dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum_rows dout. dinp/dbias may be null.
  // add_to_dweight false: dweight = and dbias = instead (the first micro-batch of a step writes
  // the gradients, so they need no zeroing pass and the product no read of the old values).
  virtual void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int N, int IC, int OC,
                              const uint16_t* weight_lowp = nullptr, bool add_to_dweight = true,
                              const uint16_t* inp_lowp = nullptr) = 0;

  // ---- causal self-attention ------------------------------------------------------------------
  // qkv (B,T,(NH+2G) hs) holds [q (NH heads) | k (G heads) | v (G heads)], hs = C/NH, each head's
  // hs columns contiguous; G = kv_heads (0 means NH: multi-head attention; 1 <= G < NH, dividing
  // NH: grouped-query attention, query head h reads key/value head h / (NH/G)). Q and K are each
  // scaled by hs^-1/4 before the product (numerically stable form), so
  //   s[i,j] = (q_i hs^-1/4) . (k_j hs^-1/4) - slope_h * (i - j)   for j <= i (ALiBi if slopes)
  //   p = softmax_j(s) in fp32;  out_i = sum_j p[i,j] v_j            out (B,T,C)
  // att (B,NH,T,T) keeps p for the backward. alibi_slopes (NH) may be null. max_logit (B*NH),
  // nullable, receives max_{i, j<=i} s[i,j] per (b,h): the attention-logit growth the guard
  // watches (Wortsman et al. 2023), at no extra pass. doc_start (N), nullable, narrows the causal
  // window to j in [doc_start[b,i], i]: packed documents do not attend to each other (p = 0
  // outside, so the backward needs no mask of its own).
  virtual void AttentionForward(float* out, float* att, const float* qkv, const float* alibi_slopes,
                                int B, int T, int C, int NH, float* max_logit = nullptr,
                                const int32_t* doc_start = nullptr, int kv_heads = 0) = 0;
  // dqkv += the gradient of out w.r.t. qkv (a key/value head sums over the query heads it serves).
  virtual void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att,
                                 int B, int T, int C, int NH, int kv_heads = 0) = 0;

  // ---- QK-LayerNorm (Dehghani et al. 2023, Wortsman et al. 2023) ----------------------------
  // On qkv (N,(NH+2G) hs) = [q | k | v] (G = kv_heads, 0 means NH), each query head and each key
  // head (hs values) is normalised separately with weights shared across heads:
  //   q'_h = (q_h - mean) * rstd * wq + bq;  k'_g = (k_g - mean) * rstd * wk + bk;  v' = v
  // out like qkv; mean, rstd (2,N,NH): the q statistics, then the k statistics (the first G of
  // each row's NH slots).
  virtual void QkLayerNormForward(float* out, float* mean, float* rstd, const float* qkv,
                                  const float* q_weight, const float* q_bias, const float* k_weight,
                                  const float* k_bias, int N, int C, int NH, float eps,
                                  int kv_heads = 0) = 0;
  // dqkv += LayerNorm backward of dout's q and k parts (per head), and dout's v part as is;
  // dq_weight, dq_bias, dk_weight, dk_bias (hs each) += their sums over rows and heads.
  virtual void QkLayerNormBackward(float* dqkv, float* dq_weight, float* dq_bias, float* dk_weight,
                                   float* dk_bias, const float* dout, const float* qkv,
                                   const float* q_weight, const float* k_weight, const float* mean,
                                   const float* rstd, int N, int C, int NH, int kv_heads = 0) = 0;

  // ---- rotary position embedding (Su et al. 2021; the "rotate half" layout of GPT-NeoX,
  // Megatron-LM and Hugging Face Llama) ----------------------------------------------------------
  // In place on qkv (B,T,(NH+2G) hs) as AttentionForward reads it: in every query and key head
  // the first `rot` dims (even, <= hs), split in halves x1 = x[0:rot/2], x2 = x[rot/2:rot], turn
  // by the angle p w_i of the token's position p:
  //   x1_i' = x1_i cos(p w_i) - x2_i sin(p w_i);  x2_i' = x2_i cos(p w_i) + x1_i sin(p w_i)
  // w_i = base^(-2i/rot). cos_sin (P, rot) holds, per position p < P, cos(p w_i) for i < rot/2
  // then sin(p w_i). p = positions[b,t] (N) when given (ids restarted per document), else t.
  // The rest of each head, and v, pass through. Computed in fp32 in every precision (the caller
  // rounds to fp16 storage, as after GELU).
  virtual void RopeForward(float* qkv, const float* cos_sin, const int32_t* positions, int B, int T,
                           int NH, int kv_heads, int hs, int rot) = 0;
  // The transpose, in place on a gradient of the same layout (the rotation by -p w_i):
  //   dx1_i = dy1_i cos + dy2_i sin;  dx2_i = dy2_i cos - dy1_i sin
  // The one backward that does not accumulate: it turns the gradient attention's backward wrote.
  virtual void RopeBackward(float* dqkv, const float* cos_sin, const int32_t* positions, int B,
                            int T, int NH, int kv_heads, int hs, int rot) = 0;

  // ---- pointwise ----------------------------------------------------------------------------
  // GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  virtual void GeluForward(float* out, const float* inp, size_t n) = 0;
  virtual void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) = 0;
  // SwiGLU (Shazeer 2020), the gated FFN of Llama and Megatron's --swiglu: inp (N,2F) holds per
  // row [g | u] (the two halves of one fused product), out (N,F) = silu(g) * u, silu(g) = g sig(g).
  // fp32 in every precision, as GELU.
  virtual void SwigluForward(float* out, const float* inp, int N, int F) = 0;
  // dg += dout * u * sig(g) (1 + g (1 - sig(g)));  du += dout * silu(g)      dinp (N,2F)
  virtual void SwigluBackward(float* dinp, const float* inp, const float* dout, int N, int F) = 0;
  // out = a + b (residual connection). out may alias a.
  virtual void Add(float* out, const float* a, const float* b, size_t n) = 0;
  // dst += src
  virtual void Accumulate(float* dst, const float* src, size_t n) = 0;
  // x *= s
  virtual void Scale(float* x, size_t n, float s) = 0;

  // ---- loss -------------------------------------------------------------------------------
  // Softmax cross-entropy over the first V of Vp logits per row (padding columns never get
  // probability). losses[i] = -log p[i, targets[i]]. Then, in place, logits becomes the gradient
  // dlogits[i,:] = (p[i,:] - onehot(targets[i])) * dloss, padding columns set to 0.
  // Also writes, per row, the log-partition log Z = logsumexp(logits[i,:V]) into logz (nullable).
  // z_loss > 0 adds PaLM's auxiliary z_loss * (log Z)^2 to each row's objective (not to
  // losses[i]); its gradient 2 z_loss log Z p[i,:] * dloss joins dlogits.
  // A target outside [0, V) throws KeelError (InvalidArgument) instead of reading out of bounds.
  virtual void CrossEntropyForwardBackward(float* losses, float* logz, float* logits,
                                           const int32_t* targets, int N, int V, int Vp,
                                           float dloss, float z_loss = 0.0f) = 0;
  // Softmax of one row's first V logits (for sampling), returned into probs (V), host or device.
  virtual void Softmax(float* probs, const float* logits, int V, float temperature) = 0;

  // ---- reductions and the optimizer -------------------------------------------------------
  // sum of x^2 in double, in a fixed order independent of the thread count, and, in the same
  // pass over memory, the number of elements exactly equal to 0 (Megatron's "num zeros" for
  // gradients).
  struct SquaresAndZeros {
    double sum_sq = 0;
    size_t zeros = 0;
  };
  virtual SquaresAndZeros SumSquaresAndZeros(const float* x, size_t n) = 0;
  // Number of elements that are NaN or +-Inf.
  virtual size_t CountNonFinite(const float* x, size_t n) = 0;
  // AdamW (Loshchilov & Hutter) with bias correction; step is 1-based; g = grad * grad_scale
  // (gradient clipping and fp16's unscaling ride in the update's pass instead of one of their own):
  //   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  //   p -= lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd * p )
  // With `stats`, the same pass also ADDS sum (p_new - p_old)^2 and sum p_new^2 (in double, fixed
  // order) and raises max_v to max(v): the guard's update ratio and second-moment signals at no
  // extra memory traffic. With `param_lowp` (kBf16/kFp16 only), the pass also writes the new
  // weights' 16-bit compute copy (ToLowPrecision's bits) while they are in cache.
  struct AdamWStats {
    double update_sq = 0, param_sq = 0;
    float max_v = 0;
  };
  virtual void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                           float beta1, float beta2, float eps, float weight_decay, int64_t step,
                           AdamWStats* stats = nullptr, float grad_scale = 1.0f,
                           uint16_t* param_lowp = nullptr) = 0;

  // ---- vocabulary-parallel embedding and cross-entropy (tensor parallelism, model/gpt.h) ------
  // A tensor-parallel rank holds the rows [vocab_start, vocab_start + V_local) of the padded
  // vocabulary: of the word embedding, of the output layer, so of the logits' columns (logits
  // (N, V_local)). V is the real vocabulary: tokens and targets outside [0, V) throw as in the
  // single-rank ops, and columns at or past V (padding) never get probability. The model sums
  // the ranks' results over the tensor group between the steps (comm/communicator.h). The
  // defaults throw: a backend that lacks these says so in Supports.
  // out[b,t,:] = (the rank holds tokens[b,t] ? wte[tokens[b,t] - vocab_start,:] : 0)
  //              + (wpe ? wpe[pos(b,t),:] : 0)          pos as in EmbeddingForward
  virtual void VocabParallelEmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                             const float* wpe, int B, int T, int C, int V,
                                             int vocab_start, int V_local,
                                             const int32_t* positions = nullptr);
  // dwte[tokens[b,t] - vocab_start,:] += dout[b,t,:] for the rank's tokens; dwpe (nullable) as in
  // EmbeddingBackward.
  virtual void VocabParallelEmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                              const int32_t* tokens, int B, int T, int C, int V,
                                              int vocab_start, int V_local,
                                              const int32_t* positions = nullptr);
  // row_max (N) = per row, the maximum of the rank's real columns (-inf if it holds none).
  virtual void VocabParallelMax(float* row_max, const float* logits, int N, int V, int vocab_start,
                                int V_local);
  // Given the maximum over all ranks: sums (2,N) = per row sum_j exp(l_j - max) over the rank's
  // real columns, then the target's logit where the rank holds the target (else 0). The rank's
  // real columns of logits become exp(l_j - max), which the backward scales.
  virtual void VocabParallelSumExp(float* sums, float* logits, const float* row_max,
                                   const int32_t* targets, int N, int V, int vocab_start,
                                   int V_local);
  // Given sums summed over all ranks: log Z = max + log(sum exp), losses (N) = log Z - target
  // logit, logz (N, nullable) = log Z, and logits becomes the gradient of the rank's columns as
  // in CrossEntropyForwardBackward: (p - onehot) * dloss plus z-loss's 2 z_loss log Z p * dloss,
  // padding 0.
  virtual void VocabParallelCrossEntropyBackward(float* losses, float* logz, float* logits,
                                                 const float* row_max, const float* sums,
                                                 const int32_t* targets, int N, int V,
                                                 int vocab_start, int V_local, float dloss,
                                                 float z_loss = 0.0f);
};

// The CPU backend: fp32, OpenMP and OpenBLAS. `threads` <= 0 means all available cores. Code that
// runs on any backend makes it by name (backend/registry.h); tests and benches of the CPU backend
// itself call this.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);

}  // namespace keel
