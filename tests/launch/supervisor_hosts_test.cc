// The supervisor's hosts, in process: a shell script named mpirun plays the job, recording the
// hosts (--hostfile) and ranks (-np) each attempt got, and leaving the evidence a real job would
// (mpirun's report of a dead rank on stderr, replica_mismatch and transient_fault lines in
// events.jsonl, the ranks' lock files). Checked: a failure is pinned on a host only when the
// evidence names one; at --exclude-after a spare takes its place, or --elastic shrinks the ranks,
// or launch stops naming the host and the flags; hosts come back through SAVE/hosts.readmit.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launch/supervisor.h"
#include "supervisor_test_util.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using supervisor_test::Events;
using supervisor_test::ReadText;

class SupervisorHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = supervisor_test::FreshTestDir("keel_supervisor_hosts");
    fs::create_directories(dir_ + "/bin");
    run_ = dir_ + "/run";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // "mpirun": records "HOSTS NP" of each attempt in RUN/attempts.txt, then runs `body` with $N
  // the attempt.
  LaunchOptions Options(const std::string& hosts, int spares, const std::string& body,
                        const std::vector<std::string>& extra_args = {}) {
    const std::string script = dir_ + "/bin/mpirun";
    std::ofstream(script) << "#!/bin/sh\nRUN='" << run_ << "'\nN=\"$KEEL_LAUNCH_ATTEMPT\"\n"
                          << "hf= np=\n"
                          << "while [ $# -gt 0 ]; do case \"$1\" in\n"
                          << "  --hostfile) hf=$2; shift 2 ;; -np) np=$2; shift 2 ;;\n"
                          << "  *) shift ;; esac; done\n"
                          << "echo \"$(awk '{print $1}' \"$hf\" | paste -sd, -) $np\" >> "
                             "\"$RUN/attempts.txt\"\n"
                          << body;
    chmod(script.c_str(), 0755);
    LaunchOptions o;
    o.command = {
        script, "-np", "3", "keel", "train", "--global-batch-size", "12", "--micro-batch-size",
        "2"};
    o.command.insert(o.command.end(), extra_args.begin(), extra_args.end());
    o.save_dir = run_;
    o.backoff_seconds = 0;
    o.poll_seconds = 0.02;
    o.term_grace_seconds = 2;
    std::vector<std::string> names;
    std::istringstream in(hosts);
    for (std::string h; in >> h;) o.hosts.push_back({h, 1, ""});
    o.hosts_source = "hosts";
    o.spare_hosts = spares;
    return o;
  }

  LaunchResult Run(const LaunchOptions& o, Status* status = nullptr) {
    auto child = NewPosixChildProcess();
    Supervisor s(o, Env::Default(), child.get(), nullptr);
    LaunchResult r;
    const Status st = s.Run(&r);
    if (status != nullptr)
      *status = st;
    else
      EXPECT_TRUE(st.ok()) << st.message();
    return r;
  }

  std::vector<std::string> Attempts() {
    std::vector<std::string> out;
    std::istringstream in(ReadText(run_ + "/attempts.txt"));
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

  std::string dir_, run_;
};

const char* const kMpirunReport =
    "echo 'mpirun noticed that process rank 1 with PID 77 on node b exited on signal 9 "
    "(Killed).' >&2\n";

// Issue 33 (c): a crash that no evidence pins on a host (a kill mpirun did not report, a usage
// error) excludes nothing; the restart runs on the same hosts.
TEST_F(SupervisorHostsTest, AFailureWithoutEvidenceExcludesNothing) {
  LaunchOptions o = Options("a b c d", 1, "[ \"$N\" = 1 ] && exit 137\nexit 0\n");
  const LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c 3", "a,b,c 3"}));
  const std::vector<json> blame = Events(run_, "host_blame");
  ASSERT_EQ(blame.size(), 1u);
  EXPECT_TRUE(blame[0]["host"].is_null());
  EXPECT_EQ(blame[0]["blame"], "none");
  EXPECT_TRUE(Events(run_, "host_excluded").empty());
  EXPECT_NE(ReadText(run_ + "/CHRONICLE.md").find("pinned on no host"), std::string::npos);

  // A usage error is not restarted, and blames no one.
  fs::remove_all(run_);
  o = Options("a b c d", 1, "exit 2\n");
  EXPECT_EQ(Run(o).exit_code, 2);
  EXPECT_TRUE(Events(run_, "host_blame").empty());
}

// Ranks that launch itself killed (the stall backstop) are no evidence against their hosts.
TEST_F(SupervisorHostsTest, RanksLaunchKilledAreNoEvidence) {
  LaunchOptions o = Options(
      "a b c d", 1,
      std::string("if [ \"$N\" = 1 ]; then\n") + kMpirunReport + "exec sleep 100\nfi\nexit 0\n");
  o.stall_minutes = 0.005;
  o.term_grace_seconds = 0.2;
  o.exclude_after = 1;
  const LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c 3", "a,b,c 3"}));
  const std::vector<json> blame = Events(run_, "host_blame");
  ASSERT_EQ(blame.size(), 1u);
  EXPECT_TRUE(blame[0]["host"].is_null()) << blame[0];
}

// mpirun's report of a dead rank names its host: a crash takes it out at the second (the default
// --exclude-after for a crash), and the spare takes its place at the same world size.
TEST_F(SupervisorHostsTest, ASecondCrashReportedOnAHostSwapsInTheSpare) {
  const LaunchOptions o = Options(
      "a b c d", 1, std::string("if [ \"$N\" -le 2 ]; then\n") + kMpirunReport + "exit 137\nfi\n");
  const LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c 3", "a,b,c 3", "a,d,c 3"}));
  const std::vector<json> blame = Events(run_, "host_blame");
  ASSERT_EQ(blame.size(), 2u);
  EXPECT_EQ(blame[0]["host"], "b");
  EXPECT_EQ(blame[0]["blame"], "crash");
  EXPECT_EQ(blame[0]["rank"], 1);
  EXPECT_EQ(blame[0]["pinned"], 1);
  EXPECT_EQ(blame[0]["exclude_after"], 2);
  EXPECT_NE(blame[0]["evidence"].get<std::string>().find("on node b exited on signal 9"),
            std::string::npos);
  EXPECT_EQ(blame[1]["pinned"], 2);
  const std::vector<json> out = Events(run_, "host_excluded");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["host"], "b");
  EXPECT_EQ(out[0]["replaced_by"], "d");
  EXPECT_EQ(out[0]["attempt"], 2);  // the attempt whose failure took it out
  EXPECT_NE(ReadText(run_ + "/launch.status").find("hosts a,d,c | spares - | excluded b"),
            std::string::npos)
      << ReadText(run_ + "/launch.status");
  // The job's stderr reached launch's own, and the hostfile of each attempt is kept.
  EXPECT_EQ(ReadText(run_ + "/launch-hosts/attempt-3.hosts"), "a slots=1\nd slots=1\nc slots=1\n");
}

// A replica mismatch naming one host takes it out at once; with no spare and --elastic the job
// goes on with fewer ranks (the global batch stays); the operator readmits the host through
// SAVE/hosts.readmit and the job grows back at the next restart.
TEST_F(SupervisorHostsTest, ElasticShrinksWithoutASpareAndGrowsBackWhenTheHostIsReadmitted) {
  LaunchOptions o = Options("a b c", 0, R"(
case "$N" in
1) echo '{"event":"replica_mismatch","iteration":7,"message":"replicas differ: rank 1 (host b) differs in 2 of 9 tensors: w, b"}' >> "$RUN/events.jsonl"; exit 1 ;;
2) echo b > "$RUN/hosts.readmit"; exit 1 ;;
*) exit 0 ;;
esac
)");
  o.elastic = true;
  const LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c 3", "a,c 2", "a,c,b 3"}));
  const std::vector<json> out = Events(run_, "host_excluded");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["blame"], "replica_mismatch");
  EXPECT_EQ(out[0]["ranks_before"], 3);
  EXPECT_EQ(out[0]["ranks_after"], 2);
  const std::vector<json> back = Events(run_, "host_readmitted");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0]["host"], "b");
  EXPECT_FALSE(fs::exists(run_ + "/hosts.readmit"));
  const std::string chronicle = ReadText(run_ + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("the global batch and the LR schedule stay as they were"),
            std::string::npos)
      << chronicle;
}

// Without a spare and without --elastic launch stops, naming the host and the flags; a layout
// whose ranks left hold no whole tensor x pipeline replica cannot shrink, and a global batch that
// does not split over the (data-parallel) ranks left is refused before keel would refuse it.
TEST_F(SupervisorHostsTest, WithoutASpareOrElasticLaunchStopsNamingTheHostAndTheFlags) {
  const std::string mismatch =
      "echo '{\"event\":\"replica_mismatch\",\"iteration\":7,\"message\":\"rank 2 (host c) "
      "differs in 1 of 9 tensors: w\"}' >> \"$RUN/events.jsonl\"; exit 1\n";
  LaunchOptions o = Options("a b c", 0, mismatch);
  LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kStopped);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(Attempts().size(), 1u);
  std::vector<json> stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  std::string why = stops[0]["reason"];
  EXPECT_NE(why.find("host c is excluded (replica_mismatch"), std::string::npos) << why;
  EXPECT_NE(why.find("--spare-hosts"), std::string::npos) << why;
  EXPECT_NE(why.find("--elastic"), std::string::npos) << why;

  fs::remove_all(run_);
  o = Options("a b c d", 0, mismatch,
              {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"});
  o.command[2] = "4";
  o.elastic = true;
  r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kStopped);
  stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  why = stops[0]["reason"];
  EXPECT_NE(why.find("the 3 ranks left hold no whole model replica (tensor x pipeline parallel 4 "
                     "ranks)"),
            std::string::npos)
      << why;

  fs::remove_all(run_);
  o = Options("a b c d e f", 0, mismatch, {"--tensor-model-parallel-size", "2"});
  o.command[2] = "6";
  o.command[6] = "6";  // --global-batch-size 6: 6 / (2 x 2 data-parallel ranks) does not split
  o.elastic = true;
  r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kStopped);
  stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  why = stops[0]["reason"];
  EXPECT_NE(why.find("cannot shrink to 4 ranks: --global-batch-size 6 is not a multiple of "
                     "--micro-batch-size 2 x 2 data-parallel ranks (4 ranks / tensor x pipeline "
                     "parallel 2)"),
            std::string::npos)
      << why;

  fs::remove_all(run_);
  o = Options("a b c", 0, mismatch);
  o.command[6] = "6";  // --global-batch-size 6: 6 / (2 x 2 ranks) does not split
  o.elastic = true;
  r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kStopped);
  stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  why = stops[0]["reason"];
  EXPECT_NE(why.find("--global-batch-size 6 is not a multiple of --micro-batch-size 2 x 2 ranks"),
            std::string::npos)
      << why;
}

// Tensor x pipeline parallel: --elastic shrinks by whole model replicas (keel resumes any layout
// at any data-parallel size); the slots left over stay idle, and launch says so.
TEST_F(SupervisorHostsTest, ElasticShrinksAPipelineJobByWholeModelReplicas) {
  LaunchOptions o = Options("a b c d", 0, R"(
case "$N" in
1) echo '{"event":"replica_mismatch","iteration":7,"message":"replicas differ: rank 1 (host b) differs in 2 of 9 tensors: w, b"}' >> "$RUN/events.jsonl"; exit 1 ;;
*) exit 0 ;;
esac
)",
                            {"--pipeline-model-parallel-size", "2"});
  o.command[2] = "4";
  o.elastic = true;
  const LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  // 3 slots left: one replica of 2 ranks (data parallel 2 -> 1); the global batch 12 splits.
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c,d 4", "a,c,d 2"}));
  const std::vector<json> out = Events(run_, "host_excluded");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["ranks_before"], 4);
  EXPECT_EQ(out[0]["ranks_after"], 2);
}

// The job's tensor and pipeline sizes in its --config file (the command line overriding it, as in
// keel train) set the replica --elastic keeps whole; an unreadable --config stops launch before
// it starts anything (exit 2), naming the file.
TEST_F(SupervisorHostsTest, ElasticReadsTheModelParallelSizesFromTheJobsConfig) {
  const std::string config = dir_ + "/job.toml";
  std::ofstream(config) << "pipeline-model-parallel-size = 2\n";
  const std::string body = R"(
case "$N" in
1) echo '{"event":"replica_mismatch","iteration":7,"message":"replicas differ: rank 1 (host b) differs in 2 of 9 tensors: w, b"}' >> "$RUN/events.jsonl"; exit 1 ;;
*) exit 0 ;;
esac
)";
  LaunchOptions o = Options("a b c d", 0, body, {"--config", config});
  o.command[2] = "4";
  o.elastic = true;
  LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  // 3 slots left hold one replica of 2 ranks (the old reading of the flags alone ran 3).
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c,d 4", "a,c,d 2"}));

  fs::remove_all(run_);
  o = Options("a b c d", 0, body, {"--config=" + config, "--pipeline-model-parallel-size", "1"});
  o.command[2] = "4";
  o.elastic = true;
  r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c,d 4", "a,c,d 3"}));

  fs::remove_all(run_);
  o = Options("a b c d", 0, body, {"--config", dir_ + "/missing.toml"});
  o.elastic = true;
  Status st;
  r = Run(o, &st);
  EXPECT_EQ(r.end, LaunchEnd::kNotStarted);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(st.message().find("cannot read the job's keel train settings: --config " + dir_ +
                              "/missing.toml: cannot read the file"),
            std::string::npos)
      << st.message();
  EXPECT_FALSE(fs::exists(run_ + "/attempts.txt"));
  const std::vector<json> stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_NE(stops[0]["reason"].get<std::string>().find("missing.toml"), std::string::npos);
}

// Straggler exclusion, in process: the job names host b a straggler after checkpoint 10 and
// writes checkpoint 20 a second later; launch, past --straggler-exclude-minutes, stops it there.
// Then `rest` runs (the job's SIGTERM from launch ends it with exit 0, as keel's save-and-exit);
// later attempts run `later`.
std::string StragglerJob(const std::string& rest, const std::string& later = "exit 0") {
  return R"(trap 'exit 0' TERM USR1
if [ "$N" = 1 ]; then
  echo 10 > "$RUN/latest_checkpointed_iteration.txt"
  echo '{"event":"straggler","iteration":10,"rank":1,"host":"b"}' >> "$RUN/events.jsonl"
  sleep 1
  echo 20 > "$RUN/latest_checkpointed_iteration.txt"
)" + rest +
         "\nfi\n" + later + "\n";
}

// Issue: a straggler stop at the run's last checkpoint (20 of --train-iters 20, the job finishing
// on its own) is the end of the run: no restart, no host taken out for nothing.
TEST_F(SupervisorHostsTest, AStragglerStopAtTheRunsLastCheckpointFinishes) {
  LaunchOptions o = Options("a b c d", 1, StragglerJob("  sleep 1"), {"--train-iters", "20"});
  o.straggler_exclude_minutes = 0.001;
  const LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c 3"}));
  EXPECT_TRUE(Events(run_, "restart").empty());
  EXPECT_TRUE(Events(run_, "host_excluded").empty());
  ASSERT_EQ(Events(run_, "launch_finished").size(), 1u);
  const std::string chronicle = ReadText(run_ + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("launch: attempt 1 finished (exit 0): checkpoint iter_0000020 completes "
                           "the run (--train-iters 20); host b, named a straggler, was to be taken "
                           "out at it and is not"),
            std::string::npos)
      << chronicle;
  EXPECT_NE(ReadText(run_ + "/launch.status").find("finished | attempt 1 | restarts 0 of 3 |"),
            std::string::npos);

  // The same stop at checkpoint 20 of 40 is a restart on the spare.
  fs::remove_all(run_);
  o = Options("a b c d", 1, StragglerJob("  sleep 10"), {"--train-iters", "40"});
  o.straggler_exclude_minutes = 0.001;
  EXPECT_EQ(Run(o).end, LaunchEnd::kFinished);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c 3", "a,d,c 3"}));
}

// Issue: taking a straggler's host out is launch's own planned stop, not a failure: it restarts
// on the spare even with --max-restarts 0, and says it did not count; a failure still counts.
TEST_F(SupervisorHostsTest, AStragglerStopDoesNotCountAgainstMaxRestarts) {
  LaunchOptions o = Options("a b c d", 1, StragglerJob("  sleep 10"), {"--train-iters", "40"});
  o.straggler_exclude_minutes = 0.001;
  o.max_restarts = 0;
  LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(r.restarts, 0);
  EXPECT_EQ(r.planned_restarts, 1);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c 3", "a,d,c 3"}));
  const std::vector<json> restarts = Events(run_, "restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["attempt"], 1);
  EXPECT_EQ(restarts[0]["restart"], 0);  // restarts counted so far
  EXPECT_EQ(restarts[0]["counted"], false);
  EXPECT_EQ(restarts[0]["lost_iterations"], 0);
  const std::vector<json> out = Events(run_, "host_excluded");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["host"], "b");
  EXPECT_EQ(out[0]["replaced_by"], "d");
  const std::vector<json> done = Events(run_, "launch_finished");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]["attempt"], 2);
  EXPECT_EQ(done[0]["restarts"], 0);
  const std::string chronicle = ReadText(run_ + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("- launch: planned restart (not counted against --max-restarts: 0 of 0 "
                           "used): attempt 1 was stopped (exit 0): stopped by launch to take out "
                           "host b"),
            std::string::npos)
      << chronicle;
  EXPECT_NE(chronicle.find("attempt 2 finished (exit 0) after 0 restarts (and 1 planned by "
                           "launch, not counted)"),
            std::string::npos)
      << chronicle;
  EXPECT_NE(ReadText(run_ + "/launch.status")
                .find("finished | attempt 2 | restarts 0 of 0 (+1 "
                      "planned) |"),
            std::string::npos)
      << ReadText(run_ + "/launch.status");

  // A failure after it is counted: --max-restarts 0 gives up on it.
  fs::remove_all(run_);
  o = Options("a b c d", 1, StragglerJob("  sleep 10", "exit 1"), {"--train-iters", "40"});
  o.straggler_exclude_minutes = 0.001;
  o.max_restarts = 0;
  r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kGaveUp);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.restarts, 0);
  EXPECT_EQ(r.planned_restarts, 1);
  EXPECT_EQ(Attempts().size(), 2u);
}

// A transient fault pinned on a rank is pinned on its host through the ranks' lock files; one is
// not enough to take it out (the crash threshold, 2), --exclude-after 1 is.
TEST_F(SupervisorHostsTest, ATransientFaultIsPinnedOnTheHostOfItsRank) {
  LaunchOptions o = Options("a b c d", 1, R"(
mkdir -p "$RUN/locks"
i=0; for h in $(awk '{print $1}' "$RUN/launch-hosts/attempt-$N.hosts"); do
  echo "{\"host\":\"$h\",\"rank\":$i,\"world_size\":3}" > "$RUN/locks/rank-00$i.lock"; i=$((i+1))
done
[ "$N" = 1 ] || exit 0
echo '{"event":"transient_fault","iteration":5,"ranks":[2]}' >> "$RUN/events.jsonl"; exit 1
)");
  LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  std::vector<json> blame = Events(run_, "host_blame");
  ASSERT_EQ(blame.size(), 1u);
  EXPECT_EQ(blame[0]["host"], "c");
  EXPECT_EQ(blame[0]["blame"], "transient_fault");
  EXPECT_TRUE(Events(run_, "host_excluded").empty());

  fs::remove_all(run_);
  o.exclude_after = 1;
  r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(Attempts(), (std::vector<std::string>{"a,b,c 3", "a,b,d 3"}));
}

// A command that chooses hosts itself is refused, naming the argument; so is a spare count that
// leaves no host.
TEST_F(SupervisorHostsTest, RefusesConflictsBeforeStarting) {
  LaunchOptions o = Options("a b", 0, "exit 0\n");
  o.command.insert(o.command.begin() + 1, {"-H", "x,y"});
  Status st;
  LaunchResult r = Run(o, &st);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(st.message().find("the command's '-H' chooses hosts"), std::string::npos)
      << st.message();
  o = Options("a b", 2, "exit 0\n");
  r = Run(o, &st);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(st.message().find("--spare-hosts 2 leaves no host"), std::string::npos);
  EXPECT_FALSE(fs::exists(run_ + "/attempts.txt"));
}

}  // namespace
}  // namespace keel
