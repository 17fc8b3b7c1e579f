// `keel train --backend cuda` where it cannot run: a build without KEEL_CUDA names the rebuild, a
// CUDA build on a machine without a GPU names the driver's answer; both exit 2 before training
// and write no checkpoint. (On a GPU the run trains: scripts/device-check.sh checks that.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "keel_process.h"
#ifdef KEEL_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace keel {
namespace {

using keel_test::FreshTempDir;
using keel_test::RunKeelShell;

TEST(CudaCliTest, BackendCudaWhereItCannotRunIsAUsageErrorNamingTheFix) {
#ifdef KEEL_WITH_CUDA
  if (CudaDeviceAvailable().ok()) GTEST_SKIP() << "a GPU is here: --backend cuda would train";
  const char* want = "--backend cuda: no ";  // "no usable CUDA device", "no CUDA device found"
#else
  const char* want =
      "--backend cuda: this keel was built without CUDA: configure with -DKEEL_CUDA=ON on a "
      "machine with nvcc (scripts/device-check.sh does)";
#endif
  const std::string dir = FreshTempDir("backend_cuda");
  const auto r = RunKeelShell("",
                              "train --backend cuda --train-iters 2 --lr-warmup-iters 0 "
                              "--threads 1 --save " +
                                  dir + "/run");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/latest_checkpointed_iteration.txt")) << r.out;
}

}  // namespace
}  // namespace keel
