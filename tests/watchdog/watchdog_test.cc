// The watchdog with a clock the test moves and CheckOnce driven by hand: when it fires (each
// phase's own limit, never for a phase that moved on), what the dump and the log say, how another
// rank joins through the trigger file, and one run of the real thread.
#include "watchdog/watchdog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_recorder.h"
#include "comm/communicator.h"
#include "comm/process_mesh.h"
#include "comm/recording_communicator.h"
#include "core/fault_injection_env.h"
#include "core/log.h"
#include "watchdog/hang_dump.h"
#include "watchdog/phase_tracker.h"

namespace {

namespace fs = std::filesystem;
using keel::Phase;
using keel::Watchdog;
using keel::WatchdogOptions;

constexpr uint64_t kSec = 1'000'000;

// An Env whose clock the test moves; sleeping moves it too, so a wait on it ends at once.
class ClockEnv : public keel::FaultInjectionEnv {
 public:
  ClockEnv() : FaultInjectionEnv(keel::Env::Default()) {}
  uint64_t NowMicros() override {
    if (on_clock_read && reads_before_hook-- == 0) {
      auto hook = std::move(on_clock_read);
      on_clock_read = nullptr;
      hook();
    }
    return now_us.load();
  }
  void SleepForMicros(uint64_t us) override { now_us += us; }
  std::atomic<uint64_t> now_us{1000 * kSec};
  // Runs once, at the clock read after the next `reads_before_hook`: the watchdog reads the clock
  // right after its phase snapshot, and again once it has taken the stacks.
  std::function<void()> on_clock_read;
  int reads_before_hook = 0;
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One rank: its tracker, flight recorder and watchdog, with the exit codes it asked for.
struct Rank {
  Rank(ClockEnv* env, WatchdogOptions o) : phases(env), collectives(env) {
    o.exit = [this](int code) { exits.push_back(code); };
    watchdog = std::make_unique<Watchdog>(env, &phases, &collectives, std::move(o));
  }
  keel::PhaseTracker phases;
  keel::CollectiveRecorder collectives;
  std::vector<int> exits;
  std::unique_ptr<Watchdog> watchdog;
};

class WatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/keel_watchdog_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    keel::SetLogCopy(
        [this](const std::string& line) {
          std::lock_guard<std::mutex> l(log_mu_);
          log_.push_back(line);
        },
        false, "");
  }
  void TearDown() override {
    keel::SetLogCopy(nullptr, false, "");
    fs::remove_all(dir_);
  }
  WatchdogOptions Options(int rank = 0, int world = 1) const {
    WatchdogOptions o;
    o.hangs_dir = dir_ + "/hangs";
    o.job_id = "job-17";
    o.rank = rank;
    o.world_size = world;
    o.host = "host-" + std::to_string(rank);
    o.timeout_us = 100 * kSec;
    o.first_iteration_timeout_us = 300 * kSec;
    o.save_timeout_us = 50 * kSec;
    o.eval_timeout_us = 200 * kSec;
    o.join_grace_us = 20 * kSec;
    return o;
  }
  std::vector<std::string> Log() {
    std::lock_guard<std::mutex> l(log_mu_);
    return log_;
  }
  std::string dir_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
  ClockEnv env_;
};

// Past the first iteration, in iteration `it`, phase `p`.
void InIteration(Rank* r, int64_t it, Phase p) {
  r->phases.BeginIteration(1);
  r->phases.EndIteration();
  r->phases.BeginIteration(it);
  r->phases.Enter(p);
}

TEST_F(WatchdogTest, NoFireWhilePhasesChange) {
  Rank r(&env_, Options());
  int64_t it = 0;
  for (int step = 0; step < 200; ++step) {
    // Each phase lasts 90 s: under every limit, though 200 of them last far longer than any.
    env_.now_us += 90 * kSec;
    if (step % 4 == 0) {
      if (it > 0) r.phases.EndIteration();
      r.phases.BeginIteration(++it);
    } else {
      r.phases.Enter(step % 4 == 1 ? Phase::kForward : Phase::kReduce);
    }
    ASSERT_FALSE(r.watchdog->CheckOnce()) << step;
    env_.now_us += 5 * kSec;
    ASSERT_FALSE(r.watchdog->CheckOnce()) << step;
  }
  EXPECT_TRUE(r.exits.empty());
  EXPECT_FALSE(fs::exists(dir_ + "/hangs"));
}

TEST_F(WatchdogTest, EachPhaseFiresAfterItsOwnLimit) {
  struct Case {
    const char* what;
    std::function<void(Rank*)> enter;
    uint64_t limit_s;
    const char* phase;
  };
  const Case cases[] = {
      {"startup", [](Rank*) {}, 300, "startup"},
      {"first iteration", [](Rank* r) { r->phases.BeginIteration(1); }, 300, "data wait"},
      {"normal", [](Rank* r) { InIteration(r, 9, Phase::kBackward); }, 100, "backward"},
      {"save", [](Rank* r) { InIteration(r, 9, Phase::kSave); }, 50, "save"},
      {"eval", [](Rank* r) { InIteration(r, 9, Phase::kEval); }, 200, "eval"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(dir_);
    Rank r(&env_, Options());
    c.enter(&r);
    env_.now_us += c.limit_s * kSec;  // exactly the limit: not over it
    EXPECT_FALSE(r.watchdog->CheckOnce());
    EXPECT_TRUE(r.exits.empty());
    env_.now_us += 1;
    EXPECT_TRUE(r.watchdog->CheckOnce());
    EXPECT_EQ(r.exits, std::vector<int>{4});
    const keel::PhaseSnapshot s = r.phases.Snapshot();
    keel::HangDump d;
    const std::string path = dir_ + "/hangs/iter_" + std::to_string(s.iteration) + "/rank-000.txt";
    ASSERT_TRUE(keel::ParseHangDump(Slurp(path), &d).ok()) << path;
    EXPECT_EQ(d.phase, c.phase);
    EXPECT_TRUE(d.fired_here);
    // A rank fires once.
    env_.now_us += 1000 * kSec;
    EXPECT_FALSE(r.watchdog->CheckOnce());
    EXPECT_EQ(r.exits.size(), 1u);
  }
}

TEST_F(WatchdogTest, APhaseWithoutALimitOfItsOwnUsesTheTimeout) {
  WatchdogOptions o = Options();
  o.save_timeout_us = 0;
  o.first_iteration_timeout_us = 0;
  Rank r(&env_, o);
  r.phases.Enter(Phase::kStartup);
  env_.now_us += 100 * kSec + 1;
  EXPECT_TRUE(r.watchdog->CheckOnce());

  // And a timeout of 0 is none at all.
  o = Options();
  o.timeout_us = o.first_iteration_timeout_us = o.save_timeout_us = o.eval_timeout_us = 0;
  o.job_id = "job-18";  // not the job whose trigger the first rank left
  Rank never(&env_, o);
  env_.now_us += 1'000'000 * kSec;
  EXPECT_FALSE(never.watchdog->CheckOnce());
  EXPECT_TRUE(never.exits.empty());
}

TEST_F(WatchdogTest, TheDumpSaysWhereTheRankIsAndTheLogLineWhereTheDumpIs) {
  Rank r(&env_, Options());
  InIteration(&r, 7, Phase::kReduce);
  const uint64_t a = r.collectives.Begin("reduce-scatter", 4096);
  env_.now_us += 2 * kSec;
  r.collectives.End(a);
  r.collectives.Begin("all-gather", 1024);  // never ends
  env_.now_us += 101 * kSec;
  ASSERT_TRUE(r.watchdog->CheckOnce());
  EXPECT_EQ(r.exits, std::vector<int>{4});

  const std::string iter_dir = dir_ + "/hangs/iter_7";
  keel::HangDump d;
  const keel::Status st = keel::ParseHangDump(Slurp(iter_dir + "/rank-000.txt"), &d);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.host, "host-0");
  EXPECT_EQ(d.pid, getpid());
  EXPECT_TRUE(d.fired_here);
  EXPECT_EQ(d.phase, "reduce");
  EXPECT_EQ(d.iteration, 7);
  EXPECT_NEAR(d.phase_seconds, 103.0, 1e-6);
  EXPECT_EQ(d.reason,
            "the main thread has been in reduce of iteration 7 for 103.0 s, over its limit of "
            "100 s");
  EXPECT_EQ(d.digest.count, 2u);
  EXPECT_EQ(d.digest.hash, r.collectives.digest().hash);
  ASSERT_EQ(d.collectives.size(), 2u);
  EXPECT_EQ(d.collectives[0].kind, "reduce-scatter");
  EXPECT_EQ(d.collectives[0].duration_us, 2 * kSec);
  EXPECT_EQ(d.collectives[0].began_us_ago, 103 * kSec);
  EXPECT_FALSE(d.collectives[0].in_flight);
  EXPECT_EQ(d.collectives[1].seq, 2u);
  EXPECT_TRUE(d.collectives[1].in_flight);
  EXPECT_EQ(d.collectives[1].began_us_ago, 101 * kSec);
  // Every thread of this process, the dumping one marked; the main thread (TID = PID) answered.
  int callers = 0;
  bool main_answered = false;
  for (const keel::ThreadStack& t : d.threads) {
    callers += t.is_caller;
    if (t.tid == getpid()) main_answered = !t.frames.empty() && t.frames[0] != keel::kNoReplyFrame;
  }
  EXPECT_EQ(callers, 1);
  EXPECT_TRUE(main_answered);

  EXPECT_EQ(Slurp(keel::HangTriggerPath(dir_ + "/hangs", "job-17")), "iter_7 rank 0\n");
  const auto log = Log();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0],
            "error: watchdog: rank 0 (host host-0) has been in reduce of iteration 7 for 103.0 s "
            "(limit 100 s; in collective #2 all-gather); stacks in " +
                iter_dir + "/rank-000.txt; ending the job with exit 4 (`keel hangs analyze " +
                iter_dir + "` groups the ranks)");
}

// Tensor parallel: the mesh's groups, split from the recording communicator, record their own
// collectives; a rank stuck in a tensor-group all-reduce (its peer never joins) is dumped with
// that collective in flight under the group's name, and the log line names it.
TEST_F(WatchdogTest, AHangInsideATensorGroupAllReduceIsNamed) {
  auto comms = keel::MakeThreadGroup(2);
  std::vector<std::unique_ptr<keel::RecordingCommunicator>> world;
  for (int r = 0; r < 2; ++r)
    world.push_back(std::make_unique<keel::RecordingCommunicator>(comms[r].get(), &env_));
  std::vector<std::unique_ptr<keel::ProcessMesh>> mesh(2);
  {
    std::vector<std::thread> split;
    for (int r = 0; r < 2; ++r)
      split.emplace_back(
          [&, r] { ASSERT_TRUE(keel::ProcessMesh::Make(world[r].get(), 2, 1, &mesh[r]).ok()); });
    for (auto& t : split) t.join();
  }
  auto* tensor0 = dynamic_cast<keel::RecordingCommunicator*>(mesh[0]->tensor());
  ASSERT_NE(tensor0, nullptr);
  Rank r(&env_, Options(0, 2));
  r.watchdog->AddGroup("tensor", &tensor0->recorder());
  InIteration(&r, 5, Phase::kForward);
  std::vector<float> x(256, 1.0f), y(256, 2.0f);
  std::thread stuck([&] { mesh[0]->tensor()->AllReduceSum(x.data(), x.size()); });
  while (tensor0->recorder().Recent().empty()) std::this_thread::yield();
  env_.now_us += 101 * kSec;
  ASSERT_TRUE(r.watchdog->CheckOnce());
  // Rank 1 joins at last: the all-reduce completes and the thread ends.
  mesh[1]->tensor()->AllReduceSum(y.data(), y.size());
  stuck.join();
  EXPECT_EQ(x[0], 3.0f);

  keel::HangDump d;
  const keel::Status st = keel::ParseHangDump(Slurp(dir_ + "/hangs/iter_5/rank-000.txt"), &d);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(d.collectives.empty());  // nothing of the world's
  ASSERT_EQ(d.groups.size(), 1u);
  EXPECT_EQ(d.groups[0].name, "tensor");
  ASSERT_EQ(d.groups[0].collectives.size(), 1u);
  EXPECT_EQ(d.groups[0].collectives[0].kind, "all-reduce-sum-floats");
  EXPECT_EQ(d.groups[0].collectives[0].bytes, 256 * sizeof(float));
  EXPECT_TRUE(d.groups[0].collectives[0].in_flight);
  const auto log = Log();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("(limit 100 s; in the tensor group's collective #1 all-reduce-sum-floats)"),
            std::string::npos)
      << log[0];
}

// Pipeline parallel: a stage stuck inside a send to its peer stage is in a point-to-point
// transfer, not a collective (only the peer takes part), though the phase tracker files it under
// reduce; the log line names it as a transfer.
TEST_F(WatchdogTest, AHangInsideAPipelineSendIsNamedAPipelineTransfer) {
  Rank r(&env_, Options(2, 4));
  keel::CollectiveRecorder p2p(&env_);
  r.watchdog->AddGroup(keel::kPipelineTransfersGroup, &p2p);
  InIteration(&r, 5, Phase::kReduce);  // the phase a pipeline transfer runs in
  p2p.End(p2p.Begin("recv-from-0", 4096));
  p2p.Begin("send-to-0", 4096);  // the peer never receives
  env_.now_us += 101 * kSec;
  ASSERT_TRUE(r.watchdog->CheckOnce());
  keel::HangDump d;
  ASSERT_TRUE(keel::ParseHangDump(Slurp(dir_ + "/hangs/iter_5/rank-002.txt"), &d).ok());
  ASSERT_EQ(d.groups.size(), 1u);
  EXPECT_EQ(d.groups[0].name, "pipeline-p2p");
  EXPECT_EQ(d.phase,
            "reduce");  // the dump keeps the tracker's phase (keel hangs analyze groups by it)
  const auto log = Log();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(
      log[0].find("has been in pipeline transfer (send/recv) of iteration 5 for 101.0 s "
                  "(limit 100 s; in send-to-0, the pipeline group's transfer #2); stacks in "),
      std::string::npos)
      << log[0];
  EXPECT_EQ(log[0].find("collective"), std::string::npos) << log[0];
}

TEST_F(WatchdogTest, AnotherRankJoinsThroughTheTrigger) {
  ClockEnv env1;  // each rank its own clock, as on two machines
  Rank r0(&env_, Options(0, 2));
  Rank r1(&env1, Options(1, 2));
  InIteration(&r0, 20, Phase::kReduce);
  r0.collectives.Begin("reduce-scatter", 64);
  InIteration(&r1, 21, Phase::kData);  // moved on (the odd one out): not over any limit
  ASSERT_FALSE(r1.watchdog->CheckOnce());

  env_.now_us += 101 * kSec;
  const uint64_t before = env_.now_us;
  ASSERT_TRUE(r0.watchdog->CheckOnce());
  EXPECT_EQ(r0.exits, std::vector<int>{4});
  // Alone in the directory, rank 0 waited out the grace period before it exited.
  EXPECT_GE(env_.now_us - before, 20 * kSec);
  EXPECT_LT(env_.now_us - before, 21 * kSec);

  const uint64_t before1 = env1.now_us;
  ASSERT_TRUE(r1.watchdog->CheckOnce());
  EXPECT_EQ(r1.exits, std::vector<int>{4});
  EXPECT_EQ(env1.now_us, before1);  // both dumps there: no wait
  // Rank 1 dumps beside rank 0's dump, in the iteration directory the trigger names.
  keel::HangDump d;
  const std::string path = dir_ + "/hangs/iter_20/rank-001.txt";
  ASSERT_TRUE(keel::ParseHangDump(Slurp(path), &d).ok()) << path;
  EXPECT_FALSE(d.fired_here);
  EXPECT_EQ(d.iteration, 21);
  EXPECT_EQ(d.phase, "data wait");
  EXPECT_EQ(d.reason, "rank 0's watchdog fired (iter_20); this rank dumped where it was");
  EXPECT_FALSE(fs::exists(dir_ + "/hangs/iter_21"));
  const auto log = Log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1].rfind("error: watchdog: rank 1 (host host-1) joins the hang dump of rank 0: it "
                         "has been in data wait of iteration 21 for 0.0 s (before any "
                         "collective); stacks in " +
                             path,
                         0),
            0u)
      << log[1];
}

TEST_F(WatchdogTest, RanksFiringTogetherAgreeOnOneDirectory) {
  ClockEnv env1;
  Rank r0(&env_, Options(0, 2));
  Rank r1(&env1, Options(1, 2));
  InIteration(&r0, 20, Phase::kReduce);
  InIteration(&r1, 21, Phase::kReduce);
  // Rank 1 sees no trigger yet when it checks, then rank 0's appears while rank 1 takes its
  // stacks, before it claims the trigger: rank 1 adopts rank 0's directory.
  env_.now_us += 101 * kSec;
  env1.now_us += 101 * kSec;
  env1.reads_before_hook = 1;
  env1.on_clock_read = [&] { ASSERT_TRUE(r0.watchdog->CheckOnce()); };
  ASSERT_TRUE(r1.watchdog->CheckOnce());
  keel::HangDump d;
  ASSERT_TRUE(keel::ParseHangDump(Slurp(dir_ + "/hangs/iter_20/rank-001.txt"), &d).ok());
  EXPECT_TRUE(d.fired_here);
  EXPECT_EQ(d.iteration, 21);
  EXPECT_EQ(Slurp(keel::HangTriggerPath(dir_ + "/hangs", "job-17")), "iter_20 rank 0\n");
}

TEST_F(WatchdogTest, AStaleTriggerOfAnotherJobIsIgnored) {
  fs::create_directories(dir_ + "/hangs/iter_3");
  std::ofstream(keel::HangTriggerPath(dir_ + "/hangs", "job-16")) << "iter_3 rank 1\n";
  Rank r(&env_, Options());
  InIteration(&r, 5, Phase::kForward);
  env_.now_us += 99 * kSec;
  EXPECT_FALSE(r.watchdog->CheckOnce());
  EXPECT_TRUE(r.exits.empty());
  EXPECT_FALSE(fs::exists(dir_ + "/hangs/iter_3/rank-000.txt"));
  EXPECT_FALSE(fs::exists(dir_ + "/hangs/iter_5"));
}

TEST_F(WatchdogTest, APhaseThatEndsWhileTheStacksAreTakenIsNoHang) {
  Rank r(&env_, Options());
  InIteration(&r, 4, Phase::kOptimizer);
  env_.now_us += 101 * kSec;
  // The main thread moves on while the watchdog takes the stacks.
  env_.reads_before_hook = 1;
  env_.on_clock_read = [&] { r.phases.Enter(Phase::kIdle); };
  EXPECT_FALSE(r.watchdog->CheckOnce());
  EXPECT_TRUE(r.exits.empty());
  EXPECT_FALSE(fs::exists(dir_ + "/hangs"));
  // The new phase instance has its own full limit.
  env_.now_us += 100 * kSec;
  EXPECT_FALSE(r.watchdog->CheckOnce());
  env_.now_us += 1;
  EXPECT_TRUE(r.watchdog->CheckOnce());
}

TEST_F(WatchdogTest, WithoutAHangsDirectoryTheDumpGoesToStderr) {
  WatchdogOptions o = Options();
  o.hangs_dir.clear();
  Rank r(&env_, o);
  InIteration(&r, 3, Phase::kForward);
  env_.now_us += 101 * kSec;
  ASSERT_TRUE(r.watchdog->CheckOnce());
  EXPECT_EQ(r.exits, std::vector<int>{4});
  const auto log = Log();
  ASSERT_EQ(log.size(), 2u);
  keel::HangDump d;
  ASSERT_TRUE(keel::ParseHangDump(log[0] + "\n", &d).ok()) << log[0];
  EXPECT_EQ(d.phase, "forward");
  EXPECT_NE(log[1].find("stacks above; ending the job with exit 4"), std::string::npos) << log[1];
}

TEST_F(WatchdogTest, TheThreadFiresOnTheRealClock) {
  std::mutex mu;
  std::condition_variable cv;
  int exit_code = -1;
  keel::PhaseTracker phases(keel::Env::Default());
  keel::CollectiveRecorder collectives(keel::Env::Default());
  WatchdogOptions o = Options();
  o.timeout_us = o.first_iteration_timeout_us = 200'000;  // 0.2 s; polls every 20 ms
  o.exit = [&](int code) {
    std::lock_guard<std::mutex> l(mu);
    exit_code = code;
    cv.notify_all();
  };
  const auto start = std::chrono::steady_clock::now();
  {
    Watchdog w(keel::Env::Default(), &phases, &collectives, o);
    phases.BeginIteration(1);
    w.Start();
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(20), [&] { return exit_code >= 0; }));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(exit_code, 4);
  EXPECT_GE(s, 0.2);
  EXPECT_LT(s, 5.0);
  EXPECT_TRUE(fs::exists(dir_ + "/hangs/iter_1/rank-000.txt"));
}

TEST_F(WatchdogTest, TheDestructorDoesNotWaitOutAPoll) {
  keel::PhaseTracker phases(keel::Env::Default());
  WatchdogOptions o = Options();
  o.poll_us = 60 * kSec;
  const auto start = std::chrono::steady_clock::now();
  {
    Watchdog w(keel::Env::Default(), &phases, nullptr, o);
    w.Start();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

}  // namespace
