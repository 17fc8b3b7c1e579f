// Training checkpoints in-process: a run saved and resumed (through the files on disk) gives the
// same losses and the same final state bits as one that never stopped, including mid log-interval
// and across a batch ramp-up; a checkpoint that does not match the model is refused; config
// changes on resume are classified and refused or accepted by the right flag.
#include "checkpoint/train_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "../train/pattern_data.h"
#include "../train/test_loop.h"
#include "backend/profiling_backend.h"
#include "checkpoint/manifest.h"
#include "checkpoint/resume.h"
#include "checkpoint/safetensors.h"
#include "core/fault_injection_env.h"
#include "core/rng.h"
#include "train/checkpoint_controller.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using test_loop::CapturedLog;
using test_loop::TestLoop;

TrainConfig Tiny(bool ramp = true) {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden = 32;
  c.model.heads = 4;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  if (ramp) {
    c.rampup_batch_size = {4, 2, 24};  // 4, 6, then 8 sequences per iteration
    c.train_iters = 0;
    c.train_samples = 100;
    c.lr_warmup_iters = 0;
    c.lr_warmup_samples = 12;
  } else {
    c.train_iters = 14;
    c.lr_warmup_iters = 3;
  }
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.model.vocab = 50;
  c.log_interval = 4;
  c.eval_interval = 7;
  c.eval_iters = 1;
  c.threads = 2;
  std::vector<std::string> notes;
  Status st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return c;
}

// The learnable pattern stream of the trainer tests (tests/train/pattern_data.h).
using test_data::PatternData;

struct Harness {
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  std::unique_ptr<Communicator> comm = MakeSingleProcessCommunicator();
  Trainer tr;
  explicit Harness(const TrainConfig& c)
      : tr(c, be.get(), comm.get(), {PatternData(1), PatternData(2)}) {}
};

RunInfo NoTokenizer() {
  RunInfo r;
  r.meta.tokenizer = "none";
  return r;
}

// The iteration lines without their timing fields.
std::string Untimed(const std::string& line) {
  std::string out;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t bar = line.find('|', pos);
    std::string field = line.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos);
    if (field.find("elapsed time") == std::string::npos &&
        field.find("samples per second") == std::string::npos &&
        field.find("TFLOPs") == std::string::npos)
      out += field + "|";
    if (bar == std::string::npos) break;
    pos = bar + 1;
  }
  return out;
}

TEST(TrainCheckpointTest, ResumeMidIntervalIsBitIdenticalToAnUninterruptedRun) {
  const TrainConfig c = Tiny();
  // Uninterrupted.
  Harness a(c);
  a.tr.InitializeWeights();
  std::vector<std::string> lines_a;
  {
    CapturedLog log;
    ASSERT_TRUE(TestLoop{&a.tr}.Run().ok());
    for (const std::string& l : log.lines) lines_a.push_back(Untimed(l));
  }
  const uint64_t want = a.tr.StateFingerprint();

  // Stopped at iteration 6 (mid log interval, mid ramp-up), saved, reloaded in a new trainer.
  const std::string root = ::testing::TempDir() + "/keel_train_ckpt_" + std::to_string(getpid());
  fs::remove_all(root);
  std::vector<std::string> lines_b;
  {
    Harness b(c);
    b.tr.InitializeWeights();
    CheckpointStore store(Env::Default(), root, nullptr);
    CheckpointController ctl(c, Env::Default(), &store, &b.tr, NoTokenizer(),
                             nlohmann::json::array(), nullptr);
    CapturedLog log;
    TestLoop loop{&b.tr};
    loop.go_on = [&] { return b.tr.state().counters.iteration < 6; };
    ASSERT_TRUE(loop.Run().ok());
    for (const std::string& l : log.lines) lines_b.push_back(Untimed(l));
    ASSERT_EQ(b.tr.state().counters.iteration, 6);
    ASSERT_TRUE(ctl.SaveNow("test").ok());
  }
  Harness r(c);
  CheckpointStore store(Env::Default(), root, nullptr);
  CheckpointInfo info;
  ASSERT_TRUE(store.FindNewestValid(true, &info).ok());
  SavedTrainState saved;
  ASSERT_TRUE(ReadSavedTrainState(Env::Default(), info.path, &saved).ok());
  EXPECT_EQ(saved.train.counters.iteration, 6);
  EXPECT_EQ(saved.train.optimizer_step, 6);
  EXPECT_TRUE(DiffConfigForResume(saved.config, c).empty());
  ASSERT_TRUE(RestoreTrainer(Env::Default(), saved, &r.tr).ok());
  {
    CapturedLog log;
    ASSERT_TRUE(TestLoop{&r.tr}.Run().ok());
    for (const std::string& l : log.lines) lines_b.push_back(Untimed(l));
  }
  EXPECT_EQ(lines_b, lines_a);  // same losses, LRs, batch sizes, validation, at every line
  EXPECT_EQ(r.tr.StateFingerprint(), want);
  fs::remove_all(root);
}

// A save reads the weights without writing them: the bf16 compute copy stays current (the next
// Forward converts nothing), and the run's bits are those of a run that never saved.
TEST(TrainCheckpointTest, SavingLeavesTheBf16CopyCurrent) {
  TrainConfig c = Tiny(false);
  c.precision = Precision::kBf16;
  c.train_iters = 4;
  Harness a(c);
  a.tr.InitializeWeights();
  ASSERT_TRUE(TestLoop{&a.tr}.Run().ok());

  const std::string root = ::testing::TempDir() + "/keel_lowp_ckpt_" + std::to_string(getpid());
  fs::remove_all(root);
  Harness b(c);
  b.tr.InitializeWeights();
  CheckpointStore store(Env::Default(), root, nullptr);
  CheckpointController ctl(c, Env::Default(), &store, &b.tr, NoTokenizer(), nlohmann::json::array(),
                           nullptr);
  TestLoop loop{&b.tr};
  loop.go_on = [&] { return ctl.SaveNow("test").ok(); };
  ASSERT_TRUE(loop.Run().ok());
  EXPECT_EQ(b.tr.state().counters.iteration, 4);
  EXPECT_EQ(b.tr.model().lowp_conversions(), a.tr.model().lowp_conversions());
  EXPECT_EQ(b.tr.model().lowp_conversions(), 1);  // the first Forward's, and no other
  EXPECT_EQ(b.tr.StateFingerprint(), a.tr.StateFingerprint());
  fs::remove_all(root);
}

// A backend whose memory the host cannot read gets its checkpoint through staged host copies
// (Backend's default ViewOnHost): the same tensors as the CPU backend's zero-copy views.
class StagingBackend : public ProfilingBackend {
 public:
  using ProfilingBackend::ProfilingBackend;
  HostView ViewOnHost(const float* src, size_t n) override { return Backend::ViewOnHost(src, n); }
};

TEST(TrainCheckpointTest, StagedHostViewsWriteTheSameTensors) {
  const TrainConfig c = Tiny(false);
  Harness h(c);
  h.tr.InitializeWeights();
  TestLoop loop{&h.tr};
  loop.go_on = [&] { return h.tr.state().counters.iteration < 2; };
  ASSERT_TRUE(loop.Run().ok());
  CheckpointStaging zero_copy, staged;
  std::vector<CheckpointFile> direct, copied;
  ASSERT_TRUE(BuildTrainCheckpoint(Env::Default(), CheckpointSourceOf(h.tr), NoTokenizer(),
                                   nlohmann::json::array(), &zero_copy, &direct)
                  .ok());
  EXPECT_TRUE(zero_copy.params.zero_copy());
  StagingBackend staging_backend(h.be.get());
  TrainCheckpointSource src = CheckpointSourceOf(h.tr);
  GptModel staged_model(&staging_backend, h.tr.model().spec());
  staging_backend.CopyToDevice(staged_model.mutable_param_data(), h.tr.model().param_data(),
                               h.tr.model().num_params());
  src.model = &staged_model;
  ASSERT_TRUE(BuildTrainCheckpoint(Env::Default(), src, NoTokenizer(), nlohmann::json::array(),
                                   &staged, &copied)
                  .ok());
  EXPECT_FALSE(staged.params.zero_copy());
  EXPECT_FALSE(staged.exp_avg.zero_copy());
  ASSERT_EQ(direct.size(), copied.size());
  for (size_t f = 0; f < direct.size(); ++f) {
    SCOPED_TRACE(direct[f].name);
    ASSERT_EQ(direct[f].tensors.size(), copied[f].tensors.size());
    for (size_t t = 0; t < direct[f].tensors.size(); ++t) {
      const TensorView &x = direct[f].tensors[t], &y = copied[f].tensors[t];
      EXPECT_EQ(x.name, y.name);
      size_t n = 1;
      for (int64_t d : x.shape) n *= static_cast<size_t>(d);
      EXPECT_NE(x.data, y.data) << x.name;
      EXPECT_EQ(std::memcmp(x.data, y.data, n * sizeof(float)), 0) << x.name;
    }
  }
}

// fp16: the loss scaler's scale and trackers travel with the checkpoint (a resumed run that
// restarted the scale at 2^32 would skip updates the uninterrupted run applied).
TEST(TrainCheckpointTest, Fp16ResumeCarriesTheLossScalerBitForBit) {
  TrainConfig c = Tiny(false);
  c.precision = Precision::kFp16;
  c.initial_loss_scale = 1024;
  c.loss_scale_window = 3;  // the scale climbs, overflows, backs off within 14 iterations
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  Harness a(c);
  a.tr.InitializeWeights();
  ASSERT_TRUE(TestLoop{&a.tr}.Run().ok());
  const uint64_t want = a.tr.StateFingerprint();

  const std::string root = ::testing::TempDir() + "/keel_fp16_ckpt_" + std::to_string(getpid());
  fs::remove_all(root);
  LossScalerState at_save;
  {
    Harness b(c);
    b.tr.InitializeWeights();
    CheckpointStore store(Env::Default(), root, nullptr);
    CheckpointController ctl(c, Env::Default(), &store, &b.tr, NoTokenizer(),
                             nlohmann::json::array(), nullptr);
    TestLoop loop{&b.tr};
    loop.go_on = [&] { return b.tr.state().counters.iteration < 7; };
    ASSERT_TRUE(loop.Run().ok());
    at_save = b.tr.state().loss_scaler;
    ASSERT_NE(at_save.scale, 1024);  // the scale moved: the test can tell a reset
    ASSERT_TRUE(ctl.SaveNow("test").ok());
  }
  Harness r(c);
  CheckpointStore store(Env::Default(), root, nullptr);
  CheckpointInfo info;
  ASSERT_TRUE(store.FindNewestValid(true, &info).ok());
  SavedTrainState saved;
  ASSERT_TRUE(ReadSavedTrainState(Env::Default(), info.path, &saved).ok());
  EXPECT_EQ(saved.train.loss_scaler, at_save);
  EXPECT_EQ(saved.config.precision, Precision::kFp16);
  ASSERT_TRUE(RestoreTrainer(Env::Default(), saved, &r.tr).ok());
  EXPECT_EQ(r.tr.loss_scaler()->state(), at_save);
  ASSERT_TRUE(TestLoop{&r.tr}.Run().ok());
  EXPECT_EQ(r.tr.StateFingerprint(), want);
  fs::remove_all(root);
}

TEST(TrainCheckpointTest, CheckpointOfAnotherShapeIsRefused) {
  TrainConfig c = Tiny();
  const std::string root =
      ::testing::TempDir() + "/keel_train_ckpt_shape_" + std::to_string(getpid());
  fs::remove_all(root);
  {
    Harness h(c);
    h.tr.InitializeWeights();
    CheckpointStore store(Env::Default(), root, nullptr);
    CheckpointController ctl(c, Env::Default(), &store, &h.tr, NoTokenizer(),
                             nlohmann::json::array(), nullptr);
    ASSERT_TRUE(ctl.SaveNow("test").ok());
  }
  SavedTrainState saved;
  ASSERT_TRUE(ReadSavedTrainState(Env::Default(), root + "/iter_0000000", &saved).ok());
  TrainConfig other = c;
  other.model.hidden = 64;
  Harness h(other);
  Status st = RestoreTrainer(Env::Default(), saved, &h.tr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("differs from this run's"), std::string::npos) << st.message();
  fs::remove_all(root);
}

// --qk-layernorm-epsilon is in the checkpoint's model (where it differs from the LayerNorm
// epsilon) and its config: it comes back, and a run with another one is refused.
TEST(TrainCheckpointTest, QkLayerNormEpsilonRoundTripsThroughACheckpoint) {
  TrainConfig c = Tiny();
  c.model.qk_layernorm = true;
  c.model.qk_layernorm_eps = 1e-3f;
  const std::string root =
      ::testing::TempDir() + "/keel_train_ckpt_qkeps_" + std::to_string(getpid());
  fs::remove_all(root);
  {
    Harness h(c);
    h.tr.InitializeWeights();
    CheckpointStore store(Env::Default(), root, nullptr);
    CheckpointController ctl(c, Env::Default(), &store, &h.tr, NoTokenizer(),
                             nlohmann::json::array(), nullptr);
    ASSERT_TRUE(ctl.SaveNow("test").ok());
  }
  SavedTrainState saved;
  ASSERT_TRUE(ReadSavedTrainState(Env::Default(), root + "/iter_0000000", &saved).ok());
  EXPECT_EQ(saved.spec.qk_layernorm_eps, 1e-3f);
  EXPECT_EQ(saved.config.model.qk_layernorm_eps, 1e-3f);
  {
    Harness h(c);
    EXPECT_TRUE(RestoreTrainer(Env::Default(), saved, &h.tr).ok());
  }
  TrainConfig other = c;
  other.model.qk_layernorm_eps = 0;  // the LayerNorm epsilon, 1e-5
  Harness h(other);
  const Status st = RestoreTrainer(Env::Default(), saved, &h.tr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("differs from this run's"), std::string::npos) << st.message();
  std::map<std::string, ConfigChange::Kind> kinds;
  for (const auto& ch : DiffConfigForResume(c, other)) kinds[ch.key] = ch.kind;
  EXPECT_EQ(kinds.at("qk-layernorm-epsilon"), ConfigChange::Kind::kShape);
  fs::remove_all(root);
}

TEST(TrainCheckpointTest, ConfigChangesAreClassifiedAndNeedTheRightFlag) {
  const TrainConfig saved = Tiny(false);
  TrainConfig now = saved;
  now.lr = 1e-3;         // scheduler
  now.seed = 99;         // data order
  now.log_interval = 1;  // free
  now.train_iters = 28;  // free, but moves the decay (derived from train-iters)
  now.lr_decay_iters = 0;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&now, &notes).ok());
  std::vector<ConfigChange> changes = DiffConfigForResume(saved, now);
  std::map<std::string, ConfigChange::Kind> kinds;
  for (const auto& ch : changes) kinds[ch.key] = ch.kind;
  EXPECT_EQ(kinds.at("lr"), ConfigChange::Kind::kScheduler);
  EXPECT_EQ(kinds.at("seed"), ConfigChange::Kind::kDataOrder);
  EXPECT_EQ(kinds.at("log-interval"), ConfigChange::Kind::kFree);
  EXPECT_EQ(kinds.at("lr decay (samples)"), ConfigChange::Kind::kScheduler);

  std::vector<ConfigChange> accepted, free;
  Status st = CheckResumeChanges(changes, now, &accepted, &free);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("lr: 0.003 -> 0.001"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--override-scheduler"), std::string::npos);
  EXPECT_NE(st.message().find("--override-data-order"), std::string::npos);

  now.override_scheduler = true;
  st = CheckResumeChanges(changes, now, &accepted, &free);
  ASSERT_FALSE(st.ok());  // the seed still needs its own flag
  EXPECT_EQ(st.message().find("(accept with --override-scheduler)"), std::string::npos);
  now.override_data_order = true;
  ASSERT_TRUE(CheckResumeChanges(changes, now, &accepted, &free).ok());
  EXPECT_EQ(accepted.size(), 3u);  // lr, decay, seed
  ASSERT_FALSE(free.empty());
  std::map<std::string, std::string> described;
  for (const ConfigChange& c : free) described[c.key] = DescribeChange(c);
  ASSERT_TRUE(described.count("log-interval"));
  EXPECT_EQ(described["log-interval"], "log-interval: 4 -> 1");

  // A shape change is refused whatever the flags.
  TrainConfig bigger = saved;
  bigger.model.num_layers = 3;
  bigger.override_scheduler = bigger.override_data_order = true;
  st = CheckResumeChanges(DiffConfigForResume(saved, bigger), bigger, &accepted, &free);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("num-layers: 2 -> 3"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cannot change on resume"), std::string::npos);

  // QK-LayerNorm adds parameters: a shape change. The z-loss changes the objective: a scheduler
  // change. Guard settings and skip ranges are free.
  TrainConfig stab = saved;
  stab.model.qk_layernorm = true;
  stab.model.z_loss = 1e-4;
  stab.guard_lr_cut = 0.25;
  stab.skip_train_iteration_range = {"3-4"};
  kinds.clear();
  for (const auto& ch : DiffConfigForResume(saved, stab)) kinds[ch.key] = ch.kind;
  EXPECT_EQ(kinds.at("qk-layernorm"), ConfigChange::Kind::kShape);
  EXPECT_EQ(kinds.at("z-loss"), ConfigChange::Kind::kScheduler);
  EXPECT_EQ(kinds.at("guard-lr-cut"), ConfigChange::Kind::kFree);
  EXPECT_EQ(kinds.at("skip-train-iteration-range"), ConfigChange::Kind::kFree);

  // RoPE's scaling changes what every angle is: refused on resume like the base.
  TrainConfig scaled = saved;
  scaled.model.rope_llama3 = true;
  scaled.model.rope_llama3_factor = 32;
  scaled.model.rope_interpolation_factor = 2;
  kinds.clear();
  for (const auto& ch : DiffConfigForResume(saved, scaled)) kinds[ch.key] = ch.kind;
  for (const char* key :
       {"use-rope-scaling", "rope-scaling-factor", "rotary-seq-len-interpolation-factor"})
    EXPECT_EQ(kinds.at(key), ConfigChange::Kind::kShape) << key;
}

TEST(TrainCheckpointTest, LongerRunWithTheSameDecayIsAFreeChange) {
  TrainConfig saved = Tiny(false);
  TrainConfig now = saved;
  now.train_iters = 2 * saved.train_iters;
  now.lr_decay_iters = saved.train_iters;  // the decay the checkpoint was following
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&now, &notes).ok());
  const std::vector<ConfigChange> changes = DiffConfigForResume(saved, now);
  ASSERT_EQ(changes.size(), 1u);  // lengths are compared as the schedule in samples
  EXPECT_EQ(changes[0].key, "train-iters");
  EXPECT_EQ(changes[0].kind, ConfigChange::Kind::kFree);
}

TEST(TrainCheckpointTest, RepeatedSaveFailuresStopTheRunWithTheError) {
  TrainConfig c = Tiny();
  c.save_interval = 1;
  const std::string root =
      ::testing::TempDir() + "/keel_train_ckpt_fail_" + std::to_string(getpid());
  fs::remove_all(root);
  FaultInjectionEnv env(Env::Default());  // a disk that stays full
  env.Arm(FaultInjectionEnv::Fault::kNoSpace, 1, "model.safetensors", /*persistent=*/true);
  Harness h(c);
  h.tr.InitializeWeights();
  CheckpointStore store(&env, root, nullptr);
  std::vector<std::string> log;
  CheckpointController ctl(c, &env, &store, &h.tr, NoTokenizer(), nlohmann::json::array(),
                           [&](const std::string& l) { log.push_back(l); });
  TestLoop loop{&h.tr};
  loop.ckpt = &ctl;
  const Status st = loop.Run();  // the final save is not tried: the run ends with the error
  EXPECT_EQ(h.tr.state().counters.iteration, 3);  // stopped after the third failed save
  EXPECT_EQ(ctl.stop_reason(), StopReason::kSaveFailures);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("3 consecutive checkpoint saves failed"), std::string::npos);
  ASSERT_GE(log.size(), 3u);
  EXPECT_NE(log[0].find("1 of 3 consecutive failures allowed"), std::string::npos) << log[0];
  fs::remove_all(root);
}

// An Env whose clock the test moves.
class ClockEnv : public FaultInjectionEnv {
 public:
  ClockEnv() : FaultInjectionEnv(Env::Default()) {}
  uint64_t NowMicros() override { return now_us; }
  uint64_t now_us = 1'000'000;
};

TEST(TrainCheckpointTest, TimeBasedSavesAndExitDurationFollowTheClock) {
  TrainConfig c = Tiny(false);
  c.save_interval = 0;            // no iteration-based saves
  c.save_interval_minutes = 1.5;  // every 90 s
  c.exit_duration_in_mins = 5.0;  // stop after 300 s
  c.keep_last_checkpoints = 0;
  const std::string root =
      ::testing::TempDir() + "/keel_train_ckpt_clock_" + std::to_string(getpid());
  fs::remove_all(root);
  ClockEnv env;
  Harness h(c);
  h.tr.InitializeWeights();
  CheckpointStore store(&env, root, nullptr);
  CheckpointController ctl(c, &env, &store, &h.tr, NoTokenizer(), nlohmann::json::array(), nullptr);
  TestLoop loop{&h.tr};
  loop.ckpt = &ctl;
  loop.go_on = [&] {
    env.now_us += 40'000'000;  // each iteration "takes" 40 s
    return true;
  };
  ASSERT_TRUE(loop.Run().ok());  // with the final (stop request) save
  // 40 s per iteration: saves after iterations 3 (120 s), 6 (240 s since the start, 120 since the
  // last); the exit duration (300 s) is reached at iteration 8 (320 s), which saves and stops.
  EXPECT_EQ(ctl.stop_reason(), StopReason::kExitDuration);
  EXPECT_EQ(h.tr.state().counters.iteration, 8);
  std::vector<CheckpointInfo> all;
  ASSERT_TRUE(store.List(&all).ok());
  std::vector<int64_t> its;
  for (const auto& i : all) its.push_back(i.iteration);
  EXPECT_EQ(its, (std::vector<int64_t>{3, 6, 8}));
  fs::remove_all(root);
}

// A state.json, manifest.json or safetensors header that was edited or damaged is refused with
// the file, the key and the fix, never a bare nlohmann message.
TEST(TrainCheckpointTest, MalformedCheckpointJsonNamesTheFileTheKeyAndTheFix) {
  const TrainConfig c = Tiny(false);
  const std::string root = ::testing::TempDir() + "/keel_ckpt_json_" + std::to_string(getpid());
  fs::remove_all(root);
  {
    Harness h(c);
    h.tr.InitializeWeights();
    CheckpointStore store(Env::Default(), root, nullptr);
    CheckpointController ctl(c, Env::Default(), &store, &h.tr, NoTokenizer(),
                             nlohmann::json::array(), nullptr);
    ASSERT_TRUE(ctl.SaveNow("test").ok());
  }
  const std::string dir = JoinPath(root, CheckpointDirName(0));
  const std::string sp = JoinPath(dir, "state.json");
  std::string text;
  ASSERT_TRUE(Env::Default()->ReadFileToString(sp, &text).ok());
  const nlohmann::json good = nlohmann::json::parse(text);
  auto expect_refused = [&](const std::string& message, const std::string& file,
                            const std::string& words) {
    EXPECT_EQ(message.rfind(file + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(words), std::string::npos) << message;
    EXPECT_NE(message.find("another checkpoint of the run (`keel ckpt list SAVE`"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
  };
  using Edit = std::function<void(nlohmann::json&)>;
  const std::vector<std::pair<Edit, std::string>> cases = {
      {[](nlohmann::json& s) { s["counters"]["iteration"] = "ten"; },
       "key 'counters.iteration' must be an integer, but is the string \"ten\""},
      {[](nlohmann::json& s) { s["counters"].erase("consumed_samples"); },
       "key 'counters.consumed_samples' is missing"},
      {[](nlohmann::json& s) { s.erase("optimizer"); }, "key 'optimizer' is missing"},
      {[](nlohmann::json& s) { s["scheduler"] = nlohmann::json::array(); },
       "key 'scheduler' must be an object, but is an array []"},
      {[](nlohmann::json& s) { s["metrics"]["interval"]["loss_sum"] = "x"; },
       "key 'metrics.interval.loss_sum' must be a number (or null)"},
      {[](nlohmann::json& s) { s["data"]["skipped_iteration_ranges"] = {{4}}; },
       "key 'data.skipped_iteration_ranges[0][1]' is missing"},
      {[](nlohmann::json& s) { s["model"]["hidden"] = 32.5; },
       "key 'model.hidden' must be an integer, but is the number 32.5"},
      {[](nlohmann::json& s) { s["model"]["num_layers"] = 0; },
       "key 'model' describes no model keel can build"},
      // RoPE scaling edited by hand: a fractional linear factor, or both kinds at once.
      {[](nlohmann::json& s) { s["model"]["rope_linear_factor"] = 2.5; },
       "key 'model' describes no model keel can build"},
      {[](nlohmann::json& s) {
         s["model"]["rope_linear_factor"] = 2;
         s["model"]["rope_llama3"] = {{"factor", 8.0},
                                      {"low_freq_factor", 1.0},
                                      {"high_freq_factor", 4.0},
                                      {"original_max_positions", 8192}};
       },
       "key 'model' describes no model keel can build"},
      {[](nlohmann::json& s) { s["model"]["num_layers"] = 1 << 30; },
       "bytes of weights) but model.safetensors holds"},  // refused before it is allocated
      {[](nlohmann::json& s) { s["guard"] = 7; }, "key 'guard' must be an object (or null)"},
      {[](nlohmann::json& s) { s["format_version"] = "1"; },
       "key 'format_version' must be an integer"},
      // Found by fuzz/state_json_fuzz (fuzz/regressions/state_json_fuzz): a number with an
      // exponent was converted to an integer with undefined behaviour beyond its range.
      {[](nlohmann::json& s) { s["counters"]["iteration"] = 1e300; },
       "key 'counters.iteration' must be an integer, but is the number"},
      {[](nlohmann::json& s) { s["data"]["order_salt"] = -3.5; },
       "key 'data.order_salt' must be an integer"},
      {[](nlohmann::json& s) { s["counters"]["consumed_samples"] = -8; },
       "key 'counters.consumed_samples' must be a non-negative integer, but is -8"},
  };
  for (const auto& [edit, words] : cases) {
    nlohmann::json s = good;
    edit(s);
    ASSERT_TRUE(WriteFileAtomic(Env::Default(), sp, s.dump(2)).ok());
    SavedTrainState saved;
    const Status st = ReadSavedTrainState(Env::Default(), dir, &saved);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    expect_refused(st.message(), sp, words);
  }

  // Also found by fuzz/state_json_fuzz: a "format" of another type threw out of the reader.
  for (const char* format : {R"({"format": 1})", R"({"format": ["keel-train-state"]})"}) {
    ASSERT_TRUE(WriteFileAtomic(Env::Default(), sp, format).ok());
    SavedTrainState saved;
    const Status st = ReadSavedTrainState(Env::Default(), dir, &saved);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find(sp + " is not a keel training state"), std::string::npos)
        << st.message();
  }
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), sp, good.dump(2)).ok());

  // Found by fuzz/checkpoint_config_fuzz (fuzz/regressions/checkpoint_config_fuzz): a saved
  // config.toml that Validate refuses reached the LR schedule's invariants on resume as an
  // internal error. It is Corruption naming the file and the rule.
  const std::string cp = JoinPath(dir, "config.toml");
  std::string config;
  ASSERT_TRUE(Env::Default()->ReadFileToString(cp, &config).ok());
  auto with = [&](const std::string& key, const std::string& value) {
    const size_t at = config.find("\n" + key + " = ");
    EXPECT_NE(at, std::string::npos) << key;
    const size_t end = config.find('\n', at + 1);
    return config.substr(0, at + 1) + key + " = " + value + config.substr(end);
  };
  for (const auto& [key, value, words] : std::vector<std::array<std::string, 3>>{
           {"lr-warmup-iters", "400000", "warmup"},
           {"global-batch-size", "7", "global-batch-size 7 is not divisible"}}) {
    ASSERT_TRUE(WriteFileAtomic(Env::Default(), cp, with(key, value)).ok());
    SavedTrainState saved;
    const Status st = ReadSavedTrainState(Env::Default(), dir, &saved);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    EXPECT_EQ(st.message().rfind(cp + ": the saved config is not valid: ", 0), 0u) << st.message();
    EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find("internal error"), std::string::npos) << st.message();
  }
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), cp, config).ok());
  {
    SavedTrainState saved;
    ASSERT_TRUE(ReadSavedTrainState(Env::Default(), dir, &saved).ok());
  }

  const std::string mp = JoinPath(dir, kManifestFile);
  Manifest m;
  Status st = Manifest::FromJson(R"({"format": "keel-checkpoint", "format_version": 1,
                                     "iteration": 3})",
                                 mp, &m);
  expect_refused(st.message(), mp, "key 'files' is missing");
  st = Manifest::FromJson(R"({"format": "keel-checkpoint", "format_version": 1, "iteration": 3,
                              "files": [{"name": "a", "size": "12", "xxh3": "00"}]})",
                          mp, &m);
  expect_refused(st.message(), mp, "key 'files[0].size' must be an integer");
  st = Manifest::FromJson(R"({"format": "keel-checkpoint", "format_version": 1, "iteration": 3,
                              "files": [{"name": "a", "size": 12, "xxh3": "xyz"}]})",
                          mp, &m);
  expect_refused(st.message(), mp, "key 'files[0].xxh3' must be 16 hexadecimal digits");
  st = Manifest::FromJson(R"({"format": 7})", mp, &m);
  EXPECT_NE(st.message().find("is not a keel checkpoint manifest"), std::string::npos)
      << st.message();

  const std::string header = R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})";
  std::string image(8, '\0');
  image[0] = static_cast<char>(header.size());
  image += header + std::string(4, '\0');
  std::map<std::string, TensorRef> tensors;
  st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &tensors, nullptr);
  expect_refused(st.message(), "m.safetensors (safetensors header)",
                 "key 'w.dtype' must be a string, but is the number 5");
  fs::remove_all(root);
}

}  // namespace
}  // namespace keel
