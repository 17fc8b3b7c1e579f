// The CPU backend's own choices, beyond the backend-generic op tests (backend_ops_test.cc): what
// Describe reports, the alignment of its buffers, and that its memory is the host's.
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

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
}

// Host-side readers (checkpoint saves) skip the staging copy on the CPU.
TEST(CpuBackendTest, MemoryIsHostReadable) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  float* f = be->AllocFloats(4);
  EXPECT_EQ(be->HostReadable(f), f);
  be->Free(f);
}

}  // namespace
}  // namespace keel
