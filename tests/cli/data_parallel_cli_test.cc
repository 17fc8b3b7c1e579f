// Data parallel end to end: `keel train` under `mpirun -np 2|3` (oversubscribed, one thread per
// rank) against the one-process run of the same global batch; ZeRO-1 on and off; a rank killed
// with SIGKILL; a crash inside a save on rank 1; resumes on other world sizes; the guard rolling
// back every rank. Every mpirun runs under `timeout`, so a hang fails the test instead of CI.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/shard_range.h"
#include "keel_process.h"

namespace {

using keel_test::FreshTempDir;
using keel_test::KeelResult;
using keel_test::ReadText;
using keel_test::RunShell;
namespace fs = std::filesystem;

const std::string kModel = keel_test::kDataParallelModel;

using keel_test::Mpirun;

KeelResult Train(int np, const std::string& args) {
  const std::string keel = std::string(KEEL_BINARY) + " " + kModel + " " + args;
  if (np == 1) return RunShell(keel);
  return RunShell(Mpirun(np) + keel);
}

// Rank 1 alone runs with `env` set (a per-rank fault), through a shell.
KeelResult TrainWithRank1Env(int np, const std::string& env, const std::string& args) {
  const std::string keel = std::string(KEEL_BINARY) + " " + kModel + " " + args;
  return RunShell(Mpirun(np) + "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then export " + env +
                  "; fi; exec " + keel + "'");
}

std::string Fingerprint(const std::string& out) {
  const std::smatch m = [&] {
    std::smatch r;
    std::regex_search(out, r, std::regex("state fingerprint: ([0-9a-f]{16})"));
    return r;
  }();
  return m.empty() ? "(none)" : m[1].str();
}

// The lm loss of every iteration line, in order.
std::vector<double> Losses(const std::string& out) {
  std::vector<double> v;
  const std::regex re(R"(iteration +\d+/ +\d+ \|.*\| lm loss: ([0-9.E+-]+) \|)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it)
    v.push_back(std::stod((*it)[1]));
  return v;
}

double MaxDiff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// The lm loss of every training record of a run's metrics.jsonl, at full precision.
std::vector<double> MetricsLosses(const std::string& run) {
  std::vector<double> v;
  std::istringstream in(ReadText(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "train") v.push_back(j["lm_loss"].get<double>());
  }
  return v;
}

TEST(DataParallelCliTest, LossesMatchOneProcessAndRepeatRunsAreBitIdentical) {
  const std::string dir = FreshTempDir("dp_losses");
  const KeelResult one = Train(1, "--train-iters 50 --save " + dir + "/one");
  const KeelResult two = Train(2, "--train-iters 50 --save " + dir + "/two");
  const KeelResult again = Train(2, "--train-iters 50");
  const KeelResult three = Train(3, "--train-iters 50 --save " + dir + "/three");
  for (const KeelResult* r : {&one, &two, &again, &three}) ASSERT_EQ(r->code, 0) << r->out;
  EXPECT_NE(two.out.find("data parallel: MPI (Open MPI"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("rank 0 of 2"), std::string::npos);
  const std::vector<double> l1 = MetricsLosses(dir + "/one");
  ASSERT_EQ(l1.size(), 50u) << one.out;
  // Only the order of the fp32 gradient sums differs (each rank accumulates its micro-batches,
  // then the ranks' sums are added): the losses agree to fp32 summation tolerance.
  const double d2 = MaxDiff(l1, MetricsLosses(dir + "/two"));
  const double d3 = MaxDiff(l1, MetricsLosses(dir + "/three"));
  std::printf("max |loss(DP=1) - loss(DP=2)| = %.3g, DP=3: %.3g over 50 iterations\n", d2, d3);
  EXPECT_LT(d2, 1e-5);
  EXPECT_LT(d3, 1e-5);
  EXPECT_EQ(Fingerprint(two.out), Fingerprint(again.out));
  // The iteration line is printed once (rank 0); rank 1 writes its own log.
  EXPECT_EQ(Losses(two.out).size(), 50u);
  const std::string rank1 = ReadText(dir + "/two/logs/rank-001.log");
  EXPECT_NE(rank1.find("rank 1 of 2"), std::string::npos) << rank1;
  EXPECT_TRUE(fs::exists(dir + "/two/logs/rank-000.log"));
  EXPECT_TRUE(fs::exists(dir + "/two/iter_0000050/optimizer.rank-001-of-002.safetensors"));
}

TEST(DataParallelCliTest, ZeroOneGivesTheSameBitsWithMomentsDividedByTheRanks) {
  const std::string dir = FreshTempDir("dp_zero");
  const KeelResult on = Train(2, "--train-iters 20 --save " + dir + "/on");
  const KeelResult off =
      Train(2, "--train-iters 20 --use-distributed-optimizer=false --save " + dir + "/off");
  ASSERT_EQ(on.code, 0) << on.out;
  ASSERT_EQ(off.code, 0) << off.out;
  // The same element-wise Adam on the same reduced gradients: identical weights and moments.
  EXPECT_EQ(Fingerprint(on.out), Fingerprint(off.out));
  std::smatch m;
  const std::string log_on = ReadText(dir + "/on/logs/rank-001.log");
  const std::string log_off = ReadText(dir + "/off/logs/rank-001.log");
  const std::regex re(R"(holds the Adam moments of (\d+) of (\d+) parameters)");
  ASSERT_TRUE(std::regex_search(log_on, m, re)) << log_on;
  const size_t held_on = std::stoull(m[1]), n = std::stoull(m[2]);
  ASSERT_TRUE(std::regex_search(log_off, m, re)) << log_off;
  const size_t held_off = std::stoull(m[1]);
  EXPECT_EQ(held_off, n);
  EXPECT_EQ(held_on, keel::ShardOf(n, 1, 2).size());
  EXPECT_LE(held_on, n / 2 + 16);
  std::printf("Adam moments per rank: ZeRO-1 %zu of %zu parameters (%.3f of the replicated)\n",
              held_on, n, static_cast<double>(held_on) / held_off);
}

TEST(DataParallelCliTest, KilledRankEndsEveryRankAndTheRunResumesBitIdentically) {
  const std::string dir = FreshTempDir("dp_kill");
  const std::string args = "--train-iters 400 --save-interval 20 --log-interval 50 --save ";
  const KeelResult full = Train(2, args + dir + "/full");
  ASSERT_EQ(full.code, 0) << full.out;
  // Kill rank 1 with SIGKILL once a checkpoint exists.
  const std::string run = dir + "/run";
  std::string out;
  std::thread t([&] { out = Train(2, args + run).out + "\n(exit)"; });
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(run + "/latest_checkpointed_iteration.txt") &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const KeelResult pid = RunShell("pgrep -f 'keel.*--save " + run + "$' | tail -1");
  ASSERT_FALSE(pid.out.empty());
  const auto killed = std::chrono::steady_clock::now();
  RunShell("kill -9 " + pid.out);
  t.join();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::printf("every rank exited %.2f s after kill -9 of one\n", secs);
  EXPECT_LT(secs, 10.0) << out;
  EXPECT_EQ(out.find("training finished"), std::string::npos) << out;
  const KeelResult resumed = Train(2, args + run);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  EXPECT_EQ(Fingerprint(resumed.out), Fingerprint(full.out));
}

TEST(DataParallelCliTest, AnErrorOnOneRankEndsEveryRankWithItsExitCode) {
  // Rank 1 alone is given a malformed fault hook: it fails before the run opens, while rank 0
  // goes on into the run's first collective.
  const auto t0 = std::chrono::steady_clock::now();
  const KeelResult r = TrainWithRank1Env(2, "KEEL_TRAIN_FAULTS=bogus", "--train-iters 20");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("[rank 1] error: rank 1 failed (exit 2); ending every rank of the job"),
            std::string::npos)
      << r.out;
  EXPECT_LT(secs, 10.0) << r.out;
}

TEST(DataParallelCliTest, AKillSwitchAtStartStopsEveryRankBeforeAnyWork) {
  const std::string dir = FreshTempDir("dp_kill_switch");
  RunShell("touch " + dir + "/stop");
  const KeelResult r =
      Train(2, "--train-iters 20 --kill-switch-path " + dir + "/stop --save " + dir + "/run");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("exists: not training"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/run/latest_checkpointed_iteration.txt"));
}

TEST(DataParallelCliTest, CrashInsideASaveOnRank1LeavesThePreviousCheckpoint) {
  const std::string dir = FreshTempDir("dp_crash_save");
  const std::string args = "--train-iters 60 --save-interval 20 --log-interval 20 --save ";
  const KeelResult full = Train(2, args + dir + "/full");
  ASSERT_EQ(full.code, 0) << full.out;
  // Rank 1 dies while writing its moments of the second save (iteration 40).
  const std::string run = dir + "/run";
  const KeelResult crashed =
      TrainWithRank1Env(2, "KEEL_FAULT_INJECTION=crash-at=60:optimizer.rank-001", args + run);
  EXPECT_NE(crashed.code, 0) << crashed.out;
  EXPECT_EQ(ReadText(run + "/latest_checkpointed_iteration.txt"), "20\n");
  EXPECT_TRUE(fs::exists(run + "/.tmp.iter_0000040"));
  const KeelResult verify = RunShell(std::string(KEEL_BINARY) + " ckpt verify " + run);
  EXPECT_EQ(verify.code, 0) << verify.out;
  const KeelResult resumed = Train(2, args + run);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from " + run + "/iter_0000020"), std::string::npos)
      << resumed.out;
  EXPECT_EQ(Fingerprint(resumed.out), Fingerprint(full.out));
}

TEST(DataParallelCliTest, CheckpointsResumeOnAnotherWorldSize) {
  const std::string dir = FreshTempDir("dp_world");
  const std::string args = "--train-iters 30 --save-interval 10 --save ";
  const KeelResult full = Train(2, args + dir + "/full");
  ASSERT_EQ(full.code, 0) << full.out;
  const std::vector<double> ref = Losses(full.out);
  ASSERT_EQ(ref.size(), 30u);
  // Saved by 2 ranks at iteration 10, continued by 1 and by 3.
  ASSERT_EQ(Train(2, "--exit-interval 10 " + args + dir + "/a").code, 0);
  fs::copy(dir + "/a", dir + "/b", fs::copy_options::recursive);
  for (const auto& [np, run] : {std::pair{1, "/a"}, std::pair{3, "/b"}}) {
    const KeelResult r = Train(np, args + dir + run);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("was saved by 2 data-parallel ranks; this run has " + std::to_string(np)),
              std::string::npos)
        << r.out;
    const std::vector<double> l = Losses(r.out);
    ASSERT_EQ(l.size(), 20u) << r.out;
    EXPECT_LT(MaxDiff(std::vector<double>(ref.begin() + 10, ref.end()), l), 2e-4);
  }
  // Saved by 3 ranks at iteration 10, continued by 2.
  ASSERT_EQ(Train(3, "--exit-interval 10 " + args + dir + "/c").code, 0);
  const KeelResult c = Train(2, args + dir + "/c");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("was saved by 3 data-parallel ranks; this run has 2"), std::string::npos);
  // The tools read sharded checkpoints: verify, inspect a moment, diff across world sizes.
  const std::string k = KEEL_BINARY;
  KeelResult r = RunShell(k + " ckpt verify " + dir + "/c");
  EXPECT_EQ(r.code, 0) << r.out;
  r = RunShell(k + " ckpt inspect " + dir +
               "/b/iter_0000030 optimizer.exp_avg.final_layernorm.bias");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("optimizer.exp_avg.final_layernorm.bias"), std::string::npos) << r.out;
  // iteration 30 written by 1 rank (/a) and by 3 ranks (/b): the same tensors, close values.
  r = RunShell(k + " ckpt diff " + dir + "/a/iter_0000030 " + dir + "/b/iter_0000030");
  EXPECT_EQ(r.out.find("only in"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tensors differ"), std::string::npos) << r.out;
}

TEST(DataParallelCliTest, GuardRollsBackEveryRankOnAPoisonedWindowOfOneRank) {
  const std::string dir = FreshTempDir("dp_guard");
  const std::string args =
      "--guard act --guard-max-data-skips 3 --train-iters 150 --save-interval 20 --log-interval 10 "
      "--lr 5e-3 --save " +
      dir + "/run";
  const KeelResult r = TrainWithRank1Env(2, "KEEL_TRAIN_FAULTS=poison=61-72", args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rolled back to iteration 60"), std::string::npos) << r.out;
  // One journal entry per decision (rank 0 writes the journal).
  std::istringstream events(ReadText(dir + "/run/events.jsonl"));
  int rollbacks = 0;
  for (std::string line; std::getline(events, line);)
    if (nlohmann::json::parse(line)["event"] == "rollback") ++rollbacks;
  EXPECT_EQ(rollbacks, 1);
  // Rank 1 made the same decision and loaded the same checkpoint.
  const std::string rank1 = ReadText(dir + "/run/logs/rank-001.log");
  EXPECT_NE(rank1.find("rolled back to iteration 60"), std::string::npos) << rank1;
}

// Rerun before acting, across ranks: rank 1 computes iteration 70 once on a corrupted weight.
// The all-reduced loss spikes; every rank computes its part again, and the one whose own sum
// differs is named: a transient fault on rank 1, its update skipped on every rank, no rollback.
TEST(DataParallelCliTest, TransientFaultIsPinnedOnTheRankWhoseArithmeticFailed) {
  const std::string dir = FreshTempDir("dp_transient");
  const KeelResult r =
      TrainWithRank1Env(2, "KEEL_TRAIN_FAULTS=corrupt=70:rank=1",
                        "--guard act --train-iters 100 --save-interval 50 --log-interval 10 "
                        "--lr 5e-3 --save " +
                            dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream events(ReadText(dir + "/run/events.jsonl"));
  int transient = 0, other = 0;
  for (std::string line; std::getline(events, line);) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e["event"] == "transient_fault") {
      ++transient;
      EXPECT_EQ(e["iteration"], 70);
      EXPECT_EQ(e["ranks"], nlohmann::json({1}));
    } else if (e["event"] == "detected" || e["event"] == "skip_update" ||
               e["event"] == "rollback" || e["event"] == "stop") {
      ++other;  // the guard's other decisions: none (stragglers and throughput may be noted)
    }
  }
  EXPECT_EQ(transient, 1) << ReadText(dir + "/run/events.jsonl");
  EXPECT_EQ(other, 0) << ReadText(dir + "/run/events.jsonl");
  EXPECT_NE(
      ReadText(dir + "/run/CHRONICLE.md").find("a transient fault in the arithmetic on rank 1"),
      std::string::npos);
}

}  // namespace
