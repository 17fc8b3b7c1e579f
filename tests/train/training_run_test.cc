// TrainingRun in-process (train/training_run.h): a run opened, trained, stopped and reopened as
// a library resumes to the bits of one that never stopped; --load SAVE/iter_N rolls back through
// the same RollbackTo as the guard and replays to the same bits; the kill switch, the test hooks
// and the counters behave as the CLI documents.
#include "train/training_run.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "../data/data_test_util.h"
#include "core/fault_injection_env.h"
#include "data/prepare.h"
#include "train/memory_estimate.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using datatest::GeneratedCorpus;
using datatest::TempDir;
using datatest::WriteTextFile;

// One small SentencePiece dataset for every test of this file.
const std::string& DatasetPrefix() {
  static TempDir* dir = new TempDir();  // outlives the tests; removed with the temp dir
  static const std::string prefix = [] {
    PrepareOptions options;
    options.inputs.push_back(dir->Join("corpus.txt"));
    WriteTextFile(options.inputs.back(), GeneratedCorpus(400, 7));
    options.output_prefix = dir->Join("data/corpus");
    options.tokenizer = "sentencepiece";
    options.vocab_size = 300;
    PrepareStats stats;
    Status st = PrepareDataset(Env::Default(), options, &stats);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return options.output_prefix;
  }();
  return prefix;
}

TrainConfig Tiny(const std::string& save) {
  TrainConfig c;
  c.num_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = 2;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = 20;
  c.lr_warmup_iters = 2;
  c.log_interval = 5;
  c.eval_interval = 10;
  c.eval_iters = 1;
  c.save_interval = 5;
  c.sample_tokens = 0;
  c.threads = 1;
  c.data_path = {DatasetPrefix()};
  c.save = save;
  return c;
}

struct RunResult {
  Status status;
  TrainingRun::Outcome outcome = TrainingRun::Outcome::kFinished;
  ResumePoint::Kind resumed = ResumePoint::Kind::kFresh;
  int64_t start_iteration = -1;
  TrainState state;
  uint64_t fingerprint = 0;
};

RunResult OpenAndTrain(const TrainConfig& c, const TestHooks* hooks = nullptr,
                       Env* env = Env::Default()) {
  auto comm = MakeSingleProcessCommunicator();
  RunOptions options;
  options.env = env;
  options.comm = comm.get();
  options.test_hooks = hooks;
  RunResult r;
  std::unique_ptr<TrainingRun> run;
  r.status = TrainingRun::Open(c, options, &run);
  if (!r.status.ok()) return r;
  r.resumed = run->resume_point().kind;
  r.start_iteration = run->resume_point().saved ? run->trainer().state().counters.iteration : 0;
  r.status = run->Train(&r.outcome);
  if (r.outcome != TrainingRun::Outcome::kNotStarted) {
    r.state = run->trainer().state();
    r.fingerprint = run->StateFingerprint();
  }
  return r;
}

TEST(TrainingRunTest, StoppedAndReopenedRunEndsOnTheUninterruptedBits) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref")));
  ASSERT_TRUE(ref.status.ok()) << ref.status.ToString();
  EXPECT_EQ(ref.outcome, TrainingRun::Outcome::kFinished);
  EXPECT_EQ(ref.resumed, ResumePoint::Kind::kFresh);
  EXPECT_EQ(ref.state.counters.iteration, 20);
  EXPECT_EQ(ref.state.optimizer_step, 20);

  TrainConfig c = Tiny(dir.Join("run"));
  c.exit_interval = 7;  // stops after iteration 7, mid log interval, and saves
  const RunResult first = OpenAndTrain(c);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  EXPECT_EQ(first.outcome, TrainingRun::Outcome::kStopped);
  EXPECT_EQ(first.state.counters.iteration, 7);
  c.exit_interval = 0;  // a free change on resume
  const RunResult second = OpenAndTrain(c);
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  EXPECT_EQ(second.resumed, ResumePoint::Kind::kResume);
  EXPECT_EQ(second.start_iteration, 7);
  EXPECT_EQ(second.outcome, TrainingRun::Outcome::kFinished);
  EXPECT_EQ(second.fingerprint, ref.fingerprint);
  // A third open finds the run complete and trains nothing.
  const RunResult third = OpenAndTrain(c);
  ASSERT_TRUE(third.status.ok());
  EXPECT_EQ(third.outcome, TrainingRun::Outcome::kAlreadyComplete);
  EXPECT_EQ(third.fingerprint, ref.fingerprint);
}

TEST(TrainingRunTest, LoadOfOwnCheckpointRollsBackAndReplaysToTheSameBits) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.keep_last_checkpoints = 0;  // keep iteration 10
  const RunResult ref = OpenAndTrain(c);
  ASSERT_TRUE(ref.status.ok()) << ref.status.ToString();
  c.load = dir.Join("run/iter_0000010");
  const RunResult back = OpenAndTrain(c);
  ASSERT_TRUE(back.status.ok()) << back.status.ToString();
  EXPECT_EQ(back.resumed, ResumePoint::Kind::kRollback);
  EXPECT_EQ(back.start_iteration, 10);
  // The newer checkpoints were kept aside, and the run replayed 11..20 to the same bits.
  EXPECT_TRUE(fs::exists(dir.Join("run/iter_0000015.rolled-back")));
  EXPECT_TRUE(fs::exists(dir.Join("run/iter_0000020.rolled-back")));
  EXPECT_TRUE(fs::exists(dir.Join("run/iter_0000020")));  // saved again by the replay
  EXPECT_EQ(back.fingerprint, ref.fingerprint);
}

TEST(TrainingRunTest, KillSwitchAtStartTrainsNothing) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.kill_switch_path = dir.Join("STOP");
  WriteTextFile(c.kill_switch_path, "stop\n");
  const RunResult r = OpenAndTrain(c);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.outcome, TrainingRun::Outcome::kNotStarted);
  EXPECT_FALSE(fs::exists(dir.Join("run/iter_0000005")));
}

TEST(TrainingRunTest, WrongInputsAreRefusedBeforeAnyWork) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.data_path = {dir.Join("missing/corpus")};
  RunResult r = OpenAndTrain(c);
  EXPECT_FALSE(r.status.ok());
  c = Tiny(dir.Join("run"));
  c.num_attention_heads = 3;  // 32 % 3 != 0
  r = OpenAndTrain(c);
  EXPECT_EQ(r.status.code(), Status::Code::kInvalidArgument) << r.status.ToString();
  EXPECT_FALSE(fs::exists(dir.Join("run/iter_0000005")));
}

// The default Env, with a fixed figure for the memory this process may still allocate.
class FixedMemoryEnv : public FaultInjectionEnv {
 public:
  explicit FixedMemoryEnv(uint64_t bytes) : FaultInjectionEnv(Env::Default()), bytes_(bytes) {}
  Status AvailableMemory(MemoryAvailable* out) override {
    out->bytes = bytes_;
    out->source = "the test's figure";
    return Status::OK();
  }

 private:
  uint64_t bytes_;
};

TEST(TrainingRunTest, ARunThatCannotFitIsRefusedWithTheNumbersBeforeAnyWork) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  // What this run needs, as the run computes it once the vocabulary is known.
  TrainConfig resolved = c;
  resolved.vocab_size = 300;  // DatasetPrefix's
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&resolved, &notes).ok());
  const MemoryEstimate need = EstimateRunMemory(resolved);

  FixedMemoryEnv small(need.total() - 1);
  RunResult r = OpenAndTrain(c, nullptr, &small);
  ASSERT_EQ(r.status.code(), Status::Code::kInvalidArgument) << r.status.ToString();
  const std::string& m = r.status.message();
  EXPECT_NE(m.find("needs about " + FormatBytes(need.total()) + " of memory but " +
                   FormatBytes(need.total() - 1) + " is available (the test's figure)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("weights " + FormatBytes(need.weights)), std::string::npos) << m;
  EXPECT_NE(m.find("--micro-batch-size 1 fits"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(dir.Join("run/iter_0000005")));

  FixedMemoryEnv enough(need.total());
  r = OpenAndTrain(c, nullptr, &enough);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.state.counters.iteration, 20);
}

TEST(TrainingRunTest, TestHooksPlantNansThatAreCountedAsNanAndSkipped) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.guard = GuardLevel::kOff;
  TestHooks hooks;
  hooks.nan_grad = {{3, 4}};
  const RunResult r = OpenAndTrain(c, &hooks);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.state.counters.nan_iterations, 2);
  EXPECT_EQ(r.state.counters.skipped_iterations, 2);
  EXPECT_EQ(r.state.optimizer_step, 18);
}

TEST(TrainingRunTest, SkippedDataWindowsAreNotNan) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.skip_train_iteration_range = {"6-10"};
  const RunResult r = OpenAndTrain(c);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.state.counters.data_skipped_iterations, 5);
  EXPECT_EQ(r.state.counters.nan_iterations, 0);
  EXPECT_EQ(r.state.optimizer_step, 15);
}

}  // namespace
}  // namespace keel
