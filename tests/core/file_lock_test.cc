// Env::LockFile (flock) and RunDirectoryLock, one per --save directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/communicator.h"
#include "core/env.h"
#include "train/rank_agreement.h"

namespace keel {
namespace {

std::string TempDir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("keel_lock_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(FileLockTest, OneHolderAtATimeAndTheHolderIsReadable) {
  Env* env = Env::Default();
  const std::string path = TempDir("one") + "/x.lock";
  std::unique_ptr<FileLock> a, b;
  std::string previous = "unset";
  ASSERT_TRUE(env->LockFile(path, "holder a\n", &a, &previous).ok());
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(previous, "");
  EXPECT_EQ(Read(path), "holder a\n");
  // Held (flock conflicts between two opens, even in one process): refused, holder named.
  ASSERT_TRUE(env->LockFile(path, "holder b\n", &b, &previous).ok());
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(previous, "holder a\n");
  EXPECT_EQ(Read(path), "holder a\n");
  // A release empties the file: the next holder sees a clean release.
  a.reset();
  EXPECT_EQ(Read(path), "");
  ASSERT_TRUE(env->LockFile(path, "holder b\n", &b, &previous).ok());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(previous, "");
}

TEST(FileLockTest, WhatAHolderThatDiedLeftIsReported) {
  const std::string path = TempDir("stale") + "/x.lock";
  std::ofstream(path) << "a holder that was killed\n";
  std::unique_ptr<FileLock> lock;
  std::string previous;
  ASSERT_TRUE(Env::Default()->LockFile(path, "me\n", &lock, &previous).ok());
  ASSERT_NE(lock, nullptr);
  EXPECT_EQ(previous, "a holder that was killed\n");
  EXPECT_EQ(Read(path), "me\n");
}

TEST(FileLockTest, AnUnwritableLockIsAnErrorNamingThePath) {
  std::unique_ptr<FileLock> lock;
  std::string previous;
  const Status st = Env::Default()->LockFile("/proc/keel-no-such/x.lock", "me\n", &lock, &previous);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/proc/keel-no-such/x.lock"), std::string::npos) << st.message();
}

TEST(RunDirectoryLockTest, ASecondRunOnTheDirectoryIsRefusedNamingTheFirst) {
  const std::string dir = TempDir("run");
  auto comm = MakeSingleProcessCommunicator();
  std::unique_ptr<RunDirectoryLock> first, second;
  std::vector<std::string> notes;
  ASSERT_TRUE(RunDirectoryLock::Acquire(Env::Default(), comm.get(), dir, &first, &notes).ok());
  EXPECT_TRUE(notes.empty());
  const Status st = RunDirectoryLock::Acquire(Env::Default(), comm.get(), dir, &second, &notes);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("is in use by another keel run (host "), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(", pid " + std::to_string(getpid()) + ", rank 0, since "),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(RunDirectoryLock::LockPath(dir, 0)), std::string::npos);
  first.reset();
  ASSERT_TRUE(RunDirectoryLock::Acquire(Env::Default(), comm.get(), dir, &second, &notes).ok());
  EXPECT_TRUE(notes.empty()) << "a clean release is not a take-over";
}

TEST(RunDirectoryLockTest, ALockLeftByADeadHolderIsTakenOverWithANote) {
  const std::string dir = TempDir("stale_run");
  std::filesystem::create_directories(dir + "/locks");
  std::ofstream(RunDirectoryLock::LockPath(dir, 0))
      << R"({"host":"gone","pid":4242,"rank":0,"started":"2026-11-27T00:00:00Z"})"
      << "\n";
  auto comm = MakeSingleProcessCommunicator();
  std::unique_ptr<RunDirectoryLock> lock;
  std::vector<std::string> notes;
  ASSERT_TRUE(RunDirectoryLock::Acquire(Env::Default(), comm.get(), dir, &lock, &notes).ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("left by host gone, pid 4242, rank 0, since 2026-11-27T00:00:00Z: that "
                          "process ended without releasing it"),
            std::string::npos)
      << notes[0];
}

TEST(RankAgreementTest, OnlyThreadCountsMayDifferBetweenRanks) {
  EXPECT_TRUE(MayDifferBetweenRanks("threads"));
  EXPECT_TRUE(MayDifferBetweenRanks("num-workers"));
  for (const char* s : {"hidden-size", "seed", "lr", "data-path", "save", "fp16", "train-iters"})
    EXPECT_FALSE(MayDifferBetweenRanks(s)) << s;
}

}  // namespace
}  // namespace keel
