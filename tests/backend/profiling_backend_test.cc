// ProfilingBackend forwards every op unchanged (the same bits as the backend it wraps) and counts
// each op's calls and time; a trainer runs through it as through any backend.
#include "backend/profiling_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace keel {
namespace {

TEST(ProfilingBackendTest, ForwardsOpsAndCountsThem) {
  auto cpu = MakeCpuBackend(2);
  ProfilingBackend prof(cpu.get());
  EXPECT_EQ(prof.Name(), cpu->Name());
  const int N = 16, IC = 8, OC = 4;
  std::vector<float> hin(N * IC), hw(OC * IC);
  for (size_t i = 0; i < hin.size(); ++i) hin[i] = 0.01f * static_cast<float>(i % 17);
  for (size_t i = 0; i < hw.size(); ++i) hw[i] = 0.02f * static_cast<float>(i % 5) - 0.03f;
  float* in = prof.AllocFloats(hin.size());
  float* w = prof.AllocFloats(hw.size());
  float* out1 = prof.AllocFloats(N * OC);
  float* out2 = cpu->AllocFloats(N * OC);
  prof.CopyToDevice(in, hin.data(), hin.size());
  prof.CopyToDevice(w, hw.data(), hw.size());
  Backend* be = &prof;  // the interface's default arguments, as the model calls it
  be->MatmulForward(out1, in, w, nullptr, N, IC, OC);
  be->MatmulForward(out1, in, w, nullptr, N, IC, OC);
  cpu->MatmulForward(out2, in, w, nullptr, N, IC, OC);
  EXPECT_EQ(std::memcmp(out1, out2, N * OC * sizeof(float)), 0);
  EXPECT_EQ(prof.SumSquaresAndZeros(out1, N * OC).sum_sq,
            cpu->SumSquaresAndZeros(out2, N * OC).sum_sq);
  prof.SetPrecision(Precision::kBf16);
  EXPECT_EQ(cpu->precision(), Precision::kBf16);  // settings reach the wrapped backend
  prof.SetPrecision(Precision::kFp32);

  const auto& t = prof.times();
  ASSERT_EQ(t.count("MatmulForward"), 1u);
  EXPECT_EQ(t.at("MatmulForward").calls, 2);
  EXPECT_GE(t.at("MatmulForward").seconds, 0.0);
  EXPECT_EQ(t.at("AllocFloats").calls, 3);
  EXPECT_EQ(t.at("SumSquaresAndZeros").calls, 1);
  EXPECT_EQ(t.count("AdamWUpdate"), 0u);
  prof.Reset();
  EXPECT_TRUE(prof.times().empty());
  for (float* p : {in, w, out1}) prof.Free(p);
  cpu->Free(out2);
}

}  // namespace
}  // namespace keel
