// The ranks of a job agree before any work (issue: many-rank jobs under hostile conditions):
// ranks started with different settings are refused naming them, an error on some ranks keeps
// its words and exit code on every rank, the ranks must see one --save directory, and one run at
// a time holds a --save directory. Every mpirun runs under `timeout`.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "keel_process.h"

namespace {

using keel_test::FreshTempDir;
using keel_test::KeelResult;
using keel_test::Mpirun;
using keel_test::ReadText;
using keel_test::RunShell;
namespace fs = std::filesystem;

const std::string kModel = keel_test::kDataParallelModel;

// Two ranks; rank 1 runs through a shell that first evaluates `rank1` (an export, a cd, or
// extra flags in $EXTRA), as an MPMD section or a per-rank variable in a launch script would.
// `launcher` goes before mpirun (keel launch).
KeelResult TrainTwoRanks(const std::string& args, const std::string& rank1,
                         const std::string& cwd = "", const std::string& launcher = "") {
  const std::string keel = std::string(KEEL_BINARY) + " " + kModel + " " + args;
  return RunShell((cwd.empty() ? "" : "cd " + cwd + " && ") + launcher + Mpirun(2, "", 90) +
                  "sh -c 'EXTRA=; if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then " + rank1 +
                  "; fi; exec " + keel + " $EXTRA'");
}

TEST(RankAgreementCliTest, RanksStartedWithDifferentModelFlagsAreRefusedBeforeAnyWork) {
  // Before: malloc(): corrupted top size (SIGABRT) in the gradient reducer.
  const std::string dir = FreshTempDir("agree_alibi");
  const KeelResult r = TrainTwoRanks("--train-iters 4 --save " + dir + "/run",
                                     "EXTRA=\"--position-embedding-type alibi\"");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the ranks of this job were started with different settings: "
                       "--position-embedding-type (rank 0: \"learned_absolute\"; rank 1: "
                       "\"alibi\")"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("out of step"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/run")) << "nothing is written before the ranks agree";
}

TEST(RankAgreementCliTest, EveryDifferingSettingIsNamedWithItsRanks) {
  // Before: a different --hidden-size hung in reduce-scatter, a different --train-iters hung at
  // the end, and --seed, --lr or --fp16 trained to exit 0 without a word.
  const KeelResult r =
      TrainTwoRanks("--train-iters 4",
                    "EXTRA=\"--hidden-size 32 --seed 7 --lr 7e-4 --fp16 --train-iters 6 "
                    "--threads 2\"");
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* want : {"--hidden-size (rank 0: 64; rank 1: 32)",
                           "--seed (rank 0: 1234; rank "
                           "1: 7)",
                           "--lr (rank 0:", "--fp16 (rank 0: false; rank 1: true)",
                           "--train-iters (rank 0: 4; rank 1: 6)"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_EQ(r.out.find("--threads ("), std::string::npos) << "threads may differ\n" << r.out;
}

TEST(RankAgreementCliTest, RanksGivenDifferentSaveDirectoriesAreRefusedBeforeAnyWork) {
  // Before: trained until the first save, then failed as "collectives out of step" (exit 4),
  // leaving .tmp.iter_N behind.
  const std::string dir = FreshTempDir("agree_save");
  const KeelResult r = TrainTwoRanks("--train-iters 6 --save-interval 3 --save " + dir + "/a",
                                     "EXTRA=\"--save " + dir + "/b\"");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--save (rank 0: \"" + dir + "/a\"; rank 1: \"" + dir + "/b\")"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir + "/a"));
  EXPECT_FALSE(fs::exists(dir + "/b"));
}

TEST(RankAgreementCliTest, RanksThatSeeDifferentDirectoriesUnderOneSavePathAreRefused) {
  // The same relative --save on every rank, but rank 1 starts elsewhere: as ranks on machines
  // without a shared filesystem would, each writes a directory of its own.
  const std::string dir = FreshTempDir("agree_same_dir");
  fs::create_directories(dir + "/zero");
  fs::create_directories(dir + "/one");
  const KeelResult r =
      TrainTwoRanks("--train-iters 4 --save run", "cd " + dir + "/one", dir + "/zero");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("rank 1 (host "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not see the --save directory rank 0 writes"), std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir + "/zero/run/latest_checkpointed_iteration.txt"));
}

TEST(RankAgreementCliTest, AConfigThatDiffersFromTheCheckpointKeepsItsWordsOnEveryRank) {
  // Before: exit 4, "collectives out of step: rank 1 is at #6 agree-on-status (0 B); rank 0 is
  // at #6 agree-on-status (280 B)".
  const std::string dir = FreshTempDir("agree_resume");
  const std::string save = " --save " + dir + "/run";
  const KeelResult first = TrainTwoRanks("--train-iters 4" + save, "true");
  ASSERT_EQ(first.code, 0) << first.out;
  const KeelResult r = TrainTwoRanks("--train-iters 6 --lr 5e-4" + save, "true");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the config differs from the checkpoint's"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("out of step"), std::string::npos) << r.out;
  EXPECT_EQ(ReadText(dir + "/run/latest_checkpointed_iteration.txt"), "4\n");
  // Before: keel launch restarted it 3 times as "the watchdog ended a hung job".
  const KeelResult launched =
      TrainTwoRanks("--train-iters 6 --lr 5e-4" + save, "true", "",
                    std::string("timeout 200 ") + KEEL_BINARY +
                        " launch --backoff-seconds 0 --save " + dir + "/run -- ");
  EXPECT_EQ(launched.code, 2) << launched.out;
  EXPECT_NE(launched.out.find("not restarting, it would fail the same"), std::string::npos)
      << launched.out;
  EXPECT_EQ(launched.out.find("restart 1 of"), std::string::npos) << launched.out;
}

TEST(RankAgreementCliTest, AFullDiskOnOneRankDuringASaveKeepsItsWords) {
  // Before: exit 4, "collectives out of step" (the message made rank 1's status longer). Now the
  // failed save is reported with rank 1's words, and the run goes on to the next save (one
  // failed save of three in a row is allowed, docs/checkpoints.md).
  const std::string dir = FreshTempDir("agree_enospc");
  const KeelResult r = TrainTwoRanks("--train-iters 4 --save-interval 2 --save " + dir + "/run",
                                     "export KEEL_FAULT_INJECTION=enospc-at=1:optimizer.rank-001");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("saving checkpoint " + dir +
                       "/run/iter_0000002 failed: rank 1: cannot "
                       "write '" +
                       dir +
                       "/run/.tmp.iter_0000002/optimizer.rank-001-of-002"
                       ".safetensors': No space left on device"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("out of step"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/run/iter_0000002")) << "no partial checkpoint is committed";
  EXPECT_EQ(ReadText(dir + "/run/latest_checkpointed_iteration.txt"), "4\n");
}

TEST(RankAgreementCliTest, ASecondRunOnALockedSaveDirectoryIsRefusedNamingTheHolder) {
  // Before: both runs exited 0 and the directory held both seeds' checkpoints interleaved.
  const std::string dir = FreshTempDir("agree_lock");
  const std::string run = dir + "/run";
  const std::string keel = std::string(KEEL_BINARY) + " " + kModel + " --save " + run;
  // The holder: a long run in the background, its pid written by the shell that execs it.
  RunShell("sh -c 'echo $$ > " + dir + "/pid; exec " + keel +
           " --train-iters 100000 --save-interval 100000 --exit-duration-in-mins 2' > " + dir +
           "/holder.log 2>&1 &");
  const std::string lock = run + "/locks/rank-000.lock";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ReadText(lock).find("\"pid\"") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_NE(ReadText(lock).find("\"pid\""), std::string::npos) << ReadText(dir + "/holder.log");
  const int holder = std::stoi(ReadText(dir + "/pid"));

  const KeelResult second = RunShell(keel + " --train-iters 4 --seed 99");
  EXPECT_EQ(second.code, 2) << second.out;
  EXPECT_NE(second.out.find("--save " + run + " is in use by another keel run (host "),
            std::string::npos)
      << second.out;
  EXPECT_NE(second.out.find("pid " + std::to_string(holder) + ", rank 0"), std::string::npos)
      << second.out;

  // The holder killed without releasing its lock: the next run takes it over and says so.
  kill(holder, SIGKILL);
  for (int i = 0; i < 100 && kill(holder, 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const KeelResult third = RunShell(keel + " --train-iters 4");
  EXPECT_EQ(third.code, 0) << third.out;
  EXPECT_NE(third.out.find("note: took over the lock " + lock + " left by host "),
            std::string::npos)
      << third.out;
  EXPECT_NE(third.out.find("pid " + std::to_string(holder) + ", rank 0"), std::string::npos)
      << third.out;
  EXPECT_EQ(ReadText(lock), "") << "a clean end releases the lock";
}

}  // namespace
