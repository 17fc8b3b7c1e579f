// The CUDA backend's own kernels: straightforward and correct first (one block per row, loops in
// a fixed order), mirroring the CPU backend's arithmetic. Speed comes later, measured on the GPU
// (docs/cuda.md). No float atomics anywhere: every reduction has one fixed order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_kernels.h"

namespace keel::cuda {
namespace {

constexpr int kThreads = 256;  // block size of the row kernels (a power of two: tree sums)

__device__ __forceinline__ float RoundBf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float R(float x, bool lowp) {
  return lowp ? RoundBf16(x) : x;
}

// Tree reduction over the block (blockDim.x a power of two, <= kThreads): a fixed order.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T* smem, Op op) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) smem[threadIdx.x] = op(smem[threadIdx.x], smem[threadIdx.x + s]);
    __syncthreads();
  }
  const T r = smem[0];
  __syncthreads();  // smem may be reused right after
  return r;
}
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

unsigned Blocks(size_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// ---- column sums: K values per (row, column) summed over rows --------------------------------
// Stage 1: block (x: columns, y: chunk of kColumnChunkRows rows) sums its rows in order.
// Stage 2: the chunks in order, in double. F::operator()(r, c, acc) adds its K values to acc.
template <int K, typename F>
__global__ void ColumnPartialKernel(F f, double* partial, int R, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y, nchunks = gridDim.y;
  if (c >= C) return;
  double acc[K];
  for (int k = 0; k < K; k++) acc[k] = 0.0;
  const int r1 = min(R, (chunk + 1) * kColumnChunkRows);
  for (int r = chunk * kColumnChunkRows; r < r1; r++) f(r, c, acc);
  for (int k = 0; k < K; k++) partial[(size_t(k) * nchunks + chunk) * C + c] = acc[k];
}

template <int K>
struct Outs {
  float* p[K];
};

template <int K>
__global__ void ColumnFinishKernel(const double* partial, Outs<K> outs, int nchunks, int C,
                                   bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int k = 0; k < K; k++) {
    if (outs.p[k] == nullptr) continue;
    double s = 0.0;
    for (int ch = 0; ch < nchunks; ch++) s += partial[(size_t(k) * nchunks + ch) * C + c];
    outs.p[k][c] = (accumulate ? outs.p[k][c] : 0.0f) + static_cast<float>(s);
  }
}

template <int K, typename F>
cudaError_t ColumnSums(F f, Outs<K> outs, int R, int C, bool accumulate, double* partial,
                       cudaStream_t s) {
  const int nchunks = ColumnChunks(R);
  if (R == 0 || C == 0) return cudaGetLastError();
  dim3 grid(Blocks(C, 128), nchunks);
  ColumnPartialKernel<K><<<grid, 128, 0, s>>>(f, partial, R, C);
  ColumnFinishKernel<K><<<Blocks(C, 128), 128, 0, s>>>(partial, outs, nchunks, C, accumulate);
  return cudaGetLastError();
}

// ---- small pointwise kernels ------------------------------------------------------------------

__global__ void ToBf16Kernel(uint16_t* dst, const float* src, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const __nv_bfloat16 b = __float2bfloat16_rn(src[i]);
    dst[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

__global__ void FillRowsKernel(float* c, const float* row, int M, int N) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size_t(M) * N) c[i] = row[i % N];
}

struct BiasTerm {
  const float* dout;
  int OC;
  __device__ void operator()(int r, int c, double* acc) const {
    acc[0] += dout[size_t(r) * OC + c];
  }
};

__global__ void FirstOutOfRangeKernel(int* first_bad, const int32_t* ids, int n, int V) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  // An integer minimum: the same answer in any order.
  if (i < n && (ids[i] < 0 || ids[i] >= V)) atomicMin(first_bad, i);
}

__global__ void EmbeddingForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                       const float* wpe, const int32_t* positions, int N, int T,
                                       int C) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(N) * C) return;
  const int bt = int(i / C), c = int(i % C);
  float v = wte[size_t(tokens[bt]) * C + c];
  if (wpe != nullptr) v += wpe[size_t(positions ? positions[bt] : bt % T) * C + c];
  out[i] = v;
}

// One thread per channel adds every token's row in token order: repeated tokens hit the same
// row, and this order needs no atomics (the CPU backend's order too).
__global__ void EmbeddingBackwardKernel(float* dwte, float* dwpe, const float* dout,
                                        const int32_t* tokens, const int32_t* positions, int N,
                                        int T, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int bt = 0; bt < N; bt++) {
    const float d = dout[size_t(bt) * C + c];
    dwte[size_t(tokens[bt]) * C + c] += d;
    if (dwpe != nullptr) dwpe[size_t(positions ? positions[bt] : bt % T) * C + c] += d;
  }
}

// ---- LayerNorm / RMSNorm ------------------------------------------------------------------------

__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const float* w, const float* b, int C, float eps) {
  __shared__ float red[kThreads];
  const int n = blockIdx.x;
  const float* x = inp + size_t(n) * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  const float m = BlockReduce(s, red, SumOp()) / C;
  float v = 0.0f;  // two passes: no cancellation of E[x^2] - E[x]^2
  for (int c = threadIdx.x; c < C; c += blockDim.x) v += (x[c] - m) * (x[c] - m);
  const float var = BlockReduce(v, red, SumOp()) / C;
  const float r = 1.0f / sqrtf(var + eps);
  float* y = out + size_t(n) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = (x[c] - m) * r * w[c] + b[c];
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[n] = m;
    if (rstd != nullptr) rstd[n] = r;
  }
}

__global__ void LayerNormBackwardKernel(float* dinp, const float* dout, const float* inp,
                                        const float* w, const float* mean, const float* rstd,
                                        int C) {
  __shared__ float red[kThreads];
  const int n = blockIdx.x;
  const float* x = inp + size_t(n) * C;
  const float* dy = dout + size_t(n) * C;
  const float m = mean[n], r = rstd[n];
  float a = 0.0f, b = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float dn = dy[c] * w[c];
    a += dn;
    b += dn * (x[c] - m) * r;
  }
  const float dmean = BlockReduce(a, red, SumOp()) / C;
  const float dxhat_mean = BlockReduce(b, red, SumOp()) / C;
  float* dx = dinp + size_t(n) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (x[c] - m) * r;
    dx[c] += r * (dy[c] * w[c] - dmean - xhat * dxhat_mean);
  }
}

struct LayerNormParamTerm {
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ void operator()(int n, int c, double* acc) const {
    const size_t i = size_t(n) * C + c;
    acc[0] += dout[i] * (inp[i] - mean[n]) * rstd[n];
    acc[1] += dout[i];
  }
};

__global__ void RmsNormForwardKernel(float* out, float* rstd, const float* inp, const float* w,
                                     int C, float eps) {
  __shared__ float red[kThreads];
  const int n = blockIdx.x;
  const float* x = inp + size_t(n) * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c] * x[c];
  const float r = 1.0f / sqrtf(BlockReduce(s, red, SumOp()) / C + eps);
  float* y = out + size_t(n) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c] * r * w[c];
  if (threadIdx.x == 0 && rstd != nullptr) rstd[n] = r;
}

__global__ void RmsNormBackwardKernel(float* dinp, const float* dout, const float* inp,
                                      const float* w, const float* rstd, int C) {
  __shared__ float red[kThreads];
  const int n = blockIdx.x;
  const float* x = inp + size_t(n) * C;
  const float* dy = dout + size_t(n) * C;
  const float r = rstd[n];
  float a = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) a += dy[c] * w[c] * x[c] * r;
  const float dxhat_mean = BlockReduce(a, red, SumOp()) / C;
  float* dx = dinp + size_t(n) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dx[c] += r * (dy[c] * w[c] - x[c] * r * dxhat_mean);
}

struct RmsNormParamTerm {
  const float *dout, *inp, *rstd;
  int C;
  __device__ void operator()(int n, int c, double* acc) const {
    const size_t i = size_t(n) * C + c;
    acc[0] += dout[i] * inp[i] * rstd[n];
  }
};

// ---- QK-LayerNorm: one thread per (row, head segment); segments are q heads then k heads -------

__global__ void QkLayerNormForwardKernel(float* out, float* mean, float* rstd, const float* qkv,
                                         const float* qw, const float* qb, const float* kw,
                                         const float* kb, int N, int NH, int G, int hs, float eps) {
  const int W = (NH + 2 * G) * hs, segs = NH + G;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(N) * segs) return;
  const int n = int(idx / segs), seg = int(idx % segs);
  const int part = seg < NH ? 0 : 1, h = part == 0 ? seg : seg - NH;
  const float* w = part == 0 ? qw : kw;
  const float* b = part == 0 ? qb : kb;
  const float* x = qkv + size_t(n) * W + size_t(seg) * hs;
  float* y = out + size_t(n) * W + size_t(seg) * hs;
  float m = 0.0f, v = 0.0f;
  for (int c = 0; c < hs; c++) m += x[c];
  m /= hs;
  for (int c = 0; c < hs; c++) v += (x[c] - m) * (x[c] - m);
  const float r = 1.0f / sqrtf(v / hs + eps);
  for (int c = 0; c < hs; c++) y[c] = (x[c] - m) * r * w[c] + b[c];
  const size_t stat = (size_t(part) * N + n) * NH + h;
  mean[stat] = m;
  rstd[stat] = r;
}

__global__ void QkLayerNormBackwardKernel(float* dqkv, const float* dout, const float* qkv,
                                          const float* qw, const float* kw, const float* mean,
                                          const float* rstd, int N, int NH, int G, int hs) {
  const int W = (NH + 2 * G) * hs, segs = NH + G;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(N) * segs) return;
  const int n = int(idx / segs), seg = int(idx % segs);
  const int part = seg < NH ? 0 : 1, h = part == 0 ? seg : seg - NH;
  const float* w = part == 0 ? qw : kw;
  const size_t off = size_t(n) * W + size_t(seg) * hs;
  const float *x = qkv + off, *dy = dout + off;
  float* dx = dqkv + off;
  const size_t stat = (size_t(part) * N + n) * NH + h;
  const float m = mean[stat], r = rstd[stat];
  float dmean = 0.0f, dxhat_mean = 0.0f;
  for (int c = 0; c < hs; c++) {
    const float dn = dy[c] * w[c];
    dmean += dn;
    dxhat_mean += dn * (x[c] - m) * r;
  }
  dmean /= hs;
  dxhat_mean /= hs;
  for (int c = 0; c < hs; c++) {
    const float xhat = (x[c] - m) * r;
    dx[c] += r * (dy[c] * w[c] - dmean - xhat * dxhat_mean);
  }
}

// v's part of the gradient passes through: dx += dy over the columns [v0, W).
__global__ void AccumulateColumnsKernel(float* dst, const float* src, int N, int W, int v0) {
  const int cols = W - v0;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(N) * cols) return;
  const size_t j = (i / cols) * W + v0 + i % cols;
  dst[j] += src[j];
}

// Rows r = n * heads + h (the CPU's order: rows outer, heads inner), columns c < hs.
struct QkParamTerm {
  const float *dout, *qkv, *mean, *rstd;
  int N, NH, heads, W, hs, part;
  __device__ void operator()(int r, int c, double* acc) const {
    const int n = r / heads, h = r % heads;
    const size_t i = size_t(n) * W + size_t(part) * NH * hs + size_t(h) * hs + c;
    const size_t stat = (size_t(part) * N + n) * NH + h;
    acc[0] += dout[i] * (qkv[i] - mean[stat]) * rstd[stat];
    acc[1] += dout[i];
  }
};

// ---- attention ------------------------------------------------------------------------------
// Row kernels: one block per (b, h, i). The scores of row i go to att's row, softmax in place,
// then out_i = P_i v with the block's threads over the head's dims.

__global__ void AttentionForwardKernel(float* out, float* att, const float* qkv,
                                       const float* slopes, int T, int NH, int G, int hs,
                                       const int32_t* doc_start, bool lowp, float* row_max,
                                       float a) {
  extern __shared__ float smem[];  // q row (hs), then the reduction buffer (blockDim floats)
  float* qs = smem;
  float* red = smem + hs;
  __shared__ double dred[kThreads];
  const int i = blockIdx.x % T, h = (blockIdx.x / T) % NH, b = blockIdx.x / (T * NH);
  const int g = h / (NH / G), W = (NH + 2 * G) * hs, C = NH * hs;
  const float* base = qkv + size_t(b) * T * W;
  for (int d = threadIdx.x; d < hs; d += blockDim.x)
    qs[d] = R(a * base[size_t(i) * W + size_t(h) * hs + d], lowp);
  __syncthreads();
  const int s0 = doc_start != nullptr ? doc_start[size_t(b) * T + i] : 0;
  const float slope = slopes != nullptr ? slopes[h] : 0.0f;
  float* row = att + ((size_t(b) * NH + h) * T + i) * T;
  float lmax = -INFINITY;
  for (int j = s0 + threadIdx.x; j <= i; j += blockDim.x) {
    const float* k = base + size_t(j) * W + size_t(NH + g) * hs;
    float dot = 0.0f;
    for (int d = 0; d < hs; d++) dot += qs[d] * R(a * k[d], lowp);
    const float sc = slope != 0.0f ? dot - slope * static_cast<float>(i - j) : dot;
    row[j] = sc;
    lmax = fmaxf(lmax, sc);
  }
  const float mx = BlockReduce(lmax, red, MaxOp());
  double lsum = 0.0;
  for (int j = s0 + threadIdx.x; j <= i; j += blockDim.x) {
    const float e = expf(row[j] - mx);
    row[j] = e;
    lsum += e;
  }
  const double sum = BlockReduce(lsum, dred, SumOp());
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    row[j] = (j < s0 || j > i) ? 0.0f : R(row[j] * inv, lowp);
  if (threadIdx.x == 0) row_max[blockIdx.x] = mx;
  __syncthreads();  // the row's probabilities, written by every thread, are read below
  float* o = out + (size_t(b) * T + i) * C + size_t(h) * hs;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    const float* v = base + size_t(NH + G + g) * hs + d;
    float acc = 0.0f;
    for (int j = 0; j <= i; j++) acc += row[j] * R(v[size_t(j) * W], lowp);
    o[d] = acc;
  }
}

// max over the rows of one (b, h): a max is exact in any order.
__global__ void RowMaxKernel(float* max_logit, const float* row_max, int BH, int T) {
  const int bh = blockIdx.x * blockDim.x + threadIdx.x;
  if (bh >= BH) return;
  float m = -INFINITY;
  for (int i = 0; i < T; i++) m = fmaxf(m, row_max[size_t(bh) * T + i]);
  max_logit[bh] = m;
}

// dP_ij = dout_i . v_j;  dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)   (j <= i), into ds's row.
__global__ void AttentionDsKernel(float* ds, const float* dout, const float* qkv, const float* att,
                                  int T, int NH, int G, int hs, bool lowp) {
  extern __shared__ float smem[];  // dout row (hs), then the reduction buffer
  float* dys = smem;
  float* red = smem + hs;
  const int i = blockIdx.x % T, h = (blockIdx.x / T) % NH, b = blockIdx.x / (T * NH);
  const int g = h / (NH / G), W = (NH + 2 * G) * hs, C = NH * hs;
  const float* base = qkv + size_t(b) * T * W;
  for (int d = threadIdx.x; d < hs; d += blockDim.x)
    dys[d] = R(dout[(size_t(b) * T + i) * C + size_t(h) * hs + d], lowp);
  __syncthreads();
  const float* p = att + ((size_t(b) * NH + h) * T + i) * T;
  float* row = ds + ((size_t(b) * NH + h) * T + i) * T;
  float ldot = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* v = base + size_t(j) * W + size_t(NH + G + g) * hs;
    float dp = 0.0f;
    for (int d = 0; d < hs; d++) dp += dys[d] * R(v[d], lowp);
    row[j] = dp;
    ldot += p[j] * dp;
  }
  const float dot = BlockReduce(ldot, red, SumOp());
  for (int j = threadIdx.x; j <= i; j += blockDim.x) row[j] = R(p[j] * (row[j] - dot), lowp);
}

// dq_i += a sum_{j<=i} dS_ij (a k_j)
__global__ void AttentionDqKernel(float* dqkv, const float* qkv, const float* ds, int T, int NH,
                                  int G, int hs, bool lowp, float a) {
  const int i = blockIdx.x % T, h = (blockIdx.x / T) % NH, b = blockIdx.x / (T * NH);
  const int g = h / (NH / G), W = (NH + 2 * G) * hs;
  const float* base = qkv + size_t(b) * T * W;
  const float* row = ds + ((size_t(b) * NH + h) * T + i) * T;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    const float* k = base + size_t(NH + g) * hs + d;
    float acc = 0.0f;
    for (int j = 0; j <= i; j++) acc += row[j] * R(a * k[size_t(j) * W], lowp);
    dqkv[(size_t(b) * T + i) * W + size_t(h) * hs + d] += a * acc;
  }
}

// Per key/value head g and key j, over the query heads it serves in head order:
// dk_j += a sum_{i>=j} dS_ij (a q_i);  dv_j += sum_{i>=j} P_ij dout_i.
__global__ void AttentionDkvKernel(float* dqkv, const float* dout, const float* qkv,
                                   const float* att, const float* ds, int T, int NH, int G, int hs,
                                   bool lowp, float a) {
  const int j = blockIdx.x % T, g = (blockIdx.x / T) % G, b = blockIdx.x / (T * G);
  const int group = NH / G, W = (NH + 2 * G) * hs, C = NH * hs;
  const float* base = qkv + size_t(b) * T * W;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    float* dk = dqkv + (size_t(b) * T + j) * W + size_t(NH + g) * hs + d;
    float* dv = dqkv + (size_t(b) * T + j) * W + size_t(NH + G + g) * hs + d;
    for (int h = g * group; h < (g + 1) * group; h++) {
      const float* drow = ds + (size_t(b) * NH + h) * T * T;
      const float* prow = att + (size_t(b) * NH + h) * T * T;
      float acck = 0.0f, accv = 0.0f;
      for (int i = j; i < T; i++) {
        acck += drow[size_t(i) * T + j] * R(a * base[size_t(i) * W + size_t(h) * hs + d], lowp);
        accv +=
            prow[size_t(i) * T + j] * R(dout[(size_t(b) * T + i) * C + size_t(h) * hs + d], lowp);
      }
      *dk += a * acck;
      *dv += accv;
    }
  }
}

// ---- RoPE -------------------------------------------------------------------------------------

__global__ void RopeKernel(float* qkv, const float* cos_sin, const int32_t* positions, int N, int T,
                           int NH, int G, int hs, int rot, float sign) {
  const int half = rot / 2, heads = NH + G, W = (NH + 2 * G) * hs;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(N) * heads * half) return;
  const int i = int(idx % half), h = int((idx / half) % heads),
            n = int(idx / (size_t(half) * heads));
  const int p = positions != nullptr ? positions[n] : n % T;
  const float c = cos_sin[size_t(p) * rot + i], sn = sign * cos_sin[size_t(p) * rot + half + i];
  float* x1 = qkv + size_t(n) * W + size_t(h) * hs;
  const float x = x1[i], y = x1[half + i];
  x1[i] = x * c - y * sn;
  x1[half + i] = y * c + x * sn;
}

// ---- pointwise --------------------------------------------------------------------------------

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

__global__ void GeluForwardKernel(float* out, const float* inp, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(kGeluK * (x + kGeluC * x * x * x)));
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i];
  const float th = tanhf(kGeluK * (x + kGeluC * x * x * x));
  const float local =
      0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
  dinp[i] += local * dout[i];
}

__global__ void SwigluForwardKernel(float* out, const float* inp, int N, int F) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(N) * F) return;
  const size_t n = idx / F, i = idx % F;
  const float g = inp[n * 2 * F + i], u = inp[n * 2 * F + F + i];
  const float sig = 1.0f / (1.0f + expf(-g));
  out[idx] = g * sig * u;
}

__global__ void SwigluBackwardKernel(float* dinp, const float* inp, const float* dout, int N,
                                     int F) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(N) * F) return;
  const size_t n = idx / F, i = idx % F;
  const float g = inp[n * 2 * F + i], u = inp[n * 2 * F + F + i], dy = dout[idx];
  const float sig = 1.0f / (1.0f + expf(-g));
  dinp[n * 2 * F + i] += dy * u * sig * (1.0f + g * (1.0f - sig));
  dinp[n * 2 * F + F + i] += dy * g * sig;
}

__global__ void AddKernel(float* out, const float* a, const float* b, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
__global__ void AccumulateKernel(float* dst, const float* src, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}
__global__ void ScaleKernel(float* x, size_t n, float v) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= v;
}

// ---- loss -------------------------------------------------------------------------------------

// One block per row: log Z = max + log sum exp (sum in double), loss, then the gradient in place.
__global__ void CrossEntropyKernel(float* losses, float* logz, float* logits,
                                   const int32_t* targets, int V, int Vp, float dloss,
                                   float z_loss) {
  __shared__ float red[kThreads];
  __shared__ double dred[kThreads];
  const int i = blockIdx.x, t = targets[i];
  float* row = logits + size_t(i) * Vp;
  const float target_logit = row[t];  // read by every thread before any write below
  float lmax = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) lmax = fmaxf(lmax, row[j]);
  const float mx = BlockReduce(lmax, red, MaxOp());
  double lsum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float e = expf(row[j] - mx);
    row[j] = e;
    lsum += e;
  }
  const double sum = BlockReduce(lsum, dred, SumOp());
  const double lz = mx + log(sum);
  if (threadIdx.x == 0) {
    losses[i] = static_cast<float>(lz - target_logit);
    if (logz != nullptr) logz[i] = static_cast<float>(lz);
  }
  const float scale = static_cast<float>(dloss * (1.0 + 2.0 * z_loss * lz) / sum);
  for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] *= scale;
  for (int j = V + threadIdx.x; j < Vp; j += blockDim.x) row[j] = 0.0f;
  __syncthreads();
  if (threadIdx.x == 0) row[t] -= dloss;
}

__global__ void SoftmaxKernel(float* probs, const float* logits, int V, float temperature) {
  __shared__ double dred[kThreads];
  const double inv_t = 1.0 / temperature;
  double lmax = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) lmax = fmax(lmax, logits[j] * inv_t);
  dred[threadIdx.x] = lmax;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) dred[threadIdx.x] = fmax(dred[threadIdx.x], dred[threadIdx.x + s]);
    __syncthreads();
  }
  const double mx = dred[0];
  __syncthreads();
  double lsum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) lsum += exp(logits[j] * inv_t - mx);
  const double sum = BlockReduce(lsum, dred, SumOp());
  for (int j = threadIdx.x; j < V; j += blockDim.x)
    probs[j] = static_cast<float>(exp(logits[j] * inv_t - mx) / sum);
}

// ---- whole-array reductions: block k sums elements [k kReduceChunk, (k+1) kReduceChunk) --------

__global__ void SquaresZerosKernel(const float* x, size_t n, double* psq, unsigned long long* pz) {
  __shared__ double dred[kThreads];
  __shared__ unsigned long long zred[kThreads];
  const size_t i0 = size_t(blockIdx.x) * kReduceChunk;
  const size_t i1 = min(n, i0 + kReduceChunk);
  double s = 0.0;
  unsigned long long z = 0;
  for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    s += double(x[i]) * x[i];
    z += x[i] == 0.0f;
  }
  s = BlockReduce(s, dred, SumOp());
  z = BlockReduce(z, zred, SumOp());
  if (threadIdx.x == 0) psq[blockIdx.x] = s, pz[blockIdx.x] = z;
}

__global__ void NonFiniteKernel(const float* x, size_t n, unsigned long long* pc) {
  __shared__ unsigned long long zred[kThreads];
  const size_t i0 = size_t(blockIdx.x) * kReduceChunk;
  const size_t i1 = min(n, i0 + kReduceChunk);
  unsigned long long c = 0;
  for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
    c += (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
  c = BlockReduce(c, zred, SumOp());
  if (threadIdx.x == 0) pc[blockIdx.x] = c;
}

// Partials of K kinds (k-th kind at partial[k * nblocks ...]) summed in block order by one
// thread (a few thousand values at most); kind `max_kind` takes the max instead.
template <typename T>
__global__ void FinishKernel(const T* partial, T* result, int K, size_t nblocks, int max_kind) {
  for (int k = 0; k < K; k++) {
    T s = 0;
    for (size_t i = 0; i < nblocks; i++) {
      const T v = partial[size_t(k) * nblocks + i];
      s = k == max_kind ? (v > s ? v : s) : s + v;
    }
    result[k] = s;
  }
}

// ---- AdamW --------------------------------------------------------------------------------------

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, size_t n,
                            AdamWArgs k, bool stats, double* partial, uint16_t* param_lowp) {
  __shared__ double dred[kThreads];
  const size_t i0 = size_t(blockIdx.x) * kReduceChunk;
  const size_t i1 = min(n, i0 + kReduceChunk);
  double su = 0.0, sp = 0.0, mv = 0.0;
  for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const float g = grad[i] * k.grad_scale;
    const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
    const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / k.bc1, vhat = vi / k.bc2;
    const float old = param[i];
    const float p = old - k.lr * (mhat / (sqrtf(vhat) + k.eps) + k.weight_decay * old);
    param[i] = p;
    if (param_lowp != nullptr) {
      const __nv_bfloat16 b = __float2bfloat16_rn(p);
      param_lowp[i] = *reinterpret_cast<const uint16_t*>(&b);
    }
    if (stats) {
      const double d = double(p) - double(old);
      su += d * d;
      sp += double(p) * p;
      mv = fmax(mv, double(vi));
    }
  }
  if (!stats) return;
  const size_t nb = gridDim.x;
  su = BlockReduce(su, dred, SumOp());
  sp = BlockReduce(sp, dred, SumOp());
  dred[threadIdx.x] = mv;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) dred[threadIdx.x] = fmax(dred[threadIdx.x], dred[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = su;
    partial[nb + blockIdx.x] = sp;
    partial[2 * nb + blockIdx.x] = dred[0];
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------

cudaError_t ToBf16(uint16_t* dst, const float* src, size_t n, cudaStream_t s) {
  if (n > 0) ToBf16Kernel<<<Blocks(n), kThreads, 0, s>>>(dst, src, n);
  return cudaGetLastError();
}

cudaError_t FillRows(float* c, const float* row, int M, int N, cudaStream_t s) {
  const size_t n = size_t(M) * N;
  if (n > 0) FillRowsKernel<<<Blocks(n), kThreads, 0, s>>>(c, row, M, N);
  return cudaGetLastError();
}

cudaError_t BiasGrad(float* dbias, const float* dout, int N, int OC, bool accumulate,
                     double* partial, cudaStream_t s) {
  if (N == 0) {
    if (!accumulate) cudaMemsetAsync(dbias, 0, sizeof(float) * OC, s);
    return cudaGetLastError();
  }
  return ColumnSums<1>(BiasTerm{dout, OC}, Outs<1>{{dbias}}, N, OC, accumulate, partial, s);
}

cudaError_t FirstOutOfRange(int* first_bad, const int32_t* ids, int n, int V, cudaStream_t s) {
  if (n > 0) FirstOutOfRangeKernel<<<Blocks(n), kThreads, 0, s>>>(first_bad, ids, n, V);
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                             const int32_t* positions, int B, int T, int C, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  if (n > 0)
    EmbeddingForwardKernel<<<Blocks(n), kThreads, 0, s>>>(out, tokens, wte, wpe, positions, B * T,
                                                          T, C);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                              const int32_t* positions, int B, int T, int C, cudaStream_t s) {
  if (C > 0)
    EmbeddingBackwardKernel<<<Blocks(C, 128), 128, 0, s>>>(dwte, dwpe, dout, tokens, positions,
                                                           B * T, T, C);
  return cudaGetLastError();
}

cudaError_t LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                             const float* weight, const float* bias, int N, int C, float eps,
                             cudaStream_t s) {
  if (N > 0)
    LayerNormForwardKernel<<<N, kThreads, 0, s>>>(out, mean, rstd, inp, weight, bias, C, eps);
  return cudaGetLastError();
}

cudaError_t LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, const float* mean,
                              const float* rstd, int N, int C, double* partial, cudaStream_t s) {
  if (N == 0) return cudaGetLastError();
  if (dinp != nullptr)
    LayerNormBackwardKernel<<<N, kThreads, 0, s>>>(dinp, dout, inp, weight, mean, rstd, C);
  if (dweight == nullptr && dbias == nullptr) return cudaGetLastError();
  return ColumnSums<2>(LayerNormParamTerm{dout, inp, mean, rstd, C}, Outs<2>{{dweight, dbias}}, N,
                       C, true, partial, s);
}

cudaError_t RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N,
                           int C, float eps, cudaStream_t s) {
  if (N > 0) RmsNormForwardKernel<<<N, kThreads, 0, s>>>(out, rstd, inp, weight, C, eps);
  return cudaGetLastError();
}

cudaError_t RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                            const float* weight, const float* rstd, int N, int C, double* partial,
                            cudaStream_t s) {
  if (N == 0) return cudaGetLastError();
  if (dinp != nullptr)
    RmsNormBackwardKernel<<<N, kThreads, 0, s>>>(dinp, dout, inp, weight, rstd, C);
  if (dweight == nullptr) return cudaGetLastError();
  return ColumnSums<1>(RmsNormParamTerm{dout, inp, rstd, C}, Outs<1>{{dweight}}, N, C, true,
                       partial, s);
}

cudaError_t QkLayerNormForward(float* out, float* mean, float* rstd, const float* qkv,
                               const float* q_weight, const float* q_bias, const float* k_weight,
                               const float* k_bias, int N, int NH, int G, int hs, float eps,
                               cudaStream_t s) {
  if (N == 0) return cudaGetLastError();
  const size_t n = size_t(N) * (NH + G);
  QkLayerNormForwardKernel<<<Blocks(n, 128), 128, 0, s>>>(out, mean, rstd, qkv, q_weight, q_bias,
                                                          k_weight, k_bias, N, NH, G, hs, eps);
  const int W = (NH + 2 * G) * hs, v0 = (NH + G) * hs;  // v passes through
  if (out != qkv)
    cudaMemcpy2DAsync(out + v0, sizeof(float) * W, qkv + v0, sizeof(float) * W,
                      sizeof(float) * (W - v0), N, cudaMemcpyDeviceToDevice, s);
  return cudaGetLastError();
}

cudaError_t QkLayerNormBackward(float* dqkv, float* dq_weight, float* dq_bias, float* dk_weight,
                                float* dk_bias, const float* dout, const float* qkv,
                                const float* q_weight, const float* k_weight, const float* mean,
                                const float* rstd, int N, int NH, int G, int hs, double* partial,
                                cudaStream_t s) {
  if (N == 0) return cudaGetLastError();
  const int W = (NH + 2 * G) * hs, v0 = (NH + G) * hs;
  QkLayerNormBackwardKernel<<<Blocks(size_t(N) * (NH + G), 128), 128, 0, s>>>(
      dqkv, dout, qkv, q_weight, k_weight, mean, rstd, N, NH, G, hs);
  AccumulateColumnsKernel<<<Blocks(size_t(N) * (W - v0)), kThreads, 0, s>>>(dqkv, dout, N, W, v0);
  for (int part = 0; part < 2; part++) {
    const int heads = part == 0 ? NH : G;
    Outs<2> outs{{part == 0 ? dq_weight : dk_weight, part == 0 ? dq_bias : dk_bias}};
    const cudaError_t e =
        ColumnSums<2>(QkParamTerm{dout, qkv, mean, rstd, N, NH, heads, W, hs, part}, outs,
                      N * heads, hs, true, partial, s);
    if (e != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

namespace {
int AttThreads(int T) {
  int t = 32;
  while (t < T && t < kThreads) t *= 2;
  return t;
}
float HeadScale(int hs) {
  return static_cast<float>(std::pow(static_cast<double>(hs), -0.25));
}
}  // namespace

cudaError_t AttentionForward(float* out, float* att, const float* qkv, const float* alibi_slopes,
                             int B, int T, int NH, int G, int hs, float* max_logit,
                             const int32_t* doc_start, bool lowp, float* row_max, cudaStream_t s) {
  if (B == 0 || T == 0) return cudaGetLastError();
  const int threads = AttThreads(T);
  const size_t smem = sizeof(float) * (hs + threads);
  AttentionForwardKernel<<<B * NH * T, threads, smem, s>>>(
      out, att, qkv, alibi_slopes, T, NH, G, hs, doc_start, lowp, row_max, HeadScale(hs));
  if (max_logit != nullptr)
    RowMaxKernel<<<Blocks(B * NH, 128), 128, 0, s>>>(max_logit, row_max, B * NH, T);
  return cudaGetLastError();
}

cudaError_t AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att,
                              int B, int T, int NH, int G, int hs, bool lowp, float* ds,
                              cudaStream_t s) {
  if (B == 0 || T == 0) return cudaGetLastError();
  const int threads = AttThreads(T);
  const float a = HeadScale(hs);
  AttentionDsKernel<<<B * NH * T, threads, sizeof(float) * (hs + threads), s>>>(ds, dout, qkv, att,
                                                                                T, NH, G, hs, lowp);
  const int dthreads = hs >= 64 ? 64 : 32;
  AttentionDqKernel<<<B * NH * T, dthreads, 0, s>>>(dqkv, qkv, ds, T, NH, G, hs, lowp, a);
  AttentionDkvKernel<<<B * G * T, dthreads, 0, s>>>(dqkv, dout, qkv, att, ds, T, NH, G, hs, lowp,
                                                    a);
  return cudaGetLastError();
}

cudaError_t Rope(float* qkv, const float* cos_sin, const int32_t* positions, int B, int T, int NH,
                 int G, int hs, int rot, float sign, cudaStream_t s) {
  const size_t n = size_t(B) * T * (NH + G) * (rot / 2);
  if (n > 0)
    RopeKernel<<<Blocks(n), kThreads, 0, s>>>(qkv, cos_sin, positions, B * T, T, NH, G, hs, rot,
                                              sign);
  return cudaGetLastError();
}

cudaError_t GeluForward(float* out, const float* inp, size_t n, cudaStream_t s) {
  if (n > 0) GeluForwardKernel<<<Blocks(n), kThreads, 0, s>>>(out, inp, n);
  return cudaGetLastError();
}
cudaError_t GeluBackward(float* dinp, const float* inp, const float* dout, size_t n,
                         cudaStream_t s) {
  if (n > 0) GeluBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(dinp, inp, dout, n);
  return cudaGetLastError();
}
cudaError_t SwigluForward(float* out, const float* inp, int N, int F, cudaStream_t s) {
  const size_t n = size_t(N) * F;
  if (n > 0) SwigluForwardKernel<<<Blocks(n), kThreads, 0, s>>>(out, inp, N, F);
  return cudaGetLastError();
}
cudaError_t SwigluBackward(float* dinp, const float* inp, const float* dout, int N, int F,
                           cudaStream_t s) {
  const size_t n = size_t(N) * F;
  if (n > 0) SwigluBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(dinp, inp, dout, N, F);
  return cudaGetLastError();
}
cudaError_t Add(float* out, const float* a, const float* b, size_t n, cudaStream_t s) {
  if (n > 0) AddKernel<<<Blocks(n), kThreads, 0, s>>>(out, a, b, n);
  return cudaGetLastError();
}
cudaError_t Accumulate(float* dst, const float* src, size_t n, cudaStream_t s) {
  if (n > 0) AccumulateKernel<<<Blocks(n), kThreads, 0, s>>>(dst, src, n);
  return cudaGetLastError();
}
cudaError_t Scale(float* x, size_t n, float v, cudaStream_t s) {
  if (n > 0) ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, v);
  return cudaGetLastError();
}

cudaError_t CrossEntropy(float* losses, float* logz, float* logits, const int32_t* targets, int N,
                         int V, int Vp, float dloss, float z_loss, cudaStream_t s) {
  if (N > 0)
    CrossEntropyKernel<<<N, kThreads, 0, s>>>(losses, logz, logits, targets, V, Vp, dloss, z_loss);
  return cudaGetLastError();
}

cudaError_t Softmax(float* probs, const float* logits, int V, float temperature, cudaStream_t s) {
  SoftmaxKernel<<<1, kThreads, 0, s>>>(probs, logits, V, temperature);
  return cudaGetLastError();
}

cudaError_t SumSquaresAndZeros(const float* x, size_t n, double* partial_sq,
                               unsigned long long* partial_zeros, double* result,
                               unsigned long long* zeros, cudaStream_t s) {
  const size_t nb = ReduceBlocks(n);
  if (nb > 0) SquaresZerosKernel<<<nb, kThreads, 0, s>>>(x, n, partial_sq, partial_zeros);
  FinishKernel<double><<<1, 1, 0, s>>>(partial_sq, result, 1, nb, -1);
  FinishKernel<unsigned long long><<<1, 1, 0, s>>>(partial_zeros, zeros, 1, nb, -1);
  return cudaGetLastError();
}

cudaError_t CountNonFinite(const float* x, size_t n, unsigned long long* partial,
                           unsigned long long* count, cudaStream_t s) {
  const size_t nb = ReduceBlocks(n);
  if (nb > 0) NonFiniteKernel<<<nb, kThreads, 0, s>>>(x, n, partial);
  FinishKernel<unsigned long long><<<1, 1, 0, s>>>(partial, count, 1, nb, -1);
  return cudaGetLastError();
}

cudaError_t AdamW(float* param, const float* grad, float* m, float* v, size_t n, AdamWArgs a,
                  bool stats, double* partial, double* result, uint16_t* param_lowp,
                  cudaStream_t s) {
  const size_t nb = ReduceBlocks(n);
  if (nb > 0)
    AdamWKernel<<<nb, kThreads, 0, s>>>(param, grad, m, v, n, a, stats, partial, param_lowp);
  if (stats) FinishKernel<double><<<1, 1, 0, s>>>(partial, result, 3, nb, 2);
  return cudaGetLastError();
}

}  // namespace keel::cuda
