#include "backend/cpu/low_precision.h"

#include <algorithm>
#include <bit>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

namespace keel::lowp {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KEEL_LOWP_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define KEEL_LOWP_CLONES
#endif

// Round to nearest even on the 16 bits dropped; a NaN keeps a set mantissa bit (stays NaN).
inline uint16_t Bf16Bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float Bf16Value(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}
// IEEE half by bit manipulation, round to nearest even (F. Giesen's method): portable to compilers
// without _Float16 on x86 (clang 14, the fuzz build). GCC's _Float16 (F16C where the clone has
// it) is used for the bulk kernels; the tests check that both give the same bits.
inline uint16_t Fp16BitsSoft(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (ax < 0x38800000u) {
    // Below 2^-14: a subnormal half. Adding 0.5 puts its units (2^-24) in the low mantissa bits,
    // rounded to nearest even by the fp32 addition itself.
    const float r = std::bit_cast<float>(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  const uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + odd;  // exponent 127 -> 15 bias, plus the rounding bias
  return static_cast<uint16_t>(sign | (ax >> 13));
}
inline float Fp16ValueSoft(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u) return std::bit_cast<float>(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em < 0x400u) {  // zero or subnormal: em * 2^-24, exact in fp32
    const float v = static_cast<float>(em) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((em << 13) + 0x38000000u));
}
#if defined(__GNUC__) && !defined(__clang__)
inline uint16_t Fp16Bits(float x) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(x));
}
inline float Fp16Value(uint16_t h) {
  return static_cast<float>(std::bit_cast<_Float16>(h));
}
#else
inline uint16_t Fp16Bits(float x) {
  return Fp16BitsSoft(x);
}
inline float Fp16Value(uint16_t h) {
  return Fp16ValueSoft(h);
}
#endif

KEEL_LOWP_CLONES void ToBf16Generic(uint16_t* dst, const float* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] = Bf16Bits(src[i]);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// AVX512-BF16's VCVTNEPS2BF16 converts 16 values in one instruction with Bf16Bits's rounding and
// NaN rule, but flushes subnormal inputs to zero: a vector holding one converts the generic way,
// so the bits never depend on which path ran. About 5x the generic loop's rate (the weights'
// copy of a GPT-2 124M update: ~9 ms of integer work otherwise).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void ToBf16Native(uint16_t* dst,
                                                                                  const float* src,
                                                                                  size_t n) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x007fffff);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    const __m512i u = _mm512_castps_si512(x);
    const __mmask16 subnormal =
        _mm512_testn_epi32_mask(u, exponent) & _mm512_test_epi32_mask(u, mantissa);
    if (subnormal != 0) {
      for (size_t j = i; j < i + 16; j++) dst[j] = Bf16Bits(src[j]);
      continue;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
  }
  for (; i < n; i++) dst[i] = Bf16Bits(src[i]);
}

void ToBf16Kernel(uint16_t* dst, const float* src, size_t n) {
  static const bool native = __builtin_cpu_supports("avx512bf16");
  if (native) {
    ToBf16Native(dst, src, n);
  } else {
    ToBf16Generic(dst, src, n);
  }
}
#else
void ToBf16Kernel(uint16_t* dst, const float* src, size_t n) {
  ToBf16Generic(dst, src, n);
}
#endif
KEEL_LOWP_CLONES void ToFp16Kernel(uint16_t* dst, const float* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] = Fp16Bits(src[i]);
}
KEEL_LOWP_CLONES void FromBf16Kernel(float* dst, const uint16_t* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] = Bf16Value(src[i]);
}
KEEL_LOWP_CLONES void FromFp16Kernel(float* dst, const uint16_t* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] = Fp16Value(src[i]);
}
KEEL_LOWP_CLONES void RoundBf16Kernel(float* x, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) x[i] = Bf16Value(Bf16Bits(x[i]));
}
KEEL_LOWP_CLONES void RoundFp16Kernel(float* x, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) x[i] = Fp16Value(Fp16Bits(x[i]));
}

// Long arrays in chunks over the team; short ones on the calling thread.
constexpr size_t kChunk = size_t{1} << 14;

template <typename F>
void Chunked(size_t n, int threads, F f) {
  const size_t nchunks = (n + kChunk - 1) / kChunk;
  const int team = n >= 2 * kChunk ? std::max(threads, 1) : 1;
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
  for (size_t ch = 0; ch < nchunks; ch++) {
    const size_t i0 = ch * kChunk;
    f(i0, std::min(kChunk, n - i0));
  }
}

}  // namespace

void ToBits(uint16_t* dst, const float* src, size_t n, Precision p, int threads) {
  if (p == Precision::kBf16) {
    Chunked(n, threads, [&](size_t i0, size_t len) { ToBf16Kernel(dst + i0, src + i0, len); });
  } else {
    Chunked(n, threads, [&](size_t i0, size_t len) { ToFp16Kernel(dst + i0, src + i0, len); });
  }
}

void ToBitsSerial(uint16_t* dst, const float* src, size_t n, Precision p) {
  if (p == Precision::kBf16) {
    ToBf16Kernel(dst, src, n);
  } else {
    ToFp16Kernel(dst, src, n);
  }
}

void FromBits(float* dst, const uint16_t* src, size_t n, Precision p, int threads) {
  if (p == Precision::kBf16) {
    Chunked(n, threads, [&](size_t i0, size_t len) { FromBf16Kernel(dst + i0, src + i0, len); });
  } else {
    Chunked(n, threads, [&](size_t i0, size_t len) { FromFp16Kernel(dst + i0, src + i0, len); });
  }
}

void Round(float* x, size_t n, Precision p, int threads) {
  if (p == Precision::kBf16) {
    Chunked(n, threads, [&](size_t i0, size_t len) { RoundBf16Kernel(x + i0, len); });
  } else if (p == Precision::kFp16) {
    Chunked(n, threads, [&](size_t i0, size_t len) { RoundFp16Kernel(x + i0, len); });
  }
}

void RoundSerial(float* x, size_t n, Precision p) {
  if (p == Precision::kBf16) {
    RoundBf16Kernel(x, n);
  } else if (p == Precision::kFp16) {
    RoundFp16Kernel(x, n);
  }
}

uint16_t ToBf16(float x) {
  return Bf16Bits(x);
}
float FromBf16(uint16_t b) {
  return Bf16Value(b);
}
uint16_t ToFp16(float x) {
  return Fp16BitsSoft(x);
}
float FromFp16(uint16_t h) {
  return Fp16ValueSoft(h);
}

}  // namespace keel::lowp
