// --async-save in-process (train/checkpoint_controller.h, checkpoint/async_checkpoint_writer.h):
// a background save writes the same bytes as a synchronous one and resumes to the same bits; a
// crash or a failure inside a background write leaves the previous checkpoint the newest and a
// valid resume; a failed background save counts as a failed periodic save; the next save, a stop
// request and the end of the run wait for the save in flight.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "../data/data_test_util.h"
#include "checkpoint/manifest.h"
#include "core/fault_injection_env.h"
#include "core/log.h"
#include "data/prepare.h"
#include "small_dataset.h"
#include "train/memory_estimate.h"
#include "train/training_run.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using datatest::GeneratedCorpus;
using datatest::TempDir;
using datatest::WriteTextFile;

const std::string& DatasetPrefix() {
  return datatest::SmallDatasetPrefix(7);
}

TrainConfig Tiny(const std::string& save, bool async) {
  TrainConfig c;
  c.model.num_layers = 1;
  c.model.hidden = 32;
  c.model.heads = 2;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = 20;
  c.lr_warmup_iters = 2;
  c.log_interval = 5;
  c.eval_interval = 10;
  c.eval_iters = 1;
  c.save_interval = 5;
  c.keep_last_checkpoints = 0;
  c.sample_tokens = 0;
  c.threads = 1;
  c.data_path = {DatasetPrefix()};
  c.save = save;
  c.async_save = async;
  return c;
}

// The lines logged while it lives (stdout muted); safe to read after the run.
class Captured {
 public:
  Captured() {
    SetLogCopy([this](const std::string& l) { lines.push_back(l); }, /*mute_stdout=*/true, "");
  }
  ~Captured() { SetLogCopy(nullptr, /*mute_stdout=*/false, ""); }
  std::string Text() const {
    std::string t;
    for (const std::string& l : lines) t += l + "\n";
    return t;
  }
  std::vector<std::string> lines;
};

struct RunResult {
  Status status;
  TrainingRun::Outcome outcome = TrainingRun::Outcome::kFinished;
  int64_t start_iteration = -1;
  uint64_t fingerprint = 0;
  std::string marker_after_train;  // read before the run is destroyed
  std::string log;
};

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

RunResult OpenAndTrain(const TrainConfig& c, Env* env = Env::Default()) {
  Captured log;
  auto comm = MakeSingleProcessCommunicator();
  RunResult r;
  std::unique_ptr<TrainingRun> run;
  r.status = TrainingRun::Open(c, {env, comm.get(), nullptr}, &run);
  if (r.status.ok()) {
    r.start_iteration = run->trainer().state().counters.iteration;
    r.status = run->Train(&r.outcome);
    r.fingerprint = run->StateFingerprint();
    r.marker_after_train = ReadFile(c.save + "/" + kMarkerFile);
  }
  run.reset();
  r.log = log.Text();
  return r;
}

// state.json without its time stamp and the config's hash (of the config below, which names
// --async-save and the --save directory).
nlohmann::json StateWithoutTime(const std::string& dir) {
  nlohmann::json s = nlohmann::json::parse(ReadFile(dir + "/state.json"));
  s.erase("saved_at");
  s.erase("config_hash");
  return s;
}

// config.toml without the two lines that differ by design: --async-save and the --save directory.
std::string ConfigWithoutAsync(const std::string& dir) {
  std::string text = ReadFile(dir + "/config.toml"), out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("async-save", 0) != 0 && line.rfind("save = ", 0) != 0) out += line + "\n";
  return out;
}

TEST(AsyncSaveTest, WritesTheSameBytesAsASynchronousSaveAndEndsOnTheSameBits) {
  TempDir dir;
  const RunResult sync = OpenAndTrain(Tiny(dir.Join("sync"), false));
  const RunResult async = OpenAndTrain(Tiny(dir.Join("async"), true));
  ASSERT_TRUE(sync.status.ok()) << sync.status.ToString();
  ASSERT_TRUE(async.status.ok()) << async.status.ToString() << async.log;
  EXPECT_EQ(sync.fingerprint, async.fingerprint);
  // Saves at 5, 10 and 15 in the background (20 too: the end of the run waits for it).
  for (const char* it : {"iter_0000005", "iter_0000010", "iter_0000015", "iter_0000020"}) {
    const std::string a = dir.Join(std::string("sync/") + it);
    const std::string b = dir.Join(std::string("async/") + it);
    ASSERT_TRUE(fs::exists(b + "/manifest.json")) << it << async.log;
    EXPECT_TRUE(VerifyCheckpointDir(Env::Default(), b, true, nullptr).ok()) << it;
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "tokenizer.model"})
      EXPECT_TRUE(ReadFile(a + "/" + f) == ReadFile(b + "/" + f)) << it << "/" << f;
    EXPECT_EQ(StateWithoutTime(a), StateWithoutTime(b)) << it;
    EXPECT_EQ(ConfigWithoutAsync(a), ConfigWithoutAsync(b)) << it;
  }
  EXPECT_NE(async.log.find("saved checkpoint " + dir.Join("async/iter_0000005") +
                           " (--save-interval, --async-save)"),
            std::string::npos)
      << async.log;
  EXPECT_NE(async.log.find("the loop stalled"), std::string::npos);
  // Resuming from a checkpoint written in the background reaches the same bits.
  fs::remove_all(dir.Join("async/iter_0000020"));
  fs::remove_all(dir.Join("async/iter_0000015"));
  std::ofstream(dir.Join("async/") + kMarkerFile) << "10\n";
  const RunResult resumed = OpenAndTrain(Tiny(dir.Join("async"), true));
  ASSERT_TRUE(resumed.status.ok()) << resumed.status.ToString();
  EXPECT_EQ(resumed.start_iteration, 10);
  EXPECT_EQ(resumed.fingerprint, sync.fingerprint);
}

// An Env whose directory syncs inside a save's temporary directory take `delay_ms`: background
// writes that are still running when the loop reaches its next save, stop or end.
class SlowSaveEnv : public FaultInjectionEnv {
 public:
  explicit SlowSaveEnv(int delay_ms) : FaultInjectionEnv(Env::Default()), delay_ms_(delay_ms) {}
  Status SyncDir(const std::string& dir) override {
    if (dir.find(".tmp.iter_") != std::string::npos)
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    return FaultInjectionEnv::SyncDir(dir);
  }

 private:
  int delay_ms_;
};

TEST(AsyncSaveTest, TheNextSaveAndTheEndOfTheRunWaitForTheSaveInFlight) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), false));
  ASSERT_TRUE(ref.status.ok());
  SlowSaveEnv env(300);
  TrainConfig c = Tiny(dir.Join("run"), true);
  c.save_interval = 1;  // every iteration: each save finds the previous one still writing
  c.keep_last_checkpoints = 3;
  const RunResult r = OpenAndTrain(c, &env);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString() << r.log;
  EXPECT_EQ(r.fingerprint, ref.fingerprint);
  // The end of the run waited: the last save is committed when Train returns.
  EXPECT_EQ(r.marker_after_train, "20\n");
  // Every save was committed, in order, each once (one in flight at a time).
  size_t at = 0;
  for (int it = 1; it <= 20; ++it) {
    const std::string line = fmt::format("saved checkpoint {}/iter_{:07d} (", c.save, it);
    const size_t found = r.log.find(line, at);
    ASSERT_NE(found, std::string::npos) << it << "\n" << r.log;
    at = found + 1;
  }
  // Retention ran after the commits: the newest 3 are left.
  EXPECT_TRUE(fs::exists(dir.Join("run/iter_0000018")));
  EXPECT_FALSE(fs::exists(dir.Join("run/iter_0000016")));
  // Saves that waited for the previous one count the wait as the loop's stall.
  EXPECT_NE(r.log.find("the loop stalled 0.3"), std::string::npos) << r.log;
}

TEST(AsyncSaveTest, AStopRequestWaitsForTheSaveInFlightAndResumesToTheSameBits) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), false));
  ASSERT_TRUE(ref.status.ok());
  SlowSaveEnv env(400);
  TrainConfig c = Tiny(dir.Join("run"), true);
  c.exit_interval = 6;  // the stop comes while the save of iteration 5 is being written
  const RunResult first = OpenAndTrain(c, &env);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  EXPECT_EQ(first.outcome, TrainingRun::Outcome::kStopped);
  const size_t bg = first.log.find("iter_0000005 (--save-interval, --async-save)");
  const size_t stop = first.log.find("iter_0000006 (stop request)");
  ASSERT_NE(bg, std::string::npos) << first.log;
  ASSERT_NE(stop, std::string::npos) << first.log;
  EXPECT_LT(bg, stop);  // committed before the stop's own save
  EXPECT_EQ(first.marker_after_train, "6\n");
  c.exit_interval = 0;
  const RunResult second = OpenAndTrain(c);
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  EXPECT_EQ(second.start_iteration, 6);
  EXPECT_EQ(second.fingerprint, ref.fingerprint);
}

TEST(AsyncSaveTest, ACrashInsideABackgroundWriteLeavesThePreviousCheckpointAndAValidResume) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), false));
  ASSERT_TRUE(ref.status.ok());
  // The crash at the 1st, 2nd, ... filesystem mutation inside the save of iteration 10 (file
  // creates, appends, syncs, the manifest, the rename): the process is dead from there on.
  int crashed_inside = 0;
  for (int nth = 1; nth <= 40; nth += 3) {
    const std::string run = dir.Join(fmt::format("run{}", nth));
    FaultInjectionEnv env(Env::Default());
    env.SetCrashHook([] {});
    env.Arm(FaultInjectionEnv::Fault::kCrash, nth, "iter_0000010");
    const RunResult crashed = OpenAndTrain(Tiny(run, true), &env);
    if (!env.fired()) break;  // past the save's last mutation
    ++crashed_inside;
    // The newest committed checkpoint is that of iteration 5 (or 10 when the crash hit after
    // the rename, at the marker: a complete checkpoint the next start adopts).
    CheckpointStore store(Env::Default(), run, nullptr);
    ASSERT_TRUE(store.Recover().ok());
    CheckpointInfo newest;
    ASSERT_TRUE(store.FindNewestValid(false, &newest).ok()) << nth << crashed.log;
    EXPECT_TRUE(newest.iteration == 5 || newest.iteration == 10) << nth;
    const RunResult resumed = OpenAndTrain(Tiny(run, true));
    ASSERT_TRUE(resumed.status.ok()) << nth << resumed.status.ToString();
    EXPECT_EQ(resumed.start_iteration, newest.iteration);
    EXPECT_EQ(resumed.fingerprint, ref.fingerprint) << nth;
  }
  EXPECT_GE(crashed_inside, 5);
}

TEST(AsyncSaveTest, AFailedBackgroundSaveCountsAsAFailedPeriodicSave) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), false));
  ASSERT_TRUE(ref.status.ok());
  {
    // One full disk while the save of iteration 10 is written: logged, training goes on, the
    // previous checkpoint stays the newest until the next save, and the run ends on the same bits.
    FaultInjectionEnv env(Env::Default());
    env.Arm(FaultInjectionEnv::Fault::kNoSpace, 1, ".tmp.iter_0000010");
    const std::string run = dir.Join("once");
    const RunResult r = OpenAndTrain(Tiny(run, true), &env);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString() << r.log;
    EXPECT_NE(r.log.find("(1 of 3 consecutive failures allowed; training continues"),
              std::string::npos)
        << r.log;
    EXPECT_FALSE(fs::exists(run + "/iter_0000010"));
    EXPECT_FALSE(fs::exists(run + "/.tmp.iter_0000010"));
    EXPECT_TRUE(fs::exists(run + "/iter_0000015"));
    EXPECT_EQ(r.fingerprint, ref.fingerprint);
  }
  {
    // A disk that stays full: the third failed save in a row stops the run with the error.
    FaultInjectionEnv env(Env::Default());
    env.Arm(FaultInjectionEnv::Fault::kNoSpace, 1, ".tmp.iter_", /*persistent=*/true);
    const RunResult r = OpenAndTrain(Tiny(dir.Join("full"), true), &env);
    EXPECT_FALSE(r.status.ok());
    EXPECT_NE(r.status.message().find("3 consecutive checkpoint saves failed"), std::string::npos)
        << r.status.ToString() << r.log;
    EXPECT_NE(r.log.find("(2 of 3 consecutive failures allowed"), std::string::npos) << r.log;
    EXPECT_FALSE(fs::exists(dir.Join("full/") + kMarkerFile));
  }
}

TEST(AsyncSaveTest, TheStagingCopiesAreCountedInTheMemoryEstimate) {
  TrainConfig c = Tiny("/tmp/unused", false);
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  const MemoryEstimate sync = EstimateRunMemory(c);
  c.async_save = true;
  const MemoryEstimate async = EstimateRunMemory(c);
  EXPECT_EQ(sync.staging, 0u);
  // fp32 weights and both moments.
  EXPECT_EQ(async.staging, 3 * async.params * sizeof(float));
  EXPECT_EQ(async.total(), sync.total() + async.staging);
  EXPECT_NE(DescribeMemoryEstimate(c, async).find("--async-save staging"), std::string::npos);
}

}  // namespace
}  // namespace keel
