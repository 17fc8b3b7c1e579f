// Conversions between fp32 and the two 16-bit formats of mixed precision, round to nearest even:
//   bf16: fp32's 8-bit exponent with 7 mantissa bits (range as fp32, ~3 significant digits);
//   fp16: IEEE half, 5-bit exponent and 10 mantissa bits: largest finite 65504, subnormals below
//         6.1e-5, so |x| > 65519.99 becomes inf — the overflow that fp16 loss scaling watches for.
// NaN stays NaN. Loops are vectorised (runtime-dispatched clones) and parallel over long arrays.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/precision.h"

namespace keel::lowp {

// dst[i] = 16-bit pattern of src[i] in `p` (kBf16 or kFp16).
void ToBits(uint16_t* dst, const float* src, size_t n, Precision p, int threads);
// The same on the calling thread alone (no OpenMP region), for chunks of a parallel loop.
void ToBitsSerial(uint16_t* dst, const float* src, size_t n, Precision p);
// dst[i] = the fp32 value of bits src[i] in `p` (exact: every bf16 and fp16 value is an fp32).
void FromBits(float* dst, const uint16_t* src, size_t n, Precision p, int threads);
// x[i] = float(round_p(x[i])) in place: a value that went through 16-bit storage. kFp32: no-op.
void Round(float* x, size_t n, Precision p, int threads);
// The same on the calling thread alone, for short spans inside a parallel region (attention's
// rows): no OpenMP region is opened.
void RoundSerial(float* x, size_t n, Precision p);

// One value, for tests and scalar code (fp16: a portable bit-level conversion, the reference the
// vector kernels are tested against).
uint16_t ToBf16(float x);
float FromBf16(uint16_t b);
uint16_t ToFp16(float x);
float FromFp16(uint16_t h);

}  // namespace keel::lowp
