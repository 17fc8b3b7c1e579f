// Backends by name: "cpu" is there, an unknown name is refused naming the known ones, and a
// registered backend is made by its name.
#include "backend/registry.h"

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"

namespace keel {
namespace {

TEST(BackendRegistryTest, MakesTheCpuBackendByName) {
  std::unique_ptr<Backend> be;
  ASSERT_TRUE(MakeBackend("cpu", 1, &be).ok());
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->Name(), "cpu");
  EXPECT_EQ(static_cast<CpuBackend*>(be.get())->threads(), 1);
}

TEST(BackendRegistryTest, UnknownNameIsRefusedNamingTheKnownBackends) {
  std::unique_ptr<Backend> be;
  const Status st = MakeBackend("tpu", 1, &be);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--backend tpu"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cpu"), std::string::npos) << st.message();
  EXPECT_EQ(be, nullptr);
}

// --backend cuda in a build without KEEL_CUDA names the rebuild; in a CUDA build it makes the
// backend, or, on a machine without a GPU, says so instead of failing inside the driver.
TEST(BackendRegistryTest, CudaIsMadeOrRefusedNamingWhy) {
  std::unique_ptr<Backend> be;
  const Status st = MakeBackend("cuda", 1, &be);
#ifdef KEEL_WITH_CUDA
  if (st.ok()) {
    ASSERT_NE(be, nullptr);
    EXPECT_EQ(be->Name(), "cuda");
    return;
  }
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("CUDA device"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--backend cpu"), std::string::npos) << st.message();
#else
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--backend cuda: this keel was built without CUDA"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("-DKEEL_CUDA=ON"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("scripts/device-check.sh"), std::string::npos) << st.message();
#endif
  EXPECT_EQ(be, nullptr);
}

TEST(BackendRegistryTest, RegisteredBackendIsMadeByItsName) {
  int asked_threads = -1;
  RegisterBackend("registry-test", [&](int threads) {
    asked_threads = threads;
    return MakeCpuBackend(threads);
  });
  std::unique_ptr<Backend> be;
  ASSERT_TRUE(MakeBackend("registry-test", 3, &be).ok());
  EXPECT_EQ(asked_threads, 3);
  const std::vector<std::string> names = BackendNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "registry-test"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
}

}  // namespace
}  // namespace keel
