// CheckpointController::RollbackTo with an --async-save write in flight
// (train/checkpoint_controller.h): the rollback waits for the background save first (its outcome
// logged and counted, as any periodic save's), then moves the marker and restores; the state after
// it is the target checkpoint's, bit for bit the state a resume from that checkpoint reaches.
// Driven by hand, as the guard does after its decision, without TrainingRun's own wait before the
// guard acts: only RollbackTo's wait stands between the write and the rollback here.
#include "train/checkpoint_controller.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "../data/data_test_util.h"
#include "core/fault_injection_env.h"
#include "core/rng.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using datatest::TempDir;
using json = nlohmann::json;

TrainConfig Tiny(const std::string& save) {
  TrainConfig c;
  c.model.num_layers = 1;
  c.model.hidden = 32;
  c.model.heads = 2;
  c.model.vocab = 50;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = 20;
  c.lr_warmup_iters = 2;
  c.log_interval = 5;
  c.eval_interval = 1000;
  c.eval_iters = 0;
  c.save_interval = 5;
  c.keep_last_checkpoints = 0;
  c.threads = 1;
  c.save = save;
  c.async_save = true;
  std::vector<std::string> notes;
  const Status st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return c;
}

// A learnable stream of made-up tokens (the guard tests' data).
SampleFn Data(uint64_t seed) {
  return [seed](int64_t index, int32_t* tokens) {
    int32_t v = static_cast<int32_t>(U64At({seed, RngPurpose::kTest, 0}, index) % 50);
    for (int t = 0; t <= 16; ++t) {
      tokens[t] = v;
      v = (v * 7 + 3) % 50;
    }
    return 0;
  };
}

// The directory syncs inside the temporary directory of checkpoint 10 wait until Release() (then
// fail, with `fail`): a background write held in flight for as long as the test wants.
class HeldSaveEnv : public FaultInjectionEnv {
 public:
  explicit HeldSaveEnv(bool fail) : FaultInjectionEnv(Env::Default()), fail_(fail) {}
  Status SyncDir(const std::string& dir) override {
    if (dir.find(".tmp.iter_0000010") != std::string::npos) {
      std::unique_lock<std::mutex> lock(mu_);
      // Bounded: a test that never releases fails instead of hanging.
      cv_.wait_for(lock, std::chrono::seconds(30), [this] { return released_; });
      if (fail_) return Status::IOError("fsync " + dir + ": Input/output error (injected)");
    }
    return FaultInjectionEnv::SyncDir(dir);
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  bool fail_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

// Weights, Adam moments and step: equal when two trainers hold the same model.
uint64_t ModelHash(Trainer& tr) {
  const size_t n = tr.model().num_params();
  std::vector<float> h(3 * n);
  Backend* be = tr.model().backend();
  be->CopyToHost(h.data(), tr.model().param_data(), n);
  be->CopyToHost(h.data() + n, tr.optimizer().exp_avg(), n);
  be->CopyToHost(h.data() + 2 * n, tr.optimizer().exp_avg_sq(), n);
  return XXH3_64bits(h.data(), h.size() * sizeof(float)) ^
         static_cast<uint64_t>(tr.optimizer().step());
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// One trainer with its store and controller; every line either logs goes to `lines`, in order.
struct Loop {
  Loop(const TrainConfig& c, Env* env)
      : be(MakeCpuBackend(1)),
        comm(MakeSingleProcessCommunicator()),
        tr(c, be.get(), comm.get(), {Data(1), Data(2)}),
        store(env, c.save, [this](const std::string& l) { lines.push_back(l); }),
        ckpt(c, env, &store, &tr, Info(), json::array(),
             [this](const std::string& l) { lines.push_back(l); }) {}
  static RunInfo Info() {
    RunInfo run;
    run.meta.tokenizer = "none";
    return run;
  }
  // One iteration, as the loop runs it: the update waits for a background save's snapshot.
  void Step() {
    const IterationPlan plan = tr.PlanIteration();
    StepResult r;
    ASSERT_TRUE(tr.ComputeGradients(plan, &r).ok());
    ckpt.WaitForSnapshot();
    tr.Update(/*apply=*/true, &r);
    tr.EndIteration(plan, &r);
  }
  void StepTo(int64_t it) {
    while (tr.state().counters.iteration < it) Step();
  }
  // The index of the first line from line `from` on that contains `part` (npos: none).
  size_t Find(const std::string& part, size_t from = 0) const {
    for (size_t i = from; i < lines.size(); ++i)
      if (lines[i].find(part) != std::string::npos) return i;
    return std::string::npos;
  }
  std::string Text() const {
    std::string t;
    for (const std::string& l : lines) t += l + "\n";
    return t;
  }

  std::vector<std::string> lines;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Communicator> comm;
  Trainer tr;
  CheckpointStore store;
  CheckpointController ckpt;
};

// The reference: a fresh trainer resumed from checkpoint `dir`.
struct Resumed {
  explicit Resumed(const TrainConfig& c, const std::string& dir) : run(c, Env::Default()) {
    SavedTrainState saved;
    EXPECT_TRUE(ReadVerifiedCheckpoint(Env::Default(), dir, &saved).ok());
    EXPECT_TRUE(run.ckpt.Restore(saved, /*in_save_dir=*/true).ok());
  }
  Loop run;
};

// Trains to 5 (a synchronous save), then to 10 (a background save, held by `env`), on to 12 while
// it is written, and rolls back to 5 with the write still in flight. Returns the lines before the
// rollback began; `kept` gets the checkpoints moved aside.
size_t RollBackWithASaveInFlight(Loop* run, HeldSaveEnv* env, const std::string& save,
                                 std::vector<std::string>* kept) {
  run->tr.InitializeWeights();
  run->StepTo(5);
  EXPECT_TRUE(run->ckpt.SaveNow("--save-interval").ok());
  run->StepTo(10);
  EXPECT_TRUE(
      run->ckpt.SaveNow("--save-interval", nullptr, CheckpointController::SaveMode::kBackground)
          .ok());
  EXPECT_TRUE(run->ckpt.OnPeriodicSave(Status::OK()));
  run->StepTo(12);
  // The guard's decision: back to 5, read (verified) while the write goes on.
  SavedTrainState target;
  EXPECT_TRUE(ReadVerifiedCheckpoint(Env::Default(), save + "/iter_0000005", &target).ok());
  EXPECT_TRUE(run->ckpt.SaveInFlight());
  // The write is let go 0.3 s into the rollback.
  std::thread release([env] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    env->Release();
  });
  const size_t before = run->lines.size();
  const Status st = run->ckpt.RollbackTo(target, kept);
  EXPECT_TRUE(st.ok()) << st.ToString();
  release.join();
  return before;
}

// The state after the rollback is the resume's from the target, and stays so for 5 iterations.
void ExpectTheStateOfAResumeFrom(Loop* run, const TrainConfig& c, const std::string& target) {
  Resumed ref(c, target);
  EXPECT_EQ(run->tr.state().counters.iteration, 5);
  EXPECT_EQ(run->tr.StateFingerprint(), ref.run.tr.StateFingerprint());
  EXPECT_EQ(ModelHash(run->tr), ModelHash(ref.run.tr));
  // To the next log boundary: the fingerprint holds the open log interval's wall times.
  run->StepTo(10);
  ref.run.StepTo(10);
  EXPECT_EQ(run->tr.StateFingerprint(), ref.run.tr.StateFingerprint());
  EXPECT_EQ(ModelHash(run->tr), ModelHash(ref.run.tr));
}

TEST(CheckpointControllerTest, ARollbackWaitsForTheBackgroundSaveInFlightThenRestoresTheTarget) {
  TempDir dir;
  const TrainConfig c = Tiny(dir.Join("run"));
  HeldSaveEnv env(/*fail=*/false);
  Loop run(c, &env);
  std::vector<std::string> kept;
  const size_t before = RollBackWithASaveInFlight(&run, &env, c.save, &kept);
  // The write was waited for: collected, committed and logged inside the rollback, before the
  // rollback moved anything.
  EXPECT_FALSE(run.ckpt.SaveInFlight());
  const size_t saved = run.Find(
      "saved checkpoint " + c.save + "/iter_0000010 (--save-interval, --async-save)", before);
  const size_t moved =
      run.Find("rolling back to iter_0000005: moved the newer iter_0000010", before);
  ASSERT_NE(saved, std::string::npos) << run.Text();
  ASSERT_NE(moved, std::string::npos) << run.Text();
  EXPECT_LT(saved, moved);
  // Its write lasted until it was let go, inside the rollback.
  double took = 0;
  const size_t at = run.lines[saved].find("the background write took ");
  ASSERT_NE(at, std::string::npos) << run.lines[saved];
  ASSERT_EQ(std::sscanf(run.lines[saved].c_str() + at, "the background write took %lf", &took), 1);
  EXPECT_GE(took, 0.3) << run.lines[saved];
  // Then the rollback: 10 kept aside, the marker at 5, nothing left half-written.
  EXPECT_EQ(kept, std::vector<std::string>{"iter_0000010.rolled-back"});
  EXPECT_EQ(ReadFile(c.save + "/" + kMarkerFile), "5\n");
  EXPECT_TRUE(fs::exists(c.save + "/iter_0000010.rolled-back/manifest.json"));
  EXPECT_FALSE(fs::exists(c.save + "/iter_0000010"));
  EXPECT_FALSE(fs::exists(c.save + "/.tmp.iter_0000010"));
  EXPECT_EQ(run.ckpt.last_saved_iteration(), 5);
  ExpectTheStateOfAResumeFrom(&run, c, c.save + "/iter_0000005");
  // Nothing more arrives later from the write that was in flight.
  EXPECT_EQ(ReadFile(c.save + "/" + kMarkerFile), "5\n");
}

TEST(CheckpointControllerTest, ABackgroundSaveThatFailsDuringARollbackIsLoggedAndCounted) {
  TempDir dir;
  const TrainConfig c = Tiny(dir.Join("run"));
  HeldSaveEnv env(/*fail=*/true);
  Loop run(c, &env);
  std::vector<std::string> kept;
  const size_t before = RollBackWithASaveInFlight(&run, &env, c.save, &kept);
  EXPECT_FALSE(run.ckpt.SaveInFlight());
  // Counted as a failed periodic save (the first of 3 allowed), logged before the rollback ran.
  const size_t failed = run.Find("(1 of 3 consecutive failures allowed", before);
  ASSERT_NE(failed, std::string::npos) << run.Text();
  EXPECT_NE(run.lines[failed].find("ERROR: "), std::string::npos) << run.lines[failed];
  EXPECT_NE(run.lines[failed].find("injected"), std::string::npos) << run.lines[failed];
  EXPECT_EQ(run.ckpt.stop_reason(), StopReason::kNone);
  EXPECT_TRUE(kept.empty());
  EXPECT_EQ(ReadFile(c.save + "/" + kMarkerFile), "5\n");
  EXPECT_FALSE(fs::exists(c.save + "/iter_0000010"));
  EXPECT_FALSE(fs::exists(c.save + "/.tmp.iter_0000010"));
  ExpectTheStateOfAResumeFrom(&run, c, c.save + "/iter_0000005");
}

}  // namespace
}  // namespace keel
