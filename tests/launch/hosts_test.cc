// keel launch's hosts: Open MPI's hostfile format and its errors, Slurm's node lists, the command
// of an attempt (mpirun --hostfile, srun --nodelist, the rank count), the refusal of a command
// that chooses hosts itself, and the launcher's report of a dead rank as evidence.
#include "launch/hosts.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "launch/blame.h"
#include "launch/job_settings.h"

namespace keel {
namespace {

TEST(HostsTest, ParsesOpenMpiHostfiles) {
  std::vector<HostEntry> h;
  ASSERT_TRUE(
      ParseHostfile("# the job\nn1 slots=4\n\n  n2 slots=2 max_slots=8 # spare\nn3\n", "hosts", &h)
          .ok());
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].name, "n1");
  EXPECT_EQ(h[0].slots, 4);
  EXPECT_EQ(h[1].slots, 2);
  EXPECT_EQ(h[1].extra, "max_slots=8");
  EXPECT_EQ(h[2].slots, 1);
  EXPECT_EQ(FormatHostfile(h), "n1 slots=4\nn2 slots=2 max_slots=8\nn3 slots=1\n");
}

TEST(HostsTest, HostfileErrorsNameTheLineAndTheFix) {
  std::vector<HostEntry> h;
  Status st = ParseHostfile("n1\nn2 slots=x\n", "hosts", &h);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("hosts line 2: 'slots=x' needs a whole number"), std::string::npos)
      << st.message();
  st = ParseHostfile("n1\n# c\nn1 slots=2\n", "hosts", &h);
  EXPECT_NE(st.message().find("hosts line 3: host n1 is listed twice"), std::string::npos)
      << st.message();
  st = ParseHostfile("n1 cpu\n", "hosts", &h);
  EXPECT_NE(st.message().find("line 1: 'cpu' after the host name is not KEY=VALUE"),
            std::string::npos)
      << st.message();
  st = ParseHostfile("# nothing\n", "hosts", &h);
  EXPECT_NE(st.message().find("lists no host"), std::string::npos) << st.message();
}

TEST(HostsTest, ExpandsSlurmNodeLists) {
  std::vector<std::string> n;
  ASSERT_TRUE(ExpandSlurmNodeList("node[01-03,07],gpu5,rack[1-2]x", &n).ok());
  EXPECT_EQ(n, (std::vector<std::string>{"node01", "node02", "node03", "node07", "gpu5", "rack1x",
                                         "rack2x"}));
  EXPECT_FALSE(ExpandSlurmNodeList("node[01-03", &n).ok());
  EXPECT_FALSE(ExpandSlurmNodeList("node[3-1]", &n).ok());
  EXPECT_FALSE(ExpandSlurmNodeList("node[a]", &n).ok());
}

// Found by fuzz/launch_hosts_fuzz: each range was capped at 100000 nodes but not the list, so 300
// ranges in 2.4 KB expanded to 30 million names (a hang, then out of memory); and a long prefix
// or zero padding made names of any length.
TEST(HostsTest, SlurmNodeListIsCappedInNodesAndNameLength) {
  std::vector<std::string> n;
  ASSERT_TRUE(ExpandSlurmNodeList("n[0-49999],m[0-49999]", &n).ok());
  EXPECT_EQ(n.size(), 100000u);
  std::string many = "node-long-prefix-name[0-99999";
  for (int i = 0; i < 299; ++i) many += ",0-99999";
  Status st = ExpandSlurmNodeList(many + "]", &n);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("names more than 100000 nodes"), std::string::npos) << st.message();
  st = ExpandSlurmNodeList("n[0-49999],m[0-49999],x", &n);
  EXPECT_NE(st.message().find("names more than 100000 nodes"), std::string::npos) << st.message();
  st = ExpandSlurmNodeList(std::string(251, 'n') + "[1-99999]", &n);  // n...n99999: 256
  EXPECT_NE(st.message().find("has 256 characters, more than a host name can (255)"),
            std::string::npos)
      << st.message();
  st = ExpandSlurmNodeList("node[" + std::string(300, '0') + "1-2]", &n);  // zero padding
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  st = ExpandSlurmNodeList(std::string(256, 'a'), &n);
  EXPECT_NE(st.message().find("has 256 characters"), std::string::npos) << st.message();
  EXPECT_TRUE(ExpandSlurmNodeList(std::string(255, 'a'), &n).ok());
}

// Found by fuzz/launch_hosts_fuzz: numbers were read with strtol from c_str(), so a range holding
// a NUL ("[\0...") read as 0, and with it a second bracket inside the first gave names holding
// ']' and ','; slots=1 followed by a NUL read as slots=1.
TEST(HostsTest, NodeNumbersAndSlotsAreDigitsOnly) {
  std::vector<std::string> n;
  for (const std::string& list :
       {std::string("[\0W\301\nnode[00,0-027],gp11]u5", 27), std::string("n[1\0x]", 6),
        std::string("n[+1]"), std::string("n[ 1-2]"), std::string("n[1-2[3]]")}) {
    const Status st = ExpandSlurmNodeList(list, &n);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << list;
  }
  std::vector<HostEntry> h;
  EXPECT_FALSE(ParseHostfile(std::string("n1 slots=1\0x\n", 13), "hosts", &h).ok());
}

TEST(HostsTest, RefusesACommandThatChoosesHostsItself) {
  for (const std::vector<std::string>& c :
       {std::vector<std::string>{"mpirun", "-H", "a,b", "-np", "2", "keel", "train"},
        {"mpirun", "--hostfile", "h", "keel", "train"},
        {"mpiexec", "--host=a", "keel", "train"},
        {"srun", "--nodelist=a", "keel", "train"},
        {"srun", "-x", "a", "keel", "train"}}) {
    const Status st = CheckCommandTakesHosts(c);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << c[1];
    EXPECT_NE(st.message().find("remove '" + c[1] + "' from the command"), std::string::npos)
        << st.message();
  }
  EXPECT_NE(CheckCommandTakesHosts({"keel", "train"}).message().find("mpirun"), std::string::npos);
  // keel train's own flags are not mpirun's.
  EXPECT_TRUE(CheckCommandTakesHosts({"mpirun", "-np", "2", "/bin/keel", "train", "-H"}).ok());
}

TEST(HostsTest, TheCommandOfAnAttempt) {
  const std::vector<HostEntry> hosts = {{"a", 1, ""}, {"c", 1, ""}};
  const std::vector<std::string> mpi = {"mpirun", "--oversubscribe", "-np", "3",
                                        "keel",   "train",           "-n",  "7"};
  EXPECT_EQ(CommandRankCount(mpi), 3);
  EXPECT_EQ(CommandForHosts(mpi, "H", hosts, -1),
            (std::vector<std::string>{"mpirun", "--hostfile", "H", "--oversubscribe", "-np", "3",
                                      "keel", "train", "-n", "7"}));
  EXPECT_EQ(CommandForHosts(mpi, "H", hosts, 2),
            (std::vector<std::string>{"mpirun", "--hostfile", "H", "--oversubscribe", "-np", "2",
                                      "keel", "train", "-n", "7"}));
  const std::vector<std::string> srun = {"srun",       "--mpi=pmix", "--nodes=3",
                                         "--ntasks=3", "keel",       "train"};
  EXPECT_EQ(CommandRankCount(srun), 3);
  EXPECT_EQ(CommandForHosts(srun, "", hosts, 2),
            (std::vector<std::string>{"srun", "--nodelist=a,c", "--nodes=2", "--mpi=pmix",
                                      "--ntasks=2", "keel", "train"}));
  EXPECT_EQ(
      CommandForHosts({"srun", "-N", "3", "keel"}, "", hosts, 2),
      (std::vector<std::string>{"srun", "--nodelist=a,c", "--nodes=2", "--ntasks=2", "keel"}));
  EXPECT_EQ(CommandModelParallelSize(
                {"keel", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size=2"}),
            4);
  EXPECT_EQ(CommandModelParallelSize({"keel", "--model-parallel-size=2"}), 2);
  EXPECT_EQ(CommandModelParallelSize({"keel", "train"}), 1);
}

TEST(HostsTest, FindsKeelTrainsArgumentsInTheCommand) {
  using V = std::vector<std::string>;
  EXPECT_EQ(CommandTrainArgs({"mpirun", "-np", "4", "build/keel", "train", "--save", "r"}),
            (V{"train", "--save", "r"}));
  EXPECT_EQ(CommandTrainArgs({"srun", "--ntasks=8", "keel", "train"}), (V{"train"}));
  EXPECT_EQ(CommandTrainArgs({"build/keel", "train", "--config", "c.toml"}),
            (V{"train", "--config", "c.toml"}));
  EXPECT_TRUE(CommandTrainArgs({"mpirun", "-np", "2", "./wrapper.sh", "--tensor"}).empty());
  EXPECT_TRUE(CommandTrainArgs({"keel", "launch"}).empty());
}

// The job's settings as keel train reads them: the --config file under the flags; a
// --train-samples run's length from its global batch; a wrapper's flags as written.
TEST(HostsTest, ReadsTheJobsSettingsFromItsConfigUnderItsFlags) {
  const std::string config = ::testing::TempDir() + "job_settings_" + std::to_string(getpid());
  std::ofstream(config) << "tensor-model-parallel-size = 2\npipeline-model-parallel-size = 2\n"
                           "global-batch-size = 32\ntrain-iters = 500\n";
  JobSettings j;
  ASSERT_TRUE(ReadJobSettings({"mpirun", "-np", "8", "keel", "train", "--config", config,
                               "--pipeline-model-parallel-size=1", "--micro-batch-size", "4"},
                              8, &j)
                  .ok());
  EXPECT_EQ(j.tensor, 2);
  EXPECT_EQ(j.pipeline, 1);
  EXPECT_EQ(j.global_batch, 32);
  EXPECT_EQ(j.micro_batch, 4);
  EXPECT_EQ(j.train_iters, 500);
  EXPECT_EQ(j.source, "keel train's --config " + config + " and flags");

  ASSERT_TRUE(ReadJobSettings({"mpirun", "-np", "2", "keel", "train", "--train-samples", "100",
                               "--global-batch-size", "8", "--micro-batch-size", "4"},
                              2, &j)
                  .ok());
  EXPECT_EQ(j.train_iters, 12);  // 100 / 8, floored as Megatron

  ASSERT_TRUE(ReadJobSettings({"mpirun", "-np", "4", "./run.sh", "--tensor-model-parallel-size",
                               "2", "--train-iters", "30"},
                              4, &j)
                  .ok());
  EXPECT_EQ(j.ModelParallel(), 2);
  EXPECT_EQ(j.train_iters, 30);
  EXPECT_EQ(j.global_batch, 0);

  Status st = ReadJobSettings({"keel", "train", "--config", config + ".missing"}, -1, &j);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--config " + config + ".missing: cannot read the file"),
            std::string::npos)
      << st.message();
  std::remove(config.c_str());
}

TEST(HostsTest, ParsesDurations) {
  double s = 0;
  EXPECT_TRUE(ParseDuration("90", &s) && s == 90);
  EXPECT_TRUE(ParseDuration("30m", &s) && s == 1800);
  EXPECT_TRUE(ParseDuration("2h", &s) && s == 7200);
  EXPECT_TRUE(ParseDuration("1d", &s) && s == 86400);
  EXPECT_FALSE(ParseDuration("2 hours", &s));
  EXPECT_FALSE(ParseDuration("-1", &s));
}

TEST(HostsTest, TheLaunchersReportOfADeadRankNamesItsHost) {
  Blame b = BlameFromLauncherOutput(
      "-----\nmpirun noticed that process rank 1 with PID 0 on node n2 exited on signal 9 "
      "(Killed).\n-----\n");
  EXPECT_EQ(b.kind, BlameKind::kCrash);
  EXPECT_EQ(b.host, "n2");
  EXPECT_EQ(b.rank, 1);
  EXPECT_NE(b.evidence.find("exited on signal 9 (Killed)"), std::string::npos) << b.evidence;
  b = BlameFromLauncherOutput("srun: error: gpu07: task 5: Killed\n");
  EXPECT_EQ(b.host, "gpu07");
  EXPECT_EQ(b.rank, 5);
  b = BlameFromLauncherOutput(
      "mpirun detected that one or more processes exited with non-zero "
      "status\n  Exit code:    2\n");
  EXPECT_EQ(b.kind, BlameKind::kNone);
}

// A replica mismatch names the host of the replica that differs from the majority; with two
// replicas there is none, and the failure is pinned on no host.
TEST(HostsTest, AReplicaMismatchIsPinnedOnlyWhenThereIsAMajority) {
  const std::string head =
      "{\"event\":\"replica_mismatch\",\"iteration\":20,\"message\":\"replica check at iteration "
      "20: rank 1 (host h2) differs in 1 of 9 tensors: w";
  Blame b = BlameFailure(Env::Default(), "/nonexistent", {head + "\"}"}, "");
  EXPECT_EQ(b.kind, BlameKind::kReplicaMismatch);
  EXPECT_EQ(b.host, "h2");
  EXPECT_EQ(b.rank, 1);
  b = BlameFailure(Env::Default(), "/nonexistent",
                   {head + " (with two ranks, no majority: either may be the damaged one)\"}"}, "");
  EXPECT_EQ(b.kind, BlameKind::kReplicaMismatch);
  EXPECT_TRUE(b.host.empty());
  // Lines of other kinds, or half-written ones, are no evidence.
  b = BlameFailure(Env::Default(), "/nonexistent", {"{\"event\":\"straggler\",\"rank\":1", "x"},
                   "");
  EXPECT_EQ(b.kind, BlameKind::kNone);
}

}  // namespace
}  // namespace keel
