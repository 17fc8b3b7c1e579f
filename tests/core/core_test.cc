#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "core/env.h"
#include "core/rng.h"
#include "core/status.h"

namespace keel {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds).
TEST(RngTest, PhiloxMatchesRandom123KnownAnswers) {
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(Philox4x32x10({0, 0, 0, 0}, {0, 0}),
            (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      Philox4x32x10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      Philox4x32x10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(RngTest, StreamsAreIndependentOfDrawOrderAndDistinctByKey) {
  const RngKey a{1, RngPurpose::kInit, 0}, b{1, RngPurpose::kInit, 1},
      c{1, RngPurpose::kDataOrder, 0};
  EXPECT_EQ(U64At(a, 12345), U64At(a, 12345));
  EXPECT_NE(U64At(a, 0), U64At(b, 0));
  EXPECT_NE(U64At(a, 0), U64At(c, 0));
  EXPECT_NE(U64At(a, 0), U64At({2, RngPurpose::kInit, 0}, 0));
}

TEST(RngTest, UniformAndNormalHaveTheRightMoments) {
  const RngKey k{7, RngPurpose::kTest, 0};
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  float umin = 1, umax = 0;
  for (int i = 0; i < n; ++i) {
    const float u = UniformAt(k, i);
    umin = std::min(umin, u);
    umax = std::max(umax, u);
    su += u;
    const double z = NormalAt(k, i);
    sn += z;
    sn2 += z * z;
  }
  EXPECT_GE(umin, 0.0f);
  EXPECT_LT(umax, 1.0f);
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sn2 / n), 1.0, 0.01);
}

TEST(StatusTest, CarriesCodeAndMessage) {
  EXPECT_TRUE(Status::OK().ok());
  Status s = Status::InvalidArgument("--lr -1 must be positive");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "invalid argument: --lr -1 must be positive");
}

TEST(EnvTest, AtomicWriteReplacesWholeFileAndLeavesNoTemporary) {
  Env* env = Env::Default();
  const std::string dir = ::testing::TempDir() + "/keel_env_test";
  ASSERT_TRUE(env->CreateDirs(dir).ok());
  const std::string path = JoinPath(dir, "marker.txt");
  ASSERT_TRUE(WriteFileAtomic(env, path, "100\n").ok());
  ASSERT_TRUE(WriteFileAtomic(env, path, "200\n").ok());
  std::string got;
  ASSERT_TRUE(env->ReadFileToString(path, &got).ok());
  EXPECT_EQ(got, "200\n");
  std::vector<std::string> names;
  ASSERT_TRUE(env->GetChildren(dir, &names).ok());
  EXPECT_EQ(names, std::vector<std::string>{"marker.txt"});
  std::unique_ptr<ReadOnlyRegion> region;
  ASSERT_TRUE(env->MapReadOnly(path, &region).ok());
  EXPECT_EQ(std::string(region->data(), region->size()), "200\n");
  Status missing = env->ReadFileToString(JoinPath(dir, "nope"), &got);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("nope"), std::string::npos);
  ASSERT_TRUE(env->RemoveDirRecursive(dir).ok());
  EXPECT_FALSE(env->FileExists(dir));
}

// Large appends switch a new file to O_DIRECT through a bounce buffer (where the file system allows
// it); whatever the mix of sizes and offsets, the file must hold exactly the bytes appended, also
// when it is closed without a Sync and when appends follow a Sync.
TEST(EnvTest, LargeAndSmallAppendsMixedKeepEveryByte) {
  Env* env = Env::Default();
  const std::string dir = ::testing::TempDir() + "/keel_env_direct_test";
  ASSERT_TRUE(env->CreateDirs(dir).ok());
  std::string expect;
  auto chunk = [&](size_t n, char seed) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 131 + (i >> 12));
    expect += s;
    return s;
  };
  for (bool sync_midway : {false, true}) {
    expect.clear();
    const std::string path = JoinPath(dir, sync_midway ? "synced.bin" : "closed.bin");
    std::unique_ptr<WritableFile> f;
    ASSERT_TRUE(env->NewWritableFile(path, &f).ok());
    ASSERT_TRUE(f->Append(chunk(1234, 'a')).ok());                     // unaligned offset
    ASSERT_TRUE(f->Append(chunk((size_t{37} << 20) + 77, 'b')).ok());  // several bounce blocks
    ASSERT_TRUE(f->Append(chunk(3, 'c')).ok());
    if (sync_midway) {
      ASSERT_TRUE(f->Sync().ok());
    }
    ASSERT_TRUE(f->Append(chunk((size_t{5} << 20) + 1, 'd')).ok());
    ASSERT_TRUE(f->Append(chunk(4096, 'e')).ok());
    if (sync_midway) {
      ASSERT_TRUE(f->Sync().ok());
    }
    ASSERT_TRUE(f->Close().ok());
    std::string got;
    ASSERT_TRUE(env->ReadFileToString(path, &got).ok());
    ASSERT_EQ(got.size(), expect.size());
    EXPECT_TRUE(got == expect);
  }
  ASSERT_TRUE(env->RemoveDirRecursive(dir).ok());
}

// AvailableMemory: MemAvailable, or the lowest limit of the process's cgroup and its ancestors
// less what each uses (droppable page cache not counted), whichever is less; cgroup v2 and v1.
TEST(EnvTest, AvailableMemoryIsTheLeastOfMemAvailableAndTheCgroupLimits) {
  std::map<std::string, std::string> files = {
      {"/proc/meminfo", "MemTotal:       32000000 kB\nMemAvailable:   8000000 kB\n"},
  };
  auto read = [&](const std::string& path, std::string* text) {
    auto it = files.find(path);
    if (it == files.end()) return false;
    *text = it->second;
    return true;
  };
  MemoryAvailable m;
  ASSERT_TRUE(AvailableMemoryFromFiles(read, &m).ok());
  EXPECT_EQ(m.bytes, uint64_t{8000000} * 1024);
  EXPECT_EQ(m.source, "MemAvailable in /proc/meminfo");

  // cgroup v2, unlimited at the leaf, 4 GiB at the parent with 3 GiB used of which 1 GiB is
  // inactive page cache: 2 GiB left.
  const uint64_t gib = uint64_t{1} << 30;
  files["/proc/self/cgroup"] = "0::/jobs/run7\n";
  files["/sys/fs/cgroup/jobs/run7/memory.max"] = "max\n";
  files["/sys/fs/cgroup/jobs/run7/memory.current"] = "1000\n";
  files["/sys/fs/cgroup/jobs/memory.max"] = std::to_string(4 * gib) + "\n";
  files["/sys/fs/cgroup/jobs/memory.current"] = std::to_string(3 * gib) + "\n";
  files["/sys/fs/cgroup/jobs/memory.stat"] =
      "anon 100\nfile 2000\ninactive_file " + std::to_string(gib) + "\n";
  ASSERT_TRUE(AvailableMemoryFromFiles(read, &m).ok());
  EXPECT_EQ(m.bytes, 2 * gib);
  EXPECT_NE(m.source.find("/sys/fs/cgroup/jobs/memory.max"), std::string::npos) << m.source;

  // cgroup v1 (the memory controller's own hierarchy): 1 GiB limit, 768 MiB used.
  files["/proc/self/cgroup"] = "4:memory:/box\n1:cpu:/\n";
  files["/sys/fs/cgroup/memory/box/memory.limit_in_bytes"] = std::to_string(gib);
  files["/sys/fs/cgroup/memory/box/memory.usage_in_bytes"] = std::to_string(768 << 20);
  files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712";  // no limit
  files["/sys/fs/cgroup/memory/memory.usage_in_bytes"] = "5";
  ASSERT_TRUE(AvailableMemoryFromFiles(read, &m).ok());
  EXPECT_EQ(m.bytes, uint64_t{256} << 20);

  files.clear();
  EXPECT_EQ(AvailableMemoryFromFiles(read, &m).code(), Status::Code::kNotFound);
  // This machine: some figure, from the real files.
  ASSERT_TRUE(Env::Default()->AvailableMemory(&m).ok());
  EXPECT_GT(m.bytes, 0u);
}

}  // namespace
}  // namespace keel
