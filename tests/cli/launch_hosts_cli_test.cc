// Issue 33: `keel launch --hostfile FILE --spare-hosts N` with a real `keel train`. The "hosts"
// are played on this machine: tests/cli/hosts/mpirun (a stand-in named mpirun) takes the
// hostfile launch writes for each attempt and starts every rank through the real mpirun with
// KEEL_TEST_HOSTNAME set to its host, so hang dumps, straggler events and lock files name the
// hosts of the hostfile, and KEEL_TRAIN_FAULTS's host= key fails one of them.
//   (a) a rank on host h2 hangs at iteration 30: the spare h4 takes its place and the run ends
//       with the uninterrupted run's state fingerprint; the journal names h2 with the hang dump;
//   (b) no spare: with --elastic the job ends on 2 ranks, global batch unchanged, losses within
//       tolerance; without it launch stops naming the host and the flag;
//   (d) a host slowed for a long time is named a straggler, excluded at the next checkpoint, and
//       the job goes on on the spare.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "keel_process.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using keel_test::KeelResult;
using keel_test::ReadText;

const std::string kModel = keel_test::kDataParallelModel + " --log-interval 10";
// The watchdog ends a hang within seconds; the first iteration may take longer on a busy machine.
const std::string kHang =
    " --distributed-timeout-minutes 0.0667 --first-iteration-timeout-minutes 1";

std::string Mpirun() {
  return std::string(KEEL_SOURCE_DIR) + "/tests/cli/hosts/mpirun";
}

std::vector<json> Events(const std::string& run, const std::string& kind) {
  std::vector<json> out;
  std::istringstream in(ReadText(run + "/events.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (const json e = json::parse(line); e.value("event", "") == kind) out.push_back(e);
  return out;
}

std::string Fingerprint(const std::string& out) {
  static const std::regex re("state fingerprint: ([0-9a-f]{16})");
  std::string last;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it)
    last = (*it)[1].str();
  return last;
}

// The iteration line of `it`: its lm loss and global batch size.
bool IterationLine(const std::string& out, int it, double* loss, int* batch) {
  std::smatch m;
  const std::regex re("iteration +" + std::to_string(it) +
                      "/[^\\n]*global batch size: +([0-9]+) \\| lm loss: ([0-9.E+-]+)");
  for (auto i = std::sregex_iterator(out.begin(), out.end(), re); i != std::sregex_iterator(); ++i)
    m = *i;
  if (m.empty()) return false;
  *batch = std::stoi(m[1]);
  *loss = std::stod(m[2]);
  return true;
}

#if defined(KEEL_SANITIZED_BUILD)
const char* const kEnv = "ASAN_OPTIONS=detect_leaks=0 ";
#else
const char* const kEnv = "";
#endif

class LaunchHostsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = keel_test::FreshTempDir(std::string("launch_hosts_") +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    run_ = dir_ + "/run";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Hosts(const std::string& names) {
    const std::string path = dir_ + "/hosts";
    std::ofstream f(path);
    std::istringstream in(names);
    for (std::string h; in >> h;) f << h << " slots=1\n";
    return path;
  }

  // keel launch LAUNCH_ARGS -- mpirun -np NP keel train ... with KEEL_TRAIN_FAULTS=faults.
  KeelResult Launch(const std::string& faults, const std::string& launch_args, int np,
                    const std::string& train_args) {
    return keel_test::RunShell(std::string(kEnv) + "KEEL_TRAIN_FAULTS=" + faults + " timeout 300 " +
                               KEEL_BINARY + " launch --backoff-seconds 0 " + launch_args + " -- " +
                               Mpirun() + " -np " + std::to_string(np) + " " + KEEL_BINARY + " " +
                               kModel + " " + train_args + " --save " + run_);
  }

  // The uninterrupted run on 3 ranks, once for the suite.
  static const KeelResult& Uninterrupted() {
    static const KeelResult r = [] {
      const std::string save = keel_test::FreshTempDir("launch_hosts_uninterrupted");
      KeelResult k = keel_test::RunShell(keel_test::Mpirun(3) + KEEL_BINARY + " " + kModel +
                                         " --train-iters 40 --save-interval 10 --save " + save);
      fs::remove_all(save);
      return k;
    }();
    return r;
  }

  std::string dir_, run_;
};

TEST_F(LaunchHostsCliTest, AHungHostIsReplacedByTheSpareAndTheRunEndsBitExact) {
  const KeelResult& base = Uninterrupted();
  ASSERT_EQ(base.code, 0) << base.out;
  const KeelResult r =
      Launch("hang=30:host=h2", "--hostfile " + Hosts("h1 h2 h3 h4") + " --spare-hosts 1", 3,
             "--train-iters 40 --save-interval 10" + kHang);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Fingerprint(r.out), Fingerprint(base.out)) << r.out;
  EXPECT_FALSE(Fingerprint(r.out).empty());
  const std::vector<json> blame = Events(run_, "host_blame");
  ASSERT_EQ(blame.size(), 1u) << r.out;
  EXPECT_EQ(blame[0]["host"], "h2");
  EXPECT_EQ(blame[0]["blame"], "hang");
  EXPECT_EQ(blame[0]["rank"], 1);
  EXPECT_EQ(blame[0]["source"], run_ + "/hangs/iter_30");
  EXPECT_NE(blame[0]["evidence"].get<std::string>().find("rank 1 (host h2)"), std::string::npos)
      << blame[0];
  const std::vector<json> out = Events(run_, "host_excluded");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["host"], "h2");
  EXPECT_EQ(out[0]["replaced_by"], "h4");
  const std::vector<json> hosts = Events(run_, "launch_hosts");
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[1]["hosts"], json({"h1", "h4", "h3"}));
  EXPECT_EQ(hosts[1]["excluded"], json({"h2"}));
  EXPECT_NE(ReadText(run_ + "/launch.status").find("hosts h1,h4,h3 | spares - | excluded h2"),
            std::string::npos);
  EXPECT_NE(ReadText(run_ + "/CHRONICLE.md").find("pinned on host h2 (hang)"), std::string::npos);
}

// A bit flipped in the weights of the rank on h3 (memory that corrupts): the replica check of the
// save at iteration 20 names h3, the spare takes its place, and the resume from iteration 10 ends
// with the uninterrupted run's fingerprint.
TEST_F(LaunchHostsCliTest, AReplicaMismatchOnAHostSwapsInTheSpareAndEndsBitExact) {
  const KeelResult& base = Uninterrupted();
  ASSERT_EQ(base.code, 0) << base.out;
  const KeelResult r =
      Launch("bitflip=20:host=h3", "--hostfile " + Hosts("h1 h2 h3 h4") + " --spare-hosts 1", 3,
             "--train-iters 40 --save-interval 10");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Fingerprint(r.out), Fingerprint(base.out)) << r.out;
  const std::vector<json> blame = Events(run_, "host_blame");
  ASSERT_EQ(blame.size(), 1u) << r.out;
  EXPECT_EQ(blame[0]["host"], "h3");
  EXPECT_EQ(blame[0]["blame"], "replica_mismatch");
  const std::vector<json> out = Events(run_, "host_excluded");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["replaced_by"], "h4");
}

TEST_F(LaunchHostsCliTest, WithoutASpareElasticGoesOnWithTwoRanksAndWithoutItLaunchStops) {
  const KeelResult& base = Uninterrupted();
  ASSERT_EQ(base.code, 0) << base.out;
  KeelResult r = Launch("hang=30:host=h2", "--hostfile " + Hosts("h1 h2 h3") + " --elastic", 3,
                        "--train-iters 40 --save-interval 10" + kHang);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<json> out = Events(run_, "host_excluded");
  ASSERT_EQ(out.size(), 1u) << r.out;
  EXPECT_EQ(out[0]["ranks_before"], 3);
  EXPECT_EQ(out[0]["ranks_after"], 2);
  EXPECT_NE(r.out.find("rank 0 of 2"), std::string::npos) << r.out;
  double loss = 0, base_loss = 0;
  int batch = 0, base_batch = 0;
  ASSERT_TRUE(IterationLine(r.out, 40, &loss, &batch)) << r.out;
  ASSERT_TRUE(IterationLine(base.out, 40, &base_loss, &base_batch)) << base.out;
  EXPECT_EQ(batch, 12);
  EXPECT_EQ(batch, base_batch);
  EXPECT_NEAR(loss, base_loss, 1e-3 * base_loss);  // another reduction order: not bit for bit
  EXPECT_NE(ReadText(run_ + "/CHRONICLE.md").find("the global batch and the LR schedule stay"),
            std::string::npos);

  fs::remove_all(run_);
  r = Launch("hang=30:host=h2", "--hostfile " + Hosts("h1 h2 h3"), 3,
             "--train-iters 40 --save-interval 10" + kHang);
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("host h2 is excluded (hang"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--elastic to go on with fewer data-parallel ranks"), std::string::npos)
      << r.out;
  EXPECT_EQ(Events(run_, "launch_hosts").size(), 1u);  // not restarted
}

// Issue 33 (d). The 10% is below what this shared 2-core machine measures reliably (a
// healthy rank was once 9% slower for 100 iterations, no_limbo_cli_test.cc): the host sleeps 50%
// of its compute time against a 25% threshold, as the straggler tests do.
TEST_F(LaunchHostsCliTest, ASlowHostIsExcludedAtTheNextCheckpointAndTheJobGoesOn) {
#if defined(KEEL_SANITIZED_BUILD)
  GTEST_SKIP() << "timing test: sanitizers slow the ranks unevenly";
#endif
  const KeelResult r = Launch(
      "slow=0.5:host=h2",
      "--hostfile " + Hosts("h1 h2 h3") + " --spare-hosts 1 --straggler-exclude-minutes 0.01", 2,
      "--train-iters 100 --save-interval 10 --straggler-window 2 --straggler-threshold 0.25");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<json> named = Events(run_, "straggler");
  ASSERT_FALSE(named.empty()) << r.out;
  EXPECT_EQ(named[0]["host"], "h2");
  const std::vector<json> out = Events(run_, "host_excluded");
  ASSERT_EQ(out.size(), 1u) << r.out;
  EXPECT_EQ(out[0]["host"], "h2");
  EXPECT_EQ(out[0]["blame"], "straggler");
  EXPECT_EQ(out[0]["replaced_by"], "h3");
  // Stopped right after a checkpoint (it saved again on the way out): nothing lost.
  const std::vector<json> restarts = Events(run_, "restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["lost_iterations"], 0);
  EXPECT_EQ(ReadText(run_ + "/latest_checkpointed_iteration.txt"), "100\n");
}

// Under srun without --hostfile the hosts are Slurm's node list: the spare is left out of
// --nodelist, the command's --nodes replaced.
TEST_F(LaunchHostsCliTest, UnderSrunTheHostsAreSlurmsNodeList) {
  fs::create_directories(dir_ + "/bin");
  const std::string srun = dir_ + "/bin/srun";
  std::ofstream(srun) << "#!/bin/sh\necho \"$*\" > " << dir_ << "/srun-args\n";
  fs::permissions(srun, fs::perms::owner_all);
  const KeelResult r =
      keel_test::RunShell("SLURM_JOB_NODELIST='gpu[07-09]' SLURM_NTASKS_PER_NODE=4 timeout 60 " +
                          std::string(KEEL_BINARY) + " launch --spare-hosts 1 -- " + srun +
                          " --mpi=pmix -N 3 --ntasks=8 " + KEEL_BINARY + " train --save " + run_);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: keel launch takes the hosts from SLURM_JOB_NODELIST=gpu[07-09] (3 "
                       "nodes, 4 tasks each)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(ReadText(dir_ + "/srun-args"),
            "--nodelist=gpu07,gpu08 --nodes=2 --mpi=pmix --ntasks=8 " + std::string(KEEL_BINARY) +
                " train --save " + run_ + "\n");
  EXPECT_NE(ReadText(run_ + "/launch.status").find("hosts gpu07,gpu08 | spares gpu09"),
            std::string::npos);
}

TEST_F(LaunchHostsCliTest, HostArgumentErrorsExitTwoNamingTheFix) {
  const std::string tail = " -- " + Mpirun() + " -np 2 " + KEEL_BINARY + " train --save " + run_;
  std::ofstream(dir_ + "/bad") << "h1\nh2 slots=two\n";
  KeelResult r =
      keel_test::RunShell(std::string(KEEL_BINARY) + " launch --hostfile " + dir_ + "/bad" + tail);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("bad line 2: 'slots=two' needs a whole number"), std::string::npos) << r.out;
  r = keel_test::RunShell(std::string(KEEL_BINARY) + " launch --spare-hosts 1" + tail);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("need the hosts: give --hostfile FILE"), std::string::npos) << r.out;
  r = keel_test::RunShell(std::string(KEEL_BINARY) + " launch --hostfile " + Hosts("h1 h2") +
                          " -- " + Mpirun() + " --host h1,h2 -np 2 " + KEEL_BINARY +
                          " train --save " + run_);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the command's '--host' chooses hosts"), std::string::npos) << r.out;
  r = keel_test::RunShell(std::string(KEEL_BINARY) + " launch --hostfile " + Hosts("h1 h2") +
                          " --readmit-after soon" + tail);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--readmit-after 'soon' is not a duration"), std::string::npos) << r.out;
  r = keel_test::RunShell(std::string(KEEL_BINARY) + " launch --hostfile " + Hosts("h1 h2") +
                          " --spare-hosts 2" + tail);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--spare-hosts 2 leaves no host to run on"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(run_ + "/events.jsonl"));  // nothing started
}

}  // namespace
