#include "backend/cpu/cpu_backend.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "backend/cpu/blas.h"
#include "backend/cpu/dnnl_gemm.h"
#include "backend/cpu/low_precision.h"
#include "core/status.h"

namespace keel {
namespace {

// Reductions split their input into chunks of this many elements regardless of the thread count,
// and combine the chunk results in order, so the bits never depend on scheduling.
constexpr size_t kReduceChunk = size_t{1} << 16;
// Column-parallel reductions (parameter gradients summed over rows) give each thread whole blocks
// of this many channels: a cache line of floats per row, summed over rows in row order.
constexpr int kChannelBlock = 64;
// Attention computes its T x T products in row blocks of this size and skips blocks above the
// diagonal (they are masked anyway), halving the work of the causal products.
constexpr int kAttBlock = 64;
// Loops over fewer elements than this run on the calling thread alone.
constexpr size_t kMinParallelWork = size_t{1} << 15;

void* AllocZeroed(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment; 64 bytes suits AVX-512 and cache lines.
  // Buffers of 2 MiB and more (weights, gradients, moments, large activations) are 2 MiB-aligned
  // and asked to be backed by transparent huge pages: the passes over them stream hundreds of MB,
  // which with 4 KiB pages miss the TLB on every page and stop the hardware prefetcher at every
  // page boundary. Where THP is off, madvise fails harmlessly.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  size_t padded = std::max<size_t>(align, (bytes + align - 1) / align * align);
  void* p = std::aligned_alloc(align, padded);
  // Callers that know what the memory was for (TrainingRun, the CLI) turn this into a message.
  if (p == nullptr) throw std::bad_alloc();
  if (align == kHuge) madvise(p, padded, MADV_HUGEPAGE);
  std::memset(p, 0, padded);
  return p;
}

// ---- vector kernels ---------------------------------------------------------------------------
// glibc's expf/tanhf are scalar (7 and 14 ns here), which made softmax rows, the cross-entropy and
// GELU cost as much as the GEMMs. These loops use a polynomial exp the compiler can vectorise and
// are compiled for several x86-64 levels with run-time dispatch (binaries must run on any x86-64).
// Each machine always takes the same clone, so results stay deterministic.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KEEL_VECTOR_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define KEEL_VECTOR_CLONES
#endif

// exp(x) for x <= 88 (Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial in r).
// Max relative error 8e-8 (about 1 ulp); returns 0 below -87 instead of denormals. Branch-free.
inline float VecExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 = hi + lo
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float xc = x > 88.0f ? 88.0f : x;
  xc = xc < -87.0f ? -87.0f : xc;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = xc - n * kLn2Hi - n * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float er = poly * r * r + r + 1.0f;
  // n is an integer in [-126, 127], or NaN when x is: converting NaN to int is undefined (UBSan
  // caught it), so it becomes 0 there and the NaN reaches the result through er.
  const float n_int = n == n ? n : 0.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n_int) + 127) << 23);
  return x < -87.0f ? 0.0f : er * two_n;
}

// tanh(u) = 1 - 2 / (1 + exp(2u)); absolute error ~1e-7, saturates correctly at +-1.
inline float VecTanh(float u) {
  return 1.0f - 2.0f / (1.0f + VecExp(2.0f * u));
}

KEEL_VECTOR_CLONES float MaxOf(const float* x, int n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < n; j++) mx = std::max(mx, x[j]);
  return mx;
}

// x[j] = exp(x[j] - shift); returns sum_j x[j]: fp32 vector sums over blocks of 256 elements
// (a double accumulator would keep the loop from vectorising), block sums added in double.
KEEL_VECTOR_CLONES double ExpShiftSum(float* x, int n, float shift) {
  double sum = 0.0;
  for (int j0 = 0; j0 < n; j0 += 256) {
    const int j1 = std::min(n, j0 + 256);
    float block = 0.0f;
#pragma omp simd reduction(+ : block)
    for (int j = j0; j < j1; j++) {
      x[j] = VecExp(x[j] - shift);
      block += x[j];
    }
    sum += block;
  }
  return sum;
}

KEEL_VECTOR_CLONES float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; j++) s += a[j] * b[j];
  return s;
}

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

// y = 0.5 x (1 + tanh(k (x + c x^3)))
KEEL_VECTOR_CLONES void GeluKernel(float* out, const float* inp, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + VecTanh(kGeluK * (x + kGeluC * x * x * x)));
  }
}

// dx += dy * (0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3 c x^2)),  u = k (x + c x^3)
KEEL_VECTOR_CLONES void GeluBackwardKernel(float* dinp, const float* inp, const float* dout,
                                           size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float th = VecTanh(kGeluK * (x + kGeluC * x * x * x));
    const float local =
        0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
    dinp[i] += local * dout[i];
  }
}

// sum of x^2 in double (the vector lanes' partial sums added in a fixed order per clone).
KEEL_VECTOR_CLONES double SumSquaresKernel(const float* x, size_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (size_t i = 0; i < n; i++) s += double(x[i]) * x[i];
  return s;
}

KEEL_VECTOR_CLONES size_t CountZerosKernel(const float* x, size_t n) {
  size_t count = 0;
#pragma omp simd reduction(+ : count)
  for (size_t i = 0; i < n; i++) count += (x[i] == 0.0f);
  return count;
}

// NaN or +-Inf: all exponent bits set. Tested on the bits so -ffast-math cannot fold it away.
KEEL_VECTOR_CLONES size_t CountNonFiniteKernel(const float* x, size_t n) {
  size_t count = 0;
#pragma omp simd reduction(+ : count)
  for (size_t i = 0; i < n; i++)
    count += ((std::bit_cast<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u);
  return count;
}

KEEL_VECTOR_CLONES void AccumulateKernel(float* dst, const float* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

KEEL_VECTOR_CLONES void ScaleKernel(float* x, size_t n, float s) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

struct AdamWConstants {
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale;
};

// One chunk of AdamW (backend.h): compiled per ISA, so AVX-512 machines run its divisions and
// square roots 16 wide (baseline x86-64 code made the update a quarter of a GPT-2 124M step).
KEEL_VECTOR_CLONES void AdamWKernel(float* param, const float* grad, float* m, float* v, size_t n,
                                    AdamWConstants k) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    const float g = grad[i] * k.grad_scale;
    const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
    const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / k.bc1, vhat = vi / k.bc2;
    param[i] -= k.lr * (mhat / (std::sqrt(vhat) + k.eps) + k.weight_decay * param[i]);
  }
}

// The same update, also returning sum (p_new - p_old)^2, sum p_new^2 (float sums within a chunk:
// a signal needs no more) and max v.
struct AdamWChunkStats {
  float update_sq, param_sq, max_v;
};
KEEL_VECTOR_CLONES AdamWChunkStats AdamWStatsKernel(float* param, const float* grad, float* m,
                                                    float* v, size_t n, AdamWConstants k,
                                                    float max_v) {
  float su = 0.0f, sp = 0.0f, cmax = max_v;
#pragma omp simd reduction(+ : su, sp) reduction(max : cmax)
  for (size_t i = 0; i < n; i++) {
    const float g = grad[i] * k.grad_scale;
    const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
    const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / k.bc1, vhat = vi / k.bc2;
    const float old = param[i];
    const float p = old - k.lr * (mhat / (std::sqrt(vhat) + k.eps) + k.weight_decay * old);
    param[i] = p;
    const float d = p - old;
    su += d * d;
    sp += p * p;
    cmax = std::max(cmax, vi);
  }
  return {su, sp, cmax};
}

// Pointwise ops on long arrays hand each thread whole chunks of this many elements.
constexpr size_t kPointwiseChunk = 4096;

}  // namespace

CpuBackend::CpuBackend(int threads) : threads_(threads > 0 ? threads : omp_get_max_threads()) {
  blas::Init();
  omp_set_num_threads(threads_);
  blas::SetNumThreads(threads_);
}

std::string CpuBackend::Describe() const {
  // The clone the ifunc resolver of the KEEL_VECTOR_CLONES loops picks on this CPU.
  std::string vec = "baseline ISA";
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (__builtin_cpu_supports("x86-64-v4")) {
    vec = "x86-64-v4 (AVX-512)";
  } else if (__builtin_cpu_supports("x86-64-v3")) {
    vec = "x86-64-v3 (AVX2)";
  }
#endif
  std::string out = "cpu " + std::string(PrecisionName(precision_)) + ", " +
                    std::to_string(threads_) + " threads, vector loops " + vec + "; " +
                    blas::Description();
  if (precision_ == Precision::kBf16) {
    out += NativeBf16() ? "; bf16 products: " + dnnl_gemm::Description()
                        : "; bf16 products emulated: fp32 sgemm of bf16-rounded operands (" +
                              dnnl_gemm::Description() + ")";
  } else if (precision_ == Precision::kFp16) {
    out += "; fp16 emulated: fp32 sgemm of fp16-rounded operands, outputs rounded to fp16";
  }
  return out;
}

bool CpuBackend::NativeBf16() const {
  return dnnl_gemm::Available();
}

void CpuBackend::UseThreads() const {
  if (omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
}

int CpuBackend::ThreadsFor(size_t work) const {
  return work >= kMinParallelWork ? threads_ : 1;
}

// ---- memory ---------------------------------------------------------------------------------

float* CpuBackend::AllocFloats(size_t n) {
  return static_cast<float*>(AllocZeroed(n * sizeof(float)));
}
int32_t* CpuBackend::AllocInts(size_t n) {
  return static_cast<int32_t*>(AllocZeroed(n * sizeof(int32_t)));
}
void CpuBackend::Free(void* p) {
  std::free(p);
}
void CpuBackend::CopyToDevice(float* dst, const float* host_src, size_t n) {
  std::memcpy(dst, host_src, n * sizeof(float));
}
void CpuBackend::CopyToHost(float* host_dst, const float* src, size_t n) {
  std::memcpy(host_dst, src, n * sizeof(float));
}
void CpuBackend::CopyIntsToDevice(int32_t* dst, const int32_t* host_src, size_t n) {
  std::memcpy(dst, host_src, n * sizeof(int32_t));
}
void CpuBackend::CopyIntsToHost(int32_t* host_dst, const int32_t* src, size_t n) {
  std::memcpy(host_dst, src, n * sizeof(int32_t));
}
void CpuBackend::Zero(float* x, size_t n) {
  std::memset(x, 0, n * sizeof(float));
}
void CpuBackend::Copy(float* dst, const float* src, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

// ---- mixed precision ------------------------------------------------------------------------

uint16_t* CpuBackend::AllocHalves(size_t n) {
  return static_cast<uint16_t*>(AllocZeroed(n * sizeof(uint16_t)));
}

void CpuBackend::ToLowPrecision(uint16_t* dst, const float* src, size_t n) {
  KEEL_CHECK(precision_ != Precision::kFp32, "ToLowPrecision needs a bf16 or fp16 precision");
  lowp::ToBits(dst, src, n, precision_, threads_);
}

void CpuBackend::RoundToStorage(float* x, size_t n) {
  if (precision_ == Precision::kFp16) lowp::Round(x, n, precision_, threads_);
}

namespace {

template <typename T>
T* Grow(std::vector<T>* v, size_t n) {
  if (v->size() < n) v->resize(n);
  return v->data();
}

}  // namespace

// Every row of C (M,N) = row (N).
void CpuBackend::FillRows(float* C, const float* row, int M, int N) const {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(M) * N))
  for (int m = 0; m < M; m++) std::memcpy(C + size_t(m) * N, row, N * sizeof(float));
}

void CpuBackend::LowPrecisionGemm(bool trans_a, bool trans_b, int M, int N, int K, Operand a,
                                  Operand b, float* C, bool accumulate, const float* bias) {
  KEEL_CHECK(bias == nullptr || !accumulate, "LowPrecisionGemm: a bias with accumulate");
  if (precision_ == Precision::kBf16 && NativeBf16()) {
    auto bits = [&](const Operand& x, std::vector<uint16_t>* buf) -> const uint16_t* {
      if (x.bits != nullptr) return x.bits;
      uint16_t* out = Grow(buf, x.n);
      lowp::ToBits(out, x.f32, x.n, precision_, threads_);
      return out;
    };
    const uint16_t* ab = bits(a, &bits_a_);
    const uint16_t* bb = bits(b, &bits_b_);
    dnnl_gemm::GemmBf16(trans_a, trans_b, M, N, K, ab, bb, C, accumulate, bias);
    return;
  }
  if (bias != nullptr) {
    FillRows(C, bias, M, N);  // the GEMM adds to the bias rows
    accumulate = true;
  }
  // fp32 sgemm of the rounded values: the same products as a 16-bit GEMM with fp32 accumulation
  // (every bf16/fp16 product is exact in fp32), only the summation order may differ.
  auto values = [&](const Operand& x, std::vector<float>* buf) {
    float* v = Grow(buf, x.n);
    if (x.bits != nullptr) {
      lowp::FromBits(v, x.bits, x.n, precision_, threads_);
    } else {
      std::memcpy(v, x.f32, x.n * sizeof(float));
      lowp::Round(v, x.n, precision_, threads_);
    }
    return v;
  };
  const float* av = values(a, &vals_a_);
  const float* bv = values(b, &vals_b_);
  blas::Sgemm(trans_a, trans_b, M, N, K, 1.0f, av, trans_a ? M : K, bv, trans_b ? K : N,
              accumulate ? 1.0f : 0.0f, C, N);
}

// ---- embeddings -----------------------------------------------------------------------------

namespace {

// The safety net under the loop's own check of its inputs: one compare per token, before any row
// of the table is touched.
void CheckTokenRows(const int32_t* tokens, int n, int V, const char* op) {
  int bad = -1;
  for (int i = 0; i < n && bad < 0; i++)
    if (static_cast<uint32_t>(tokens[i]) >= static_cast<uint32_t>(V)) bad = i;
  KEEL_CHECK(bad < 0, std::string(op) + ": token id " + std::to_string(tokens[bad]) + " at row " +
                          std::to_string(bad) + " is outside the embedding table [0, " +
                          std::to_string(V) +
                          ") (the training loop checks every sample against the vocabulary "
                          "first; this caller did not)");
}

}  // namespace

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]          out (B,T,C), wte (V,C), wpe (maxT,C)
void CpuBackend::EmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                  const float* wpe, int B, int T, int C, int V,
                                  const int32_t* positions) {
  CheckTokenRows(tokens, B * T, V, "EmbeddingForward");
  EmbeddingRowsForward(out, tokens, wte, wpe, B, T, C, 0, V, positions);
}

// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[t,:] += dout[b,t,:]
void CpuBackend::EmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                   const int32_t* tokens, int B, int T, int C, int V,
                                   const int32_t* positions) {
  CheckTokenRows(tokens, B * T, V, "EmbeddingBackward");
  EmbeddingRowsBackward(dwte, dwpe, dout, tokens, B, T, C, 0, V, positions);
}

// ---- layer norm -----------------------------------------------------------------------------

// y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps)    x,y (N,C); w,b (C); mean,rstd (N)
void CpuBackend::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * C))
  for (int n = 0; n < N; n++) {
    const float* x = inp + size_t(n) * C;
    float* y = out + size_t(n) * C;
    // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
    // simd reductions: vector partial sums in an order fixed at compile time (deterministic).
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const float s = 1.0f / std::sqrt(var + eps);
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    if (mean != nullptr) mean[n] = m;
    if (rstd != nullptr) rstd[n] = s;
  }
}

// xhat = (x - mean) * rstd
// dx += rstd * (dy*w - mean_c(dy*w) - xhat * mean_c(dy*w*xhat));  dw += sum_n dy*xhat;
// db += sum_n dy.  Rows are independent for dx; dw/db are summed per channel block in row order.
void CpuBackend::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, const float* mean,
                                   const float* rstd, int N, int C) {
  if (dinp != nullptr) {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * C))
    for (int n = 0; n < N; n++) {
      const float* x = inp + size_t(n) * C;
      const float* dy = dout + size_t(n) * C;
      float* dx = dinp + size_t(n) * C;
      const float m = mean[n], s = rstd[n];
      float dnorm_mean = 0.0f, dnorm_xhat_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_xhat_mean)
      for (int c = 0; c < C; c++) {
        const float dnorm = dy[c] * weight[c];
        dnorm_mean += dnorm;
        dnorm_xhat_mean += dnorm * (x[c] - m) * s;
      }
      dnorm_mean /= C;
      dnorm_xhat_mean /= C;
      for (int c = 0; c < C; c++) {
        const float xhat = (x[c] - m) * s;
        dx[c] += s * (dy[c] * weight[c] - dnorm_mean - xhat * dnorm_xhat_mean);
      }
    }
  }
  if (dweight == nullptr && dbias == nullptr) return;
  const int nblocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * C))
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    float dw[kChannelBlock] = {}, db[kChannelBlock] = {};
    for (int n = 0; n < N; n++) {
      const float* x = inp + size_t(n) * C;
      const float* dy = dout + size_t(n) * C;
      const float m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; c++) {
        dw[c - c0] += dy[c] * (x[c] - m) * s;
        db[c - c0] += dy[c];
      }
    }
    for (int c = c0; c < c1; c++) {
      if (dweight != nullptr) dweight[c] += dw[c - c0];
      if (dbias != nullptr) dbias[c] += db[c - c0];
    }
  }
}

// ---- RMSNorm --------------------------------------------------------------------------------

void CpuBackend::RmsNormForward(float* out, float* rstd, const float* inp, const float* weight,
                                int N, int C, float eps) {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * C))
  for (int n = 0; n < N; n++) {
    const float* x = inp + size_t(n) * C;
    float* y = out + size_t(n) * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    const float s = 1.0f / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; c++) y[c] = x[c] * s * weight[c];
    if (rstd != nullptr) rstd[n] = s;
  }
}

// xhat = x * rstd:  dx += rstd * (dy*w - xhat * mean_c(dy*w*xhat));  dw += sum_n dy*xhat.
// Rows are independent for dx; dw is summed per channel block in row order.
void CpuBackend::RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const float* rstd, int N, int C) {
  if (dinp != nullptr) {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * C))
    for (int n = 0; n < N; n++) {
      const float* x = inp + size_t(n) * C;
      const float* dy = dout + size_t(n) * C;
      float* dx = dinp + size_t(n) * C;
      const float s = rstd[n];
      float dnorm_xhat_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_xhat_mean)
      for (int c = 0; c < C; c++) dnorm_xhat_mean += dy[c] * weight[c] * x[c] * s;
      dnorm_xhat_mean /= C;
      for (int c = 0; c < C; c++) dx[c] += s * (dy[c] * weight[c] - x[c] * s * dnorm_xhat_mean);
    }
  }
  if (dweight == nullptr) return;
  const int nblocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * C))
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    float dw[kChannelBlock] = {};
    for (int n = 0; n < N; n++) {
      const float* x = inp + size_t(n) * C;
      const float* dy = dout + size_t(n) * C;
      const float s = rstd[n];
      for (int c = c0; c < c1; c++) dw[c - c0] += dy[c] * x[c] * s;
    }
    for (int c = c0; c < c1; c++) dweight[c] += dw[c - c0];
  }
}

// ---- QK-LayerNorm ---------------------------------------------------------------------------

// For row n, part (0: q with NH heads, 1: k with G heads) and head h: the hs values at
// qkv[n, part*NH*hs + h*hs ...]; rows are (NH + 2G) hs wide.
void CpuBackend::QkLayerNormForward(float* out, float* mean, float* rstd, const float* qkv,
                                    const float* q_weight, const float* q_bias,
                                    const float* k_weight, const float* k_bias, int N, int C,
                                    int NH, float eps, int kv_heads) {
  const int G = kv_heads > 0 ? kv_heads : NH;
  const int hs = C / NH, W = (NH + 2 * G) * hs;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * W))
  for (int n = 0; n < N; n++) {
    const float* x = qkv + size_t(n) * W;
    float* y = out + size_t(n) * W;
    for (int part = 0; part < 2; part++) {
      const float* w = part == 0 ? q_weight : k_weight;
      const float* b = part == 0 ? q_bias : k_bias;
      for (int h = 0; h < (part == 0 ? NH : G); h++) {
        const float* xs = x + (part * NH + h) * hs;
        float* ys = y + (part * NH + h) * hs;
        float m = 0.0f, v = 0.0f;
        for (int c = 0; c < hs; c++) m += xs[c];
        m /= hs;
        for (int c = 0; c < hs; c++) v += (xs[c] - m) * (xs[c] - m);
        const float s = 1.0f / std::sqrt(v / hs + eps);
        for (int c = 0; c < hs; c++) ys[c] = (xs[c] - m) * s * w[c] + b[c];
        const size_t stat = (size_t(part) * N + n) * NH + h;
        mean[stat] = m;
        rstd[stat] = s;
      }
    }
    const int v0 = (NH + G) * hs;  // v passes through
    std::memcpy(y + v0, x + v0, sizeof(float) * (W - v0));
  }
}

void CpuBackend::QkLayerNormBackward(float* dqkv, float* dq_weight, float* dq_bias,
                                     float* dk_weight, float* dk_bias, const float* dout,
                                     const float* qkv, const float* q_weight, const float* k_weight,
                                     const float* mean, const float* rstd, int N, int C, int NH,
                                     int kv_heads) {
  const int G = kv_heads > 0 ? kv_heads : NH;
  const int hs = C / NH, W = (NH + 2 * G) * hs, v0 = (NH + G) * hs;
  // dx = rstd (dy w - mean(dy w) - xhat mean(dy w xhat)), per head segment; v: dx = dy.
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * W))
  for (int n = 0; n < N; n++) {
    const float* x = qkv + size_t(n) * W;
    const float* dy = dout + size_t(n) * W;
    float* dx = dqkv + size_t(n) * W;
    for (int part = 0; part < 2; part++) {
      const float* w = part == 0 ? q_weight : k_weight;
      for (int h = 0; h < (part == 0 ? NH : G); h++) {
        const int off = (part * NH + h) * hs;
        const size_t stat = (size_t(part) * N + n) * NH + h;
        const float m = mean[stat], s = rstd[stat];
        float dmean = 0.0f, dxhat_mean = 0.0f;
        for (int c = 0; c < hs; c++) {
          const float dn = dy[off + c] * w[c];
          dmean += dn;
          dxhat_mean += dn * (x[off + c] - m) * s;
        }
        dmean /= hs;
        dxhat_mean /= hs;
        for (int c = 0; c < hs; c++) {
          const float xhat = (x[off + c] - m) * s;
          dx[off + c] += s * (dy[off + c] * w[c] - dmean - xhat * dxhat_mean);
        }
      }
    }
    for (int c = v0; c < W; c++) dx[c] += dy[c];
  }
  // Weight and bias gradients: one fixed order over (row, head), thread-count independent.
  for (int part = 0; part < 2; part++) {
    float* dw = part == 0 ? dq_weight : dk_weight;
    float* db = part == 0 ? dq_bias : dk_bias;
    const int heads = part == 0 ? NH : G;
    for (int n = 0; n < N; n++) {
      const float* x = qkv + size_t(n) * W + part * NH * hs;
      const float* dy = dout + size_t(n) * W + part * NH * hs;
      for (int h = 0; h < heads; h++) {
        const size_t stat = (size_t(part) * N + n) * NH + h;
        const float m = mean[stat], s = rstd[stat];
        for (int c = 0; c < hs; c++) {
          dw[c] += dy[h * hs + c] * (x[h * hs + c] - m) * s;
          db[c] += dy[h * hs + c];
        }
      }
    }
  }
}

// ---- linear layer ---------------------------------------------------------------------------

// out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias (OC)
void CpuBackend::MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                               int N, int IC, int OC, const uint16_t* weight_lowp,
                               const uint16_t* inp_lowp) {
  UseThreads();
  if (precision_ == Precision::kFp32) {
    // Start from the bias rows and let the GEMM add to them (beta = 1): one pass over out.
    float beta = 0.0f;
    if (bias != nullptr) {
      FillRows(out, bias, N, OC);
      beta = 1.0f;
    }
    blas::Sgemm(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
    return;
  }
  // oneDNN adds the bias in the product's own epilogue (0.5 ms per GPT-2 layer less than copying
  // the bias rows and reading them back, measured).
  const size_t n_inp = size_t(N) * IC, n_w = size_t(OC) * IC;
  LowPrecisionGemm(false, true, N, OC, IC, {inp, inp_lowp, n_inp}, {weight, weight_lowp, n_w}, out,
                   false, bias);
  RoundToStorage(out, size_t(N) * OC);
}

// dinp (N,IC) += dout (N,OC) @ weight (OC,IC);  dweight (OC,IC) += dout^T @ inp (N,IC);
// dbias (OC) += sum_n dout[n,:]
void CpuBackend::MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                const float* inp, const float* weight, int N, int IC, int OC,
                                const uint16_t* weight_lowp, bool add_to_dweight,
                                const uint16_t* inp_lowp) {
  UseThreads();
  if (precision_ == Precision::kFp32) {
    if (dinp != nullptr)
      blas::Sgemm(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 1.0f, dinp, IC);
    if (dweight != nullptr) {
      // OpenBLAS's beta = 0 clears C in a slower pass of its own (GPT-2's output layer: 50 ms
      // against 43 with beta = 1, measured): our parallel zeroing, then accumulate.
      if (!add_to_dweight) Zero(dweight, size_t(OC) * IC);
      blas::Sgemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    }
  } else {
    // dout is rounded once for both products.
    const size_t n_out = size_t(N) * OC, n_inp = size_t(N) * IC, n_w = size_t(OC) * IC;
    uint16_t* dout_bits = Grow(&bits_d_, n_out);
    lowp::ToBits(dout_bits, dout, n_out, precision_, threads_);
    const Operand d{nullptr, dout_bits, n_out};
    if (dinp != nullptr) {
      LowPrecisionGemm(false, false, N, IC, OC, d, {weight, weight_lowp, n_w}, dinp, true);
      RoundToStorage(dinp, n_inp);
    }
    if (dweight != nullptr) {
      // This micro-batch's gradient is a product of its own (fp16: an fp16 tensor, overflow ->
      // inf), added to the fp32 gradient (Megatron's main_grad). In bf16 too: oneDNN's
      // accumulating epilogue measured slower than the product plus a separate add (GPT-2's
      // output layer: 38 ms against 32).
      float* contribution = add_to_dweight ? Grow(&product_, n_w) : dweight;
      LowPrecisionGemm(true, false, OC, IC, N, d, {inp, inp_lowp, n_inp}, contribution, false);
      RoundToStorage(contribution, n_w);
      if (add_to_dweight) Accumulate(dweight, contribution, n_w);
    }
  }
  if (dbias != nullptr) {
    // Summed in double, per channel block in row order: independent of the thread count.
    const int nblocks = (OC + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * OC))
    for (int blk = 0; blk < nblocks; blk++) {
      const int o0 = blk * kChannelBlock, o1 = std::min(OC, o0 + kChannelBlock);
      double acc[kChannelBlock] = {};
      for (int n = 0; n < N; n++) {
        const float* d = dout + size_t(n) * OC;
        for (int o = o0; o < o1; o++) acc[o - o0] += d[o];
      }
      for (int o = o0; o < o1; o++) {
        dbias[o] = (add_to_dweight ? dbias[o] : 0.0f) + static_cast<float>(acc[o - o0]);
      }
    }
  }
}

// ---- causal self-attention ------------------------------------------------------------------
//
// Per (b,h), with q,k,v the (T,hs) head slices of qkv (row stride 3C), a = hs^-1/4:
//   S = (a q)(a k)^T - slope_h (i - j),  P = softmax_rows(S) over j <= i,  out_h = P v
// The products run as single-threaded GEMMs on per-thread scratch, with OpenMP over (b,h).

namespace {

// dst (T,hs) = a * src (T,hs) read with row stride ld.
void ScaleHead(float* dst, const float* src, int T, int hs, int ld, float a) {
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < hs; i++) dst[size_t(t) * hs + i] = a * src[size_t(t) * ld + i];
  }
}

// Rows [i0, i0+rows) of a causal T x T product only reach columns < i0+rows.
int BlockRows(int i0, int T) {
  return std::min(kAttBlock, T - i0);
}

// Per-thread scratch that persists across calls (OpenMP keeps its threads), so the attention loops
// neither allocate nor page-fault fresh memory on every call (T x T floats is 4 MiB at T = 1024).
float* Scratch(int slot, size_t n) {
  thread_local std::vector<float> buffers[5];
  std::vector<float>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

float HeadScale(int hs) {
  return static_cast<float>(std::pow(static_cast<double>(hs), -0.25));
}

}  // namespace

void CpuBackend::AttentionForward(float* out, float* att, const float* qkv,
                                  const float* alibi_slopes, int B, int T, int C, int NH,
                                  float* max_logit, const int32_t* doc_start, int kv_heads) {
  UseThreads();  // with one thread the region is inactive and OpenBLAS would use its own count
  const int G = kv_heads > 0 ? kv_heads : NH;
  const int hs = C / NH, W = (NH + 2 * G) * hs, group = NH / G;
  const float a = HeadScale(hs);
  const bool lowp = precision_ != Precision::kFp32;
#pragma omp parallel num_threads(ThreadsFor(size_t(B) * T * T * C))
  {
    float* qs = Scratch(0, size_t(T) * hs);
    float* ks = Scratch(1, size_t(T) * hs);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH, g = h / group;
      const float* q = qkv + size_t(b) * T * W + h * hs;
      const float* k = qkv + size_t(b) * T * W + (NH + g) * hs;
      const float* v = qkv + size_t(b) * T * W + (NH + G + g) * hs;
      float* p = att + size_t(bh) * T * T;
      float* o = out + size_t(b) * T * C + h * hs;
      ScaleHead(qs, q, T, hs, W, a);
      ScaleHead(ks, k, T, hs, W, a);
      // Low precision: the products read rounded copies of q, k, v (and P, below).
      const float* vv = v;
      int ldv = W;
      if (lowp) {
        float* vs = Scratch(3, size_t(T) * hs);
        ScaleHead(vs, v, T, hs, W, 1.0f);
        for (float* x : {qs, ks, vs}) lowp::RoundSerial(x, size_t(T) * hs, precision_);
        vv = vs;
        ldv = hs;
      }
      // S (T,T) = qs @ ks^T, lower block triangle only
      for (int i0 = 0; i0 < T; i0 += kAttBlock) {
        const int rows = BlockRows(i0, T);
        blas::Sgemm(false, true, rows, i0 + rows, hs, 1.0f, qs + size_t(i0) * hs, hs, ks, hs, 0.0f,
                    p + size_t(i0) * T, T);
      }
      // P = softmax over s0 <= j <= i of S - slope (i - j), max subtracted; masked entries are 0
      // (s0 = the first token of i's document with doc_start, else 0)
      const float slope = alibi_slopes != nullptr ? alibi_slopes[h] : 0.0f;
      float head_max = -INFINITY;
      for (int i = 0; i < T; i++) {
        float* row = p + size_t(i) * T;
        const int s0 = doc_start != nullptr ? doc_start[size_t(b) * T + i] : 0;
        if (precision_ == Precision::kFp16) lowp::RoundSerial(row, i + 1, precision_);  // S in fp16
        if (slope != 0.0f) {
          for (int j = s0; j <= i; j++) row[j] -= slope * static_cast<float>(i - j);
        }
        const float row_max = MaxOf(row + s0, i + 1 - s0);
        head_max = std::max(head_max, row_max);
        const double sum = ExpShiftSum(row + s0, i + 1 - s0, row_max);
        const float inv = static_cast<float>(1.0 / sum);
        for (int j = 0; j < s0; j++) row[j] = 0.0f;
        for (int j = s0; j <= i; j++) row[j] *= inv;
        for (int j = i + 1; j < T; j++) row[j] = 0.0f;
        if (lowp) lowp::RoundSerial(row + s0, i + 1 - s0, precision_);  // P as the product reads it
      }
      if (max_logit != nullptr) max_logit[bh] = head_max;
      // out_h (T,hs) = P @ v, v read in place with row stride W (or its rounded copy)
      for (int i0 = 0; i0 < T; i0 += kAttBlock) {
        const int rows = BlockRows(i0, T);
        blas::Sgemm(false, false, rows, hs, i0 + rows, 1.0f, p + size_t(i0) * T, T, vv, ldv, 0.0f,
                    o + size_t(i0) * C, C);
      }
    }
  }
  RoundToStorage(out, size_t(B) * T * C);
}

// dP = dout_h v^T;  dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik);
// dq += a dS (a k);  dk += a dS^T (a q);  dv += P^T dout_h.   All accumulate into dqkv.
// One task per (sequence, key/value head): the query heads sharing a key and value head add to
// their gradients one after the other, in head order (no races, thread-count independent bits).
void CpuBackend::AttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                   const float* att, int B, int T, int C, int NH, int kv_heads) {
  UseThreads();  // with one thread the region is inactive and OpenBLAS would use its own count
  const int G = kv_heads > 0 ? kv_heads : NH;
  const int hs = C / NH, W = (NH + 2 * G) * hs, group = NH / G;
  const float a = HeadScale(hs);
  const bool lowp = precision_ != Precision::kFp32;
#pragma omp parallel num_threads(ThreadsFor(size_t(B) * T * T * C))
  {
    float* qs = Scratch(0, size_t(T) * hs);
    float* ks = Scratch(1, size_t(T) * hs);
    float* ds = Scratch(2, size_t(T) * T);
#pragma omp for schedule(static)
    for (int bg = 0; bg < B * G; bg++) {
      const int b = bg / G, g = bg % G;
      const float* k = qkv + size_t(b) * T * W + (NH + g) * hs;
      const float* v = qkv + size_t(b) * T * W + (NH + G + g) * hs;
      float* dk = dqkv + size_t(b) * T * W + (NH + g) * hs;
      float* dv = dqkv + size_t(b) * T * W + (NH + G + g) * hs;
      ScaleHead(ks, k, T, hs, W, a);
      // Low precision: the products read rounded copies of q, k, v, dout_h and dS.
      const float* vv = v;
      int ldv = W;
      if (lowp) {
        float* vs = Scratch(3, size_t(T) * hs);
        ScaleHead(vs, v, T, hs, W, 1.0f);
        for (float* x : {ks, vs}) lowp::RoundSerial(x, size_t(T) * hs, precision_);
        vv = vs;
        ldv = hs;
      }
      for (int h = g * group; h < (g + 1) * group; h++) {
        const float* q = qkv + size_t(b) * T * W + h * hs;
        float* dq = dqkv + size_t(b) * T * W + h * hs;
        const float* p = att + (size_t(b) * NH + h) * T * T;
        const float* dy = dout + size_t(b) * T * C + h * hs;
        ScaleHead(qs, q, T, hs, W, a);
        const float* dyy = dy;
        int lddy = C;
        if (lowp) {
          float* dys = Scratch(4, size_t(T) * hs);
          ScaleHead(dys, dy, T, hs, C, 1.0f);
          for (float* x : {qs, dys}) lowp::RoundSerial(x, size_t(T) * hs, precision_);
          dyy = dys;
          lddy = hs;
        }
        // dP (T,T) = dout_h @ v^T, lower block triangle only
        for (int i0 = 0; i0 < T; i0 += kAttBlock) {
          const int rows = BlockRows(i0, T);
          blas::Sgemm(false, true, rows, i0 + rows, hs, 1.0f, dyy + size_t(i0) * lddy, lddy, vv,
                      ldv, 0.0f, ds + size_t(i0) * T, T);
        }
        // dS in place of dP; entries j > i inside a computed block are zeroed for the GEMMs below
        for (int i = 0; i < T; i++) {
          const float* prow = p + size_t(i) * T;
          float* row = ds + size_t(i) * T;
          const float dot = Dot(prow, row, i + 1);
          for (int j = 0; j <= i; j++) row[j] = prow[j] * (row[j] - dot);
          const int block_end = std::min(T, (i / kAttBlock + 1) * kAttBlock);
          for (int j = i + 1; j < block_end; j++) row[j] = 0.0f;
          if (lowp) lowp::RoundSerial(row, i + 1, precision_);
        }
        for (int i0 = 0; i0 < T; i0 += kAttBlock) {
          const int rows = BlockRows(i0, T);
          // dq[i0 block] += a dS[i0 block, :i0+rows] @ ks[:i0+rows]
          blas::Sgemm(false, false, rows, hs, i0 + rows, a, ds + size_t(i0) * T, T, ks, hs, 1.0f,
                      dq + size_t(i0) * W, W);
          // Column block j0 = i0 only gets contributions from rows i >= j0.
          // dk[j0 block] += a dS[j0:, j0 block]^T @ qs[j0:]
          blas::Sgemm(true, false, rows, hs, T - i0, a, ds + size_t(i0) * T + i0, T,
                      qs + size_t(i0) * hs, hs, 1.0f, dk + size_t(i0) * W, W);
          // dv[j0 block] += P[j0:, j0 block]^T @ dout_h[j0:]
          blas::Sgemm(true, false, rows, hs, T - i0, 1.0f, p + size_t(i0) * T + i0, T,
                      dyy + size_t(i0) * lddy, lddy, 1.0f, dv + size_t(i0) * W, W);
        }
      }
    }
  }
  RoundToStorage(dqkv, size_t(B) * T * W);
}

// ---- rotary position embedding ----------------------------------------------------------------
//
// Per token (position p) and per query or key head x (hs values, the first `rot` turned):
//   [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]   (cos, sin of p w_i: row p of cos_sin)
// The backward turns by the opposite angle (sin -> -sin): the rotation's transpose.
namespace {

void RopeRotate(float* qkv, const float* cos_sin, const int32_t* positions, int B, int T, int NH,
                int G, int hs, int rot, float sign, int threads) {
  const int W = (NH + 2 * G) * hs, half = rot / 2, heads = NH + G;
  const int N = B * T;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; n++) {
    const int p = positions != nullptr ? positions[n] : n % T;
    const float* c = cos_sin + size_t(p) * rot;
    const float* sn = c + half;
    float* row = qkv + size_t(n) * W;
    for (int h = 0; h < heads; h++) {  // the query heads, then the key heads: contiguous
      float* x1 = row + size_t(h) * hs;
      float* x2 = x1 + half;
      for (int i = 0; i < half; i++) {
        const float a = x1[i], b = x2[i], s = sign * sn[i];
        x1[i] = a * c[i] - b * s;
        x2[i] = b * c[i] + a * s;
      }
    }
  }
}

}  // namespace

void CpuBackend::RopeForward(float* qkv, const float* cos_sin, const int32_t* positions, int B,
                             int T, int NH, int kv_heads, int hs, int rot) {
  const int G = kv_heads > 0 ? kv_heads : NH;
  RopeRotate(qkv, cos_sin, positions, B, T, NH, G, hs, rot, 1.0f,
             ThreadsFor(size_t(B) * T * (NH + G) * rot));
}

void CpuBackend::RopeBackward(float* dqkv, const float* cos_sin, const int32_t* positions, int B,
                              int T, int NH, int kv_heads, int hs, int rot) {
  const int G = kv_heads > 0 ? kv_heads : NH;
  RopeRotate(dqkv, cos_sin, positions, B, T, NH, G, hs, rot, -1.0f,
             ThreadsFor(size_t(B) * T * (NH + G) * rot));
}

// ---- pointwise ------------------------------------------------------------------------------

// GELU (tanh approximation) over chunks; the math is in GeluKernel / GeluBackwardKernel above.
void CpuBackend::GeluForward(float* out, const float* inp, size_t n) {
  const size_t nchunks = (n + kPointwiseChunk - 1) / kPointwiseChunk;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(n))
  for (size_t ch = 0; ch < nchunks; ch++) {
    const size_t i0 = ch * kPointwiseChunk, len = std::min(kPointwiseChunk, n - i0);
    GeluKernel(out + i0, inp + i0, len);
  }
}

void CpuBackend::GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  const size_t nchunks = (n + kPointwiseChunk - 1) / kPointwiseChunk;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(n))
  for (size_t ch = 0; ch < nchunks; ch++) {
    const size_t i0 = ch * kPointwiseChunk, len = std::min(kPointwiseChunk, n - i0);
    GeluBackwardKernel(dinp + i0, inp + i0, dout + i0, len);
  }
}

// SwiGLU: per row [g | u] -> silu(g) u, with sig(g) = 1 / (1 + exp(-g)) in fp32.
void CpuBackend::SwigluForward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * F))
  for (int n = 0; n < N; n++) {
    const float* g = inp + size_t(n) * 2 * F;
    const float* u = g + F;
    float* y = out + size_t(n) * F;
    for (int i = 0; i < F; i++) {
      const float sig = 1.0f / (1.0f + std::exp(-g[i]));
      y[i] = g[i] * sig * u[i];
    }
  }
}

// d silu(g)/dg = sig(g) (1 + g (1 - sig(g)))
void CpuBackend::SwigluBackward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * F))
  for (int n = 0; n < N; n++) {
    const float* g = inp + size_t(n) * 2 * F;
    const float* u = g + F;
    const float* dy = dout + size_t(n) * F;
    float* dg = dinp + size_t(n) * 2 * F;
    float* du = dg + F;
    for (int i = 0; i < F; i++) {
      const float sig = 1.0f / (1.0f + std::exp(-g[i]));
      const float silu = g[i] * sig;
      dg[i] += dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
      du[i] += dy[i] * silu;
    }
  }
}

void CpuBackend::Add(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for simd schedule(static) num_threads(ThreadsFor(n))
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void CpuBackend::Accumulate(float* dst, const float* src, size_t n) {
  const size_t nchunks = (n + kPointwiseChunk - 1) / kPointwiseChunk;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(n))
  for (size_t ch = 0; ch < nchunks; ch++) {
    const size_t i0 = ch * kPointwiseChunk;
    AccumulateKernel(dst + i0, src + i0, std::min(kPointwiseChunk, n - i0));
  }
}

void CpuBackend::Scale(float* x, size_t n, float s) {
  const size_t nchunks = (n + kPointwiseChunk - 1) / kPointwiseChunk;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(n))
  for (size_t ch = 0; ch < nchunks; ch++) {
    const size_t i0 = ch * kPointwiseChunk;
    ScaleKernel(x + i0, std::min(kPointwiseChunk, n - i0), s);
  }
}

// ---- loss -----------------------------------------------------------------------------------

// Per row i (logits (N,Vp), only the first V are real):
//   log Z = max + log sum_j exp(l_j - max) (block sums in double);  loss_i = log Z - l[target]
//   dl_j = (exp(l_j - log Z) - [j == target]) * dloss for j < V;  dl_j = 0 for padding j >= V
void CpuBackend::CrossEntropyForwardBackward(float* losses, float* logz, float* logits,
                                             const int32_t* targets, int N, int V, int Vp,
                                             float dloss, float z_loss) {
  for (int i = 0; i < N; i++) {
    if (targets[i] < 0 || targets[i] >= V) {
      throw KeelError(Status::InvalidArgument(
          "cross-entropy target " + std::to_string(targets[i]) + " at row " + std::to_string(i) +
          " is outside the vocabulary [0, " + std::to_string(V) +
          ") (the training loop checks every sample against the vocabulary before the model "
          "sees it, naming the dataset and document; this caller did not)"));
    }
  }
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * V))
  for (int i = 0; i < N; i++) {
    float* row = logits + size_t(i) * Vp;
    const int t = targets[i];
    const float mx = MaxOf(row, V);
    // Keep exp(l_j - max) in the row so the gradient pass needs no second exp.
    const float target_logit = row[t];
    const double sum = ExpShiftSum(row, V, mx);
    const double lz = mx + std::log(sum);
    losses[i] = static_cast<float>(lz - target_logit);
    if (logz != nullptr) logz[i] = static_cast<float>(lz);
    // d/dl_j [CE + z (log Z)^2] = p_j (1 + 2 z log Z) - onehot_j
    const float scale = static_cast<float>(dloss * (1.0 + 2.0 * z_loss * lz) / sum);
    for (int j = 0; j < V; j++) row[j] *= scale;
    row[t] -= dloss;
    for (int j = V; j < Vp; j++) row[j] = 0.0f;
  }
}

// ---- vocabulary-parallel embedding and cross-entropy ----------------------------------------

void CpuBackend::VocabParallelEmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                               const float* wpe, int B, int T, int C, int V,
                                               int vocab_start, int V_local,
                                               const int32_t* positions) {
  CheckTokenRows(tokens, B * T, V, "VocabParallelEmbeddingForward");
  EmbeddingRowsForward(out, tokens, wte, wpe, B, T, C, vocab_start, V_local, positions);
}

// The rows of wte for tokens in [vocab_start, vocab_start + V_local) (the whole table: 0, V), zeros
// for the others, plus the position rows; tokens already checked.
void CpuBackend::EmbeddingRowsForward(float* out, const int32_t* tokens, const float* wte,
                                      const float* wpe, int B, int T, int C, int vocab_start,
                                      int V_local, const int32_t* positions) {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(B) * T * C))
  for (int bt = 0; bt < B * T; bt++) {
    float* o = out + size_t(bt) * C;
    const int row = tokens[bt] - vocab_start;
    const bool mine = row >= 0 && row < V_local;
    const float* e = wte + size_t(mine ? row : 0) * C;
    if (wpe != nullptr) {
      const float* pos = wpe + size_t(positions ? positions[bt] : bt % T) * C;
      // 0 + pos is pos exactly: the sum over ranks is the single-rank sum's bits.
      for (int c = 0; c < C; c++) o[c] = (mine ? e[c] : 0.0f) + pos[c];
    } else if (mine) {
      std::memcpy(o, e, C * sizeof(float));
    } else {
      std::memset(o, 0, C * sizeof(float));
    }
  }
}

void CpuBackend::VocabParallelEmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                                const int32_t* tokens, int B, int T, int C, int V,
                                                int vocab_start, int V_local,
                                                const int32_t* positions) {
  CheckTokenRows(tokens, B * T, V, "VocabParallelEmbeddingBackward");
  EmbeddingRowsBackward(dwte, dwpe, dout, tokens, B, T, C, vocab_start, V_local, positions);
}

// Threads split channels (repeated tokens hit the same row): each element of dwte is summed by one
// thread in token order. No atomics, same bits every run. Tokens already checked.
void CpuBackend::EmbeddingRowsBackward(float* dwte, float* dwpe, const float* dout,
                                       const int32_t* tokens, int B, int T, int C, int vocab_start,
                                       int V_local, const int32_t* positions) {
  const int nblocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(B) * T * C))
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int bt = 0; bt < B * T; bt++) {
      const float* d = dout + size_t(bt) * C;
      const int row = tokens[bt] - vocab_start;
      if (row >= 0 && row < V_local) {
        float* dw = dwte + size_t(row) * C;
        for (int c = c0; c < c1; c++) dw[c] += d[c];
      }
      if (dwpe != nullptr) {
        float* dp = dwpe + size_t(positions ? positions[bt] : bt % T) * C;
        for (int c = c0; c < c1; c++) dp[c] += d[c];
      }
    }
  }
}

namespace {
// How many of a rank's V_local columns are real (global index < V).
int RealColumns(int V, int vocab_start, int V_local) {
  return std::clamp(V - vocab_start, 0, V_local);
}
void CheckTargets(const int32_t* targets, int N, int V) {
  for (int i = 0; i < N; i++) {
    if (targets[i] < 0 || targets[i] >= V) {
      throw KeelError(Status::InvalidArgument(
          "cross-entropy target " + std::to_string(targets[i]) + " at row " + std::to_string(i) +
          " is outside the vocabulary [0, " + std::to_string(V) +
          ") (the training loop checks every sample against the vocabulary before the model "
          "sees it, naming the dataset and document; this caller did not)"));
    }
  }
}
}  // namespace

void CpuBackend::VocabParallelMax(float* row_max, const float* logits, int N, int V,
                                  int vocab_start, int V_local) {
  const int real = RealColumns(V, vocab_start, V_local);
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * V_local))
  for (int i = 0; i < N; i++) row_max[i] = MaxOf(logits + size_t(i) * V_local, real);
}

void CpuBackend::VocabParallelSumExp(float* sums, float* logits, const float* row_max,
                                     const int32_t* targets, int N, int V, int vocab_start,
                                     int V_local) {
  CheckTargets(targets, N, V);
  const int real = RealColumns(V, vocab_start, V_local);
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * V_local))
  for (int i = 0; i < N; i++) {
    float* row = logits + size_t(i) * V_local;
    const int t = targets[i] - vocab_start;
    sums[N + i] = t >= 0 && t < real ? row[t] : 0.0f;
    sums[i] = static_cast<float>(ExpShiftSum(row, real, row_max[i]));
  }
}

void CpuBackend::VocabParallelCrossEntropyBackward(float* losses, float* logz, float* logits,
                                                   const float* row_max, const float* sums,
                                                   const int32_t* targets, int N, int V,
                                                   int vocab_start, int V_local, float dloss,
                                                   float z_loss) {
  const int real = RealColumns(V, vocab_start, V_local);
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(size_t(N) * V_local))
  for (int i = 0; i < N; i++) {
    float* row = logits + size_t(i) * V_local;  // exp(l_j - max), from VocabParallelSumExp
    const double sum = sums[i];
    const double lz = row_max[i] + std::log(sum);
    losses[i] = static_cast<float>(lz - sums[N + i]);
    if (logz != nullptr) logz[i] = static_cast<float>(lz);
    const float scale = static_cast<float>(dloss * (1.0 + 2.0 * z_loss * lz) / sum);
    for (int j = 0; j < real; j++) row[j] *= scale;
    const int t = targets[i] - vocab_start;
    if (t >= 0 && t < real) row[t] -= dloss;
    for (int j = real; j < V_local; j++) row[j] = 0.0f;
  }
}

// probs = softmax(logits[:V] / temperature), in double for one row.
void CpuBackend::Softmax(float* probs, const float* logits, int V, float temperature) {
  const double inv_t = 1.0 / temperature;
  double mx = -INFINITY;
  for (int j = 0; j < V; j++) mx = std::max(mx, logits[j] * inv_t);
  double sum = 0.0;
  for (int j = 0; j < V; j++) sum += std::exp(logits[j] * inv_t - mx);
  for (int j = 0; j < V; j++) probs[j] = static_cast<float>(std::exp(logits[j] * inv_t - mx) / sum);
}

// ---- reductions and the optimizer -----------------------------------------------------------

// Sum of x^2: fixed chunks summed in double, chunk sums added in order (thread-count
// independent); each chunk also counted for zeros while it is in cache (integer counts are exact,
// so any summation order is deterministic).
Backend::SquaresAndZeros CpuBackend::SumSquaresAndZeros(const float* x, size_t n) {
  const size_t nchunks = (n + kReduceChunk - 1) / kReduceChunk;
  std::vector<double> partial(nchunks);
  size_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count) num_threads(ThreadsFor(n))
  for (size_t ch = 0; ch < nchunks; ch++) {
    const size_t i0 = ch * kReduceChunk, len = std::min(kReduceChunk, n - i0);
    partial[ch] = SumSquaresKernel(x + i0, len);
    count += CountZerosKernel(x + i0, len);
  }
  SquaresAndZeros r;
  for (double s : partial) r.sum_sq += s;
  r.zeros = count;
  return r;
}

size_t CpuBackend::CountNonFinite(const float* x, size_t n) {
  const size_t nchunks = (n + kReduceChunk - 1) / kReduceChunk;
  size_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count) num_threads(ThreadsFor(n))
  for (size_t ch = 0; ch < nchunks; ch++) {
    const size_t i0 = ch * kReduceChunk;
    count += CountNonFiniteKernel(x + i0, std::min(kReduceChunk, n - i0));
  }
  return count;
}

// m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// p -= lr (mhat / (sqrt(vhat) + eps) + wd p),  mhat = m / (1-b1^t), vhat = v / (1-b2^t)
void CpuBackend::AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             int64_t step, AdamWStats* stats, float grad_scale,
                             uint16_t* param_lowp) {
  KEEL_CHECK(param_lowp == nullptr || precision_ != Precision::kFp32,
             "AdamWUpdate: a 16-bit weight copy needs a bf16 or fp16 precision");
  const AdamWConstants k{lr,
                         beta1,
                         beta2,
                         eps,
                         weight_decay,
                         static_cast<float>(1.0 - std::pow(double(beta1), double(step))),
                         static_cast<float>(1.0 - std::pow(double(beta2), double(step))),
                         grad_scale};
  const size_t nchunks = (n + kReduceChunk - 1) / kReduceChunk;
  if (stats == nullptr) {
#pragma omp parallel for schedule(static) num_threads(ThreadsFor(n))
    for (size_t ch = 0; ch < nchunks; ch++) {
      const size_t i0 = ch * kReduceChunk, len = std::min(kReduceChunk, n - i0);
      AdamWKernel(param + i0, grad + i0, m + i0, v + i0, len, k);
      if (param_lowp != nullptr) lowp::ToBitsSerial(param_lowp + i0, param + i0, len, precision_);
    }
    return;
  }
  // Per-chunk sums combined in chunk order (deterministic for any thread count), and a max.
  std::vector<double> upd(nchunks), par(nchunks);
  float vmax = stats->max_v;
#pragma omp parallel for schedule(static) reduction(max : vmax) num_threads(ThreadsFor(n))
  for (size_t ch = 0; ch < nchunks; ch++) {
    const size_t i0 = ch * kReduceChunk, len = std::min(kReduceChunk, n - i0);
    const AdamWChunkStats cs =
        AdamWStatsKernel(param + i0, grad + i0, m + i0, v + i0, len, k, vmax);
    if (param_lowp != nullptr) lowp::ToBitsSerial(param_lowp + i0, param + i0, len, precision_);
    vmax = std::max(vmax, cs.max_v);
    upd[ch] = cs.update_sq;
    par[ch] = cs.param_sq;
  }
  for (size_t ch = 0; ch < nchunks; ch++) {
    stats->update_sq += upd[ch];
    stats->param_sq += par[ch];
  }
  stats->max_v = vmax;
}

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace keel
