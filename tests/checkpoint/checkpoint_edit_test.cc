// EditCheckpoint (src/checkpoint/checkpoint_edit.h): what an edit changes and records, what it
// refuses, and that a crash at every filesystem mutation of an edit leaves either the whole old
// checkpoint or the whole edited one, which verifies after CheckpointStore::Recover().
#include "checkpoint/checkpoint_edit.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "core/fault_injection_env.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace keel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string ReadFile(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// One small trained run (iterations 2 and 4 saved), copied afresh for every case.
class CheckpointEditTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pristine_ =
        (fs::temp_directory_path() / ("keel_edit_src_" + std::to_string(getpid()))).string();
    fs::remove_all(pristine_);
    const std::string cmd = std::string(KEEL_BINARY) +
                            " train --num-layers 1 --hidden-size 32 --num-attention-heads 2 "
                            "--seq-length 32 --micro-batch-size 2 --train-iters 4 "
                            "--lr-warmup-iters 2 --log-interval 1 --eval-iters 0 "
                            "--sample-tokens 0 --save-interval 2 --keep-last-checkpoints 0 "
                            "--threads 1 --save " +
                            pristine_ + " > /dev/null 2>&1";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  }
  static void TearDownTestSuite() { fs::remove_all(pristine_); }

  void SetUp() override {
    root_ = (fs::temp_directory_path() / ("keel_edit_" + std::to_string(getpid()))).string();
    Fresh();
  }
  void TearDown() override { fs::remove_all(root_); }
  void Fresh() {
    fs::remove_all(root_);
    fs::copy(pristine_, root_, fs::copy_options::recursive);
  }
  std::string Ckpt() const { return root_ + "/iter_0000004"; }
  json State() const { return json::parse(ReadFile(Ckpt() + "/state.json")); }

  static std::string pristine_;
  std::string root_;
};
std::string CheckpointEditTest::pristine_;

TEST_F(CheckpointEditTest, ScaleLrAndSetAreAppliedRecordedAndVerify) {
  const json before = State();
  const double next_lr = before["scheduler"]["next_lr"];
  CheckpointEditRequest req;
  req.scale_lr = 0.5;
  req.sets = {"lr=0.001", "lr-decay-style=linear"};
  req.reason = "loss spike";
  std::vector<CheckpointEditChange> changes;
  ASSERT_TRUE(EditCheckpoint(Env::Default(), Ckpt(), req, &changes).ok());
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].key, "scheduler.lr_scale");
  EXPECT_EQ(changes[1].key, "config.lr");
  EXPECT_EQ(changes[2].new_value, "\"linear\"");  // a string value is quoted for TOML

  EXPECT_TRUE(VerifyCheckpointDir(Env::Default(), Ckpt(), true, nullptr).ok());
  const json s = State();
  EXPECT_EQ(s["scheduler"]["lr_scale"], 0.5);
  EXPECT_DOUBLE_EQ(s["scheduler"]["next_lr"].get<double>(), 0.5 * next_lr);
  const json& h = s["history"].back();
  EXPECT_EQ(h["event"], "edit");
  EXPECT_EQ(h["reason"], "loss spike");
  EXPECT_EQ(h["changes"][1]["key"], "config.lr");
  EXPECT_EQ(h["changes"][1]["old"], "0.002");
  EXPECT_EQ(h["changes"][1]["new"], "0.001");
  EXPECT_EQ(s["history"].size(), before["history"].size() + 1);

  SavedTrainState saved;
  ASSERT_TRUE(ReadSavedTrainState(Env::Default(), Ckpt(), &saved).ok());
  EXPECT_DOUBLE_EQ(saved.config.lr, 0.001);
  EXPECT_EQ(saved.config.lr_decay_style, LrDecayStyle::kLinear);
  EXPECT_NE(s["config_hash"], before["config_hash"]);
  // The other files are shared with nothing else now, but their contents did not change.
  EXPECT_EQ(ReadFile(Ckpt() + "/model.safetensors"),
            ReadFile(pristine_ + "/iter_0000004/model.safetensors"));
  EXPECT_FALSE(fs::exists(root_ + "/.edit.iter_0000004"));
}

TEST_F(CheckpointEditTest, ScaleLrAloneKeepsConfigAndHash) {
  const json before = State();
  CheckpointEditRequest req;
  req.scale_lr = 0.25;
  req.reason = "r";
  ASSERT_TRUE(EditCheckpoint(Env::Default(), Ckpt(), req, nullptr).ok());
  EXPECT_EQ(State()["config_hash"], before["config_hash"]);
  EXPECT_EQ(ReadFile(Ckpt() + "/config.toml"), ReadFile(pristine_ + "/iter_0000004/config.toml"));
  EXPECT_EQ(State()["scheduler"]["lr_scale"], 0.25);
}

TEST_F(CheckpointEditTest, RefusalsLeaveTheCheckpointUntouched) {
  const std::string before = ReadFile(Ckpt() + "/state.json");
  auto edit = [&](std::vector<std::string> sets, std::optional<double> scale, std::string reason) {
    CheckpointEditRequest req;
    req.sets = std::move(sets);
    req.scale_lr = scale;
    req.reason = std::move(reason);
    return EditCheckpoint(Env::Default(), Ckpt(), req, nullptr);
  };
  Status st = edit({"hidden-size=64"}, std::nullopt, "x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("model shape"), std::string::npos) << st.message();
  st = edit({"seed=7"}, std::nullopt, "x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--override-data-order"), std::string::npos) << st.message();
  st = edit({"log-interval=5"}, std::nullopt, "x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  st = edit({"lr=fast"}, std::nullopt, "x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.message();
  st = edit({"lr"}, std::nullopt, "x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  st = edit({"lr-decay-style=sideways"}, std::nullopt, "x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.message();
  st = edit({"min-lr=1"}, std::nullopt, "x");  // above lr: fails Validate on the whole config
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("the edit is invalid"), std::string::npos) << st.message();
  EXPECT_EQ(edit({}, 0.5, "").code(), Status::Code::kInvalidArgument);  // no reason
  EXPECT_EQ(edit({}, -2.0, "x").code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(edit({}, 0.0, "x").code(), Status::Code::kInvalidArgument);
  // A factor that would resume above the largest learning rate training accepts (10).
  st = edit({}, 1e308, "x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--scale-lr 1e+308 would make"), std::string::npos) << st.message();
  st = edit({"lr=1e-3"}, 2e4, "x");  // the edited lr counts: 1e-3 x 2e4 = 20
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("above 10"), std::string::npos) << st.message();
  st = edit({"lr=20"}, std::nullopt, "x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--lr 20 is above 10"), std::string::npos) << st.message();
  EXPECT_EQ(edit({}, std::nullopt, "x").code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(ReadFile(Ckpt() + "/state.json"), before);

  // A checkpoint that fails verification is not edited.
  {
    std::fstream f(Ckpt() + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3000);
    f.put('\x5a');
  }
  st = edit({}, 0.5, "x");
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("fails verification"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("model.safetensors"), std::string::npos) << st.message();
  EXPECT_EQ(ReadFile(Ckpt() + "/state.json"), before);
}

TEST_F(CheckpointEditTest, CrashAtEveryMutationLeavesTheOldOrTheEditedCheckpoint) {
  bool completed = false;
  int saw_old = 0, saw_new = 0;
  for (int64_t n = 1; !completed && n < 200; ++n) {
    Fresh();
    FaultInjectionEnv env(Env::Default());
    env.SetCrashHook([] {});
    env.Arm(FaultInjectionEnv::Fault::kCrash, n);
    CheckpointEditRequest req;
    req.scale_lr = 0.5;
    req.sets = {"lr=0.001"};
    req.reason = "crash test";
    const Status st = EditCheckpoint(&env, Ckpt(), req, nullptr);
    completed = !env.fired();
    if (completed) {
      ASSERT_TRUE(st.ok()) << st.message();
    } else {
      EXPECT_FALSE(st.ok()) << "crash at mutation " << n << " was not reported";
    }
    // A later process: recovery, then the checkpoint must verify and be wholly one version.
    CheckpointStore store(Env::Default(), root_, nullptr);
    ASSERT_TRUE(store.Recover().ok()) << "crash at " << n;
    EXPECT_FALSE(fs::exists(root_ + "/.edit.iter_0000004")) << "crash at " << n;
    const Status v = VerifyCheckpointDir(Env::Default(), Ckpt(), true, nullptr);
    ASSERT_TRUE(v.ok()) << "crash at " << n << ": " << v.message();
    SavedTrainState saved;
    ASSERT_TRUE(ReadSavedTrainState(Env::Default(), Ckpt(), &saved).ok()) << "crash at " << n;
    if (saved.train.lr_scale == 1.0) {
      EXPECT_DOUBLE_EQ(saved.config.lr, 0.002) << "crash at " << n;
      EXPECT_EQ(ReadFile(Ckpt() + "/state.json"), ReadFile(pristine_ + "/iter_0000004/state.json"));
      ++saw_old;
    } else {
      EXPECT_EQ(saved.train.lr_scale, 0.5) << "crash at " << n;
      EXPECT_DOUBLE_EQ(saved.config.lr, 0.001) << "crash at " << n;
      EXPECT_EQ(saved.history.back()["reason"], "crash test");
      ++saw_new;
    }
    // The other checkpoint and the marker are never touched.
    EXPECT_TRUE(VerifyCheckpointDir(Env::Default(), root_ + "/iter_0000002", true, nullptr).ok());
    int64_t marker = 0;
    ASSERT_TRUE(store.ReadMarker(&marker).ok());
    EXPECT_EQ(marker, 4);
  }
  EXPECT_TRUE(completed);
  EXPECT_GT(saw_old, 5);  // every mutation before the exchange
  EXPECT_GE(saw_new, 2);  // the directory sync and cleanup after it
}

}  // namespace
}  // namespace keel
