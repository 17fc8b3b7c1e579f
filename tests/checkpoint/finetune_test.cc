// --finetune in process (checkpoint/resume.h, train/checkpoint_controller.h): which checkpoint a
// fine-tuning run takes, that only the model's shape must match (the schedule, data order and
// sequence length are the run's own), that a checkpoint written by `keel ckpt import` loads so by
// itself, that the same command resumes the fine-tuning run once --save holds its checkpoints, and
// that only the weights come back (iteration 0, zero moments).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/resume.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "hf/hf_import.h"
#include "train/checkpoint_controller.h"
#include "train/trainer.h"

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
      ::testing::TempDir() + "/keel_finetune_" + name + "_" + std::to_string(getpid());
  fs::remove_all(d);
  return d;
}

// A checkpoint of iteration 7 (weights initialised from the config's seed, moments set to 1).
void SaveSource(const TrainConfig& c, const std::string& root) {
  auto be = MakeCpuBackend(1);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(c, be.get(), comm.get(), {SampleFn(), SampleFn()});
  tr.InitializeWeights();
  std::vector<float> ones(tr.optimizer().shard().size(), 1.0f);
  be->CopyToDevice(tr.optimizer().exp_avg(), ones.data(), ones.size());
  TrainState s = tr.state();
  s.counters.iteration = 7;
  s.counters.consumed_samples = 28;
  s.optimizer_step = 7;
  tr.Restore(s);
  CheckpointStore store(Env::Default(), root, nullptr);
  RunInfo run;
  run.meta.tokenizer = "none";
  CheckpointController ctl(c, Env::Default(), &store, &tr, run, nlohmann::json::array(), nullptr);
  ASSERT_TRUE(ctl.SaveNow("test").ok());
}

Status Resolve(const TrainConfig& c, ResumePoint* p) {
  return ResolveResumePoint(Env::Default(), c, nullptr, p);
}

std::string Notes(const ResumePoint& p) {
  std::string s;
  for (const std::string& n : p.notes) s += n + "\n";
  return s;
}

TEST(FinetuneTest, TakesTheWeightsOnlyWithTheRunsOwnScheduleAndData) {
  const std::string src = FreshDir("src"), run = FreshDir("run");
  TrainConfig c = Tiny();
  SaveSource(c, src);
  TrainConfig f = c;
  f.load = src;
  f.save = run;
  f.finetune = true;
  // Another schedule, seed and sequence length: the run's own, no override flags needed.
  f.lr = 1e-4;
  f.min_lr = 1e-5;
  f.seed = 99;
  f.seq_length = 4;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&f, &notes).ok()) << Validate(&f, &notes).ToString();
  ResumePoint p;
  Status st = Resolve(f, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.kind, ResumePoint::Kind::kFinetune);
  EXPECT_FALSE(p.continues_run());
  EXPECT_FALSE(p.in_save_dir());
  EXPECT_NE(Notes(p).find("--finetune: only the model weights of " + src + "/iter_0000007"),
            std::string::npos)
      << Notes(p);
  // The weights come back; counters and moments stay fresh.
  auto be = MakeCpuBackend(1);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(f, be.get(), comm.get(), {SampleFn(), SampleFn()});
  ASSERT_TRUE(LoadWeightsOnly(Env::Default(), *p.saved, &tr).ok());
  EXPECT_EQ(tr.state().counters.iteration, 0);
  EXPECT_EQ(tr.state().optimizer_step, 0);
  Trainer ref(c, be.get(), comm.get(), {SampleFn(), SampleFn()});
  ref.InitializeWeights();  // the source's weights (same seed, same init)
  std::vector<float> a(tr.model().num_params()), b(a.size()), m(tr.optimizer().shard().size());
  be->CopyToHost(a.data(), tr.model().param_data(), a.size());
  be->CopyToHost(b.data(), ref.model().param_data(), b.size());
  EXPECT_EQ(a, b);
  be->CopyToHost(m.data(), tr.optimizer().exp_avg(), m.size());
  EXPECT_EQ(m, std::vector<float>(m.size(), 0.0f));
  fs::remove_all(src);
  fs::remove_all(run);
}

TEST(FinetuneTest, AnotherShapeIsRefusedWithTheDiff) {
  const std::string src = FreshDir("shape_src"), run = FreshDir("shape_run");
  TrainConfig c = Tiny();
  SaveSource(c, src);
  TrainConfig f = c;
  f.load = src;
  f.save = run;
  f.finetune = true;
  f.model.hidden = 32;
  f.model.ffn_hidden = 0;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&f, &notes).ok()) << Validate(&f, &notes).ToString();
  ResumePoint p;
  Status st = Resolve(f, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--finetune loads weights into a model of the same shape"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("hidden-size: 16 -> 32"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(run));
  // --finetune of a checkpoint of --save itself is a rollback, not a new run.
  TrainConfig g = c;
  g.save = src;
  g.load = src + "/iter_0000007";
  g.finetune = true;
  st = Resolve(g, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("drop --finetune to roll the run back"), std::string::npos)
      << st.message();
  // And --finetune needs --load, another directory than --save.
  TrainConfig h = Tiny();
  h.finetune = true;
  h.save = run;
  EXPECT_NE(Validate(&h, &notes).message().find("--finetune needs --load DIR"), std::string::npos);
  h.load = run;
  EXPECT_NE(Validate(&h, &notes).message().find("which is --save itself"), std::string::npos);
  fs::remove_all(src);
}

TEST(FinetuneTest, AnImportLoadsAsFinetuneAndTheSameCommandResumes) {
  const std::string imp = FreshDir("imp"), run = FreshDir("imp_run");
  TrainConfig c = Tiny();
  // An import of the Tiny model, written as `keel ckpt import` writes it.
  auto be = MakeCpuBackend(1);
  GptModel model(be.get(), c.model);
  model.Initialize(1, 0.02f);
  CheckpointTokenizer tok;
  tok.kind = "none";
  tok.vocab_size = 50;
  tok.eod_id = 0;
  TrainConfig ic;
  std::vector<std::string> notes;
  ASSERT_TRUE(TrainConfigForSpec(model.spec(), tok, &ic, &notes).ok());
  uint64_t bytes = 0;
  ASSERT_TRUE(WriteImportedCheckpoint(Env::Default(), imp, ic, &model, tok, {{"from", "hf"}},
                                      nullptr, &bytes)
                  .ok());
  TrainConfig f = c;
  f.load = imp;
  f.save = run;
  ResumePoint p;
  Status st = Resolve(f, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.kind, ResumePoint::Kind::kFinetune);
  EXPECT_NE(Notes(p).find("was imported from Hugging Face (keel ckpt import): loading its weights "
                          "only, as --finetune does"),
            std::string::npos)
      << Notes(p);
  // Once --save holds the fine-tuning run's checkpoints, the same command resumes them.
  SaveSource(c, run);
  st = Resolve(f, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.kind, ResumePoint::Kind::kResume);
  EXPECT_EQ(p.saved->train.counters.iteration, 7);
  EXPECT_NE(Notes(p).find("already holds this fine-tuning run's checkpoints: resuming it"),
            std::string::npos)
      << Notes(p);
  // A --load of an ordinary run into that --save is still refused.
  const std::string other = FreshDir("other");
  SaveSource(c, other);
  f.load = other;
  st = Resolve(f, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("already holds checkpoints of a run"), std::string::npos);
  fs::remove_all(imp);
  fs::remove_all(run);
  fs::remove_all(other);
}

}  // namespace
}  // namespace keel
