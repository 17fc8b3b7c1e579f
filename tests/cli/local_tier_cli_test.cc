// The local checkpoint tier end to end (--non-persistent-save-interval, docs/checkpoints.md): a
// run killed with its persistent checkpoint 40 iterations old and a local one 5 old resumes from
// the local one (the log says so) to the same state fingerprint as a run never interrupted; under
// mpirun -np 2, with rank 1's local directory deleted, from rank 1's replica on rank 0; flags
// that cannot work exit 2 naming the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>

#include "keel_process.h"

namespace {

namespace fs = std::filesystem;
using keel_test::KeelResult;
using keel_test::RunShell;

const std::string kModel =
    "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 1 "
    "--eval-interval 1000 --eval-iters 1 --sample-tokens 0 --threads 1 --train-iters 100 "
    "--save-interval 50";

std::string Fingerprint(const std::string& out) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("state fingerprint: ([0-9a-f]{16})")) ? m[1].str()
                                                                                    : "";
}

// Iteration lines (timings aside) after iteration `from`.
std::string IterationsAfter(const std::string& out, int from) {
  std::istringstream in(out);
  std::string kept;
  std::smatch m;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, m, std::regex("^ iteration +([0-9]+)/")) && std::stoi(m[1]) > from)
      kept += keel_test::WithoutTimings(line) + "\n";
  return kept;
}

KeelResult Train(int np, const std::string& args, const std::string& env = "") {
  const std::string cmd = std::string(KEEL_BINARY) + " " + kModel + " " + args;
  return RunShell(env + (env.empty() ? "" : " ") + (np == 1 ? cmd : keel_test::Mpirun(np) + cmd));
}

void KilledWithALocalCheckpoint5AndAPersistent40IterationsOld(int np) {
  const std::string dir = keel_test::FreshTempDir("local_tier_" + std::to_string(np));
  const KeelResult ref = Train(np, "--save " + dir + "/ref");
  ASSERT_EQ(ref.code, 0) << ref.out;
  const std::string args = "--save " + dir + "/run --non-persistent-save-interval 5 " +
                           "--non-persistent-local-ckpt-dir " + dir + "/local";
  // Killed (SIGKILL) at the local save of iteration 95: persistent 50, local 85 and 90.
  const KeelResult killed = Train(np, args, "KEEL_FAULT_INJECTION=crash-at=1:iter_0000095");
  ASSERT_NE(killed.code, 0) << killed.out;
  ASSERT_NE(killed.out.find("saved local checkpoint 90"), std::string::npos) << killed.out;
  if (np == 2) {
    // Rank 1's node loses its local storage (its piece and its replica of rank 0's).
    int removed = 0;
    for (const auto& run : fs::directory_iterator(dir + "/local"))
      removed += static_cast<int>(fs::remove_all(run.path() / "rank-1-of-2"));
    ASSERT_GT(removed, 0);
  }
  const KeelResult resumed = Train(np, args);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("note: resuming from the local tier: iteration 90"), std::string::npos)
      << resumed.out;
  EXPECT_NE(resumed.out.find("--save's newest valid checkpoint is iteration 50, older"),
            std::string::npos);
  if (np == 2) {
    EXPECT_NE(resumed.out.find("rank 1's piece from its replica on rank 0"), std::string::npos)
        << resumed.out;
  }
  EXPECT_NE(resumed.out.find("(local tier): iteration 90"), std::string::npos);
  EXPECT_EQ(IterationsAfter(resumed.out, 0), IterationsAfter(ref.out, 90));
  EXPECT_EQ(Fingerprint(resumed.out), Fingerprint(ref.out));
  EXPECT_FALSE(Fingerprint(ref.out).empty());
  // The chronicle names the tier.
  EXPECT_NE(keel_test::ReadText(dir + "/run/CHRONICLE.md").find("resumed (local tier) from"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(LocalTierCliTest, AKilledRunResumesFromTheLocalCheckpointNotThe40IterationsOlderOne) {
  KilledWithALocalCheckpoint5AndAPersistent40IterationsOld(1);
}

TEST(LocalTierCliTest, UnderMpirunALostLocalDirectoryIsRestoredFromItsReplica) {
  KilledWithALocalCheckpoint5AndAPersistent40IterationsOld(2);
}

TEST(LocalTierCliTest, FlagsThatCannotWorkExit2NamingTheFix) {
  const std::string dir = keel_test::FreshTempDir("local_tier_flags");
  const std::pair<std::string, std::string> cases[] = {
      {"--non-persistent-ckpt-type global", "keel has only the type local"},
      {"--save " + dir + "/a --non-persistent-save-interval 5",
       "needs --non-persistent-local-ckpt-dir DIR"},
      {"--non-persistent-save-interval 5 --non-persistent-local-ckpt-dir " + dir + "/l",
       "needs --save DIR"},
      {"--non-persistent-local-ckpt-dir " + dir + "/l",
       "saves nothing without --non-persistent-save-interval N"},
      {"--save " + dir + "/a --non-persistent-save-interval 60 --non-persistent-local-ckpt-dir " +
           dir + "/l",
       "is not shorter than --save-interval 50"},
      {"--save " + dir + "/b --non-persistent-save-interval 5 --non-persistent-local-ckpt-dir " +
           "/proc/keel-local",
       "--non-persistent-local-ckpt-dir /proc/keel-local is not writable on rank 0"},
      // Refused by the config check, before mpirun would matter: no rank count needed.
      {"--save " + dir + "/c --non-persistent-save-interval 5 --non-persistent-local-ckpt-dir " +
           dir + "/l --tensor-model-parallel-size 2",
       "--non-persistent-save-interval 5 with --tensor-model-parallel-size 2: keel's local tier "
       "saves data-parallel runs only so far"},
      {"--save " + dir + "/c --non-persistent-save-interval 5 --non-persistent-local-ckpt-dir " +
           dir + "/l --pipeline-model-parallel-size 2",
       "--non-persistent-save-interval 5 with --pipeline-model-parallel-size 2: keel's local "
       "tier saves data-parallel runs only so far (tensor and pipeline model parallel sizes 1); "
       "drop --non-persistent-save-interval and --non-persistent-local-ckpt-dir"},
  };
  for (const auto& [args, fix] : cases) {
    const KeelResult r = Train(1, args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(fix), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(dir + "/c"));  // refused before anything was written
  fs::remove_all(dir);
}

}  // namespace
