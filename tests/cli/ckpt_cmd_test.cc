// `keel ckpt` tools end to end, and the atomicity of a checkpoint rewrite (the edit tool's core)
// under a crash at every filesystem operation.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_rewrite.h"
#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "core/fault_injection_env.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string out;
};

Result Keel(const std::string& args) {
  const std::string cmd = std::string(KEEL_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  Result r{-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const char* const kTrain =
    "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --lr-warmup-iters 2 --log-interval 1 --eval-iters 0 --sample-tokens 0 "
    "--save-interval 2 --keep-last-checkpoints 0 --threads 1 ";

std::string Trained(const std::string& name, int iters = 6) {
  const std::string d =
      (fs::temp_directory_path() / ("keel_ckpt_" + name + "_" + std::to_string(getpid()))).string();
  fs::remove_all(d);
  Result r = Keel(std::string(kTrain) + "--train-iters " + std::to_string(iters) + " --save " + d);
  EXPECT_EQ(r.code, 0) << r.out;
  return d;
}

std::string ReadFile(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(CkptCmdTest, VerifyNamesEachKindOfTampering) {
  const std::string d = Trained("verify");
  Result r = Keel("ckpt verify " + d);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 of 3 checkpoints verified"), std::string::npos) << r.out;
  const std::string c = d + "/iter_0000006";
  {
    std::fstream f(c + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put('\x55');
  }
  r = Keel("ckpt verify " + c);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("optimizer.safetensors: xxh3 checksum"), std::string::npos) << r.out;
  fs::resize_file(d + "/iter_0000004/model.safetensors", 1000);
  fs::remove(d + "/iter_0000002/config.toml");
  fs::copy_file(d + "/iter_0000006/model.safetensors", d + "/iter_0000006/model.safetensors.orig");
  r = Keel("ckpt verify " + d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("iter_0000004/model.safetensors has 1000 bytes"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("iter_0000002/config.toml is missing"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.safetensors.orig is not listed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 of 3 checkpoints verified"), std::string::npos) << r.out;
  r = Keel("ckpt list " + d + " --verify");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("FAILED"), std::string::npos);
  // A checkpoint that fails verification is not edited (exit 1, the file named).
  r = Keel("ckpt edit " + d + "/iter_0000004 --scale-lr 0.5 --reason x");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("fails verification"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(CkptCmdTest, VerifyFailsACheckpointCopiedUnderAnotherIteration) {
  const std::string d = Trained("stray");
  fs::copy(d + "/iter_0000002", d + "/iter_0000009", fs::copy_options::recursive);
  Result r = Keel("ckpt verify " + d);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAILED " + d +
                       "/iter_0000009: its manifest says iteration 2 but the directory is named "
                       "iter_0000009 (iteration 9): this directory is a copy of iter_0000002, or "
                       "was renamed; move it out of the run directory"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ok " + d + "/iter_0000006: iteration 6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 of 4 checkpoints verified"), std::string::npos) << r.out;
  r = Keel("ckpt verify " + d + "/iter_0000009");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("manifest says iteration 2"), std::string::npos) << r.out;
  // The tools that read a run's newest checkpoint pass over it, saying why.
  r = Keel("ckpt inspect " + d + " counters.iteration");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("counters.iteration = 6\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("iter_0000009 is unusable"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d + "/iter_0000009"));  // a read-only tool moves nothing
  fs::remove_all(d + "/iter_0000009");

  // state.json and manifest that disagree (each file intact per the manifest) fail deep
  // verification too.
  const std::string c = d + "/iter_0000004";
  std::string state = ReadFile(c + "/state.json");
  // The counters' iteration, which a resume loads (state.json repeats it at the top level).
  const std::string was = "\"iteration\": 4", now = "\"iteration\": 5";
  const size_t at = state.find(was, state.find("\"counters\""));
  ASSERT_NE(at, std::string::npos) << state;
  state.replace(at, was.size(), now);
  ASSERT_TRUE(keel::WriteFileAtomic(keel::Env::Default(), c + "/state.json", state).ok());
  keel::Manifest m;
  ASSERT_TRUE(keel::ReadManifest(keel::Env::Default(), c, &m).ok());
  for (keel::ManifestEntry& e : m.files)
    if (e.name == "state.json")
      e.size = state.size(), e.xxh3 = keel::Xxh3(state.data(), state.size());
  ASSERT_TRUE(keel::WriteFileAtomic(keel::Env::Default(), c + "/manifest.json", m.ToJson()).ok());
  ASSERT_TRUE(keel::VerifyCheckpointDir(keel::Env::Default(), c, true, nullptr).ok());
  r = Keel("ckpt verify " + c);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(c + "/state.json says iteration 5 but the manifest says 4"),
            std::string::npos)
      << r.out;
  fs::remove_all(d);
}

TEST(CkptCmdTest, HelpListsEveryToolIncludingExportAndImport) {
  Result r = Keel("ckpt --help");
  EXPECT_EQ(r.code, 0) << r.out;
  const size_t subcommands = r.out.find("Subcommands:");
  ASSERT_NE(subcommands, std::string::npos) << r.out;
  for (const char* tool :
       {"list", "inspect", "verify", "diff", "edit", "pin", "unpin", "export", "import"})
    EXPECT_NE(r.out.find(std::string("\n  ") + tool + " ", subcommands), std::string::npos)
        << tool << "\n"
        << r.out;
  EXPECT_NE(r.out.find("Hugging Face folder (GPT-2, Llama, BLOOM)"), std::string::npos) << r.out;
  // And `export` and `import` still reach their own parsers.
  r = Keel("ckpt export --help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--hf"), std::string::npos) << r.out;
  r = Keel("ckpt import --help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--max-position-embeddings"), std::string::npos) << r.out;
}

TEST(CkptCmdTest, InspectPrintsValuesAndTensorSummariesByName) {
  const std::string d = Trained("inspect");
  Result r = Keel("ckpt inspect " + d +
                  " optimizer.step counters.consumed_samples config.lr "
                  "model.layers.0.attention.query_key_value.weight");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("optimizer.step = 6\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("counters.consumed_samples = 96\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("config.lr = 0.002\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("query_key_value.weight: F32 [96,32] numel 3072 | norm"), std::string::npos)
      << r.out;
  r = Keel("ckpt inspect " + d + "/iter_0000002 optimizer.step");
  EXPECT_NE(r.out.find("optimizer.step = 2\n"), std::string::npos) << r.out;
  r = Keel("ckpt inspect " + d + " scheduler.nxt_lr");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("did you mean"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scheduler.next_lr"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(CkptCmdTest, DiffExitCodesFollowDiff) {
  const std::string d = Trained("diff");
  Result r = Keel("ckpt diff " + d + "/iter_0000006 " + d);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("0 of 48 tensors differ"), std::string::npos) << r.out;
  r = Keel("ckpt diff " + d + "/iter_0000004 " + d + "/iter_0000006");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("48 of 48 tensors differ"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("state optimizer.step: 4 -> 6"), std::string::npos) << r.out;
  // Trouble is 2, as with diff(1): a missing file is not "different".
  fs::remove(d + "/iter_0000002/optimizer.safetensors");
  r = Keel("ckpt diff " + d + "/iter_0000002 " + d + "/iter_0000006");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("optimizer.safetensors"), std::string::npos) << r.out;
  EXPECT_EQ(Keel("ckpt diff " + d + "/iter_0000006 " + d + "/no_such_dir").code, 2);
  fs::remove_all(d);
}

TEST(CkptCmdTest, EditScalesTheLrOfTheResumedRunAndIsJournaled) {
  const std::string d = Trained("edit", 4);
  const std::string plain = d + "-plain";
  fs::remove_all(plain);
  fs::copy(d, plain, fs::copy_options::recursive);
  Result r = Keel("ckpt edit " + d + " --scale-lr 0.5 --reason \"spike at iteration 3\"");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Keel("ckpt verify " + d).code, 0);
  nlohmann::json s = nlohmann::json::parse(ReadFile(d + "/iter_0000004/state.json"));
  EXPECT_EQ(s["scheduler"]["lr_scale"], 0.5);
  EXPECT_EQ(s["history"].back()["event"], "edit");
  EXPECT_EQ(s["history"].back()["reason"], "spike at iteration 3");
  // Resume both with the same command: the edited one runs at half the LR.
  auto lr_at_5 = [](const std::string& out) {
    const size_t p = out.find(" iteration        5/");
    const size_t q = out.find("learning rate: ", p);
    return std::stod(out.substr(q + 15, 9));
  };
  Result edited = Keel(std::string(kTrain) + "--train-iters 6 --lr-decay-iters 4 --save " + d);
  Result unedited =
      Keel(std::string(kTrain) + "--train-iters 6 --lr-decay-iters 4 --save " + plain);
  ASSERT_EQ(edited.code, 0) << edited.out;
  ASSERT_EQ(unedited.code, 0) << unedited.out;
  EXPECT_NEAR(lr_at_5(edited.out), 0.5 * lr_at_5(unedited.out), 1e-3 * lr_at_5(unedited.out));

  // A config edit: resuming with the old --lr is refused with the diff, the new one accepted.
  r = Keel("ckpt edit " + d + " --set lr=0.001 --reason \"lower peak\"");
  ASSERT_EQ(r.code, 0) << r.out;
  r = Keel(std::string(kTrain) + "--train-iters 8 --lr-decay-iters 4 --save " + d);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("lr: 0.001 -> 0.002"), std::string::npos) << r.out;
  r = Keel(std::string(kTrain) + "--train-iters 8 --lr-decay-iters 4 --lr 0.001 --save " + d);
  EXPECT_EQ(r.code, 0) << r.out;
  // Shape keys and missing reasons are refused; nothing changes.
  const std::string before = ReadFile(d + "/iter_0000008/state.json");
  r = Keel("ckpt edit " + d + " --set hidden-size=64 --reason x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("model shape"), std::string::npos) << r.out;
  r = Keel("ckpt edit " + d + " --scale-lr 0.5");
  EXPECT_EQ(r.code, 2);
  r = Keel("ckpt edit " + d + " --set seed=3 --reason x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--override-data-order"), std::string::npos) << r.out;
  r = Keel("ckpt edit " + d + " --scale-lr 0 --reason x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("positive"), std::string::npos) << r.out;
  EXPECT_EQ(ReadFile(d + "/iter_0000008/state.json"), before);
  fs::remove_all(d);
  fs::remove_all(plain);
}

TEST(CkptCmdTest, PinnedCheckpointSurvivesRetention) {
  const std::string d = Trained("pin", 4);
  Result r = Keel("ckpt pin " + d + " 2 --reason \"before the spike\"");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Keel("ckpt pin " + d + " 3").code, 2);  // no such checkpoint
  r = Keel(std::string(kTrain) +
           "--train-iters 8 --lr-decay-iters 4 --keep-last-checkpoints 1 "
           "--save " +
           d);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(d + "/iter_0000002"));
  EXPECT_FALSE(fs::exists(d + "/iter_0000004"));
  EXPECT_FALSE(fs::exists(d + "/iter_0000006"));
  EXPECT_TRUE(fs::exists(d + "/iter_0000008"));
  r = Keel("ckpt list " + d);
  EXPECT_NE(r.out.find("iter_0000002 | committed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pinned: before the spike"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// A crash at every filesystem operation of a rewrite leaves a checkpoint that verifies and is
// entirely the old or entirely the new version.
TEST(CheckpointRewriteTest, CrashAtEveryStepLeavesOldOrNewNeverAMix) {
  using keel::Env;
  const std::string root =
      (fs::temp_directory_path() / ("keel_rewrite_" + std::to_string(getpid()))).string();
  bool completed = false;
  int saw_old = 0, saw_new = 0;
  for (int64_t n = 1; !completed && n < 100; ++n) {
    fs::remove_all(root);
    std::vector<float> w(100, 1.0f);
    {
      keel::CheckpointStore store(Env::Default(), root, nullptr);
      std::vector<keel::CheckpointFile> files = {
          {"model.safetensors", "", true, {{"w", {100}, w.data()}}, {}},
          {"state.json", "old-state", false, {}, {}},
          {"config.toml", "old-config", false, {}, {}}};
      ASSERT_TRUE(store.Save(1, files, nullptr).ok());
    }
    keel::FaultInjectionEnv env(Env::Default());
    env.SetCrashHook([] {});
    env.Arm(keel::FaultInjectionEnv::Fault::kCrash, n);
    keel::Status st = keel::RewriteCheckpointFiles(
        &env, root + "/iter_0000001", {{"state.json", "new-state"}, {"config.toml", "new-cfg"}});
    completed = !env.fired();
    if (completed) {
      ASSERT_TRUE(st.ok()) << st.message();
    }
    keel::CheckpointStore store(Env::Default(), root, nullptr);
    ASSERT_TRUE(store.Recover().ok());
    ASSERT_TRUE(
        keel::VerifyCheckpointDir(Env::Default(), root + "/iter_0000001", true, nullptr).ok())
        << "crash at " << n;
    const std::string state = ReadFile(root + "/iter_0000001/state.json");
    const std::string cfg = ReadFile(root + "/iter_0000001/config.toml");
    if (state == "old-state") {
      EXPECT_EQ(cfg, "old-config");
      ++saw_old;
    } else {
      EXPECT_EQ(state, "new-state");
      EXPECT_EQ(cfg, "new-cfg");
      ++saw_new;
    }
  }
  EXPECT_TRUE(completed);
  EXPECT_GT(saw_old, 5);
  EXPECT_GE(saw_new, 2);  // crashes after the exchange (in the cleanup) keep the new version
  fs::remove_all(root);
}

// Hand-edited JSON of a checkpoint reaches the user as the file, the key and the fix, never as a
// bare "[json.exception.out_of_range.403] key 'files' not found".
TEST(CkptCmdTest, MalformedJsonNamesTheFileAndTheKey) {
  const std::string d = Trained("json", 4);
  const std::string c = d + "/iter_0000004";
  nlohmann::json manifest = nlohmann::json::parse(ReadFile(c + "/manifest.json"));
  const nlohmann::json files = manifest["files"];
  manifest.erase("files");
  std::ofstream(c + "/manifest.json") << manifest.dump(2);
  Result r = Keel("ckpt verify " + d);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(c + "/manifest.json: key 'files' is missing; keel wrote this file"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("json.exception"), std::string::npos) << r.out;

  // state.json with a counter of the wrong type, its checksum in the manifest updated to match.
  nlohmann::json state = nlohmann::json::parse(ReadFile(c + "/state.json"));
  state["counters"]["consumed_samples"] = "sixteen";
  const std::string text = state.dump(2);
  std::ofstream(c + "/state.json") << text;
  manifest["files"] = files;
  for (auto& f : manifest["files"])
    if (f["name"] == "state.json") {
      f["size"] = text.size();
      f["xxh3"] = keel::HexDigest(keel::Xxh3(text.data(), text.size()));
    }
  std::ofstream(c + "/manifest.json") << manifest.dump(2);
  for (const std::string& cmd : {"ckpt verify " + c, "ckpt inspect " + c, "sample --load " + c}) {
    r = Keel(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find(c + "/state.json: key 'counters.consumed_samples' must be an integer, "
                             "but is the string \"sixteen\""),
              std::string::npos)
        << cmd << "\n"
        << r.out;
    EXPECT_EQ(r.out.find("json.exception"), std::string::npos) << r.out;
  }
  fs::remove_all(d);
}

}  // namespace
