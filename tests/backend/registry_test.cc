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
  const Status st = MakeBackend("cuda", 1, &be);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--backend cuda"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cpu"), std::string::npos) << st.message();
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
