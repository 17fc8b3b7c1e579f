// CheckpointStore: the save protocol, strict verification, fallback to the newest valid
// checkpoint, recovery after crashes at every filesystem operation of a save, injected I/O faults,
// and retention with pins.
#include "checkpoint/checkpoint_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/fault_injection_env.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  const std::string d =
      ::testing::TempDir() + "/keel_store_" + name + "_" + std::to_string(getpid());
  fs::remove_all(d);
  return d;
}

// A checkpoint whose content depends on `iteration`, so old and new are told apart.
struct Content {
  std::vector<float> w;
  std::vector<CheckpointFile> files;
  explicit Content(int64_t iteration) {
    w.assign(1000, static_cast<float>(iteration));
    CheckpointFile t{"model.safetensors", "", true, {{"w", {10, 100}, w.data()}}, {}};
    files.push_back(t);
    files.push_back(
        {"state.json", "{\"iteration\": " + std::to_string(iteration) + "}\n", false, {}, {}});
  }
};

std::vector<std::string> Logged;
CheckpointStore::Logger Collect() {
  return [](const std::string& l) { Logged.push_back(l); };
}
bool LoggedContains(const std::string& s) {
  for (const std::string& l : Logged)
    if (l.find(s) != std::string::npos) return true;
  return false;
}

std::string ReadFile(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(CheckpointStoreTest, SaveWritesIterDirectoryManifestAndMarker) {
  const std::string root = FreshDir("save");
  CheckpointStore store(Env::Default(), root, Collect());
  Content c(100);
  SaveStats stats;
  ASSERT_TRUE(store.Save(100, c.files, &stats).ok());
  EXPECT_EQ(stats.path, root + "/iter_0000100");
  EXPECT_GT(stats.bytes, 4000u);
  EXPECT_EQ(ReadFile(root + "/latest_checkpointed_iteration.txt"), "100\n");
  Manifest m;
  ASSERT_TRUE(VerifyCheckpointDir(Env::Default(), root + "/iter_0000100", true, &m).ok());
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files[0].name, "model.safetensors");
  EXPECT_EQ(m.files[0].size, fs::file_size(root + "/iter_0000100/model.safetensors"));
  // Nothing temporary is left behind.
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path();
  int64_t marker = 0;
  ASSERT_TRUE(store.ReadMarker(&marker).ok());
  EXPECT_EQ(marker, 100);
}

TEST(CheckpointStoreTest, DirectoryNamesFollowMegatron) {
  EXPECT_EQ(CheckpointDirName(100), "iter_0000100");
  int64_t it = 0;
  EXPECT_TRUE(ParseCheckpointDirName("iter_0007010", &it));
  EXPECT_EQ(it, 7010);
  EXPECT_FALSE(ParseCheckpointDirName("iter_0000100.corrupt", &it));
  EXPECT_FALSE(ParseCheckpointDirName("iter_", &it));
  EXPECT_FALSE(ParseCheckpointDirName("global_step100", &it));
}

// Each kind of tampering is refused with the offending file named.
struct Tamper {
  const char* name;
  std::function<void(const std::string& dir)> apply;
  const char* expect;  // in the error
};

TEST(CheckpointStoreTest, TamperingIsRefusedNamingTheFile) {
  const std::vector<Tamper> cases = {
      {"flipped byte",
       [](const std::string& d) {
         std::fstream f(d + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(200);
         char ch;
         f.read(&ch, 1);
         f.seekp(200);
         ch = static_cast<char>(ch ^ 0x01);
         f.write(&ch, 1);
       },
       "model.safetensors: xxh3 checksum"},
      {"truncated file",
       [](const std::string& d) { fs::resize_file(d + "/model.safetensors", 100); },
       "model.safetensors has 100 bytes but the manifest records"},
      {"removed file", [](const std::string& d) { fs::remove(d + "/state.json"); },
       "state.json is missing"},
      {"extra .orig file",
       [](const std::string& d) { fs::copy_file(d + "/state.json", d + "/state.json.orig"); },
       "state.json.orig is not listed in"},
      {"removed manifest", [](const std::string& d) { fs::remove(d + "/manifest.json"); },
       "manifest.json is missing"},
  };
  for (const Tamper& t : cases) {
    SCOPED_TRACE(t.name);
    const std::string root = FreshDir("tamper");
    CheckpointStore store(Env::Default(), root, Collect());
    Content c1(1), c2(2);
    ASSERT_TRUE(store.Save(1, c1.files, nullptr).ok());
    ASSERT_TRUE(store.Save(2, c2.files, nullptr).ok());
    t.apply(root + "/iter_0000002");
    Status st = VerifyCheckpointDir(Env::Default(), root + "/iter_0000002", true, nullptr);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(t.expect), std::string::npos) << st.message();
    // Auto-resume falls back to iteration 1, says so, and moves the bad one aside.
    Logged.clear();
    CheckpointInfo info;
    ASSERT_TRUE(store.FindNewestValid(true, &info).ok());
    EXPECT_EQ(info.iteration, 1);
    EXPECT_TRUE(LoggedContains("iter_0000002 is unusable")) << t.name;
    EXPECT_TRUE(fs::exists(root + "/iter_0000002.corrupt"));
    EXPECT_FALSE(fs::exists(root + "/iter_0000002"));
    EXPECT_EQ(ReadFile(root + "/latest_checkpointed_iteration.txt"), "1\n");
    // The run can save iteration 2 again.
    ASSERT_TRUE(store.Save(2, c2.files, nullptr).ok());
    ASSERT_TRUE(store.FindNewestValid(true, &info).ok());
    EXPECT_EQ(info.iteration, 2);
  }
}

TEST(CheckpointStoreTest, NoValidCheckpointIsAnErrorListingEachReason) {
  const std::string root = FreshDir("none");
  CheckpointStore store(Env::Default(), root, Collect());
  CheckpointInfo info;
  EXPECT_EQ(store.FindNewestValid(false, &info).code(), Status::Code::kNotFound);
  Content c(1);
  ASSERT_TRUE(store.Save(1, c.files, nullptr).ok());
  fs::remove(root + "/iter_0000001/state.json");
  Status st = store.FindNewestValid(false, &info);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("state.json is missing"), std::string::npos) << st.message();
  EXPECT_TRUE(fs::exists(root + "/iter_0000001"));  // not moved: move_aside_rejected was false
}

TEST(CheckpointStoreTest, CompleteCheckpointNewerThanTheMarkerIsAdoptedLoudly) {
  const std::string root = FreshDir("adopt");
  CheckpointStore store(Env::Default(), root, Collect());
  Content c1(1), c2(2);
  ASSERT_TRUE(store.Save(1, c1.files, nullptr).ok());
  ASSERT_TRUE(store.Save(2, c2.files, nullptr).ok());
  // As if the process died after renaming iter_0000002 but before the marker update.
  { std::ofstream(root + "/latest_checkpointed_iteration.txt") << "1\n"; }
  Logged.clear();
  CheckpointInfo info;
  ASSERT_TRUE(store.FindNewestValid(true, &info).ok());
  EXPECT_EQ(info.iteration, 2);
  EXPECT_TRUE(LoggedContains("adopting it"));
  EXPECT_EQ(ReadFile(root + "/latest_checkpointed_iteration.txt"), "2\n");
}

TEST(CheckpointStoreTest, RecoverRemovesLeftoversOfInterruptedSavesLoudly) {
  const std::string root = FreshDir("recover");
  CheckpointStore store(Env::Default(), root, Collect());
  Content c(1);
  ASSERT_TRUE(store.Save(1, c.files, nullptr).ok());
  fs::create_directories(root + "/.tmp.iter_0000002");
  { std::ofstream(root + "/.tmp.iter_0000002/model.safetensors") << "partial"; }
  { std::ofstream(root + "/latest_checkpointed_iteration.txt.tmp") << "2"; }
  fs::create_directories(root + "/.edit.iter_0000001");
  Logged.clear();
  ASSERT_TRUE(store.Recover().ok());
  EXPECT_FALSE(fs::exists(root + "/.tmp.iter_0000002"));
  EXPECT_FALSE(fs::exists(root + "/latest_checkpointed_iteration.txt.tmp"));
  EXPECT_FALSE(fs::exists(root + "/.edit.iter_0000001"));
  EXPECT_TRUE(LoggedContains(".tmp.iter_0000002: the leftover of a checkpoint save"));
  EXPECT_TRUE(LoggedContains("interrupted `keel ckpt edit`"));
  CheckpointInfo info;
  ASSERT_TRUE(store.FindNewestValid(true, &info).ok());
  EXPECT_EQ(info.iteration, 1);
}

// A crash before each filesystem operation of a save, in turn: the store always recovers to a
// consistent state, with either the previous checkpoint or the new one as the newest valid.
TEST(CheckpointStoreTest, CrashAtEveryPointOfASaveLeavesAValidCheckpoint) {
  int64_t n = 1;
  bool completed = false;
  int saw_old = 0, saw_new = 0;
  for (; !completed && n < 200; ++n) {
    const std::string root = FreshDir("crash");
    {
      CheckpointStore store(Env::Default(), root, nullptr);
      Content c1(1);
      ASSERT_TRUE(store.Save(1, c1.files, nullptr).ok());
    }
    FaultInjectionEnv env(Env::Default());
    env.SetCrashHook([] {});
    env.Arm(FaultInjectionEnv::Fault::kCrash, n);
    {
      CheckpointStore store(&env, root, nullptr);
      Content c2(2);
      Status st = store.Save(2, c2.files, nullptr);
      completed = !env.fired();
      if (!completed) {
        EXPECT_FALSE(st.ok()) << "a save that crashed reported success, crash at op " << n;
      } else {
        ASSERT_TRUE(st.ok()) << st.message();
      }
    }
    // "Restart": a new process sees whatever the crash left on disk.
    CheckpointStore store(Env::Default(), root, nullptr);
    ASSERT_TRUE(store.Recover().ok()) << "crash at op " << n;
    CheckpointInfo info;
    ASSERT_TRUE(store.FindNewestValid(true, &info).ok()) << "crash at op " << n;
    ASSERT_TRUE(info.iteration == 1 || info.iteration == 2);
    (info.iteration == 1 ? saw_old : saw_new)++;
    EXPECT_EQ(ReadFile(root + "/iter_000000" + std::to_string(info.iteration) + "/state.json"),
              "{\"iteration\": " + std::to_string(info.iteration) + "}\n");
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string name = e.path().filename().string();
      EXPECT_EQ(name.find(".tmp"), std::string::npos) << name << " after crash at op " << n;
      EXPECT_EQ(name.find(".corrupt"), std::string::npos) << name << " after crash at op " << n;
    }
  }
  EXPECT_TRUE(completed);
  EXPECT_GT(n, 10);       // a save has many crash points; each was visited
  EXPECT_GT(saw_old, 5);  // crashes before the rename keep the old checkpoint
  EXPECT_GE(saw_new, 2);  // crashes after it (before/during the marker update) adopt the new one
}

TEST(CheckpointStoreTest, InjectedIoFaultsKeepThePreviousCheckpointAndSayWhy) {
  struct Case {
    FaultInjectionEnv::Fault fault;
    std::string path_part;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {FaultInjectionEnv::Fault::kNoSpace, "model.safetensors", "No space left on device"},
      {FaultInjectionEnv::Fault::kSyncFails, "state.json", "cannot fsync"},
      {FaultInjectionEnv::Fault::kRenameFails, "iter_0000002", "cannot rename"},
      {FaultInjectionEnv::Fault::kRenameFails, "latest_checkpointed", "cannot rename"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path_part);
    const std::string root = FreshDir("fault");
    FaultInjectionEnv env(Env::Default());
    CheckpointStore store(&env, root, nullptr);
    Content c1(1), c2(2);
    ASSERT_TRUE(store.Save(1, c1.files, nullptr).ok());
    env.Arm(c.fault, 1, c.path_part);
    Status st = store.Save(2, c2.files, nullptr);
    ASSERT_TRUE(env.fired());
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("iter_0000002"), std::string::npos) << st.message();
    // The previous checkpoint is intact and loadable; nothing partial is left in the root.
    EXPECT_TRUE(VerifyCheckpointDir(Env::Default(), root + "/iter_0000001", true, nullptr).ok());
    EXPECT_FALSE(fs::exists(root + "/.tmp.iter_0000002"));
    CheckpointInfo info;
    ASSERT_TRUE(CheckpointStore(Env::Default(), root, nullptr).FindNewestValid(true, &info).ok());
    // A failed marker update leaves a complete iteration 2, which is adopted; otherwise 1.
    EXPECT_EQ(info.iteration, c.path_part == "latest_checkpointed" ? 2 : 1);
    // The next save (the fault is spent) succeeds.
    Content c3(3);
    ASSERT_TRUE(store.Save(3, c3.files, nullptr).ok());
  }
}

TEST(CheckpointStoreTest, RetentionKeepsNewestAndPinnedCheckpoints) {
  const std::string root = FreshDir("retention");
  CheckpointStore store(Env::Default(), root, Collect());
  for (int64_t it : {10, 20, 30}) {
    Content c(it);
    ASSERT_TRUE(store.Save(it, c.files, nullptr).ok());
  }
  ASSERT_TRUE(store.Pin(10, "before the spike at 15").ok());
  for (int64_t it : {40, 50}) {
    Content c(it);
    ASSERT_TRUE(store.Save(it, c.files, nullptr).ok());
  }
  Logged.clear();
  ASSERT_TRUE(store.ApplyRetention(2).ok());
  std::vector<CheckpointInfo> all;
  ASSERT_TRUE(store.List(&all).ok());
  std::vector<int64_t> its;
  for (const auto& i : all) its.push_back(i.iteration);
  EXPECT_EQ(its, (std::vector<int64_t>{10, 40, 50}));
  EXPECT_TRUE(all[0].pinned);
  EXPECT_EQ(all[0].pin_reason, "before the spike at 15");
  EXPECT_TRUE(LoggedContains("removing checkpoint " + root + "/iter_0000020"));
  ASSERT_TRUE(store.Unpin(10).ok());
  ASSERT_TRUE(store.ApplyRetention(2).ok());
  ASSERT_TRUE(store.List(&all).ok());
  EXPECT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].iteration, 40);
}

TEST(CheckpointStoreTest, SavingAnIterationAgainKeepsTheOlderCopy) {
  const std::string root = FreshDir("again");
  CheckpointStore store(Env::Default(), root, Collect());
  Content c(5);
  ASSERT_TRUE(store.Save(5, c.files, nullptr).ok());
  Logged.clear();
  ASSERT_TRUE(store.Save(5, c.files, nullptr).ok());
  EXPECT_TRUE(fs::exists(root + "/iter_0000005.superseded"));
  EXPECT_TRUE(LoggedContains("already existed"));
}

// Saves a checkpoint of each iteration, in order (the marker ends at the last).
void SaveRun(CheckpointStore* store, std::initializer_list<int64_t> iterations) {
  for (int64_t it : iterations) {
    Content c(it);
    ASSERT_TRUE(store->Save(it, c.files, nullptr).ok());
  }
}

std::vector<int64_t> Iterations(CheckpointStore* store) {
  std::vector<CheckpointInfo> all;
  EXPECT_TRUE(store->List(&all).ok());
  std::vector<int64_t> its;
  for (const CheckpointInfo& i : all) its.push_back(i.iteration);
  return its;
}

TEST(CheckpointIdentityTest, ACopiedCheckpointIsNotLoadedInPlaceOfTheRealNewest) {
  const std::string root = FreshDir("stray_copy");
  CheckpointStore store(Env::Default(), root, Collect());
  SaveRun(&store, {10, 15, 20});
  fs::copy(root + "/iter_0000010", root + "/iter_0000099", fs::copy_options::recursive);
  // The copy's files are intact, so only its identity gives it away.
  Status st = VerifyCheckpointDir(Env::Default(), root + "/iter_0000099", true, nullptr);
  ASSERT_EQ(st.code(), Status::Code::kCorruption);
  for (const char* part :
       {"manifest says iteration 10", "named iter_0000099 (iteration 99)",
        "a copy of iter_0000010, or was renamed", "move it out of the run directory"})
    EXPECT_NE(st.message().find(part), std::string::npos) << part << "\n" << st.message();
  // A resume of the run skips it, saying why, and finds the real newest.
  Logged.clear();
  CheckpointInfo info;
  ASSERT_TRUE(store.FindNewestValid(/*move_aside_rejected=*/true, &info).ok());
  EXPECT_EQ(info.iteration, 20);
  EXPECT_EQ(info.path, root + "/iter_0000020");
  EXPECT_TRUE(LoggedContains("iter_0000099 is unusable")) << ::testing::PrintToString(Logged);
  EXPECT_TRUE(LoggedContains("manifest says iteration 10"));
  EXPECT_EQ(ReadFile(root + "/latest_checkpointed_iteration.txt"), "20\n");
  // Only the stray went aside; every real checkpoint is where it was, and the next save is not
  // taken for a second attempt at an earlier iteration.
  EXPECT_TRUE(fs::exists(root + "/iter_0000099.corrupt"));
  EXPECT_EQ(Iterations(&store), (std::vector<int64_t>{10, 15, 20}));
  Logged.clear();
  SaveRun(&store, {25});
  EXPECT_FALSE(LoggedContains("already existed")) << ::testing::PrintToString(Logged);
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().string().find("superseded"), std::string::npos) << e.path();
}

TEST(CheckpointIdentityTest, AStrayLeftInPlaceChangesNothingForTheRealCheckpoints) {
  // Without moving it aside (a `keel sample` or `--load` of another run's directory), the stray
  // stays, and it is neither loaded nor counted by retention.
  const std::string root = FreshDir("stray_kept");
  CheckpointStore store(Env::Default(), root, Collect());
  SaveRun(&store, {10, 15, 20});
  fs::copy(root + "/iter_0000010", root + "/iter_0000099", fs::copy_options::recursive);
  fs::copy(root + "/iter_0000010", root + "/iter_0000017", fs::copy_options::recursive);
  CheckpointInfo info;
  ASSERT_TRUE(store.FindNewestValid(/*move_aside_rejected=*/false, &info).ok());
  EXPECT_EQ(info.iteration, 20);
  EXPECT_TRUE(fs::exists(root + "/iter_0000099"));
  // Retention keeps the two newest real checkpoints, 20 and 15: the stray named 17 takes no place
  // among them and is not deleted either (it is not this run's checkpoint 17).
  Logged.clear();
  ASSERT_TRUE(store.ApplyRetention(2).ok());
  EXPECT_EQ(Iterations(&store), (std::vector<int64_t>{15, 17, 20, 99}));
  EXPECT_TRUE(LoggedContains("retention skips " + root + "/iter_0000017"))
      << ::testing::PrintToString(Logged);
  EXPECT_TRUE(LoggedContains("removing checkpoint " + root + "/iter_0000010"));
}

TEST(CheckpointIdentityTest, AManifestNamingAnotherIterationIsRefused) {
  const std::string root = FreshDir("stray_manifest");
  CheckpointStore store(Env::Default(), root, Collect());
  SaveRun(&store, {10});
  const std::string mpath = root + "/iter_0000010/manifest.json";
  std::string text = ReadFile(mpath);
  const std::string was = "\"iteration\": 10", now = "\"iteration\": 99";
  const size_t at = text.find(was);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, was.size(), now);
  { std::ofstream(mpath, std::ios::trunc) << text; }
  Status st = VerifyCheckpointDir(Env::Default(), root + "/iter_0000010/", true, nullptr);
  ASSERT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("manifest says iteration 99 but the directory is named "
                              "iter_0000010 (iteration 10)"),
            std::string::npos)
      << st.message();
  CheckpointInfo info;
  EXPECT_EQ(store.FindNewestValid(false, &info).code(), Status::Code::kCorruption);
  // The same checkpoint under a name that claims no iteration (a copy kept elsewhere) is fine.
  fs::copy(root + "/iter_0000010", root + "/backup", fs::copy_options::recursive);
  EXPECT_TRUE(VerifyCheckpointDir(Env::Default(), root + "/backup", true, nullptr).ok());
}

TEST(CheckpointStoreTest, AnUnreadableMarkerIsLoggedWithWhatTheStoreDoesInstead) {
  for (const char* marker : {"garbage\n", "-5\n", "\n"}) {
    SCOPED_TRACE(marker);
    const std::string root = FreshDir("bad_marker");
    CheckpointStore store(Env::Default(), root, Collect());
    SaveRun(&store, {10, 20, 30});
    { std::ofstream(root + "/latest_checkpointed_iteration.txt", std::ios::trunc) << marker; }
    Logged.clear();
    std::vector<CheckpointInfo> all;
    ASSERT_TRUE(store.List(&all).ok());
    EXPECT_FALSE(all.back().committed);
    EXPECT_TRUE(LoggedContains("latest_checkpointed_iteration.txt does not hold an iteration"))
        << ::testing::PrintToString(Logged);
    EXPECT_TRUE(LoggedContains("every checkpoint counts as uncommitted"));
    Logged.clear();
    ASSERT_TRUE(store.ApplyRetention(1).ok());
    EXPECT_EQ(Iterations(&store), (std::vector<int64_t>{10, 20, 30}));
    EXPECT_TRUE(LoggedContains("retention (--keep-last-checkpoints 1) deletes nothing"))
        << ::testing::PrintToString(Logged);
    // A resume says so too, uses the newest checkpoint and rewrites the marker.
    Logged.clear();
    CheckpointInfo info;
    ASSERT_TRUE(store.FindNewestValid(true, &info).ok());
    EXPECT_EQ(info.iteration, 30);
    EXPECT_TRUE(LoggedContains("the marker rewritten"));
    EXPECT_EQ(ReadFile(root + "/latest_checkpointed_iteration.txt"), "30\n");
  }
}

TEST(ResolveCheckpointDirTest, ACheckpointDirectoryOrARunDirectorysNewestValid) {
  const std::string root = FreshDir("resolve");
  CheckpointStore store(Env::Default(), root, Collect());
  SaveRun(&store, {10, 20});
  Env* env = Env::Default();
  std::string dir;
  // A run directory: its newest checkpoint that verifies, and why newer ones were passed over.
  ASSERT_TRUE(ResolveCheckpointDir(env, root, Collect(), NamedCheckpoint::kVerify, &dir).ok());
  EXPECT_EQ(dir, root + "/iter_0000020");
  fs::remove(root + "/iter_0000020/state.json");
  Logged.clear();
  ASSERT_TRUE(ResolveCheckpointDir(env, root, Collect(), NamedCheckpoint::kVerify, &dir).ok());
  EXPECT_EQ(dir, root + "/iter_0000010");
  EXPECT_TRUE(LoggedContains("iter_0000020 is unusable"));
  EXPECT_TRUE(fs::exists(root + "/iter_0000020"));  // resolving never moves anything
  // A checkpoint directory named directly: verified, unless the caller takes it as it is.
  Status st =
      ResolveCheckpointDir(env, root + "/iter_0000020", Collect(), NamedCheckpoint::kVerify, &dir);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("state.json is missing"), std::string::npos) << st.message();
  ASSERT_TRUE(
      ResolveCheckpointDir(env, root + "/iter_0000020", Collect(), NamedCheckpoint::kAsIs, &dir)
          .ok());
  EXPECT_EQ(dir, root + "/iter_0000020");
  // Neither: a usage error naming the path.
  st = ResolveCheckpointDir(env, root + "/nothing", Collect(), NamedCheckpoint::kVerify, &dir);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find(root + "/nothing holds no checkpoint"), std::string::npos)
      << st.message();
  // A run directory none of whose checkpoints verifies: Corruption with every reason.
  fs::remove(root + "/iter_0000010/state.json");
  st = ResolveCheckpointDir(env, root, Collect(), NamedCheckpoint::kVerify, &dir);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("no checkpoint in " + root + " verifies"), std::string::npos);
}

TEST(FaultInjectionEnvTest, SpecsParseAndBadSpecsAreRefused) {
  std::unique_ptr<FaultInjectionEnv> env;
  EXPECT_TRUE(FaultInjectionEnv::FromSpec("crash-at=7", Env::Default(), &env).ok());
  EXPECT_TRUE(FaultInjectionEnv::FromSpec("enospc-at=1:optimizer", Env::Default(), &env).ok());
  Status st = FaultInjectionEnv::FromSpec("crash-at=x", Env::Default(), &env);
  EXPECT_FALSE(st.ok());
  st = FaultInjectionEnv::FromSpec("explode=1", Env::Default(), &env);
  EXPECT_NE(st.message().find("crash-at=N"), std::string::npos);
}

TEST(FaultInjectionEnvTest, NoSpaceWritesHalfThenFails) {
  const std::string p = FreshDir("enospc_file");
  FaultInjectionEnv env(Env::Default());
  env.Arm(FaultInjectionEnv::Fault::kNoSpace, 2);
  std::unique_ptr<WritableFile> f;
  ASSERT_TRUE(env.NewWritableFile(p, &f).ok());
  ASSERT_TRUE(f->Append("abcd").ok());
  Status st = f->Append("efghij");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("No space left"), std::string::npos);
  f->Close();
  EXPECT_EQ(ReadFile(p), "abcdefg");
  fs::remove(p);
}

}  // namespace
}  // namespace keel
