// RunMetrics: metrics.jsonl and TensorBoard scalars under Megatron's grouped tags; a rewind moves
// what follows the resume point to metrics-archive/ (nothing deleted) and the live files continue
// cleanly; an in-process rollback (a train record at or before the last) rewinds by itself.
#include "metrics/run_metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/fault_injection_env.h"
#include "metrics/tf_event.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

nlohmann::json Train(int64_t it) {
  return {{"kind", "train"},
          {"iteration", it},
          {"consumed_samples", it * 8},
          {"consumed_tokens", it * 256},
          {"global_batch_size", 8},
          {"lm_loss", 10.0 - it * 0.1},
          {"learning_rate", 1e-3},
          {"grad_norm", 1.0},
          {"loss_scale", 1.0},
          {"num_zeros", 0},
          {"iteration_ms", 50.0},
          {"samples_per_second", 160.0},
          {"tflops", 0.1},
          {"data_skipped", false}};
}

std::vector<int64_t> JsonlIterations(const std::string& path) {
  std::ifstream f(path);
  std::vector<int64_t> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line)["iteration"]);
  return out;
}

// tag -> steps, over every event file in dir.
std::map<std::string, std::vector<int64_t>> Events(const std::string& dir) {
  std::map<std::string, std::vector<int64_t>> out;
  // In the order they were written (the names start with the time, then pid and microseconds),
  // not the directory's order.
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    std::ifstream f(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    std::vector<DecodedEvent> evs;
    EXPECT_TRUE(ParseEventFile(bytes, p.string(), &evs).ok());
    for (const DecodedEvent& ev : evs)
      if (ev.file_version.empty()) out[ev.tag].push_back(ev.step);
  }
  return out;
}

class RunMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("keel_run_metrics_" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(RunMetricsTest, WritesJsonlAndMegatronTags) {
  std::unique_ptr<RunMetrics> m;
  TensorBoardOptions tb;  // Megatron's three switches on
  tb.timers = tb.batch_size = tb.validation_ppl = true;
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, tb, &m).ok());
  for (int64_t it = 1; it <= 4; ++it) {
    nlohmann::json r = Train(it);
    r["datasets"] = {{"sotu", {{"lm_loss", 5.0}, {"sequences", 6}}}};
    r["timers_ms"] = {{"forward-compute", 20.0}, {"optimizer", 4.0}};
    ASSERT_TRUE(m->Append(r).ok());
  }
  ASSERT_TRUE(m->Append({{"kind", "validation"},
                         {"iteration", 4},
                         {"consumed_samples", 32},
                         {"lm_loss", 6.0},
                         {"lm_loss_ppl", 403.4}})
                  .ok());
  ASSERT_TRUE(m->AppendText(3, "guard/events", "spike").ok());
  EXPECT_EQ(JsonlIterations(dir_ + "/metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 4}));
  auto ev = Events(dir_ + "/tensorboard");
  EXPECT_EQ(ev["lm-loss-training/lm loss"], (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(ev["lm-loss-training/lm loss vs samples"], (std::vector<int64_t>{8, 16, 24, 32}));
  EXPECT_EQ(ev["lm-loss-training/lm loss vs tokens"], (std::vector<int64_t>{256, 512, 768, 1024}));
  for (const char* tag :
       {"learning-rate/learning-rate", "grad-norm/grad-norm", "loss-scale/loss-scale",
        "batch-size/batch-size", "iteration-time/iteration-time",
        "batch-size/batch-size vs samples", "lm-loss-training/sotu lm loss", "throughput/TFLOPs"})
    EXPECT_EQ(ev[tag].size(), 4u) << tag;
  EXPECT_EQ(ev["lm-loss-validation/lm loss validation"], (std::vector<int64_t>{4}));
  EXPECT_EQ(ev["lm-loss-validation/lm loss validation ppl vs samples"], (std::vector<int64_t>{32}));
  EXPECT_EQ(ev["guard/events"], (std::vector<int64_t>{3}));
  for (const char* tag : {"time/forward-compute-time", "time/optimizer-time",
                          "iteration-time/samples per second", "iteration-time/tokens per second"})
    EXPECT_EQ(ev[tag], (std::vector<int64_t>{1, 2, 3, 4})) << tag;
}

// Megatron's defaults: without the switches no timers, batch size or validation perplexity.
// --tensorboard-dir puts the events elsewhere; without a run directory there is no
// metrics.jsonl, only the events.
TEST_F(RunMetricsTest, SwitchesOffAndTensorBoardDirElsewhere) {
  std::unique_ptr<RunMetrics> m;
  TensorBoardOptions tb;
  tb.dir = dir_ + "/tb/main";
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), "", tb, &m).ok());
  for (int64_t it = 1; it <= 3; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
  ASSERT_TRUE(m->Append({{"kind", "validation"},
                         {"iteration", 3},
                         {"consumed_samples", 24},
                         {"lm_loss", 6.0},
                         {"lm_loss_ppl", 403.4}})
                  .ok());
  EXPECT_FALSE(fs::exists(dir_ + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir_ + "/tensorboard"));
  auto ev = Events(dir_ + "/tb/main");
  EXPECT_EQ(ev["lm-loss-training/lm loss"], (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ev["lm-loss-validation/lm loss validation"], (std::vector<int64_t>{3}));
  for (const char* tag : {"batch-size/batch-size", "iteration-time/iteration-time",
                          "lm-loss-validation/lm loss validation ppl"})
    EXPECT_EQ(ev.count(tag), 0u) << tag;
  // A run directory and --tensorboard-dir: metrics.jsonl in one, the events in the other.
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_ + "/run", tb, &m).ok());
  ASSERT_TRUE(m->Rewind({3, 24, 768}, "resume", nullptr).ok());
  ASSERT_TRUE(m->Append(Train(4)).ok());
  EXPECT_EQ(JsonlIterations(dir_ + "/run/metrics.jsonl"), (std::vector<int64_t>{4}));
  EXPECT_FALSE(fs::exists(dir_ + "/run/tensorboard"));
  EXPECT_EQ(Events(dir_ + "/tb/main")["lm-loss-training/lm loss"],
            (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST_F(RunMetricsTest, RewindArchivesWhatFollowsAndContinuesCleanly) {
  std::unique_ptr<RunMetrics> m;
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  for (int64_t it = 1; it <= 10; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
  // A new process resumes from the checkpoint at iteration 6.
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  std::string archived;
  ASSERT_TRUE(m->Rewind({6, 48, 1536}, "resume", &archived).ok());
  ASSERT_FALSE(archived.empty());
  EXPECT_NE(archived.find("metrics-archive/resume-iter10-to-iter6-"), std::string::npos)
      << archived;
  // The archive holds everything as it was; the live files stop at 6, then continue.
  EXPECT_EQ(JsonlIterations(archived + "/metrics.jsonl").size(), 10u);
  EXPECT_EQ(Events(archived + "/tensorboard")["lm-loss-training/lm loss"].size(), 10u);
  for (int64_t it = 7; it <= 12; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
  std::vector<int64_t> want;
  for (int64_t it = 1; it <= 12; ++it) want.push_back(it);
  EXPECT_EQ(JsonlIterations(dir_ + "/metrics.jsonl"), want);
  auto ev = Events(dir_ + "/tensorboard");
  EXPECT_EQ(ev["lm-loss-training/lm loss"], want);
  std::vector<int64_t> samples;
  for (int64_t it : want) samples.push_back(it * 8);
  EXPECT_EQ(ev["grad-norm/grad-norm vs samples"], samples);
  // Nothing to move: no archive.
  ASSERT_TRUE(m->Rewind({12, 96, 3072}, "resume", &archived).ok());
  EXPECT_TRUE(archived.empty());
}

TEST_F(RunMetricsTest, ATrainRecordAtOrBeforeTheLastRewindsByItself) {
  std::unique_ptr<RunMetrics> m;
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  for (int64_t it = 1; it <= 10; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
  for (int64_t it = 8; it <= 11; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());  // rolled back to 7
  EXPECT_EQ(JsonlIterations(dir_ + "/metrics.jsonl"),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  int archives = 0;
  for (const auto& e : fs::directory_iterator(dir_ + "/metrics-archive")) {
    ++archives;
    EXPECT_EQ(e.path().filename().string().rfind("rollback-iter10-to-iter7-", 0), 0u) << e.path();
  }
  EXPECT_EQ(archives, 1);
}

// Found by fuzz/metrics_jsonl_fuzz: an "iteration" of another type threw out of Rewind (a resume
// of a run whose metrics.jsonl was edited), and one written with an exponent was converted with
// undefined behaviour. The resume goes on; such records stay in the archive only.
TEST_F(RunMetricsTest, RewindKeepsRecordsWhoseIterationIsNotAnInteger) {
  std::unique_ptr<RunMetrics> m;
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  for (int64_t it = 1; it <= 10; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
  std::ofstream(dir_ + "/metrics.jsonl", std::ios::app)
      << "{\"kind\":\"train\",\"iteration\":\"25\"}\n"
      << "{\"kind\":\"train\",\"iteration\":1e300}\n";
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  std::string archived;
  Status st = m->Rewind({6, 48, 1536}, "resume", &archived);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_FALSE(archived.empty());
  std::ifstream f(dir_ + "/metrics.jsonl");
  std::vector<std::string> kept;
  for (std::string line; std::getline(f, line);) kept.push_back(line);
  ASSERT_EQ(kept.size(), 6u);  // iterations 1..6
  std::ifstream a(archived + "/metrics.jsonl");
  const std::string archive((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
  EXPECT_NE(archive.find("\"25\""), std::string::npos) << archived;
  EXPECT_NE(archive.find("1e300"), std::string::npos) << archived;
}

// An Env whose wall clock stands still: every rewind happens "in the same second".
class FixedClockEnv : public FaultInjectionEnv {
 public:
  FixedClockEnv() : FaultInjectionEnv(Env::Default()) {}
  int64_t NowUnixMicros() override { return 1795410000000000; }  // 2026-11-23T05:00:00Z
};

std::vector<std::string> ArchiveNames(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir + "/metrics-archive")) return names;
  for (const auto& e : fs::directory_iterator(dir + "/metrics-archive"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A crash loop: the same resume twice within one second. The second archive used to collide with
// the first ("cannot rename ... tensorboard: Directory not empty", after its metrics.jsonl had
// replaced the first archive's), and `keel train` stopped. Each rewind gets its own archive, and
// a name that exists (made by hand) is never reused.
TEST_F(RunMetricsTest, RewindsToTheSameIterationInOneSecondGetTheirOwnArchives) {
  FixedClockEnv env;
  fs::create_directories(dir_ + "/metrics-archive/resume-iter20-to-iter10-20261123T050000Z-3");
  for (int round = 1; round <= 3; ++round) {
    std::unique_ptr<RunMetrics> m;
    ASSERT_TRUE(RunMetrics::Open(&env, dir_, &m).ok());
    std::string archived;
    if (round > 1) {
      Status st = m->Rewind({10, 80, 2560}, "resume", &archived);
      ASSERT_TRUE(st.ok()) << round << ": " << st.message();
      ASSERT_FALSE(archived.empty());
    }
    for (int64_t it = round == 1 ? 1 : 11; it <= 20; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
  }
  EXPECT_EQ(ArchiveNames(dir_),
            (std::vector<std::string>{"resume-iter20-to-iter10-20261123T050000Z-2",
                                      "resume-iter20-to-iter10-20261123T050000Z-3",
                                      "resume-iter20-to-iter10-20261123T050000Z-4"}));
  // Each archive holds the whole run as it was, 1..20; the live files hold 1..20 once.
  std::vector<int64_t> all;
  for (int64_t it = 1; it <= 20; ++it) all.push_back(it);
  for (const char* a : {"-2", "-4"}) {
    const std::string arch = dir_ + "/metrics-archive/resume-iter20-to-iter10-20261123T050000Z" + a;
    EXPECT_EQ(JsonlIterations(arch + "/metrics.jsonl"), all) << a;
    EXPECT_EQ(Events(arch + "/tensorboard")["lm-loss-training/lm loss"], all) << a;
  }
  EXPECT_EQ(JsonlIterations(dir_ + "/metrics.jsonl"), all);
  EXPECT_EQ(Events(dir_ + "/tensorboard")["lm-loss-training/lm loss"], all);

  // The guard's in-process rollback to the same iteration, twice in the same second.
  std::unique_ptr<RunMetrics> m;
  ASSERT_TRUE(RunMetrics::Open(&env, dir_, &m).ok());
  std::string none;
  ASSERT_TRUE(m->Rewind({20, 160, 5120}, "resume", &none).ok());  // resumed at the end: no move
  EXPECT_EQ(none, "");
  for (int round = 0; round < 2; ++round)
    for (int64_t it = 16; it <= 20; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
  int rollbacks = 0;
  for (const std::string& n : ArchiveNames(dir_))
    rollbacks += n.rfind("rollback-iter20-to-iter15-20261123T050000Z-", 0) == 0;
  EXPECT_EQ(rollbacks, 2);
  EXPECT_EQ(JsonlIterations(dir_ + "/metrics.jsonl"), all);
}

// A resume must not stop on what a crash or a person left in metrics.jsonl.
TEST_F(RunMetricsTest, RewindSkipsLinesThatAreNotRecords) {
  std::unique_ptr<RunMetrics> m;
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  for (int64_t it = 1; it <= 6; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
  std::ofstream(dir_ + "/metrics.jsonl", std::ios::app)
      << "{\"kind\": \"train\", \"iteration\": \"seven\"}\n[1, 2]\n{\"iteration\": "
         "1e400}\n{\"kind\": \"tr";
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  std::string archived;
  Status st = m->Rewind({4, 32, 1024}, "resume", &archived);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(JsonlIterations(dir_ + "/metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4}));
}

// Iterations of a skipped data window are gaps in TensorBoard as in the report: no loss, grad
// norm or throughput point, even where an older record carries a throughput for them.
TEST_F(RunMetricsTest, SkippedWindowIterationsAreGapsInTensorBoard) {
  std::unique_ptr<RunMetrics> m;
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  for (int64_t it = 1; it <= 6; ++it) {
    nlohmann::json r = Train(it);
    if (it == 3 || it == 4) {
      r["data_skipped"] = true;
      r["lm_loss"] = nullptr;
      r["grad_norm"] = nullptr;
      if (it == 3) {
        r["samples_per_second"] = nullptr;
        r["tflops"] = nullptr;
      } else {
        r["samples_per_second"] = 1.2e7;  // what records used to carry
        r["tflops"] = 5e4;
      }
    }
    ASSERT_TRUE(m->Append(r).ok());
  }
  auto ev = Events(dir_ + "/tensorboard");
  const std::vector<int64_t> trained = {1, 2, 5, 6}, all = {1, 2, 3, 4, 5, 6};
  for (const char* tag : {"lm-loss-training/lm loss", "grad-norm/grad-norm",
                          "throughput/samples per second", "throughput/TFLOPs"})
    EXPECT_EQ(ev[tag], trained) << tag;
  EXPECT_EQ(ev["learning-rate/learning-rate"], all);
}

// A dataset named by a path that is not UTF-8 (Latin-1 "café") must not throw out of the metrics
// stream (nlohmann's dump would): it is written with U+FFFD.
TEST_F(RunMetricsTest, ANameThatIsNotUtf8IsWrittenNotThrown) {
  std::unique_ptr<RunMetrics> m;
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
  nlohmann::json r = Train(1);
  r["datasets"] = {{"caf\xe9", {{"lm_loss", 5.0}, {"sequences", 6}}}};
  ASSERT_TRUE(m->Append(r).ok());
  std::ifstream f(dir_ + "/metrics.jsonl");
  std::string line;
  std::getline(f, line);
  const auto j = nlohmann::json::parse(line);
  EXPECT_TRUE(j["datasets"].contains("caf\xef\xbf\xbd")) << line;
}

// A crash (the process killed) at every filesystem operation of a rewind: the next start rewinds
// again and ends with the same live files, and an archive holds the whole run; nothing lost,
// nothing doubled, no partial archive left.
TEST_F(RunMetricsTest, ACrashAnywhereInARewindLosesNothing) {
  std::vector<int64_t> all, kept;
  for (int64_t it = 1; it <= 10; ++it) {
    all.push_back(it);
    if (it <= 6) kept.push_back(it);
  }
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("crash at mutation " + std::to_string(n));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::unique_ptr<RunMetrics> m;
    ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
    for (int64_t it = 1; it <= 10; ++it) ASSERT_TRUE(m->Append(Train(it)).ok());
    m.reset();
    FaultInjectionEnv crashing(Env::Default());
    crashing.SetCrashHook([] {});
    crashing.Arm(FaultInjectionEnv::Fault::kCrash, n);
    ASSERT_TRUE(RunMetrics::Open(&crashing, dir_, &m).ok());
    std::string archived;
    (void)m->Rewind({6, 48, 1536}, "resume", &archived);
    m.reset();
    const bool fired = crashing.fired();
    // The next process.
    ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir_, &m).ok());
    ASSERT_TRUE(m->Rewind({6, 48, 1536}, "resume", &archived).ok());
    m.reset();
    EXPECT_EQ(JsonlIterations(dir_ + "/metrics.jsonl"), kept);
    auto live = Events(dir_ + "/tensorboard");
    EXPECT_EQ(live["lm-loss-training/lm loss"], kept);
    EXPECT_EQ(live["grad-norm/grad-norm vs samples"].size(), kept.size());
    bool whole = false;
    for (const std::string& a : ArchiveNames(dir_)) {
      EXPECT_NE(a[0], '.') << a;  // no partial archive left behind
      const std::string arch = dir_ + "/metrics-archive/" + a;
      whole = whole || (JsonlIterations(arch + "/metrics.jsonl") == all &&
                        Events(arch + "/tensorboard")["lm-loss-training/lm loss"] == all);
    }
    EXPECT_TRUE(whole);
    if (!fired) break;  // the rewind ran to its end: every crash point was tried
  }
}

}  // namespace
}  // namespace keel
