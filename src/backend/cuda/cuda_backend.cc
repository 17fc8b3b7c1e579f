// The CUDA backend: memory, the stream, cuBLASLt products and the op contracts of backend.h; the
// kernels are in cuda_kernels.cu. Every CUDA and cuBLASLt call is checked: a failure throws
// KeelError naming the call and the driver's message.
#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "backend/cuda/cuda_kernels.h"

namespace keel {
namespace {

[[noreturn]] void Fail(const char* what, const std::string& why, const char* file, int line) {
  throw KeelError(
      Status::Internal(fmt::format("{}:{}: CUDA: {} failed: {}", file, line, what, why)));
}

#define KEEL_CUDA_CHECK(expr)                                                       \
  do {                                                                              \
    const cudaError_t e_ = (expr);                                                  \
    if (e_ != cudaSuccess) Fail(#expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)
#define KEEL_CUBLAS_CHECK(expr)                                                    \
  do {                                                                             \
    const cublasStatus_t s_ = (expr);                                              \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                               \
      Fail(#expr, "cuBLAS status " + std::to_string(int(s_)), __FILE__, __LINE__); \
  } while (0)

// A device buffer of scratch that grows on demand (attention's scores gradient, column partials).
class DeviceScratch {
 public:
  ~DeviceScratch() {
    if (p_ != nullptr) cudaFree(p_);
  }
  void* Get(size_t bytes) {
    if (bytes > size_) {
      // cudaFree waits for the work that may still read the old buffer.
      if (p_ != nullptr) KEEL_CUDA_CHECK(cudaFree(p_));
      p_ = nullptr;
      size_ = 0;
      if (cudaMalloc(&p_, bytes) != cudaSuccess) {
        p_ = nullptr;
        throw std::bad_alloc();
      }
      size_ = bytes;
    }
    return p_;
  }
  template <typename T>
  T* As(size_t n) {
    return static_cast<T*>(Get(std::max<size_t>(n, 1) * sizeof(T)));
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

// cuBLASLt's workspace: 32 MiB, as Hopper's kernels ask (HOPPER.md).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

class CudaBackend : public Backend {
 public:
  CudaBackend() {
    KEEL_CUDA_CHECK(cudaGetDevice(&device_));
    KEEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KEEL_CUBLAS_CHECK(cublasLtCreate(&lt_));
    KEEL_CUBLAS_CHECK(cublasCreate(&blas_));
    KEEL_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    workspace_ = workspace_scratch_.Get(kWorkspaceBytes);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cublasDestroy(blas_);
    cublasLtDestroy(lt_);
    cudaStreamDestroy(stream_);
  }

  std::string Name() const override { return "cuda"; }
  std::string Describe() const override {
    cudaDeviceProp prop{};
    std::string dev = "device ?";
    if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) {
      dev = fmt::format("{} (sm_{}{}, {:.0f} GiB)", prop.name, prop.major, prop.minor,
                        double(prop.totalGlobalMem) / double(1 << 30));
    }
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    return fmt::format(
        "cuda {}, {}, CUDA runtime {}.{}, cuBLASLt {} (cuBLAS where it has no kernel; fp32 "
        "products without TF32); "
        "attention, norms and loss: plain kernels (docs/cuda.md)",
        PrecisionName(precision_), dev, rt / 1000, (rt % 1000) / 10, cublasLtGetVersion());
  }
  // fp32 and bf16; fp16's rounding of every stored activation is not written for CUDA yet, nor
  // the vocabulary-parallel ops of tensor parallelism (the Backend defaults throw).
  bool Supports(Op op, Precision p) const override {
    if (op >= Op::kVocabParallelEmbeddingForward) return false;
    return p != Precision::kFp16;
  }
  void Synchronize() override { KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // ---- memory ---------------------------------------------------------------------------------
  float* AllocFloats(size_t n) override { return static_cast<float*>(Alloc(n * sizeof(float))); }
  int32_t* AllocInts(size_t n) override {
    return static_cast<int32_t*>(Alloc(n * sizeof(int32_t)));
  }
  uint16_t* AllocHalves(size_t n) override {
    return static_cast<uint16_t*>(Alloc(n * sizeof(uint16_t)));
  }
  void Free(void* p) override {
    if (p != nullptr) KEEL_CUDA_CHECK(cudaFree(p));  // waits for the work that uses it
  }
  void CopyToDevice(float* dst, const float* src, size_t n) override { In(dst, src, n * 4); }
  void CopyToHost(float* dst, const float* src, size_t n) override { Out(dst, src, n * 4); }
  void CopyIntsToDevice(int32_t* dst, const int32_t* src, size_t n) override {
    In(dst, src, n * 4);
  }
  void CopyIntsToHost(int32_t* dst, const int32_t* src, size_t n) override { Out(dst, src, n * 4); }
  void Zero(float* x, size_t n) override {
    if (n > 0) KEEL_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream_));
  }
  void Copy(float* dst, const float* src, size_t n) override {
    if (n > 0 && dst != src)
      KEEL_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }

  // ---- mixed precision ------------------------------------------------------------------------
  void SetPrecision(Precision p) override {
    KEEL_CHECK(p != Precision::kFp16,
               "the CUDA backend has no fp16 yet (Supports says so; use --bf16 or fp32)");
    precision_ = p;
  }
  Precision precision() const override { return precision_; }
  void ToLowPrecision(uint16_t* dst, const float* src, size_t n) override {
    KEEL_CHECK(precision_ == Precision::kBf16, "ToLowPrecision needs the bf16 precision");
    KEEL_CUDA_CHECK(cuda::ToBf16(dst, src, n, stream_));
  }
  void RoundToStorage(float*, size_t) override {}  // fp32 and bf16 keep activations in fp32

  // ---- embeddings -------------------------------------------------------------------------------
  void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                        int B, int T, int C, int V, const int32_t* positions) override {
    CheckIds(tokens, B * T, V, "EmbeddingForward", /*target=*/false);
    KEEL_CUDA_CHECK(cuda::EmbeddingForward(out, tokens, wte, wpe, positions, B, T, C, stream_));
  }
  void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                         int T, int C, int V, const int32_t* positions) override {
    CheckIds(tokens, B * T, V, "EmbeddingBackward", /*target=*/false);
    KEEL_CUDA_CHECK(cuda::EmbeddingBackward(dwte, dwpe, dout, tokens, positions, B, T, C, stream_));
  }

  // ---- norms ------------------------------------------------------------------------------------
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, float eps) override {
    KEEL_CUDA_CHECK(cuda::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps, stream_));
  }
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int N, int C) override {
    double* partial = partial_.As<double>(2 * size_t(cuda::ColumnChunks(N)) * C);
    KEEL_CUDA_CHECK(cuda::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                            C, partial, stream_));
  }
  void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                      float eps) override {
    KEEL_CUDA_CHECK(cuda::RmsNormForward(out, rstd, inp, weight, N, C, eps, stream_));
  }
  void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int N, int C) override {
    double* partial = partial_.As<double>(size_t(cuda::ColumnChunks(N)) * C);
    KEEL_CUDA_CHECK(
        cuda::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C, partial, stream_));
  }
  void QkLayerNormForward(float* out, float* mean, float* rstd, const float* qkv,
                          const float* q_weight, const float* q_bias, const float* k_weight,
                          const float* k_bias, int N, int C, int NH, float eps,
                          int kv_heads) override {
    const int G = kv_heads > 0 ? kv_heads : NH;
    KEEL_CUDA_CHECK(cuda::QkLayerNormForward(out, mean, rstd, qkv, q_weight, q_bias, k_weight,
                                             k_bias, N, NH, G, C / NH, eps, stream_));
  }
  void QkLayerNormBackward(float* dqkv, float* dq_weight, float* dq_bias, float* dk_weight,
                           float* dk_bias, const float* dout, const float* qkv,
                           const float* q_weight, const float* k_weight, const float* mean,
                           const float* rstd, int N, int C, int NH, int kv_heads) override {
    const int G = kv_heads > 0 ? kv_heads : NH, hs = C / NH;
    double* partial = partial_.As<double>(2 * size_t(cuda::ColumnChunks(N * NH)) * hs);
    KEEL_CUDA_CHECK(cuda::QkLayerNormBackward(dqkv, dq_weight, dq_bias, dk_weight, dk_bias, dout,
                                              qkv, q_weight, k_weight, mean, rstd, N, NH, G, hs,
                                              partial, stream_));
  }

  // ---- linear layer -----------------------------------------------------------------------------
  void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                     int IC, int OC, const uint16_t* weight_lowp,
                     const uint16_t* inp_lowp) override {
    float beta = 0.0f;
    if (bias != nullptr) {  // the product adds to the bias rows
      KEEL_CUDA_CHECK(cuda::FillRows(out, bias, N, OC, stream_));
      beta = 1.0f;
    }
    const Operand a = Lowp(inp, inp_lowp, size_t(N) * IC, &bits_a_);
    const Operand w = Lowp(weight, weight_lowp, size_t(OC) * IC, &bits_b_);
    Gemm(false, true, N, OC, IC, a, IC, w, IC, out, OC, beta);
  }
  void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                      const float* inp, const float* weight, int N, int IC, int OC,
                      const uint16_t* weight_lowp, bool add_to_dweight,
                      const uint16_t* inp_lowp) override {
    const Operand d = Lowp(dout, nullptr, size_t(N) * OC, &bits_d_);
    if (dinp != nullptr) {
      const Operand w = Lowp(weight, weight_lowp, size_t(OC) * IC, &bits_b_);
      Gemm(false, false, N, IC, OC, d, OC, w, IC, dinp, IC, 1.0f);
    }
    if (dweight != nullptr) {
      const Operand a = Lowp(inp, inp_lowp, size_t(N) * IC, &bits_a_);
      Gemm(true, false, OC, IC, N, d, OC, a, IC, dweight, IC, add_to_dweight ? 1.0f : 0.0f);
    }
    if (dbias != nullptr) {
      double* partial = partial_.As<double>(size_t(cuda::ColumnChunks(N)) * OC);
      KEEL_CUDA_CHECK(cuda::BiasGrad(dbias, dout, N, OC, add_to_dweight, partial, stream_));
    }
  }

  // ---- attention -------------------------------------------------------------------------------
  void AttentionForward(float* out, float* att, const float* qkv, const float* alibi_slopes, int B,
                        int T, int C, int NH, float* max_logit, const int32_t* doc_start,
                        int kv_heads) override {
    const int G = kv_heads > 0 ? kv_heads : NH;
    float* row_max = row_max_.As<float>(size_t(B) * NH * T);
    KEEL_CUDA_CHECK(cuda::AttentionForward(out, att, qkv, alibi_slopes, B, T, NH, G, C / NH,
                                           max_logit, doc_start, Lowp(), row_max, stream_));
  }
  void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                         int T, int C, int NH, int kv_heads) override {
    const int G = kv_heads > 0 ? kv_heads : NH;
    float* ds = ds_.As<float>(size_t(B) * NH * T * T);
    KEEL_CUDA_CHECK(
        cuda::AttentionBackward(dqkv, dout, qkv, att, B, T, NH, G, C / NH, Lowp(), ds, stream_));
  }
  void RopeForward(float* qkv, const float* cos_sin, const int32_t* positions, int B, int T, int NH,
                   int kv_heads, int hs, int rot) override {
    const int G = kv_heads > 0 ? kv_heads : NH;
    KEEL_CUDA_CHECK(cuda::Rope(qkv, cos_sin, positions, B, T, NH, G, hs, rot, 1.0f, stream_));
  }
  void RopeBackward(float* dqkv, const float* cos_sin, const int32_t* positions, int B, int T,
                    int NH, int kv_heads, int hs, int rot) override {
    const int G = kv_heads > 0 ? kv_heads : NH;
    KEEL_CUDA_CHECK(cuda::Rope(dqkv, cos_sin, positions, B, T, NH, G, hs, rot, -1.0f, stream_));
  }

  // ---- pointwise -------------------------------------------------------------------------------
  void GeluForward(float* out, const float* inp, size_t n) override {
    KEEL_CUDA_CHECK(cuda::GeluForward(out, inp, n, stream_));
  }
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) override {
    KEEL_CUDA_CHECK(cuda::GeluBackward(dinp, inp, dout, n, stream_));
  }
  void SwigluForward(float* out, const float* inp, int N, int F) override {
    KEEL_CUDA_CHECK(cuda::SwigluForward(out, inp, N, F, stream_));
  }
  void SwigluBackward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    KEEL_CUDA_CHECK(cuda::SwigluBackward(dinp, inp, dout, N, F, stream_));
  }
  void Add(float* out, const float* a, const float* b, size_t n) override {
    KEEL_CUDA_CHECK(cuda::Add(out, a, b, n, stream_));
  }
  void Accumulate(float* dst, const float* src, size_t n) override {
    KEEL_CUDA_CHECK(cuda::Accumulate(dst, src, n, stream_));
  }
  void Scale(float* x, size_t n, float s) override {
    KEEL_CUDA_CHECK(cuda::Scale(x, n, s, stream_));
  }

  // ---- loss ------------------------------------------------------------------------------------
  void CrossEntropyForwardBackward(float* losses, float* logz, float* logits,
                                   const int32_t* targets, int N, int V, int Vp, float dloss,
                                   float z_loss) override {
    CheckIds(targets, N, V, "cross-entropy", /*target=*/true);
    KEEL_CUDA_CHECK(
        cuda::CrossEntropy(losses, logz, logits, targets, N, V, Vp, dloss, z_loss, stream_));
  }
  void Softmax(float* probs, const float* logits, int V, float temperature) override {
    KEEL_CUDA_CHECK(cuda::Softmax(probs, logits, V, temperature, stream_));
  }

  // ---- reductions and the optimizer --------------------------------------------------------
  SquaresAndZeros SumSquaresAndZeros(const float* x, size_t n) override {
    const size_t nb = cuda::ReduceBlocks(n);
    // One scratch: [partial sums | partial counts | result sum | result count].
    auto* sq = partial_.As<double>(2 * nb + 2);
    auto* zeros = reinterpret_cast<unsigned long long*>(sq + nb);
    double* result = sq + 2 * nb;
    auto* count = reinterpret_cast<unsigned long long*>(sq + 2 * nb + 1);
    KEEL_CUDA_CHECK(cuda::SumSquaresAndZeros(x, n, sq, zeros, result, count, stream_));
    double host[2];
    Out(host, result, sizeof(host));
    SquaresAndZeros r;
    r.sum_sq = host[0];
    unsigned long long z;
    static_assert(sizeof(z) == sizeof(double));
    std::memcpy(&z, &host[1], sizeof(z));
    r.zeros = static_cast<size_t>(z);
    return r;
  }
  size_t CountNonFinite(const float* x, size_t n) override {
    const size_t nb = cuda::ReduceBlocks(n);
    auto* partial = partial_.As<unsigned long long>(nb + 1);
    KEEL_CUDA_CHECK(cuda::CountNonFinite(x, n, partial, partial + nb, stream_));
    unsigned long long count = 0;
    Out(&count, partial + nb, sizeof(count));
    return static_cast<size_t>(count);
  }
  void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int64_t step,
                   AdamWStats* stats, float grad_scale, uint16_t* param_lowp) override {
    KEEL_CHECK(param_lowp == nullptr || precision_ != Precision::kFp32,
               "AdamWUpdate: a 16-bit weight copy needs a bf16 or fp16 precision");
    const cuda::AdamWArgs a{lr,
                            beta1,
                            beta2,
                            eps,
                            weight_decay,
                            static_cast<float>(1.0 - std::pow(double(beta1), double(step))),
                            static_cast<float>(1.0 - std::pow(double(beta2), double(step))),
                            grad_scale};
    const size_t nb = cuda::ReduceBlocks(n);
    double* partial = stats != nullptr ? partial_.As<double>(3 * nb + 3) : nullptr;
    double* result = stats != nullptr ? partial + 3 * nb : nullptr;
    KEEL_CUDA_CHECK(cuda::AdamW(param, grad, m, v, n, a, stats != nullptr, partial, result,
                                param_lowp, stream_));
    if (stats == nullptr) return;
    double host[3];
    Out(host, result, sizeof(host));
    stats->update_sq += host[0];
    stats->param_sq += host[1];
    stats->max_v = std::max(stats->max_v, static_cast<float>(host[2]));
  }

 private:
  // A product operand: fp32 values, or bf16 bits (kBf16).
  struct Operand {
    const void* p;
    cudaDataType_t type;
  };

  bool Lowp() const { return precision_ == Precision::kBf16; }

  // The operand as the products read it: fp32 as is, or its bf16 bits (given, or converted into
  // `buf` here).
  Operand Lowp(const float* x, const uint16_t* bits, size_t n, DeviceScratch* buf) {
    if (precision_ == Precision::kFp32) return {x, CUDA_R_32F};
    if (bits == nullptr) {
      uint16_t* b = buf->As<uint16_t>(n);
      KEEL_CUDA_CHECK(cuda::ToBf16(b, x, n, stream_));
      bits = b;
    }
    return {bits, CUDA_R_16BF};
  }

  // Row-major C (M,N) = op(A) (M,K) op(B) (K,N) + beta C, as blas::Sgemm: cuBLASLt is
  // column-major, so it computes C^T = op(B)^T op(A)^T. fp32 accumulation (CUBLAS_COMPUTE_32F:
  // never TF32, which only the _FAST_TF32 compute types allow).
  void Gemm(bool ta, bool tb, int M, int N, int K, Operand A, int lda, Operand B, int ldb, float* C,
            int ldc, float beta) {
    if (M == 0 || N == 0) return;
    if (K == 0) {  // an empty sum: C = beta C
      if (beta == 0.0f) KEEL_CUDA_CHECK(cudaMemsetAsync(C, 0, sizeof(float) * M * ldc, stream_));
      return;
    }
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    KEEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // Column-major view: first operand is B (N x K after op), second is A.
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    KEEL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    KEEL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    // Stored column-major shapes: B^T is (N x K) or, transposed, (K x N); likewise A.
    KEEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, B.type, tb ? K : N, tb ? N : K, ldb));
    KEEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, A.type, ta ? M : K, ta ? K : M, lda));
    KEEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, ldc));
    KEEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspaceBytes;
    KEEL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    KEEL_CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(lt_, op, la, lb, lc, lc, pref, 1, &heur, &found));
    const float alpha = 1.0f;
    if (found > 0) {
      KEEL_CUBLAS_CHECK(cublasLtMatmul(lt_, op, &alpha, B.p, la, A.p, lb, &beta, C, lc, C, lc,
                                       &heur.algo, workspace_, ws, stream_));
    } else {
      // cuBLASLt offers no kernel for some shapes and alignments (bf16 rows of an odd length):
      // cuBLAS's GemmEx takes any. The same shape always takes the same path (deterministic).
      KEEL_CUBLAS_CHECK(cublasGemmEx(blas_, opa, opb, N, M, K, &alpha, B.p, B.type, ldb, A.p,
                                     A.type, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(op);
  }

  void* Alloc(size_t bytes) {
    void* p = nullptr;
    // Callers that know what the memory was for (TrainingRun, the CLI) turn this into a message.
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
      throw std::bad_alloc();
    }
    KEEL_CUDA_CHECK(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 1), stream_));
    return p;
  }
  // Host memory may be reused as soon as these return: both wait for the copy.
  void In(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    KEEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void Out(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    KEEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // The safety net under the loop's own check of its inputs: an id outside [0, V) is an error
  // before any kernel reads the table (one small kernel and a 4-byte copy back).
  void CheckIds(const int32_t* ids, int n, int V, const char* op, bool target) {
    if (n == 0) return;
    int* first = first_bad_.As<int>(1);
    KEEL_CUDA_CHECK(cudaMemcpyAsync(first, &n, sizeof(int), cudaMemcpyHostToDevice, stream_));
    KEEL_CUDA_CHECK(cuda::FirstOutOfRange(first, ids, n, V, stream_));
    int bad = n;
    Out(&bad, first, sizeof(int));
    if (bad >= n) return;
    int32_t id = 0;
    Out(&id, ids + bad, sizeof(id));
    if (target) {
      throw KeelError(Status::InvalidArgument(fmt::format(
          "cross-entropy target {} at row {} is outside the vocabulary [0, {}) (the training "
          "loop checks every sample against the vocabulary before the model sees it, naming the "
          "dataset and document; this caller did not)",
          id, bad, V)));
    }
    KEEL_CHECK(false, fmt::format("{}: token id {} at row {} is outside the embedding table [0, "
                                  "{}) (the training loop checks every sample against the "
                                  "vocabulary first; this caller did not)",
                                  op, id, bad, V));
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  Precision precision_ = Precision::kFp32;
  DeviceScratch workspace_scratch_, bits_a_, bits_b_, bits_d_, partial_, row_max_, ds_, first_bad_;
  void* workspace_ = nullptr;
};

}  // namespace

Status CudaDeviceAvailable() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::InvalidArgument(fmt::format(
        "--backend cuda: no usable CUDA device ({}); run on a machine with an NVIDIA GPU and its "
        "driver, or use --backend cpu",
        cudaGetErrorString(e)));
  }
  if (count == 0) {
    return Status::InvalidArgument(
        "--backend cuda: no CUDA device found; run on a machine with an NVIDIA GPU, or use "
        "--backend cpu");
  }
  return Status::OK();
}

std::unique_ptr<Backend> MakeCudaBackend() {
  const Status st = CudaDeviceAvailable();
  if (!st.ok()) throw KeelError(st);
  return std::make_unique<CudaBackend>();
}

}  // namespace keel
