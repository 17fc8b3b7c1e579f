// Throughput watching in a one-process run (issue 37), in-process: KEEL_TRAIN_FAULTS'
// slow=F:iters=A-B slows the run over iteration windows (a fraction F of its measured compute
// time, so the slowdown keeps its size on a loaded machine). After a slow start and a fast phase,
// a 10% slowdown for 60 iterations and a 60% one for 20 are each journaled once as a drop and
// once as a recovery, with their size, in events.jsonl and CHRONICLE.md; a healthy run journals
// none; and `keel logs analyze` of the run's own log (one line an iteration), with the live run's
// window and threshold, finds the same drops at the same iterations.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "../data/data_test_util.h"
#include "comm/communicator.h"
#include "core/fault_injection_env.h"
#include "core/log.h"
#include "data/prepare.h"
#include "journal/run_journal.h"
#include "logs/log_analysis.h"
#include "logs/megatron_log.h"
#include "small_dataset.h"
#include "train/test_hooks.h"
#include "train/training_run.h"

namespace keel {
namespace {

using datatest::GeneratedCorpus;
using datatest::TempDir;
using datatest::WriteTextFile;

const std::string& DatasetPrefix() {
  return datatest::SmallDatasetPrefix(11);
}

// The run's clock in these tests: every reading of it on the loop's thread is 100 us of work, and
// that thread's sleeps are counted, not slept. Measured on this shared 2-core machine, the wall
// clock and even the process's CPU time per iteration move by 10-30% for tens of iterations
// while other work comes and goes (the watcher reports those, rightly); this clock is the loop's
// own steps, so the series is exactly the run's work and the hook's slowdowns (a slow=F sleep is
// F of the compute time by this clock, off the CPU), and the test's expectations can be exact. The
// detector on noisy series: tests/health/throughput_drop_detector_test.cc.
class StepClockEnv : public FaultInjectionEnv {
 public:
  StepClockEnv() : FaultInjectionEnv(Env::Default()), main_(std::this_thread::get_id()) {}
  uint64_t NowMicros() override {
    if (std::this_thread::get_id() != main_) return now_.load();
    work_ += 100;
    return now_ += 100;
  }
  // The CPU time of this clock: its work, not its sleeps.
  double ProcessCpuSeconds() override { return 1e-6 * static_cast<double>(work_.load()); }
  void SleepForMicros(uint64_t micros) override {
    if (std::this_thread::get_id() == main_)
      now_ += micros;
    else
      FaultInjectionEnv::SleepForMicros(micros);
  }

 private:
  std::thread::id main_;
  std::atomic<uint64_t> now_{1000000}, work_{0};
};

// Iterations of a few milliseconds: long against the scheduler's ticks and a sleep's slack, short
// enough for 500 of them in seconds.
TrainConfig Small(const std::string& save, int64_t iters) {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden = 64;
  c.model.heads = 2;
  c.seq_length = 32;
  c.micro_batch_size = 4;
  c.global_batch_size = 8;
  c.train_iters = iters;
  c.lr_warmup_iters = 2;
  c.log_interval = 1;  // one line an iteration: the series `keel logs analyze` reads
  c.eval_iters = 0;
  c.save_interval = iters;
  c.sample_tokens = 0;
  c.threads = 1;
  c.num_workers = 0;                  // the data is read on the loop's thread: one clock
  c.distributed_timeout_minutes = 0;  // no watchdog thread reading the test's clock
  c.data_path = {DatasetPrefix()};
  c.save = save;
  return c;
}

struct Trained {
  Status status;
  std::vector<std::string> log;  // the lines logged
  std::vector<nlohmann::json> events;
  std::string chronicle;
  std::vector<double> samples_per_second;  // per iteration, from metrics.jsonl
  std::vector<double> iteration_ms;        // per iteration, from metrics.jsonl
  // How much longer iterations first..last took than the median iteration of the fast phase.
  double Slowdown(int64_t first, int64_t last, int64_t fast_first, int64_t fast_last) const {
    auto median = [&](int64_t a, int64_t b) {
      std::vector<double> v(iteration_ms.begin() + a - 1, iteration_ms.begin() + b);
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    return median(first, last) / median(fast_first, fast_last) - 1;
  }
};

Trained Train(const TrainConfig& c, const std::string& faults) {
  Trained t;
  TestHooks hooks;
  if (!faults.empty()) {
    EXPECT_EQ(setenv("KEEL_TRAIN_FAULTS", faults.c_str(), 1), 0);
    t.status = TestHooks::FromEnvironment(Env::Default(), &hooks);
    unsetenv("KEEL_TRAIN_FAULTS");
    if (!t.status.ok()) return t;
  }
  SetLogCopy([&t](const std::string& l) { t.log.push_back(l); }, /*mute_stdout=*/true, "");
  auto comm = MakeSingleProcessCommunicator();
  StepClockEnv clock;
  RunOptions options;
  options.env = &clock;
  options.comm = comm.get();
  options.test_hooks = &hooks;
  std::unique_ptr<TrainingRun> run;
  t.status = TrainingRun::Open(c, options, &run);
  TrainingRun::Outcome outcome;
  if (t.status.ok()) t.status = run->Train(&outcome);
  run.reset();
  SetLogCopy(nullptr, /*mute_stdout=*/false, "");
  std::string text;
  std::string journal;  // no events, no file
  (void)Env::Default()->ReadFileToString(c.save + "/" + kEventsFile, &journal);
  std::istringstream events(journal);
  for (std::string line; std::getline(events, line);) {
    const auto j = nlohmann::json::parse(line);
    const std::string kind = j.value("event", "");
    if (kind == "throughput_drop" || kind == "throughput_recovered") t.events.push_back(j);
  }
  t.chronicle = datatest::ReadTextFile(c.save + "/" + kChronicleFile);
  std::istringstream metrics(datatest::ReadTextFile(c.save + "/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") != "train") continue;
    t.samples_per_second.push_back(j["samples_per_second"]);
    t.iteration_ms.push_back(j["iteration_ms"]);
  }
  return t;
}

std::string Describe(const Trained& t) {
  std::string s;
  for (const auto& e : t.events) s += e.dump() + "\n";
  for (size_t k = 0; k < t.samples_per_second.size(); k += 10) {
    std::vector<double> w(t.samples_per_second.begin() + static_cast<long>(k),
                          t.samples_per_second.begin() +
                              static_cast<long>(std::min(k + 10, t.samples_per_second.size())));
    std::sort(w.begin(), w.end());
    s += fmt::format("{}:{:.0f} ", k + 1, w[w.size() / 2]);
  }
  return s;
}

// Each drop of the scenario and its recovery: the window the hook slowed, and the slowdown the
// run's own metrics show there (the journaled size must be it).
struct Expected {
  int64_t first, last;
  double slowdown;
};

void ExpectDropsAndRecoveries(const Trained& t, const std::vector<Expected>& want) {
  ASSERT_EQ(t.events.size(), 2 * want.size()) << Describe(t);
  for (size_t k = 0; k < want.size(); ++k) {
    const nlohmann::json &drop = t.events[2 * k], &back = t.events[2 * k + 1];
    SCOPED_TRACE(drop.dump() + "\n" + back.dump());
    EXPECT_EQ(drop["event"], "throughput_drop");
    // The change point is where the hook began (a few iterations either way: the first slowed
    // iteration may be quicker than the next); decided within two windows.
    EXPECT_NEAR(drop["since_iteration"].get<double>(), static_cast<double>(want[k].first), 3);
    EXPECT_LE(drop["iteration"].get<int64_t>(), want[k].first + 20);
    EXPECT_NEAR(drop["drop"].get<double>(), want[k].slowdown, 0.01);
    EXPECT_GT(drop["baseline"].get<double>(), drop["level"].get<double>());
    EXPECT_EQ(drop["follows_rank"], -1);  // one process: no rank to name
    EXPECT_NE(drop.value("reason", "").find("off the cores"), std::string::npos);
    // How sure (issue 36): these big drops are the threshold rule's, judged at its window; z is
    // there once the run had blocks enough before the drop to measure its noise.
    EXPECT_EQ(drop["window"], 10);
    if (drop.contains("z")) {
      EXPECT_GT(drop["z"].get<double>(), 5);
      EXPECT_GT(drop["noise"].get<double>(), 0);
    }
    EXPECT_EQ(back["event"], "throughput_recovered");
    EXPECT_NEAR(back["since_iteration"].get<double>(), static_cast<double>(want[k].last + 1), 3);
    EXPECT_LE(back["iteration"].get<int64_t>(), want[k].last + 1 + 20);
    EXPECT_LT(back["drop"].get<double>(), 0.03);
  }
}

// `keel logs analyze` of the run's log with the live run's window and threshold: the same drops,
// from the same change points to the same recoveries.
void ExpectAnalyzeAgrees(const Trained& t) {
  std::string text;
  for (const std::string& l : t.log) text += l + "\n";
  ParsedLog log;
  ASSERT_TRUE(ParseMegatronLog(text, "run.log", &log).ok());
  LogAnalysisOptions opt;
  opt.drop_window = 10;
  opt.drop_threshold = 0.05;
  LogAnalysis a;
  ASSERT_TRUE(AnalyzeLog(log, opt, &a).ok());
  EXPECT_EQ(a.throughput_signal, "samples per second");  // a tiny model's TFLOPs print as 0.00
  std::vector<LogEvent> drops;
  for (const LogEvent& e : a.events)
    if (e.kind == "throughput_drop") drops.push_back(e);
  // A drop still open at the end of the run is one the log's end closes.
  ASSERT_EQ(drops.size(), (t.events.size() + 1) / 2) << Describe(t);
  for (size_t k = 0; k < drops.size(); ++k) {
    SCOPED_TRACE(drops[k].detail);
    EXPECT_EQ(drops[k].start, t.events[2 * k]["since_iteration"].get<int64_t>());
    if (2 * k + 1 < t.events.size())
      EXPECT_EQ(drops[k].end + 1, t.events[2 * k + 1]["since_iteration"].get<int64_t>());
    else
      EXPECT_EQ(drops[k].end, a.last_iteration);
    EXPECT_NEAR(drops[k].baseline, t.events[2 * k]["baseline"].get<double>(),
                1e-3 * drops[k].baseline);
    EXPECT_NEAR(drops[k].value, t.events[2 * k]["level"].get<double>(), 1e-3 * drops[k].value);
  }
}

// Issue 37's "done when": a slow start, a fast phase, 10% slower for 60 iterations, fast, 60%
// slower for 20, fast. slow=F sleeps F of the compute time measured when the backward ends (about
// 56% of this model's iteration by the test's clock): 0.18 and 1.07 make the iterations 10% and
// 60% longer, as the run's metrics confirm.
TEST(ThroughputWatchTest, OneProcessSlowedTwiceAfterASlowStartJournalsEachDropAndRecovery) {
  TempDir dir;
  const Trained t = Train(Small(dir.Join("run"), 330),
                          "slow=1:iters=1-60,slow=0.18:iters=141-200,slow=1.07:iters=251-270");
  ASSERT_TRUE(t.status.ok()) << t.status.ToString();
  const double ten = t.Slowdown(141, 200, 61, 140), sixty = t.Slowdown(251, 270, 61, 140);
  EXPECT_NEAR(ten, 0.1, 0.02) << Describe(t);
  EXPECT_NEAR(sixty, 0.6, 0.06) << Describe(t);
  EXPECT_GT(t.Slowdown(21, 60, 61, 140), 0.4) << Describe(t);  // the slow start
  ExpectDropsAndRecoveries(t, {{141, 200, ten}, {251, 270, sixty}});
  // Told in the log and in the chronicle, with how much slower, since when, against which level.
  size_t slowed = 0, recovered = 0;
  for (size_t at = 0;
       (at = t.chronicle.find("the job slowed: an iteration takes", at)) != std::string::npos; ++at)
    ++slowed;
  for (size_t at = 0;
       (at = t.chronicle.find("throughput recovered since iteration", at)) != std::string::npos;
       ++at)
    ++recovered;
  EXPECT_EQ(slowed, 2u) << t.chronicle;
  EXPECT_EQ(recovered, 2u) << t.chronicle;
  EXPECT_NE(t.chronicle.find("samples per second against"), std::string::npos) << t.chronicle;
  ExpectAnalyzeAgrees(t);
}

TEST(ThroughputWatchTest, FiveHundredHealthyIterationsJournalNone) {
  TempDir dir;
  const Trained t = Train(Small(dir.Join("run"), 500), "");
  ASSERT_TRUE(t.status.ok()) << t.status.ToString();
  EXPECT_TRUE(t.events.empty()) << Describe(t);
  bool told = false;
  for (const std::string& l : t.log) told |= l.find("checks: throughput:") != std::string::npos;
  EXPECT_TRUE(told);  // one process too: the watching is on, and says its rule
  ExpectAnalyzeAgrees(t);
}

// slow=F:rank=R:iters=A-B: only iterations A..B sleep; a malformed window is refused by name.
TEST(ThroughputWatchTest, SlowHookTakesAnIterationWindow) {
  ASSERT_EQ(setenv("KEEL_TRAIN_FAULTS", "slow=0.5:iters=3-4", 1), 0);
  TestHooks hooks;
  Status st = TestHooks::FromEnvironment(Env::Default(), &hooks);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(hooks.rank_faults.size(), 1u);
  EXPECT_EQ(hooks.rank_faults[0].iterations.first, 3);
  EXPECT_EQ(hooks.rank_faults[0].iterations.last, 4);
  StepClockEnv clock;
  const std::unique_ptr<TrainerFaults> faults = hooks.TrainerFaultsFor(0, nullptr, &clock);
  ASSERT_TRUE(faults);
  auto slept = [&](int64_t it) {
    const uint64_t t0 = clock.NowMicros();
    faults->AfterBackward(it, 10.0);  // 10 s of compute: a 5 s sleep, counted, not slept
    return clock.NowMicros() - t0;
  };
  EXPECT_LT(slept(2), 1000000u);
  EXPECT_GE(slept(3), 5000000u);
  EXPECT_GE(slept(4), 5000000u);
  EXPECT_LT(slept(5), 1000000u);
  for (const char* bad : {"slow=0.5:iters=x", "slow=0.5:iters=4-3", "hang=3:iters=1-2"}) {
    ASSERT_EQ(setenv("KEEL_TRAIN_FAULTS", bad, 1), 0);
    st = TestHooks::FromEnvironment(Env::Default(), &hooks);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("iters"), std::string::npos) << st.message();
  }
  unsetenv("KEEL_TRAIN_FAULTS");
}

}  // namespace
}  // namespace keel
