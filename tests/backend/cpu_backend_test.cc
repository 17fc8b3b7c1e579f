// The CPU backend's own choices, beyond the backend-generic op tests (backend_ops_test.cc): what
// Describe reports, the alignment of its buffers, and that its memory is the host's.
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/low_precision.h"

namespace keel {
namespace {

TEST(CpuBackendTest, DescribeNamesBlasAndThreads) {
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  EXPECT_EQ(be->Name(), "cpu");
  const std::string d = be->Describe();
  EXPECT_NE(d.find("OpenBLAS"), std::string::npos) << d;
  EXPECT_NE(d.find("2 threads"), std::string::npos) << d;
  EXPECT_NE(d.find("kernels"), std::string::npos) << d;
}

// 64-byte alignment: a cache line, and what AVX-512 loads want.
TEST(CpuBackendTest, AllocIsAligned) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}}) {
    float* f = be->AllocFloats(n);
    int32_t* k = be->AllocInts(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(k) % 64, 0u);
    be->Free(f);
    be->Free(k);
  }
  // 2 MiB and more: aligned to a 2 MiB huge page (the streaming passes over weights, gradients
  // and moments ask for transparent huge pages), zeroed like every allocation.
  for (size_t n : {size_t{1} << 19, (size_t{3} << 19) + 5}) {
    float* f = be->AllocFloats(n);
    uint16_t* h = be->AllocHalves(2 * n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f) % (size_t{2} << 20), 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(h) % (size_t{2} << 20), 0u);
    EXPECT_EQ(f[n - 1], 0.0f);
    EXPECT_EQ(h[2 * n - 1], 0u);
    be->Free(f);
    be->Free(h);
  }
}

// Host-side readers (checkpoint saves) skip the staging copy on the CPU: the view is the memory.
TEST(CpuBackendTest, HostViewIsZeroCopy) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  float* f = be->AllocFloats(4);
  const HostView v = be->ViewOnHost(f, 4);
  EXPECT_TRUE(v.zero_copy());
  EXPECT_EQ(v.data(), f);
  EXPECT_EQ(v.size(), 4u);
  be->Free(f);
}

// The CPU backend runs every op in every precision.
TEST(CpuBackendTest, SupportsEveryOp) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
    for (int i = 0; i < kNumOps; ++i) EXPECT_TRUE(be->Supports(static_cast<Op>(i), p)) << i;
}

}  // namespace
}  // namespace keel

namespace keel {
namespace {

// The vector kernels (GCC's _Float16, F16C on this CPU) and the portable bit-level conversion
// (what clang builds use) agree on every fp16 value and on a sweep of fp32 values, edges included:
// 65504 is the largest finite, 65520 rounds to inf, subnormals round to nearest even, NaN stays
// NaN.
TEST(LowPrecisionTest, Fp16KernelsMatchThePortableConversionBitForBit) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> values(all.size());
  lowp::FromBits(values.data(), all.data(), all.size(), Precision::kFp16, 2);
  for (size_t i = 0; i < all.size(); ++i) {
    const float want = lowp::FromFp16(static_cast<uint16_t>(i));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(values[i])) << i;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(values[i]), std::bit_cast<uint32_t>(want)) << i;
    }
  }
  std::vector<float> sweep = {0.0f,      -0.0f,     65504.0f, 65519.99f, 65520.0f,
                              -65520.0f, 1e-8f,     3e-8f,    6.1e-5f,   1.0f + 1.0f / 2048,
                              INFINITY,  -INFINITY, NAN};
  for (uint64_t u = 0; u <= 0xffffffffull; u += 8191)
    sweep.push_back(std::bit_cast<float>(uint32_t(u)));
  std::vector<uint16_t> bits(sweep.size());
  lowp::ToBits(bits.data(), sweep.data(), sweep.size(), Precision::kFp16, 2);
  for (size_t i = 0; i < sweep.size(); ++i) {
    const uint16_t want = lowp::ToFp16(sweep[i]);
    if (std::isnan(sweep[i])) {
      ASSERT_EQ(bits[i] & 0x7c00, 0x7c00) << i;
      ASSERT_NE(bits[i] & 0x3ff, 0) << i;
    } else {
      ASSERT_EQ(bits[i], want) << sweep[i];
    }
  }
  EXPECT_EQ(lowp::ToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(lowp::ToFp16(65520.0f), 0x7c00);
  EXPECT_EQ(lowp::ToFp16(5.9604645e-8f), 0x0001);      // the smallest subnormal
  EXPECT_EQ(lowp::ToFp16(2.9802322e-8f), 0x0000);      // half of it: ties to even, 0
  EXPECT_EQ(lowp::ToBf16(1.0f + 1.0f / 256), 0x3f80);  // ties to even: 1
  EXPECT_EQ(lowp::ToBf16(1.0f + 3.0f / 256), 0x3f82);  // ties to even: up
}

// bf16 conversion: the vector path (AVX512-BF16's instruction where the CPU has it) gives the
// scalar reference's bits for every input: ties to even, overflow to inf, NaN payloads made
// quiet, and subnormals (which the instruction alone would flush to zero) in runs of any length.
TEST(LowPrecisionTest, Bf16KernelsMatchTheScalarConversionBitForBit) {
  std::vector<float> sweep = {0.0f,
                              -0.0f,
                              1.0f + 1.0f / 256,
                              1.0f + 3.0f / 256,
                              FLT_MAX,
                              INFINITY,
                              -INFINITY,
                              NAN,
                              std::bit_cast<float>(0x7f800001u),
                              std::bit_cast<float>(0xffc00123u),
                              std::bit_cast<float>(0x00000001u),
                              std::bit_cast<float>(0x807fffffu),
                              std::bit_cast<float>(0x00008000u)};
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099)
    sweep.push_back(std::bit_cast<float>(uint32_t(u)));
  for (uint32_t u = 0; u < 40; ++u) sweep.push_back(std::bit_cast<float>(0x00400000u + u));
  std::vector<uint16_t> bits(sweep.size()), serial(sweep.size());
  lowp::ToBits(bits.data(), sweep.data(), sweep.size(), Precision::kBf16, 2);
  lowp::ToBitsSerial(serial.data(), sweep.data(), sweep.size(), Precision::kBf16);
  size_t subnormals = 0;
  for (size_t i = 0; i < sweep.size(); ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(sweep[i]);
    subnormals += (u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0;
    ASSERT_EQ(bits[i], lowp::ToBf16(sweep[i])) << std::hex << u;
    ASSERT_EQ(serial[i], bits[i]) << std::hex << u;
  }
  EXPECT_GT(subnormals, 100u);
  EXPECT_EQ(lowp::ToBf16(FLT_MAX), 0x7f80);  // past bf16's largest finite: inf
  EXPECT_EQ(lowp::ToBf16(std::bit_cast<float>(0x00000001u)), 0x0000);
  EXPECT_EQ(lowp::ToBf16(std::bit_cast<float>(0x00008000u)), 0x0000);  // a tie: to even
  EXPECT_EQ(lowp::ToBf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // a tie: to even, up
  EXPECT_EQ(lowp::ToBf16(std::bit_cast<float>(0x807fffffu)), 0x8080);  // rounds up to normal
}

}  // namespace
}  // namespace keel
