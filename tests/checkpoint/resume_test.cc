// Resume resolution in-process (checkpoint/resume.h): which checkpoint a run continues from for
// every combination of --save and --load, what happens to checkpoints that fail verification or
// disagree with the marker, and the resume rules for config changes.
#include "checkpoint/resume.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "train/checkpoint_controller.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

TrainConfig Tiny() {
  TrainConfig c;
  c.model.num_layers = 1;
  c.model.hidden = 16;
  c.model.heads = 2;
  c.seq_length = 8;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = 40;
  c.lr_warmup_iters = 2;
  c.model.vocab = 50;
  c.threads = 1;
  std::vector<std::string> notes;
  Status st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return c;
}

std::string FreshDir(const std::string& name) {
  const std::string d =
      ::testing::TempDir() + "/keel_resume_" + name + "_" + std::to_string(getpid());
  fs::remove_all(d);
  return d;
}

// Saves checkpoints of a (never trained) model at `iterations` into `root`.
void SaveCheckpoints(const TrainConfig& c, const std::string& root,
                     const std::vector<int64_t>& iterations) {
  auto be = MakeCpuBackend(1);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(c, be.get(), comm.get(), {SampleFn(), SampleFn()});
  tr.InitializeWeights();
  CheckpointStore store(Env::Default(), root, nullptr);
  RunInfo run;
  run.meta.tokenizer = "none";
  CheckpointController ctl(c, Env::Default(), &store, &tr, run, nlohmann::json::array(), nullptr);
  for (int64_t it : iterations) {
    TrainState s = tr.state();
    s.counters.iteration = it;
    s.counters.consumed_samples = it * c.global_batch_size;
    s.optimizer_step = it;
    tr.Restore(s);
    ASSERT_TRUE(ctl.SaveNow("test").ok());
  }
}

void FlipAByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-5, std::ios::end);
  char ch = 0;
  f.get(ch);
  f.seekp(-5, std::ios::end);
  f.put(static_cast<char>(ch ^ 0x5a));
}

int64_t Iteration(const ResumePoint& p) {
  return p.saved ? p.saved->train.counters.iteration : -1;
}

std::vector<std::string> Log;
void Logger(const std::string& l) {
  Log.push_back(l);
}
bool Logged(const std::string& part) {
  for (const std::string& l : Log)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

TEST(ResumeTest, NoCheckpointStartsFresh) {
  TrainConfig c = Tiny();
  ResumePoint p;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());  // no --save at all
  EXPECT_EQ(p.kind, ResumePoint::Kind::kFresh);
  c.save = FreshDir("fresh");
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());  // an empty --save
  EXPECT_EQ(p.kind, ResumePoint::Kind::kFresh);
  EXPECT_EQ(p.saved, nullptr);
}

TEST(ResumeTest, ResumesTheNewestValidCheckpointOfSave) {
  TrainConfig c = Tiny();
  c.save = FreshDir("newest");
  SaveCheckpoints(c, c.save, {10, 20, 30});
  ResumePoint p;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(p.kind, ResumePoint::Kind::kResume);
  EXPECT_TRUE(p.in_save_dir());
  EXPECT_EQ(Iteration(p), 30);
  EXPECT_EQ(p.saved->train.optimizer_step, 30);
  EXPECT_TRUE(p.accepted.empty());
  // Megatron's --save X --load X is the same resume.
  c.load = c.save;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(p.kind, ResumePoint::Kind::kResume);
  EXPECT_EQ(Iteration(p), 30);
  fs::remove_all(c.save);
}

TEST(ResumeTest, CorruptNewestIsSetAsideAndTheOneBeforeIsUsed) {
  TrainConfig c = Tiny();
  c.save = FreshDir("corrupt");
  SaveCheckpoints(c, c.save, {10, 20});
  FlipAByte(c.save + "/iter_0000020/model.safetensors");
  Log.clear();
  ResumePoint p;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(p.kind, ResumePoint::Kind::kResume);
  EXPECT_EQ(Iteration(p), 10);
  EXPECT_TRUE(fs::exists(c.save + "/iter_0000020.corrupt"));  // kept for inspection, said so
  EXPECT_FALSE(fs::exists(c.save + "/iter_0000020"));
  EXPECT_TRUE(Logged("iter_0000020 is unusable")) << ::testing::PrintToString(Log);
  // When every checkpoint is broken the run refuses to start afresh over them.
  FlipAByte(c.save + "/iter_0000010/model.safetensors");
  Status st = ResolveResumePoint(Env::Default(), c, Logger, &p);
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("pass a new --save directory"), std::string::npos);
  fs::remove_all(c.save);
}

TEST(ResumeTest, LoadOfOwnCheckpointIsARollbackThatChangesNothingYet) {
  TrainConfig c = Tiny();
  c.save = FreshDir("rollback");
  SaveCheckpoints(c, c.save, {10, 20, 30});
  c.load = c.save + "/iter_0000020";
  ResumePoint p;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(p.kind, ResumePoint::Kind::kRollback);
  EXPECT_EQ(Iteration(p), 20);
  // Resolution only decides: iteration 30 is set aside when the run starts (RollbackTo), so a
  // refused config change leaves the run directory as it was.
  EXPECT_TRUE(fs::exists(c.save + "/iter_0000030"));
  c.lr *= 2;
  Status st = ResolveResumePoint(Env::Default(), c, Logger, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(fs::exists(c.save + "/iter_0000030"));
  fs::remove_all(c.save);
}

TEST(ResumeTest, LoadOfAnotherRunStartsFromItAndNeverMixesTwoRuns) {
  TrainConfig c = Tiny();
  const std::string other = FreshDir("other");
  SaveCheckpoints(c, other, {10, 20});
  c.save = FreshDir("mine");
  c.load = other;
  ResumePoint p;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(p.kind, ResumePoint::Kind::kLoad);
  EXPECT_FALSE(p.in_save_dir());  // --save numbers its own checkpoints
  EXPECT_EQ(Iteration(p), 20);
  c.load = other + "/iter_0000010";  // one checkpoint of another run
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(p.kind, ResumePoint::Kind::kLoad);
  EXPECT_EQ(Iteration(p), 10);
  // Once --save has checkpoints of its own, --load of another run is refused.
  SaveCheckpoints(c, c.save, {5});
  Status st = ResolveResumePoint(Env::Default(), c, Logger, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("already holds checkpoints"), std::string::npos) << st.message();
  // An empty --load beside a --save with checkpoints is ambiguous: refused, naming both ways out.
  c.load = FreshDir("empty_beside");
  fs::create_directories(c.load);
  st = ResolveResumePoint(Env::Default(), c, Logger, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("is empty, but --save " + c.save + " holds checkpoints"),
            std::string::npos)
      << st.message();
  fs::remove_all(other);
  fs::remove_all(c.load);
  fs::remove_all(c.save);
}

// Megatron's first launch of a `--save X --load X` script: X is empty or absent, and the run
// starts from scratch, with a note (Megatron prints a warning).
TEST(ResumeTest, EmptyOrAbsentLoadStartsFreshWithANote) {
  TrainConfig c = Tiny();
  for (const char* state : {"absent", "empty", "other files"}) {
    c.save = c.load = FreshDir("save_is_load");
    if (std::string(state) != "absent") fs::create_directories(c.load);
    if (std::string(state) == "other files") std::ofstream(c.load + "/events.jsonl") << "{}\n";
    ResumePoint p;
    Status st = ResolveResumePoint(Env::Default(), c, Logger, &p);
    ASSERT_TRUE(st.ok()) << state << ": " << st.ToString();
    EXPECT_EQ(p.kind, ResumePoint::Kind::kFresh) << state;
    ASSERT_EQ(p.notes.size(), 1u) << state;
    EXPECT_NE(p.notes[0].find("--load " + c.load), std::string::npos) << p.notes[0];
    EXPECT_NE(p.notes[0].find("starting from fresh weights"), std::string::npos) << p.notes[0];
    fs::remove_all(c.save);
  }
  // --load elsewhere, empty, and a new --save: fresh too.
  c.save = FreshDir("new_save");
  c.load = FreshDir("nothing_here");
  ResumePoint p;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(p.kind, ResumePoint::Kind::kFresh);
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("does not exist"), std::string::npos) << p.notes[0];
  // The second launch of the same script resumes what the first one saved.
  c.load = c.save;
  SaveCheckpoints(c, c.save, {10});
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(p.kind, ResumePoint::Kind::kResume);
  EXPECT_EQ(Iteration(p), 10);
  EXPECT_TRUE(p.notes.empty());
  fs::remove_all(c.save);
}

// A Megatron-LM or DeepSpeed checkpoint in --load or --save is named and left as it is: a keel
// resume would otherwise take its iter_N directories for damaged checkpoints and set them aside.
TEST(ResumeTest, MegatronOrDeepSpeedCheckpointIsRefusedAndLeftUntouched) {
  TrainConfig c = Tiny();
  const std::string megatron = FreshDir("megatron_ckpt");
  c.save = c.load = megatron;
  fs::create_directories(c.save + "/iter_0000100/mp_rank_00");
  std::ofstream(c.save + "/iter_0000100/mp_rank_00/model_optim_rng.pt") << "torch";
  std::ofstream(c.save + "/" + kMarkerFile) << "100";
  ResumePoint p;
  Status st = ResolveResumePoint(Env::Default(), c, Logger, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("written by Megatron-LM or DeepSpeed"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("iter_0000100/mp_rank_00"), std::string::npos) << st.message();
  EXPECT_TRUE(fs::exists(c.save + "/iter_0000100/mp_rank_00/model_optim_rng.pt"));
  EXPECT_FALSE(fs::exists(c.save + "/iter_0000100.corrupt"));
  // DeepSpeed's layout: global_stepN/ and a `latest` tag, as --load of another directory.
  const std::string ds = FreshDir("deepspeed_ckpt");
  fs::create_directories(ds + "/global_step100");
  std::ofstream(ds + "/latest") << "global_step100";
  c.save = FreshDir("fresh_save");
  c.load = ds;
  st = ResolveResumePoint(Env::Default(), c, Logger, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--load " + ds), std::string::npos) << st.message();
  EXPECT_TRUE(fs::exists(ds + "/global_step100"));
  fs::remove_all(ds);
  fs::remove_all(megatron);
}

TEST(ResumeTest, MarkerBehindAdoptsTheCompleteNewerCheckpoint) {
  TrainConfig c = Tiny();
  c.save = FreshDir("marker_behind");
  SaveCheckpoints(c, c.save, {10, 20});
  // As if the process died after renaming iter_0000020 but before the marker update.
  std::ofstream(c.save + "/" + kMarkerFile) << "10\n";
  Log.clear();
  ResumePoint p;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(Iteration(p), 20);
  EXPECT_TRUE(Logged("adopting it")) << ::testing::PrintToString(Log);
  CheckpointStore store(Env::Default(), c.save, nullptr);
  int64_t marker = -1;
  ASSERT_TRUE(store.ReadMarker(&marker).ok());
  EXPECT_EQ(marker, 20);
  fs::remove_all(c.save);
}

TEST(ResumeTest, MarkerAheadOfEveryCheckpointIsReportedAndTheNewestUsed) {
  TrainConfig c = Tiny();
  c.save = FreshDir("marker_ahead");
  SaveCheckpoints(c, c.save, {10, 20});
  // A marker naming a checkpoint that is gone (deleted by hand, or a lost directory).
  std::ofstream(c.save + "/" + kMarkerFile) << "30\n";
  Log.clear();
  ResumePoint p;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), c, Logger, &p).ok());
  EXPECT_EQ(Iteration(p), 20);
  EXPECT_TRUE(Logged("names iteration 30 but iter_0000030 does not exist"))
      << ::testing::PrintToString(Log);
  fs::remove_all(c.save);
}

TEST(ResumeTest, ConfigChangesNeedTheirFlagAndAreReportedWhenAccepted) {
  TrainConfig c = Tiny();
  c.save = FreshDir("diffs");
  SaveCheckpoints(c, c.save, {10});
  ResumePoint p;
  TrainConfig now = c;
  now.lr = c.lr * 2;     // a scheduler change
  now.log_interval = 3;  // a free change
  Status st = ResolveResumePoint(Env::Default(), now, Logger, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--override-scheduler"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("iter_0000010"), std::string::npos) << st.message();
  now.override_scheduler = true;
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), now, Logger, &p).ok());
  ASSERT_EQ(p.accepted.size(), 1u);
  EXPECT_EQ(p.accepted[0].key, "lr");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("log-interval"), std::string::npos);
  now.model.hidden = 32;  // the model's shape: never
  st = ResolveResumePoint(Env::Default(), now, Logger, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("model shape"), std::string::npos) << st.message();
  fs::remove_all(c.save);
}

// Master weights and moments are fp32 in every recipe: switching precision on resume is a free
// change, accepted without a flag and reported.
TEST(ResumeTest, PrecisionMayChangeOnResumeAndIsReported) {
  TrainConfig c = Tiny();
  c.save = FreshDir("precision");
  SaveCheckpoints(c, c.save, {10});
  ResumePoint p;
  TrainConfig now = c;
  now.precision = Precision::kBf16;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&now, &notes).ok());
  ASSERT_TRUE(ResolveResumePoint(Env::Default(), now, Logger, &p).ok());
  EXPECT_TRUE(p.accepted.empty());
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("bf16: false -> true"), std::string::npos) << p.notes[0];
  ASSERT_TRUE(p.saved);
  EXPECT_EQ(p.saved->config.precision, Precision::kFp32);
  fs::remove_all(c.save);
}

}  // namespace
}  // namespace keel
