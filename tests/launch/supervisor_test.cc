// The supervisor of `keel launch`, in process: shell-script children that fail, hang, get killed
// or finish by attempt (KEEL_LAUNCH_ATTEMPT), writing metrics.jsonl records and a checkpoint
// marker as keel would, so restarts, causes, lost iterations, the journal and the status file are
// checked against what the children did. A scripted child on a fake clock checks the backoff and
// the hours budget without waiting for them.
#include "launch/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/fault_injection_env.h"
#include "launch/run_progress.h"
#include "supervisor_test_util.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using supervisor_test::Events;
using supervisor_test::ReadText;

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = supervisor_test::FreshTestDir("keel_supervisor");
    run_ = dir_ + "/run";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A child: /bin/sh running `body` with $RUN set to the run directory and $N to the attempt.
  LaunchOptions Options(const std::string& body) {
    const std::string script = dir_ + "/child.sh";
    std::ofstream(script) << "RUN='" << run_ << "'\nN=\"$KEEL_LAUNCH_ATTEMPT\"\n"
                          << "echo \"$N $KEEL_LAUNCH\" >> \"$RUN/attempts.txt\"\n"
                          << body;
    LaunchOptions o;
    o.command = {"/bin/sh", script};
    o.save_dir = run_;
    o.backoff_seconds = 0;
    o.poll_seconds = 0.02;
    o.term_grace_seconds = 2;
    return o;
  }

  LaunchResult Run(const LaunchOptions& o, std::function<int()> signal = nullptr) {
    auto child = NewPosixChildProcess();
    Supervisor s(o, Env::Default(), child.get(), std::move(signal));
    LaunchResult r;
    EXPECT_TRUE(s.Run(&r).ok());
    return r;
  }

  int Attempts() {
    std::istringstream in(ReadText(run_ + "/attempts.txt"));
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      EXPECT_EQ(line, std::to_string(n) + " 1");  // KEEL_LAUNCH_ATTEMPT, KEEL_LAUNCH
    }
    return n;
  }

  std::string dir_, run_;
};

// Appends train records FROM..TO (iteration_ms = 10 x iteration) after keeping the first KEEP
// lines, as a keel resuming from checkpoint KEEP rewinds metrics.jsonl and trains on.
const char* const kTrain = R"(
train() {  # keep, from, to
  touch "$RUN/metrics.jsonl"; head -n "$1" "$RUN/metrics.jsonl" > "$RUN/m.tmp"
  mv "$RUN/m.tmp" "$RUN/metrics.jsonl"
  i=$2; while [ $i -le $3 ]; do
    echo "{\"kind\":\"train\",\"iteration\":$i,\"iteration_ms\":$((i * 10))}" >> "$RUN/metrics.jsonl"
    i=$((i + 1)); done
}
)";

TEST_F(SupervisorTest, RestartsAFailureAndAHangThenFinishesAndChroniclesEachRestart) {
  LaunchOptions o = Options(std::string(kTrain) + R"(
case "$N" in
1) train 0 1 7; echo 4 > "$RUN/latest_checkpointed_iteration.txt"; exit 1 ;;
2) train 4 5 11; echo 10 > "$RUN/latest_checkpointed_iteration.txt"
   mkdir -p "$RUN/hangs/iter_0000009" "$RUN/hangs/iter_0000011"; exit 4 ;;
*) train 10 11 14; exit 0 ;;
esac
)");
  const LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(r.restarts, 2);
  EXPECT_EQ(r.lost_iterations, 3 + 1);
  EXPECT_EQ(Attempts(), 3);

  const std::vector<json> restarts = Events(run_, "restart");
  ASSERT_EQ(restarts.size(), 2u);
  EXPECT_EQ(restarts[0]["cause"], "exit 1 (a runtime failure)");
  EXPECT_EQ(restarts[0]["iteration"], 7);
  EXPECT_EQ(restarts[0]["checkpoint_iteration"], 4);
  EXPECT_EQ(restarts[0]["lost_iterations"], 3);
  EXPECT_NEAR(restarts[0]["lost_compute_seconds"].get<double>(), 0.05 + 0.06 + 0.07, 1e-9);
  EXPECT_EQ(restarts[0]["restart"], 1);
  EXPECT_EQ(restarts[0]["attempt"], 1);  // the one that failed
  EXPECT_FALSE(restarts[0].contains("hang_dump"));
  EXPECT_EQ(restarts[1]["cause"],
            "exit 4 (the ranks could not go on together: a hang or collectives out of step)");
  EXPECT_EQ(restarts[1]["iteration"], 11);
  EXPECT_EQ(restarts[1]["checkpoint_iteration"], 10);
  EXPECT_EQ(restarts[1]["lost_iterations"], 1);
  EXPECT_NEAR(restarts[1]["lost_compute_seconds"].get<double>(), 0.11, 1e-9);
  EXPECT_EQ(restarts[1]["hang_dump"], run_ + "/hangs/iter_0000011");  // the newest dump
  for (const json& e : restarts)
    EXPECT_GE(e["lost_seconds"].get<double>(), e["lost_compute_seconds"].get<double>());

  const std::string chronicle = ReadText(run_ + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("## keel launch at "), std::string::npos) << chronicle;
  EXPECT_NE(chronicle.find("- launch: restart 1 of 3: attempt 1 failed: exit 1 (a runtime "
                           "failure); it had reached iteration 7, newest checkpoint iter_0000004 "
                           "(3 iterations lost); continuing from iter_0000004; lost "),
            std::string::npos)
      << chronicle;
  EXPECT_NE(chronicle.find("- launch: restart 2 of 3: attempt 2 failed: exit 4 (the ranks could "
                           "not go on together: a hang or collectives out of step); it had reached "
                           "iteration 11, newest checkpoint "
                           "iter_0000010 (1 iteration lost); the watchdog's stack dump is " +
                           run_ + "/hangs/iter_0000011: run `keel hangs analyze " + run_ +
                           "/hangs/iter_0000011`"),
            std::string::npos)
      << chronicle;
  EXPECT_NE(chronicle.find("- launch: attempt 3 finished (exit 0) after 2 restarts, 4 iterations "
                           "lost to failures; keel launch exits 0"),
            std::string::npos)
      << chronicle;

  const std::string status = ReadText(run_ + "/" + kLaunchStatusFile);
  EXPECT_EQ(std::count(status.begin(), status.end(), '\n'), 1) << status;
  EXPECT_NE(status.find(" keel launch: finished | attempt 3 | restarts 2 of 3 | pid - | "
                        "iteration 14 | checkpoint 10 | up "),
            std::string::npos)
      << status;
  EXPECT_NE(status.find("| lost 4 iterations"), std::string::npos) << status;
}

TEST_F(SupervisorTest, GuardStopAndConfigErrorAreNotRestarted) {
  for (int code : {3, 2}) {
    fs::remove_all(run_);
    const LaunchResult r = Run(Options("exit " + std::to_string(code) + "\n"));
    EXPECT_EQ(r.end, LaunchEnd::kStopped);
    EXPECT_EQ(r.exit_code, code);
    EXPECT_EQ(r.restarts, 0);
    EXPECT_EQ(Attempts(), 1);
    const std::vector<json> stops = Events(run_, "launch_stop");
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_EQ(stops[0]["reason"], code == 3 ? "exit 3 (the guard stopped the run: unhealthy state)"
                                            : "exit 2 (a usage or configuration error)");
    EXPECT_TRUE(Events(run_, "restart").empty());
    EXPECT_NE(ReadText(run_ + "/" + kLaunchStatusFile).find(" keel launch: stopped | attempt 1"),
              std::string::npos);
  }
}

TEST_F(SupervisorTest, GivesUpWithTheChildsCodeWhenTheRestartsAreSpent) {
  LaunchOptions o = Options(std::string(kTrain) + "train 0 1 $((N * 2)); exit 7\n");
  o.max_restarts = 2;
  const LaunchResult r = Run(o);
  EXPECT_EQ(r.end, LaunchEnd::kGaveUp);
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(Attempts(), 3);
  EXPECT_EQ(Events(run_, "restart").size(), 2u);
  const std::vector<json> gave_up = Events(run_, "launch_gave_up");
  ASSERT_EQ(gave_up.size(), 1u);
  EXPECT_EQ(gave_up[0]["cause"], "exit 7 (a failure)");
  EXPECT_EQ(gave_up[0]["iteration"], 6);
  EXPECT_EQ(gave_up[0]["lost_iterations"], 6);  // no checkpoint: from the start
  EXPECT_NE(ReadText(run_ + "/CHRONICLE.md")
                .find("- launch: gave up, its 2 restarts are spent: attempt 3 failed: exit 7 (a "
                      "failure); it had reached iteration 6, newest checkpoint none (6 iterations "
                      "lost); keel launch exits 7"),
            std::string::npos);
  EXPECT_NE(ReadText(run_ + "/" + kLaunchStatusFile).find("gave up | attempt 3 | restarts 2 of 2"),
            std::string::npos);
}

TEST_F(SupervisorTest, AChildKilledBySignalIsRestartedAndTheCauseNamesTheSignal) {
  const LaunchResult r = Run(Options("[ \"$N\" = 1 ] && kill -KILL $$\nexit 0\n"));
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(r.restarts, 1);
  const std::vector<json> restarts = Events(run_, "restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["cause"], "killed by SIGKILL (Killed)");
  EXPECT_EQ(restarts[0]["signal"], "SIGKILL");
  EXPECT_FALSE(restarts[0].contains("iteration"));  // nothing recorded
  EXPECT_NE(ReadText(run_ + "/CHRONICLE.md")
                .find("attempt 1 failed: killed by SIGKILL (Killed); it had recorded no "
                      "iteration, newest checkpoint none (0 iterations lost); continuing from the "
                      "start"),
            std::string::npos);
}

TEST_F(SupervisorTest, TheKillSwitchStopsABackoffWithinASecond) {
  LaunchOptions o = Options("exit 1\n");
  o.backoff_seconds = 60;
  o.kill_switch_path = dir_ + "/STOP";
  std::thread operator_([&] {
    while (!fs::exists(run_ + "/attempts.txt"))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::ofstream(o.kill_switch_path) << "stop\n";
  });
  const auto t0 = std::chrono::steady_clock::now();
  const LaunchResult r = Run(o);
  operator_.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(r.end, LaunchEnd::kStopped);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(Attempts(), 1);
  const std::vector<json> stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0]["reason"], "kill switch");
  EXPECT_NE(ReadText(run_ + "/CHRONICLE.md")
                .find("the kill switch " + o.kill_switch_path + " appeared during the backoff"),
            std::string::npos);

  // With the switch already there, nothing starts.
  fs::remove(run_ + "/attempts.txt");
  const LaunchResult again = Run(o);
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_EQ(again.attempts, 0);
  EXPECT_FALSE(fs::exists(run_ + "/attempts.txt"));
}

TEST_F(SupervisorTest, ASignalToLaunchIsForwardedToTheChildAndNothingRestarts) {
  LaunchOptions o = Options(R"(
trap 'echo saved > "$RUN/term"; exit 0' TERM
touch "$RUN/ready"
i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
exit 1
)");
  const std::string ready = run_ + "/ready";
  const LaunchResult r = Run(o, [&] { return fs::exists(ready) ? SIGTERM : 0; });
  EXPECT_EQ(r.end, LaunchEnd::kStopped);
  EXPECT_EQ(r.exit_code, 0);  // the child's: it saved and exited
  EXPECT_EQ(ReadText(run_ + "/term"), "saved\n");
  EXPECT_EQ(Attempts(), 1);
  const std::vector<json> stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0]["reason"], "SIGTERM");
}

TEST_F(SupervisorTest, TheStallBackstopEndsAStuckChildAndRestartsIt) {
  // Attempt 1 ignores SIGTERM (so SIGKILL must follow); attempt 2 finishes.
  LaunchOptions o = Options(std::string(kTrain) + R"(
[ "$N" != 1 ] && exit 0
train 0 1 3; trap '' TERM
i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
exit 0
)");
  o.stall_minutes = 0.01;  // 0.6 s
  o.term_grace_seconds = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  const LaunchResult r = Run(o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(r.restarts, 1);
  const std::vector<json> restarts = Events(run_, "restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["cause"], "stalled: no progress for 0.01 minutes");
  EXPECT_EQ(restarts[0]["iteration"], 3);
  EXPECT_EQ(restarts[0]["lost_iterations"], 3);
  EXPECT_GE(restarts[0]["stuck_seconds"].get<double>(), 0.6);
}

TEST_F(SupervisorTest, ACommandThatCannotRunIsAUsageError) {
  LaunchOptions o = Options("");
  o.command = {dir_ + "/no-such-program"};
  auto child = NewPosixChildProcess();
  Supervisor s(o, Env::Default(), child.get(), nullptr);
  LaunchResult r;
  const Status st = s.Run(&r);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("no-such-program': No such file or directory"), std::string::npos)
      << st.message();
  EXPECT_EQ(r.exit_code, 2);
}

// A clock that moves only when slept on, or when a scripted child "runs".
class FakeClockEnv : public FaultInjectionEnv {
 public:
  FakeClockEnv() : FaultInjectionEnv(Env::Default()) {}
  uint64_t NowMicros() override { return now_; }
  void SleepForMicros(uint64_t micros) override { now_ += micros; }
  void Advance(double seconds) { now_ += static_cast<uint64_t>(seconds * 1e6); }

 private:
  uint64_t now_ = 1000000;
};

// Each attempt runs `seconds` of fake time and ends with the scripted exit; `on_start` may write
// the run directory (a new checkpoint).
class ScriptedChild : public ChildProcess {
 public:
  ScriptedChild(FakeClockEnv* env, std::vector<ChildExit> exits, double seconds,
                std::function<void(int attempt)> on_start)
      : env_(env), exits_(std::move(exits)), seconds_(seconds), on_start_(std::move(on_start)) {}
  Status Start(const std::vector<std::string>&, const std::vector<std::string>& env,
               int* pid) override {
    EXPECT_EQ(env.size(), 2u);
    starts_.push_back(env_->NowMicros() / 1e6);
    if (on_start_) on_start_(static_cast<int>(starts_.size()));
    *pid = 100 + static_cast<int>(starts_.size());
    return Status::OK();
  }
  bool Poll(ChildExit* exit) override {
    env_->Advance(seconds_);
    *exit = exits_.at(starts_.size() - 1);
    return true;
  }
  JobProcesses FindJob() override { return {}; }
  void SignalProcess(int, int) override {}
  void SignalGroup(int) override {}
  // Seconds from the end of each attempt to the start of the next.
  std::vector<double> Waits() const {
    std::vector<double> w;
    for (size_t i = 1; i < starts_.size(); ++i) w.push_back(starts_[i] - starts_[i - 1] - seconds_);
    return w;
  }

 private:
  FakeClockEnv* env_;
  std::vector<ChildExit> exits_;
  double seconds_;
  std::function<void(int)> on_start_;
  std::vector<double> starts_;
};

TEST_F(SupervisorTest, BackoffDoublesUpToItsCapAndStartsOverAfterANewCheckpoint) {
  FakeClockEnv env;
  ChildExit fail{false, 1, 0};
  ChildExit done{false, 0, 0};
  // Attempt 4 writes a new checkpoint before it fails: its failure waits the base again.
  ScriptedChild child(&env, {fail, fail, fail, fail, fail, done}, 1.0, [&](int attempt) {
    if (attempt == 4) {
      fs::create_directories(run_);
      std::ofstream(run_ + "/latest_checkpointed_iteration.txt") << "100\n";
    }
  });
  LaunchOptions o = Options("");
  o.backoff_seconds = 10;
  o.max_backoff_seconds = 25;
  o.max_restarts = 5;
  Supervisor s(o, &env, &child, nullptr);
  LaunchResult r;
  ASSERT_TRUE(s.Run(&r).ok());
  EXPECT_EQ(r.end, LaunchEnd::kFinished);
  EXPECT_EQ(r.restarts, 5);
  EXPECT_EQ(child.Waits(), (std::vector<double>{10, 20, 25, 10, 20}));
  const std::vector<json> restarts = Events(run_, "restart");
  ASSERT_EQ(restarts.size(), 5u);
  EXPECT_EQ(restarts[2]["backoff_seconds"], 25.0);
  EXPECT_EQ(restarts[3]["backoff_seconds"], 10.0);
  EXPECT_EQ(restarts[3]["downtime_seconds"], 10.0);
}

TEST_F(SupervisorTest, NoRestartBeginsOnceMaxHoursAreSpent) {
  FakeClockEnv env;
  ChildExit fail{false, 1, 0};
  ScriptedChild child(&env, std::vector<ChildExit>(10, fail), 3600.0, nullptr);
  LaunchOptions o = Options("");
  o.max_restarts = 10;
  o.max_hours = 2.5;
  Supervisor s(o, &env, &child, nullptr);
  LaunchResult r;
  ASSERT_TRUE(s.Run(&r).ok());
  EXPECT_EQ(r.end, LaunchEnd::kGaveUp);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.attempts, 3);  // started at 0 h, 1 h, 2 h; the third ended at 3 h
  const std::vector<json> gave_up = Events(run_, "launch_gave_up");
  ASSERT_EQ(gave_up.size(), 1u);
  EXPECT_NE(
      ReadText(run_ + "/CHRONICLE.md").find("--max-hours 2.5 would be spent before a restart"),
      std::string::npos);
}

// A job as Open MPI runs it: mpirun (pid 10) and two ranks (11, 12), each in a group of its own.
// It exits 0 `save_s` after a rank is asked to stop (never when negative), and dies of the first
// SIGKILL; every signal is recorded.
class MpiJob : public ChildProcess {
 public:
  MpiJob(FakeClockEnv* env, double save_s) : env_(env), save_s_(save_s) {}
  Status Start(const std::vector<std::string>&, const std::vector<std::string>&,
               int* pid) override {
    *pid = 10;
    return Status::OK();
  }
  bool Poll(ChildExit* exit) override {
    if (killed_) {
      *exit = ChildExit{true, 0, SIGKILL};
      return true;
    }
    if (asked_us_ > 0 && save_s_ >= 0 && env_->NowMicros() >= asked_us_ + save_s_ * 1e6) {
      *exit = ChildExit{};
      return true;
    }
    return false;
  }
  JobProcesses FindJob() override { return {{11, 12}, {10}, {10, 11, 12}}; }
  void SignalProcess(int pid, int sig) override {
    sent.push_back(std::to_string(pid) + " " + SignalName(sig));
    if (pid != 10 && asked_us_ == 0) asked_us_ = env_->NowMicros();
  }
  void SignalGroup(int sig) override {
    sent.push_back("all " + SignalName(sig) + " at " +
                   std::to_string((env_->NowMicros() - asked_us_) / 1000000));
    killed_ = killed_ || sig == SIGKILL;
  }
  std::vector<std::string> sent;

 private:
  FakeClockEnv* env_;
  double save_s_;
  uint64_t asked_us_ = 0;
  bool killed_ = false;
};

// Issue 35: a signal to launch went to mpirun's process group, and mpirun killed the ranks in
// their save. The ranks are asked themselves, mpirun only with SIGUSR1 (which it passes on and
// does not kill for), and a save that takes 30 s of a 120 s grace ends launch with 0.
TEST_F(SupervisorTest, ASignalAsksTheRanksToSaveAndNeverSignalsMpirunWithSigterm) {
  FakeClockEnv env;
  MpiJob job(&env, 30);
  LaunchOptions o = Options("");
  o.term_grace_seconds = 120;
  Supervisor s(o, &env, &job, [&] { return SIGTERM; });
  LaunchResult r;
  ASSERT_TRUE(s.Run(&r).ok());
  EXPECT_EQ(r.end, LaunchEnd::kStopped);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(job.sent, (std::vector<std::string>{"11 SIGTERM", "12 SIGTERM", "10 SIGUSR1"}));
}

TEST_F(SupervisorTest, AJobThatOutlivesTheGraceIsKilledAndLaunchExitsNonZero) {
  FakeClockEnv env;
  MpiJob job(&env, -1);
  LaunchOptions o = Options("");
  o.term_grace_seconds = 60;
  Supervisor s(o, &env, &job, [&] { return SIGTERM; });
  LaunchResult r;
  ASSERT_TRUE(s.Run(&r).ok());
  EXPECT_EQ(r.end, LaunchEnd::kStopped);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(job.sent, (std::vector<std::string>{"11 SIGTERM", "12 SIGTERM", "10 SIGUSR1",
                                                "all SIGTERM at 60", "all SIGKILL at 65"}));
  const std::vector<json> stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0]["term_grace_seconds"], 60.0);
  EXPECT_NE(ReadText(run_ + "/CHRONICLE.md")
                .find("did not save and exit within --term-grace-seconds 60 and was killed"),
            std::string::npos);
}

// The stall backstop asks the same way: ranks that still answer save before the restart.
TEST_F(SupervisorTest, TheStallBackstopAsksTheRanksToSaveFirst) {
  FakeClockEnv env;
  MpiJob job(&env, 10);
  LaunchOptions o = Options("");
  o.stall_minutes = 1;
  o.max_restarts = 0;
  o.term_grace_seconds = 120;
  Supervisor s(o, &env, &job, nullptr);
  LaunchResult r;
  ASSERT_TRUE(s.Run(&r).ok());
  EXPECT_EQ(r.end, LaunchEnd::kGaveUp);
  EXPECT_EQ(job.sent, (std::vector<std::string>{"11 SIGTERM", "12 SIGTERM", "10 SIGUSR1",
                                                "all SIGKILL at 10"}));  // before a restart
}

TEST(SupervisorTableTest, ExitCodesDecideRestarts) {
  auto code = [](int c) { return ChildExit{false, c, 0}; };
  EXPECT_EQ(JudgeExit(code(0)), ChildVerdict::kFinished);
  EXPECT_EQ(JudgeExit(code(2)), ChildVerdict::kConfigError);
  EXPECT_EQ(JudgeExit(code(3)), ChildVerdict::kGuardStopped);
  EXPECT_EQ(JudgeExit(code(4)), ChildVerdict::kRestart);
  EXPECT_EQ(JudgeExit(code(1)), ChildVerdict::kRestart);
  EXPECT_EQ(JudgeExit(code(137)), ChildVerdict::kRestart);
  EXPECT_EQ(JudgeExit(ChildExit{true, 0, SIGSEGV}), ChildVerdict::kRestart);
  EXPECT_EQ(DescribeExit(code(137)), "exit 137 (a process of the job was killed by SIGKILL)");
  EXPECT_EQ(DescribeExit(ChildExit{true, 0, SIGSEGV}), "killed by SIGSEGV (Segmentation fault)");
  EXPECT_EQ(ExitCodeOf(ChildExit{true, 0, SIGSEGV}), 1);
  EXPECT_EQ(ExitCodeOf(code(4)), 4);
}

TEST(SupervisorTableTest, CommandFlagValueReadsBothSpellingsAndTheLastWins) {
  const std::vector<std::string> cmd = {"mpirun",  "-np",    "2", "keel",
                                        "train",   "--save", "a", "--kill-switch-path=/tmp/k",
                                        "--save=b"};
  EXPECT_EQ(CommandFlagValue(cmd, "--save"), "b");
  EXPECT_EQ(CommandFlagValue(cmd, "--kill-switch-path"), "/tmp/k");
  EXPECT_EQ(CommandFlagValue(cmd, "--load"), "");
  EXPECT_EQ(CommandFlagValue({"keel", "train", "--save"}, "--save"), "");  // no value
}

TEST_F(SupervisorTest, MetricsProgressSkipsAHalfWrittenLineAndOtherRecords) {
  fs::create_directories(run_);
  std::ofstream(run_ + "/metrics.jsonl") << R"({"kind":"train","iteration":1,"iteration_ms":5})"
                                            "\n"
                                         << R"({"kind":"train","iteration":2,"iteration_ms":7})"
                                            "\n"
                                         << R"({"kind":"validation","iteration":2})"
                                            "\n"
                                         << R"({"kind":"train","iteration":3,"iteration_ms":11})"
                                            "\n"
                                         << R"({"kind":"train","itera)";
  const MetricsProgress p = ReadMetricsProgress(Env::Default(), run_, 1);
  EXPECT_EQ(p.newest_iteration, 3);
  EXPECT_EQ(p.records_after, 2);
  EXPECT_EQ(p.ms_after, 18);
  EXPECT_EQ(ReadMetricsProgress(Env::Default(), dir_ + "/none", 0).newest_iteration, -1);
  EXPECT_EQ(ReadCheckpointMarker(Env::Default(), run_), -1);
}

}  // namespace
}  // namespace keel
