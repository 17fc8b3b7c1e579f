// `keel launch` as a user runs it: argument errors exit 2 with a message; a failing command is
// restarted and a finished one ends launch with 0; exit 3 is not restarted; the kill switch
// named in the command keeps it from starting; SIGTERM to launch reaches the child, which saves
// and exits, and nothing restarts; and a real `keel train` killed inside a save is restarted
// and resumes from its checkpoint, with the lost iterations counted from its metrics.jsonl.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "keel_process.h"
#include "keel_test_paths.h"  // KEEL_BINARY

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using keel_test::ReadText;

// Every run ends by itself: `timeout` ends a launch that would not.
keel_test::KeelResult Launch(const std::string& args) {
  return keel_test::RunShell(std::string("timeout 120 ") + KEEL_BINARY + " launch " + args);
}

std::vector<json> Events(const std::string& run, const std::string& kind) {
  std::vector<json> out;
  std::istringstream in(ReadText(run + "/events.jsonl"));
  std::string line;
  while (std::getline(in, line))
    if (const json e = json::parse(line); e.value("event", "") == kind) out.push_back(e);
  return out;
}

// `keel launch ARGS...` started in the background with its output in `out_path` and `env`
// ("NAME=value") added to its environment.
pid_t StartLaunch(const std::vector<std::string>& args, const std::string& out_path,
                  const std::vector<std::string>& env = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
#if defined(KEEL_SANITIZED_BUILD)
    putenv(const_cast<char*>("ASAN_OPTIONS=detect_leaks=0"));  // Open MPI's own leaks at exit
#endif
    std::vector<const char*> argv = {KEEL_BINARY, "launch"};
    for (const std::string& a : args) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    execv(KEEL_BINARY, const_cast<char* const*>(argv.data()));
    _exit(127);
  }
  return pid;
}

// Waits up to `seconds` for `pid` to exit; kills it (SIGKILL) and returns -1 when it does not.
int WaitExit(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Whether `pid` still runs (a zombie has ended: only its parent's wait is missing).
bool Alive(int pid) {
  const std::string stat = ReadText("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// The number of train records in RUN/metrics.jsonl.
int TrainRecords(const std::string& run) {
  std::istringstream in(ReadText(run + "/metrics.jsonl"));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find("\"train\"") != std::string::npos;
  return n;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

class LaunchCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = keel_test::FreshTempDir(std::string("launch_cli_") +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    run_ = dir_ + "/run";
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A shell script whose attempts append to RUN/attempts.txt.
  std::string Script(const std::string& body) {
    const std::string path = dir_ + "/child.sh";
    std::ofstream(path) << "RUN='" << run_ << "'\n"
                        << "echo \"$KEEL_LAUNCH_ATTEMPT\" >> \"$RUN/attempts.txt\"\n"
                        << body;
    return path;
  }
  std::string dir_, run_;
};

TEST_F(LaunchCliTest, ArgumentErrorsExitTwoWithAMessage) {
  struct Case {
    std::string args, message;
  };
  const std::string save = " --save " + dir_ + "/r";
  const std::vector<Case> cases = {
      {"", "needs `--` before the command"},
      {save + " /bin/true", "needs `--` before the command"},
      {save + " --", "no command after `--`"},
      {"-- /bin/true", "pass --save DIR"},
      {"--max-restarts abc" + save + " -- /bin/true", "--max-restarts"},
      {"--backoff-seconds -1" + save + " -- /bin/true", "--backoff-seconds"},
      {"--stall-minutes x" + save + " -- /bin/true", "--stall-minutes"},
      {"--no-such-flag" + save + " -- /bin/true", "--no-such-flag"},
      {save + " -- " + dir_ + "/no-such-program", "no-such-program': No such file or directory"},
  };
  for (const Case& c : cases) {
    const keel_test::KeelResult r = Launch(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
  }
}

TEST_F(LaunchCliTest, HelpShowsTheOptionsAndTheExitCodeTable) {
  const keel_test::KeelResult r = Launch("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"--max-restarts", "--max-hours", "--backoff-seconds",
                        "--max-backoff-seconds", "--term-grace-seconds", "--stall-minutes",
                        "--status-file", "--kill-switch-path", "the ranks could not go on (a hang, out of step)"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_NE(keel_test::RunShell(std::string(KEEL_BINARY) + " --help").out.find("  launch "),
            std::string::npos);
}

TEST_F(LaunchCliTest, RestartsAFailedCommandUsingItsSaveAndExitsZeroWhenItFinishes) {
  const std::string script = Script("[ \"$KEEL_LAUNCH_ATTEMPT\" -lt 3 ] && exit 1\nexit 0\n");
  const keel_test::KeelResult r =
      Launch("--backoff-seconds 0 -- /bin/sh " + script + " --save=" + run_);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ReadText(run_ + "/attempts.txt"), "1\n2\n3\n");
  EXPECT_NE(r.out.find("launch: restart 2 of 3: attempt 2 failed: exit 1 (a runtime failure)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(Events(run_, "restart").size(), 2u);
  EXPECT_NE(ReadText(run_ + "/launch.status").find("finished | attempt 3 | restarts 2 of 3"),
            std::string::npos);
}

TEST_F(LaunchCliTest, GuardStopIsNotRestartedAndItsCodeIsKept) {
  const std::string script = Script("exit 3\n");
  const keel_test::KeelResult r =
      Launch("--backoff-seconds 0 --save " + run_ + " -- /bin/sh " + script);
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_EQ(ReadText(run_ + "/attempts.txt"), "1\n");
}

TEST_F(LaunchCliTest, GivesUpWithTheLastCodeWhenTheBudgetIsSpent) {
  const std::string script = Script("exit 9\n");
  const keel_test::KeelResult r =
      Launch("--backoff-seconds 0 --max-restarts 1 -- /bin/sh " + script + " --save " + run_);
  EXPECT_EQ(r.code, 9) << r.out;
  EXPECT_EQ(ReadText(run_ + "/attempts.txt"), "1\n2\n");
  EXPECT_NE(r.out.find("launch: gave up, its 1 restarts are spent"), std::string::npos) << r.out;
}

TEST_F(LaunchCliTest, TheCommandsKillSwitchKeepsItFromStarting) {
  const std::string ks = dir_ + "/STOP";
  std::ofstream(ks) << "\n";
  const std::string script = Script("exit 0\n");
  const keel_test::KeelResult r =
      Launch("-- /bin/sh " + script + " --save " + run_ + " --kill-switch-path " + ks);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(run_ + "/attempts.txt"));
  EXPECT_NE(r.out.find("the kill switch " + ks + " exists: not starting"), std::string::npos)
      << r.out;
}

TEST_F(LaunchCliTest, SigtermToLaunchReachesTheChildAndNothingRestarts) {
  const std::string script = Script(R"(
trap 'echo saved > "$RUN/term"; exit 0' TERM
touch "$RUN/ready"
i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
exit 1
)");
  const std::string out_path = dir_ + "/out.txt";
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(KEEL_BINARY, KEEL_BINARY, "launch", "--backoff-seconds", "0", "--save", run_.c_str(),
          "--", "/bin/sh", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(run_ + "/ready") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(fs::exists(run_ + "/ready"));
  kill(pid, SIGTERM);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "keel launch did not exit after SIGTERM\n" << ReadText(out_path);
  }
  const std::string out = ReadText(out_path);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(ReadText(run_ + "/term"), "saved\n");
  EXPECT_EQ(ReadText(run_ + "/attempts.txt"), "1\n");
  EXPECT_NE(out.find("launch: received SIGTERM: asking the job to save a checkpoint and exit: "
                     "SIGTERM to the job's process group"),
            std::string::npos)
      << out;
  EXPECT_NE(ReadText(run_ + "/launch.status").find(" keel launch: stopped | attempt 1"),
            std::string::npos);
}

TEST_F(LaunchCliTest, AKeelTrainKilledInsideASaveIsRestartedAndResumes) {
  // Attempt 1 dies (SIGKILL) at the first write of the iteration-16 checkpoint.
  const std::string wrapper = dir_ + "/train.sh";
  std::ofstream(wrapper) << "[ \"$KEEL_LAUNCH_ATTEMPT\" = 1 ] && "
                         << "export KEEL_FAULT_INJECTION=crash-at=1:.tmp.iter_0000016\n"
                         << "exec " << KEEL_BINARY << " \"$@\"\n";
  const keel_test::KeelResult r =
      Launch("--backoff-seconds 0 -- /bin/sh " + wrapper +
             " train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
             "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 1 "
             "--eval-interval 100 --eval-iters 0 --sample-tokens 0 --threads 1 --save-interval 4 "
             "--train-iters 24 --save " +
             run_);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<json> restarts = Events(run_, "restart");
  ASSERT_EQ(restarts.size(), 1u) << r.out;
  EXPECT_EQ(restarts[0]["cause"], "killed by SIGKILL (Killed)");
  EXPECT_EQ(restarts[0]["checkpoint_iteration"], 12);
  EXPECT_EQ(restarts[0]["iteration"], 16);
  EXPECT_EQ(restarts[0]["lost_iterations"], 4);
  EXPECT_GT(restarts[0]["lost_compute_seconds"].get<double>(), 0);
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_EQ(ReadText(run_ + "/latest_checkpointed_iteration.txt"), "24\n");  // it finished
  EXPECT_NE(ReadText(run_ + "/launch.status").find("finished | attempt 2 | restarts 1 of 3"),
            std::string::npos);
}

// Two ranks under mpirun, training until stopped; each checkpoint commit takes 4 s.
std::vector<std::string> MpiTrainArgs(const std::string& run, const std::string& grace) {
  return {"--backoff-seconds",
          "0",
          "--max-restarts",
          "0",
          "--term-grace-seconds",
          grace,
          "--",
          "mpirun",
          "--allow-run-as-root",
          "--oversubscribe",
          "--mca",
          "btl_vader_single_copy_mechanism",
          "none",  // as keel_test::Mpirun: not allowed in many containers
          "-np",
          "2",
          KEEL_BINARY,
          "train",
          "--num-layers",
          "1",
          "--hidden-size",
          "32",
          "--num-attention-heads",
          "2",
          "--seq-length",
          "32",
          "--micro-batch-size",
          "2",
          "--global-batch-size",
          "4",
          "--lr-warmup-iters",
          "1",
          "--threads",
          "1",
          "--sample-tokens",
          "0",
          "--log-interval",
          "1",
          "--eval-interval",
          "100000",
          "--eval-iters",
          "0",
          "--save-interval",
          "100000",
          "--train-iters",
          "100000",
          "--save",
          run};
}

// Issue 35: SIGTERM to `keel launch -- mpirun ...` reached mpirun, which passed it on and killed
// the ranks about 2 s later, in their save: no iter_* and exit 1. Now every rank saves and exits,
// the checkpoint verifies, and launch exits 0.
TEST_F(LaunchCliTest, SigtermToLaunchLetsEveryMpiRankSaveAndExitsZero) {
  const std::string out_path = dir_ + "/out.txt";
  const pid_t pid =
      StartLaunch(MpiTrainArgs(run_, "60"), out_path, {"KEEL_TRAIN_FAULTS=save-delay=4"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (TrainRecords(run_) < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(TrainRecords(run_), 3) << ReadText(out_path);
  kill(pid, SIGTERM);
  const int code = WaitExit(pid, 90);
  const std::string out = ReadText(out_path);
  EXPECT_EQ(code, 0) << out;
  // Rank 0 speaks for the job; mpirun's exit 0 says every rank exited 0 after the save. A rank
  // whose signal arrives after the others' agreement point stops with them and says so instead.
  const std::string self = "saving and exiting";
  const std::string joined = "with the other ranks: a stop signal was received";
  EXPECT_EQ(Count(out, self) + Count(out, joined), 1u) << out;
  for (const char* log : {"/logs/rank-000.log", "/logs/rank-001.log"}) {
    const std::string text = ReadText(run_ + log);
    EXPECT_EQ(Count(text, self) + Count(text, joined), 1u) << log << "\n" << text;
  }
  EXPECT_NE(out.find("SIGTERM to the keel train ranks on this host"), std::string::npos) << out;
  EXPECT_NE(out.find("SIGUSR1 to mpirun/srun"), std::string::npos) << out;
  std::vector<std::string> iters;
  for (const auto& e : fs::directory_iterator(run_))
    if (e.path().filename().string().rfind("iter_", 0) == 0)
      iters.push_back(e.path().filename().string());
  ASSERT_EQ(iters.size(), 1u) << out;
  const keel_test::KeelResult verify = keel_test::RunShell(
      std::string("timeout 60 ") + KEEL_BINARY + " ckpt verify " + run_ + "/" + iters[0]);
  EXPECT_EQ(verify.code, 0) << verify.out;
  const std::vector<json> stops = Events(run_, "launch_stop");
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0]["exit_code"], 0);
}

// Ranks that do not answer (rank 1 hangs, rank 0 waits for it in a collective) are ended after
// --term-grace-seconds, and launch says so and exits non-zero.
TEST_F(LaunchCliTest, RanksThatDoNotStopAreKilledAfterTheGracePeriod) {
  const std::string out_path = dir_ + "/out.txt";
  const pid_t pid =
      StartLaunch(MpiTrainArgs(run_, "3"), out_path, {"KEEL_TRAIN_FAULTS=hang=3:rank=1"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (TrainRecords(run_) < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(TrainRecords(run_), 2) << ReadText(out_path);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // past iteration 3: rank 1 hangs
  const auto t0 = std::chrono::steady_clock::now();
  kill(pid, SIGTERM);
  const int code = WaitExit(pid, 60);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = ReadText(out_path);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, -1) << out;
  EXPECT_GE(took, 3.0) << out;
  EXPECT_LT(took, 30.0) << out;
  EXPECT_NE(out.find("did not exit within --term-grace-seconds 3"), std::string::npos) << out;
  EXPECT_NE(out.find("did not save and exit within --term-grace-seconds 3 and was killed"),
            std::string::npos)
      << out;
}

// Issue 35: kill -9 of `keel launch` left a grandchild running. Its guardian now ends the job:
// the child, a grandchild in its process group and one in a session of its own.
TEST_F(LaunchCliTest, KillNineOfLaunchLeavesNoGrandchildRunning) {
  const std::string script = Script(R"(
echo $$ > "$RUN/child.pid"
sleep 300 & echo $! > "$RUN/grandchild.pid"
setsid sleep 301 & echo $! > "$RUN/detached.pid"
touch "$RUN/ready"
wait
)");
  const std::string out_path = dir_ + "/out.txt";
  const pid_t pid =
      StartLaunch({"--term-grace-seconds", "2", "--save", run_, "--", "/bin/sh", script}, out_path);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(run_ + "/ready") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(fs::exists(run_ + "/ready")) << ReadText(out_path);
  std::vector<int> pids;
  for (const char* f : {"child.pid", "grandchild.pid", "detached.pid"})
    pids.push_back(std::stoi(ReadText(run_ + "/" + f)));
  for (int p : pids) ASSERT_TRUE(Alive(p)) << p;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto any_alive = [&] {
    for (int p : pids)
      if (Alive(p)) return true;
    return false;
  };
  while (any_alive() && std::chrono::steady_clock::now() < gone_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int p : pids) {
    EXPECT_FALSE(Alive(p)) << p << "\n" << ReadText(out_path);
    if (Alive(p)) kill(p, SIGKILL);  // leave nothing behind either way
  }
}

}  // namespace
