// TrainingRun in-process (train/training_run.h): a run opened, trained, stopped and reopened as
// a library resumes to the bits of one that never stopped; --load SAVE/iter_N rolls back through
// the same RollbackTo as the guard and replays to the same bits; the kill switch, the test hooks
// and the counters behave as the CLI documents. A token outside the vocabulary stops the run with
// its dataset, document and position and keeps the last completed iteration; an update that
// leaves non-finite weights stops it without saving them.
#include "train/training_run.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../backend/test_backends.h"
#include "../data/data_test_util.h"
#include "backend/registry.h"
#include "core/fault_injection_env.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "data/train_data.h"
#include "small_dataset.h"
#include "train/memory_estimate.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using datatest::GeneratedCorpus;
using datatest::TempDir;
using datatest::WriteTextFile;

const std::string& DatasetPrefix() {
  return datatest::SmallDatasetPrefix(7);
}

TrainConfig Tiny(const std::string& save) {
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

// The Llama family (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied output, no biases)
// stops and resumes to the same bits as GPT-2's shape; its shape cannot change on resume.
TrainConfig TinyLlama(const std::string& save) {
  TrainConfig c = Tiny(save);
  c.model.heads = 4;
  c.model.SetPosition(PositionEmbedding::kRope);
  c.model.rmsnorm = true;
  c.model.swiglu = true;
  c.model.ffn_hidden = 64;
  c.model.group_query_attention = true;
  c.model.num_query_groups = 2;
  c.model.untie_embeddings = true;
  c.model.bias = false;
  return c;
}

TEST(TrainingRunTest, LlamaShapedRunResumesToTheUninterruptedBits) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(TinyLlama(dir.Join("ref")));
  ASSERT_TRUE(ref.status.ok()) << ref.status.ToString();
  EXPECT_EQ(ref.state.counters.iteration, 20);
  TrainConfig c = TinyLlama(dir.Join("run"));
  c.exit_interval = 7;
  const RunResult first = OpenAndTrain(c);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  EXPECT_EQ(first.state.counters.iteration, 7);
  c.exit_interval = 0;
  const RunResult second = OpenAndTrain(c);
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  EXPECT_EQ(second.resumed, ResumePoint::Kind::kResume);
  EXPECT_EQ(second.fingerprint, ref.fingerprint);
  // The same run in GPT-2's shape trains other bits: the options really are in the model.
  const RunResult gpt = OpenAndTrain(Tiny(dir.Join("gpt")));
  ASSERT_TRUE(gpt.status.ok());
  EXPECT_NE(gpt.fingerprint, ref.fingerprint);
  // Each Llama option is part of the model's shape: none may change on resume.
  for (int option = 0; option < 6; ++option) {
    TrainConfig changed = TinyLlama(dir.Join("ref"));
    changed.train_iters = 30;
    const char* key = "";
    switch (option) {
      case 0:
        changed.model.SetPosition(PositionEmbedding::kLearnedAbsolute), key = "position";
        break;
      case 1:
        changed.model.rmsnorm = false, key = "normalization";
        break;
      case 2:
        changed.model.swiglu = false, key = "swiglu";
        break;
      case 3:
        changed.model.num_query_groups = 4, key = "num-query-groups";
        break;
      case 4:
        changed.model.untie_embeddings = false, key = "untie";
        break;
      case 5:
        changed.model.bias = true, key = "disable-bias-linear";
        break;
    }
    const RunResult r = OpenAndTrain(changed);
    EXPECT_EQ(r.status.code(), Status::Code::kInvalidArgument) << key;
    EXPECT_NE(r.status.message().find(key), std::string::npos) << r.status.message();
    EXPECT_NE(r.status.message().find("model shape: cannot change on resume"), std::string::npos)
        << r.status.message();
  }
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
  c.model.heads = 3;  // 32 % 3 != 0
  r = OpenAndTrain(c);
  EXPECT_EQ(r.status.code(), Status::Code::kInvalidArgument) << r.status.ToString();
  EXPECT_FALSE(fs::exists(dir.Join("run/iter_0000005")));
}

// --backend picks the backend by name: an unknown one, or one lacking an op the config needs, stops
// the run at open naming what is missing, before any iteration or checkpoint.
TEST(TrainingRunTest, ABackendThatLacksAnOpTheConfigNeedsIsRefusedAtOpen) {
  RegisterBackend("lacks-rope", [](int threads) -> std::unique_ptr<Backend> {
    return std::make_unique<testing_backends::LackingBackend>(MakeCpuBackend(threads),
                                                              Op::kRopeBackward);
  });
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.backend = "tpu";  // unknown in every build ("cuda" has a message of its own)
  RunResult r = OpenAndTrain(c);
  EXPECT_EQ(r.status.code(), Status::Code::kInvalidArgument) << r.status.ToString();
  EXPECT_NE(r.status.message().find("no such backend"), std::string::npos) << r.status.message();
  c.backend = "lacks-rope";
  c.model.SetPosition(PositionEmbedding::kRope);
  r = OpenAndTrain(c);
  EXPECT_EQ(r.status.code(), Status::Code::kInvalidArgument) << r.status.ToString();
  EXPECT_NE(r.status.message().find("lacks RopeBackward, needed by --position-embedding-type rope"),
            std::string::npos)
      << r.status.message();
  EXPECT_FALSE(fs::exists(dir.Join("run/iter_0000005")));
  // The same backend trains a config that does not use the op.
  c = Tiny(dir.Join("run2"));
  c.backend = "lacks-rope";
  c.train_iters = 3;
  r = OpenAndTrain(c);
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
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
  resolved.model.vocab = 300;  // DatasetPrefix's
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

// KEEL_TRAIN_FAULTS=lr=A-B*X (the guard's scenario benchmark): the updates of iterations A..B
// use X times the scheduled LR, and nothing else changes.
TEST(TrainingRunTest, TestHooksRaiseTheLrOverAWindow) {
  ASSERT_EQ(setenv("KEEL_TRAIN_FAULTS", "lr=3-4*10,lr=4-4*2", 1), 0);
  TestHooks hooks;
  Status st = TestHooks::FromEnvironment(Env::Default(), &hooks);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const std::unique_ptr<TrainerFaults> faults = hooks.TrainerFaultsFor(0, nullptr);
  ASSERT_TRUE(faults);
  EXPECT_EQ(faults->LrFactor(2), 1.0);
  EXPECT_EQ(faults->LrFactor(3), 10.0);
  EXPECT_EQ(faults->LrFactor(4), 20.0);  // overlapping windows multiply
  EXPECT_EQ(faults->LrFactor(5), 1.0);
  for (const char* bad :
       {"lr=3-4", "lr=3-4*0", "lr=3-4*x", "lr=3-4*", "lr=x*2", "lr=3-4*2:rank=1"}) {
    ASSERT_EQ(setenv("KEEL_TRAIN_FAULTS", bad, 1), 0);
    st = TestHooks::FromEnvironment(Env::Default(), &hooks);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("lr=A-B*X"), std::string::npos) << st.message();
  }
  unsetenv("KEEL_TRAIN_FAULTS");
  EXPECT_FALSE(TestHooks().TrainerFaultsFor(0, nullptr));  // none armed: no faults at all

  TempDir dir;
  TrainConfig c = Tiny(dir.Join("clean"));
  c.guard = GuardLevel::kOff;
  const RunResult clean = OpenAndTrain(c);
  ASSERT_TRUE(clean.status.ok()) << clean.status.ToString();
  hooks = TestHooks();
  hooks.lr = {{{3, 4}, 10.0}};
  c.save = dir.Join("raised");
  const RunResult raised = OpenAndTrain(c, &hooks);
  ASSERT_TRUE(raised.status.ok()) << raised.status.ToString();
  EXPECT_NE(raised.fingerprint, clean.fingerprint);
  // The logged LR of iterations 3 and 4 is ten times the clean run's, the others equal.
  auto lrs = [](const std::string& metrics) {
    std::map<int64_t, double> out;
    std::istringstream in(datatest::ReadTextFile(metrics));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.value("kind", "") == "train") out[j["iteration"]] = j["learning_rate"];
    }
    return out;
  };
  const auto a = lrs(dir.Join("clean/metrics.jsonl")), b = lrs(dir.Join("raised/metrics.jsonl"));
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (const auto& [it, lr] : a)
    EXPECT_DOUBLE_EQ(b.at(it), (it == 3 || it == 4) ? 10 * lr : lr) << it;
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

// A dataset of `docs` documents of 39 tokens and an EOD each (so token p of the stream is token
// p % 40 of document p / 40), gpt2 metadata with vocabulary 512; token `bad_at` of the stream is
// `bad_id` when bad_at >= 0. int32 on disk, so any id fits.
std::string WriteFixedDataset(const std::string& prefix, int docs, int64_t bad_at = -1,
                              int32_t bad_id = 0) {
  IndexedDatasetWriter w(Env::Default(), prefix, std::numeric_limits<int32_t>::max());
  EXPECT_TRUE(w.Open().ok());
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> doc(40, 0);
    for (int i = 0; i < 39; ++i) doc[i] = 1 + (d * 7 + i * 13) % 500;
    if (bad_at >= 0 && bad_at / 40 == d) doc[bad_at % 40] = bad_id;
    EXPECT_TRUE(w.AddDocument(doc).ok());
  }
  EXPECT_TRUE(w.Finish({"gpt2", "", 512, 0}).ok());
  return prefix;
}

// The stream position of token `offset` of training sample `k` of config `c`'s run.
int64_t TrainTokenPosition(const TrainConfig& c, int64_t k, int offset) {
  std::unique_ptr<TrainData> td;
  Status st =
      TrainData::Open(Env::Default(), {{1.0, c.data_path[0]}}, c.split, c.seq_length, c.seed, &td);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::vector<int32_t> t(static_cast<size_t>(c.seq_length + 1));
  return td->GetTrainSample(k, 0, t.data()).first_token + offset;
}

TEST(TrainingRunTest, TokenOutsideTheVocabularyStopsTheRunNamingItAndKeepsTheProgress) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.data_path = {WriteFixedDataset(dir.Join("data"), 60)};
  c.save_interval = 100;  // the only checkpoint is the one the data error saves
  c.eval_interval = 100;
  // Token 5 of the 3rd sample of iteration 4 (global batch 4) becomes 2000000000.
  const int64_t p = TrainTokenPosition(c, 3 * 4 + 2, 5);
  WriteFixedDataset(dir.Join("data"), 60, p, 2000000000);
  const RunResult r = OpenAndTrain(c);
  ASSERT_EQ(r.status.code(), Status::Code::kInvalidArgument) << r.status.ToString();
  const std::string& m = r.status.message();
  for (const std::string& want : std::vector<std::string>{
           fmt::format("token {} of document {} is id 2000000000", p % 40, p / 40),
           "outside the vocabulary [0, 512)", "--data-path " + dir.Join("data"),
           "training sample 14 of iteration 4", "keel data verify " + dir.Join("data"),
           "keel data prepare", "Iteration 3, the last completed, was saved in " + c.save})
    EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m;
  EXPECT_EQ(r.state.counters.iteration, 3);
  EXPECT_TRUE(fs::exists(dir.Join("run/iter_0000003")));
  EXPECT_FALSE(fs::exists(dir.Join("run/iter_0000004")));

  // Once the data is fixed, the same run resumes from the kept iteration and finishes.
  WriteFixedDataset(dir.Join("data"), 60);
  const RunResult fixed = OpenAndTrain(c);
  ASSERT_TRUE(fixed.status.ok()) << fixed.status.ToString();
  EXPECT_EQ(fixed.resumed, ResumePoint::Kind::kResume);
  EXPECT_EQ(fixed.start_iteration, 3);
  EXPECT_EQ(fixed.state.counters.iteration, 20);
}

TEST(TrainingRunTest, ValidationTokenOutsideTheVocabularyIsCaughtToo) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.save_interval = 100;
  // 60 documents split 969,30,1: the validation split is documents 58 and 59, read whole by an
  // evaluation (global batch 4 x 16 tokens); the first id past the vocabulary in document 59.
  c.data_path = {WriteFixedDataset(dir.Join("data"), 60, 59 * 40 + 3, 512)};
  const RunResult r = OpenAndTrain(c);
  ASSERT_EQ(r.status.code(), Status::Code::kInvalidArgument) << r.status.ToString();
  const std::string& m = r.status.message();
  for (const std::string& want : std::vector<std::string>{
           "token 3 of document 59 is id 512", std::string("validation sample"),
           std::string("of the evaluation after iteration 10"),
           "Iteration 10, the last completed, was saved in " + c.save})
    EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m;
  EXPECT_TRUE(fs::exists(dir.Join("run/iter_0000010")));
}

TEST(TrainingRunTest, AnUpdateThatLeavesNonFiniteWeightsStopsTheRunUnsaved) {
  TempDir dir;
  TrainConfig c = Tiny(dir.Join("run"));
  c.exit_interval = 3;  // a first process saves iteration 3 and stops
  ASSERT_TRUE(OpenAndTrain(c).status.ok());
  c.exit_interval = 0;
  // The reopened run continues at an LR scale no config would pass (as a hand-edited state
  // could): its first update drives the weights to Inf and NaN.
  auto comm = MakeSingleProcessCommunicator();
  std::unique_ptr<TrainingRun> run;
  ASSERT_TRUE(TrainingRun::Open(c, {Env::Default(), comm.get(), nullptr}, &run).ok());
  TrainState s = run->trainer().state();
  ASSERT_EQ(s.counters.iteration, 3);
  s.lr_scale = 1e308;
  run->trainer().Restore(s);
  TrainingRun::Outcome outcome;
  const Status st = run->Train(&outcome);
  ASSERT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  for (const std::string& want : std::vector<std::string>{
           "iteration 4: the update at learning rate", std::string("NaN or Inf"),
           std::string("embedding.word_embeddings.weight"), std::string("without saving"),
           "the last checkpoint is " + dir.Join("run/iter_0000003"), std::string("smaller --lr")})
    EXPECT_NE(st.message().find(want), std::string::npos) << want << "\n" << st.message();
  EXPECT_FALSE(fs::exists(dir.Join("run/iter_0000004")));
  EXPECT_EQ(datatest::ReadTextFile(dir.Join("run/latest_checkpointed_iteration.txt")), "3\n");
  // And a checkpoint holding such weights is never continued from (nor sampled, nor exported:
  // tests/cli/hostile_input_cli_test.cc).
}

}  // namespace
}  // namespace keel
