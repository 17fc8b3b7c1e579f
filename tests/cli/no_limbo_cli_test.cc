// No limbo, end to end under `mpirun -np 2|3` (oversubscribed, one thread per rank): a rank that
// stops calling collectives (every rank dumps, the job exits 4, `keel hangs analyze` names it), a
// rank that skips a collective (named, exit 4, no hang), a slow rank (named a straggler; none on a
// healthy run), a flipped bit in one replica (named at the next check, nothing of it saved).
// Faults are the test-only KEEL_TRAIN_FAULTS hooks; every mpirun runs under `timeout`.
#include <gtest/gtest.h>

#include <chrono>
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

const std::string kModel = keel_test::kDataParallelModel;

KeelResult Train(int np, const std::string& faults, const std::string& args,
                 const std::string& mpirun_options = "") {
  const std::string env = faults.empty() ? "" : "KEEL_TRAIN_FAULTS=" + faults + " ";
  const std::string keel = std::string(KEEL_BINARY) + " " + kModel + " " + args;
  return RunShell(np == 1 ? env + keel : env + Mpirun(np, mpirun_options) + keel);
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Rank 1 stops at iteration 20 (after its backward, before any collective of the reduction):
// every rank ends with exit 4 within twice the timeout, each with its dump, and `keel hangs
// analyze` names rank 1 as the odd one out.
TEST(NoLimboCliTest, HungRankEndsTheJobWithDumpsFromEveryRank) {
  const std::string save = FreshTempDir("hang3");
  const double timeout_s = 4;
  const auto t0 = std::chrono::steady_clock::now();
  const KeelResult r = Train(3, "hang=20:rank=1",
                             "--train-iters 40 --save " + save +
                                 " --save-interval 10 --distributed-timeout-minutes 0.0667 "
                                 "--first-iteration-timeout-minutes 1");
  const double secs = Seconds(t0);
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("fault: rank 1 stops at iteration 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("watchdog"), std::string::npos) << r.out;
  const std::string dir = save + "/hangs/iter_20";
  for (int rank = 0; rank < 3; ++rank) {
    const std::string dump = ReadText(dir + "/rank-00" + std::to_string(rank) + ".txt");
    ASSERT_FALSE(dump.empty()) << "rank " << rank << " wrote no dump\n" << r.out;
    // The hung rank's dump: its phase and how long it had been there when it dumped.
    if (rank == 1) {
      EXPECT_NE(dump.find("backward"), std::string::npos) << dump;
      std::smatch m;
      ASSERT_TRUE(std::regex_search(dump, m, std::regex(R"(phase seconds: ([0-9.]+))"))) << dump;
      EXPECT_LT(std::stod(m[1]), 2 * timeout_s) << dump;
    }
  }
  EXPECT_LT(secs, 60) << "the job took " << secs << " s to end";
  const KeelResult a = RunShell(std::string(KEEL_BINARY) + " hangs analyze " + dir);
  EXPECT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("rank 1 (host"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("the other 2 ranks"), std::string::npos) << a.out;
  // Rank 0's watchdog journaled the hang before the job ended.
  EXPECT_NE(ReadText(save + "/events.jsonl").find("\"event\":\"hang\""), std::string::npos);
  // The checkpoint of iteration 10 is intact: the supervisor (or a person) resumes from it.
  EXPECT_TRUE(fs::exists(save + "/iter_0000010")) << r.out;
}

// One process hangs too (a stuck data read, a deadlock): the same dump and exit code.
TEST(NoLimboCliTest, SingleProcessHangEndsWithExit4AndADump) {
  const std::string save = FreshTempDir("hang1");
  const KeelResult r = Train(1, "hang=5",
                             "--train-iters 10 --save " + save +
                                 " --distributed-timeout-minutes 0.03 "
                                 "--first-iteration-timeout-minutes 1");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_FALSE(ReadText(save + "/hangs/iter_5/rank-000.txt").empty()) << r.out;
}

// Rank 1 skips the first all-reduce of iteration 10: named at the next host collective, the job
// ends with exit 4 at once instead of hanging.
TEST(NoLimboCliTest, RankThatSkipsACollectiveIsNamed) {
  const std::string save = FreshTempDir("skip");
  const auto t0 = std::chrono::steady_clock::now();
  const KeelResult r = Train(3, "skip-collective=10:rank=1", "--train-iters 20 --save " + save);
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("fault: rank 1 skips all-reduce-sum in iteration 10"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("collectives out of step: ranks 0,2 are at"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 is at"), std::string::npos) << r.out;
  EXPECT_LT(Seconds(t0), 60);
  EXPECT_NE(ReadText(save + "/events.jsonl").find("collectives_out_of_step"), std::string::npos);
}

// --debug-collectives: the ranks agree before each gradient collective too; a clean run is
// unchanged (same fingerprint as without it).
TEST(NoLimboCliTest, DebugCollectivesChangesNothingOnAHealthyRun) {
  const KeelResult a = Train(2, "", "--train-iters 6");
  const KeelResult b = Train(2, "", "--train-iters 6 --debug-collectives");
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  std::smatch ma, mb;
  ASSERT_TRUE(std::regex_search(a.out, ma, std::regex("state fingerprint: ([0-9a-f]{16})")));
  ASSERT_TRUE(std::regex_search(b.out, mb, std::regex("state fingerprint: ([0-9a-f]{16})")));
  EXPECT_EQ(ma[1].str(), mb[1].str());
}

// One bit of one weight of rank 1's replica flips after iteration 23 (a replicated optimizer,
// so nothing overwrites it): the check at iteration 25 names rank 1 and the tensor, the run
// stops with an error and saves nothing of the damaged state.
TEST(NoLimboCliTest, FlippedBitInOneReplicaIsNamedAtTheNextCheck) {
  const std::string save = FreshTempDir("bitflip");
  const KeelResult r = Train(
      2, "bitflip=23:rank=1",
      "--train-iters 40 --save " + save +
          " --save-interval 10 --check-replicas-interval 5 --use-distributed-optimizer=false");
  EXPECT_EQ(r.code, 1) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(fault: rank 1 flipped one bit of (\S+))")))
      << r.out;
  const std::string tensor = m[1];
  EXPECT_NE(r.out.find("replica check at iteration 25"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 (host"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("differs in 1 of"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(": " + tensor), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(save + "/iter_0000020"));
  EXPECT_FALSE(fs::exists(save + "/iter_0000030"));
  EXPECT_NE(ReadText(save + "/events.jsonl").find("replica_mismatch"), std::string::npos);
}

// With ZeRO-1 (the default) every step all-gathers the weights, so a flip outside the rank's
// own shard lives until the next step: the check at the same iteration still sees it.
TEST(NoLimboCliTest, FlippedBitIsCaughtWithTheDistributedOptimizerToo) {
  const KeelResult r =
      Train(2, "bitflip=10:rank=1", "--train-iters 20 --check-replicas-interval 10");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("replica check at iteration 10"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 (host"), std::string::npos) << r.out;
}

// A healthy run's checks pass (and say so once).
TEST(NoLimboCliTest, HealthyReplicasPassTheCheck) {
  const KeelResult r = Train(2, "", "--train-iters 10 --check-replicas-interval 5");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("replica check at iteration 5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("identical on 2 ranks"), std::string::npos) << r.out;
}

// A larger model, so an iteration's compute is long against timer and scheduling noise, and
// each rank bound to its own core as HPC launchers do: unbound, the two ranks of this 2-core
// machine migrate and share cores, and their compute times differ by 2-10% for 50 iterations
// at a time (measured); bound, by about 1%.
const std::string kBound = "--bind-to core ";

// Sanitizers slow the ranks unevenly (rank 0, which writes the run's files, ran 15-20% slower for
// 50 iterations at a time under ASan, measured): straggler timings mean nothing there.
#if defined(KEEL_SANITIZED_BUILD)
#define SKIP_TIMING_UNDER_SANITIZERS() \
  GTEST_SKIP() << "timing test: sanitizers slow the ranks unevenly"
#else
#define SKIP_TIMING_UNDER_SANITIZERS() (void)0
#endif
// The straggler tests run 2 ranks on a shared 2-core CI machine, where a healthy rank was once
// 9% slower than the other for 100 iterations: the threshold is raised to 25% for both tests,
// and the slow rank sleeps 50% of its compute time, well clear of that noise.
const std::string kStragglerModel =
    "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 "
    "--micro-batch-size 2 --global-batch-size 8 --straggler-threshold 0.25";

// Rank 1 sleeps 50% of its compute time every iteration: named once, in the log, events.jsonl
// and CHRONICLE.md, after 5 slow windows of 10 iterations (at iteration 70 in quiet runs: the
// first windows are warm-up); within 150, so one window disturbed by the shared machine (which
// restarts the streak) does not fail the test.
TEST(NoLimboCliTest, SlowRankIsNamedAStraggler) {
  SKIP_TIMING_UNDER_SANITIZERS();
  const std::string save = FreshTempDir("slow");
  const KeelResult r = Train(2, "slow=0.5:rank=1",
                             kStragglerModel + " --train-iters 160 --save " + save +
                                 " --save-interval 0 --log-interval 20",
                             kBound);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string events = ReadText(save + "/events.jsonl");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      events, m, std::regex(R"(\{[^\n]*"event":"straggler"[^\n]*"iteration":(\d+)[^\n]*)")))
      << events;
  EXPECT_LE(std::stoi(m[1]), 150) << m[0];
  EXPECT_NE(m[0].str().find("\"rank\":1"), std::string::npos) << m[0];
  EXPECT_EQ(CountOf(events, "\"event\":\"straggler\""), 1) << events;
  EXPECT_NE(ReadText(save + "/CHRONICLE.md").find("rank 1 (host"), std::string::npos);
}

// No false alarm: 500 healthy iterations name no straggler.
TEST(NoLimboCliTest, HealthyRunNamesNoStraggler) {
  SKIP_TIMING_UNDER_SANITIZERS();
  const std::string save = FreshTempDir("healthy");
  const KeelResult r = Train(2, "",
                             kStragglerModel + " --train-iters 500 --save " + save +
                                 " --save-interval 0 --log-interval 100",
                             kBound);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(CountOf(ReadText(save + "/events.jsonl"), "straggler"), 0)
      << ReadText(save + "/events.jsonl");
}

std::string LastFingerprint(const std::string& out) {
  std::string last = "(none)";
  const std::regex re("state fingerprint: ([0-9a-f]{16})");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it)
    last = (*it)[1];
  return last;
}

// keel launch over mpirun: rank 1 is killed (SIGKILL) at iteration 30 of the first attempt, rank
// 0 hangs at iteration 60 of the second (the watchdog ends that job with exit 4); the third
// attempt finishes with the state of a run that was never interrupted, and the chronicle tells
// both restarts.
TEST(NoLimboCliTest, SupervisedRunSurvivesAKillAndAHang) {
  const std::string args =
      "--train-iters 80 --save-interval 10 --distributed-timeout-minutes 0.05 "
      "--first-iteration-timeout-minutes 1";
  const std::string ref = FreshTempDir("supervised_ref");
  const KeelResult clean = Train(2, "", args + " --save " + ref);
  ASSERT_EQ(clean.code, 0) << clean.out;
  const std::string save = FreshTempDir("supervised");
  const KeelResult r =
      RunShell("KEEL_TRAIN_FAULTS=kill=30:rank=1:attempt=1,hang=60:rank=0:attempt=2 timeout 400 " +
               std::string(KEEL_BINARY) + " launch --backoff-seconds 0 --max-restarts 3 -- " +
               Mpirun(2) + KEEL_BINARY + " " + kModel + " " + args + " --save " + save);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(LastFingerprint(r.out), LastFingerprint(clean.out)) << r.out;
  const std::string events = ReadText(save + "/events.jsonl");
  EXPECT_EQ(CountOf(events, "\"event\":\"restart\""), 2) << events;
  const std::string chronicle = ReadText(save + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("SIGKILL"), std::string::npos) << chronicle;
  EXPECT_NE(chronicle.find("keel hangs analyze"), std::string::npos) << chronicle;
  EXPECT_TRUE(fs::exists(save + "/hangs/iter_60")) << r.out;
  EXPECT_NE(ReadText(save + "/launch.status").find("finished"), std::string::npos);
}

TEST(NoLimboCliTest, MalformedFaultSpecIsAUsageError) {
  const KeelResult r = Train(1, "hang=soon", "--train-iters 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("'hang=soon' needs an iteration"), std::string::npos) << r.out;
}

}  // namespace
