// `keel train --async-save` end to end: periodic saves written in the background resume bit for
// bit, one process and two ranks under mpirun; a process killed inside a background write
// leaves the previous checkpoint the newest; a failed write on one rank aborts that save on every
// rank and training goes on. Every mpirun runs under `timeout` with one thread per rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "keel_process.h"

namespace {

using keel_test::FreshTempDir;
using keel_test::KeelResult;
using keel_test::Mpirun;
using keel_test::ReadText;
using keel_test::RunShell;
namespace fs = std::filesystem;

const std::string kArgs = keel_test::kDataParallelModel + " --train-iters 30 --save-interval 5 ";

KeelResult Train(int np, const std::string& args, const std::string& env = "") {
  const std::string keel = std::string(KEEL_BINARY) + " " + kArgs + args;
  if (np == 1) return RunShell(env + (env.empty() ? "" : " ") + keel);
  if (env.empty()) return RunShell(Mpirun(np) + keel);
  // Rank 1 alone runs with `env` set (a per-rank fault).
  return RunShell(Mpirun(np) + "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then export " + env +
                  "; fi; exec " + keel + "'");
}

std::string Fingerprint(const std::string& out) {
  std::smatch m;
  std::regex_search(out, m, std::regex("state fingerprint: ([0-9a-f]{16})"));
  return m.empty() ? "(none)" : m[1].str();
}

TEST(AsyncSaveCliTest, StoppedAndKilledRunsResumeBitExactly) {
  const std::string dir = FreshTempDir("async_cli");
  const KeelResult ref = Train(1, "--save " + dir + "/ref");
  ASSERT_EQ(ref.code, 0) << ref.out;
  // Stopped at 12 (the save of 10 written in the background), resumed with --async-save.
  const std::string run = dir + "/run";
  const KeelResult first = Train(1, "--async-save --exit-interval 12 --save " + run);
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("iter_0000010 (--save-interval, --async-save)"), std::string::npos)
      << first.out;
  EXPECT_NE(first.out.find("the background write took"), std::string::npos);
  EXPECT_EQ(ReadText(run + "/latest_checkpointed_iteration.txt"), "12\n");
  const KeelResult second = Train(1, "--async-save --save " + run);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("resumed from " + run + "/iter_0000012"), std::string::npos)
      << second.out;
  EXPECT_EQ(Fingerprint(second.out), Fingerprint(ref.out));

  // Killed (SIGKILL) at the 4th filesystem mutation inside the background write of iteration 15.
  const std::string killed = dir + "/killed";
  const KeelResult crashed = Train(1, "--async-save --save " + killed,
                                   "KEEL_FAULT_INJECTION=crash-at=4:.tmp.iter_0000015");
  EXPECT_NE(crashed.code, 0) << crashed.out;
  EXPECT_EQ(ReadText(killed + "/latest_checkpointed_iteration.txt"), "10\n");
  const KeelResult resumed = Train(1, "--async-save --save " + killed);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from " + killed + "/iter_0000010"), std::string::npos)
      << resumed.out;
  EXPECT_EQ(Fingerprint(resumed.out), Fingerprint(ref.out));
}

TEST(AsyncSaveCliTest, TwoRanksWriteInTheBackgroundAndRank0CommitsOnceAllWrote) {
  const std::string dir = FreshTempDir("async_dp");
  const KeelResult ref = Train(2, "--save " + dir + "/ref");
  ASSERT_EQ(ref.code, 0) << ref.out;
  const std::string run = dir + "/run";
  const KeelResult first = Train(2, "--async-save --exit-interval 17 --save " + run);
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("iter_0000015 (--save-interval, --async-save)"), std::string::npos)
      << first.out;
  EXPECT_TRUE(fs::exists(run + "/iter_0000015/optimizer.rank-001-of-002.safetensors"));
  EXPECT_EQ(RunShell(std::string(KEEL_BINARY) + " ckpt verify " + run + "/iter_0000015").code, 0);
  // Retention (--keep-last-checkpoints 2) still follows every commit, its deletions on the next
  // background save's thread or at the stop: the saves at 5 and 10 are gone, 15 and 17 kept.
  for (const char* gone : {"/iter_0000005", "/iter_0000010"}) {
    EXPECT_FALSE(fs::exists(run + gone)) << gone;
    EXPECT_NE(first.out.find("removing checkpoint " + run + gone), std::string::npos) << first.out;
  }
  EXPECT_TRUE(fs::exists(run + "/iter_0000017"));
  const KeelResult second = Train(2, "--async-save --save " + run);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("resumed from " + run + "/iter_0000017"), std::string::npos)
      << second.out;
  EXPECT_EQ(Fingerprint(second.out), Fingerprint(ref.out));

  // Rank 1's disk is full while it writes its moments of iteration 10: that save is aborted on
  // every rank (no iter_0000010, no temporary directory), counted as one failure, and the run
  // goes on to the same bits.
  const std::string full = dir + "/full";
  const KeelResult failed =
      Train(2, "--async-save --save " + full, "KEEL_FAULT_INJECTION=enospc-at=1:.tmp.iter_0000010");
  ASSERT_EQ(failed.code, 0) << failed.out;
  EXPECT_NE(failed.out.find("(1 of 3 consecutive failures allowed"), std::string::npos)
      << failed.out;
  EXPECT_FALSE(fs::exists(full + "/iter_0000010"));
  EXPECT_FALSE(fs::exists(full + "/.tmp.iter_0000010"));
  EXPECT_EQ(ReadText(full + "/latest_checkpointed_iteration.txt"), "30\n");
  EXPECT_EQ(Fingerprint(failed.out), Fingerprint(ref.out));
}

}  // namespace
