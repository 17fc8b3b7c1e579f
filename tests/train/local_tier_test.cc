// The local checkpoint tier in process (train/local_checkpoint_tier.h, --non-persistent-*): a run
// killed after a local save resumes from it, not from the older persistent checkpoint, to the
// same bits; a crash at any filesystem operation of a local save leaves a valid resume; a damaged
// piece is skipped with a note; across ranks (threads) a rank's lost directory is made good from
// its replica on the next rank, and a piece nobody holds rules its iteration out.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "../data/data_test_util.h"
#include "checkpoint/manifest.h"
#include "core/fault_injection_env.h"
#include "core/log.h"
#include "small_dataset.h"
#include "train/local_checkpoint_tier.h"
#include "train/training_run.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using datatest::TempDir;

TrainConfig Tiny(const std::string& save, const std::string& local) {
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
  c.save_interval = 10;
  c.keep_last_checkpoints = 0;
  c.sample_tokens = 0;
  c.threads = 1;
  c.data_path = {datatest::SmallDatasetPrefix(7)};
  c.save = save;
  if (!local.empty()) {
    c.non_persistent_save_interval = 2;
    c.non_persistent_local_ckpt_dir = local;
  }
  return c;
}

class Captured {
 public:
  Captured() {
    SetLogCopy([this](const std::string& l) { text += l + "\n"; }, /*mute_stdout=*/true, "");
  }
  ~Captured() { SetLogCopy(nullptr, /*mute_stdout=*/false, ""); }
  std::string text;
};

struct RunResult {
  Status status;
  int64_t start_iteration = -1;
  uint64_t fingerprint = 0;
  std::string log;
};

RunResult OpenAndTrain(const TrainConfig& c, Env* env = Env::Default()) {
  RunResult r;
  Captured log;
  {
    auto comm = MakeSingleProcessCommunicator();
    std::unique_ptr<TrainingRun> run;
    r.status = TrainingRun::Open(c, {env, comm.get(), nullptr}, &run);
    if (r.status.ok()) {
      r.start_iteration = run->trainer().state().counters.iteration;
      TrainingRun::Outcome outcome;
      r.status = run->Train(&outcome);
      r.fingerprint = run->StateFingerprint();
    }
  }
  r.log = log.text;
  return r;
}

// The run of `c` killed at the first filesystem operation of its local save of `iteration`.
RunResult KilledAtLocalSave(const TrainConfig& c, int64_t iteration) {
  FaultInjectionEnv env(Env::Default());
  env.SetCrashHook([] {});
  env.Arm(FaultInjectionEnv::Fault::kCrash, 1, "own/.tmp." + CheckpointDirName(iteration));
  RunResult r = OpenAndTrain(c, &env);
  EXPECT_TRUE(env.fired());
  return r;
}

std::string OwnPiece(const std::string& local, int64_t iteration) {
  for (const auto& e : fs::directory_iterator(local))
    return (e.path() / "rank-0-of-1" / "own" / CheckpointDirName(iteration)).string();
  return "";
}

TEST(LocalTierTest, AKilledRunResumesFromTheNewerLocalCheckpointToTheSameBits) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), ""));
  ASSERT_TRUE(ref.status.ok()) << ref.status.ToString();
  const TrainConfig c = Tiny(dir.Join("run"), dir.Join("local"));
  KilledAtLocalSave(c, 18);  // persistent: iteration 10; local: 14 and 16
  const RunResult resumed = OpenAndTrain(c);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status.ToString() << resumed.log;
  EXPECT_EQ(resumed.start_iteration, 16);
  EXPECT_NE(resumed.log.find("note: resuming from the local tier: iteration 16"), std::string::npos)
      << resumed.log;
  EXPECT_NE(resumed.log.find("newest valid checkpoint is iteration 10, older"), std::string::npos);
  EXPECT_EQ(resumed.fingerprint, ref.fingerprint);
  // Persistent retention never saw the local checkpoints; the local tier kept its newest two.
  EXPECT_TRUE(fs::exists(dir.Join("run/iter_0000010")));
  EXPECT_FALSE(fs::exists(OwnPiece(dir.Join("local"), 12)));
  EXPECT_TRUE(fs::exists(OwnPiece(dir.Join("local"), 18)));
  EXPECT_TRUE(fs::exists(OwnPiece(dir.Join("local"), 16)));
}

TEST(LocalTierTest, ACrashAtAnyOperationOfALocalSaveLeavesAValidResume) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), ""));
  ASSERT_TRUE(ref.status.ok());
  int crashed = 0;
  for (int nth = 1; nth <= 60; nth += 4) {
    const std::string run = dir.Join(fmt::format("run{}", nth));
    const TrainConfig c = Tiny(run, dir.Join(fmt::format("local{}", nth)));
    FaultInjectionEnv env(Env::Default());
    env.SetCrashHook([] {});
    env.Arm(FaultInjectionEnv::Fault::kCrash, nth, "keel-local-");
    OpenAndTrain(c, &env);
    if (!env.fired()) break;
    ++crashed;
    const RunResult resumed = OpenAndTrain(c);
    ASSERT_TRUE(resumed.status.ok()) << nth << resumed.status.ToString() << resumed.log;
    EXPECT_EQ(resumed.fingerprint, ref.fingerprint) << nth << resumed.log;
  }
  EXPECT_GE(crashed, 10);
}

TEST(LocalTierTest, ADamagedLocalPieceIsSkippedWithANote) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), ""));
  ASSERT_TRUE(ref.status.ok());
  const TrainConfig c = Tiny(dir.Join("run"), dir.Join("local"));
  KilledAtLocalSave(c, 18);
  // A flipped byte in the newest piece: the older local one (14) is used.
  const std::string weights = OwnPiece(dir.Join("local"), 16) + "/model.safetensors";
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('\x55');
  }
  const RunResult r = OpenAndTrain(c);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString() << r.log;
  EXPECT_NE(r.log.find("note: local tier: skipping " + OwnPiece(dir.Join("local"), 16)),
            std::string::npos)
      << r.log;
  EXPECT_NE(r.log.find("resuming from the local tier: iteration 14"), std::string::npos) << r.log;
  EXPECT_EQ(r.start_iteration, 14);
  EXPECT_EQ(r.fingerprint, ref.fingerprint);
}

TEST(LocalTierTest, WithEveryLocalPieceDamagedTheResumeFallsBackToThePersistentTier) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), ""));
  ASSERT_TRUE(ref.status.ok());
  const TrainConfig c = Tiny(dir.Join("run"), dir.Join("local"));
  KilledAtLocalSave(c, 18);
  for (int64_t it : {14, 16}) fs::remove(OwnPiece(dir.Join("local"), it) + "/state.json");
  const RunResult r = OpenAndTrain(c);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString() << r.log;
  EXPECT_EQ(r.start_iteration, 10);
  EXPECT_EQ(r.log.find("resuming from the local tier"), std::string::npos) << r.log;
  for (int64_t it : {14, 16})
    EXPECT_NE(r.log.find("note: local tier: skipping " + OwnPiece(dir.Join("local"), it)),
              std::string::npos)
        << r.log;
  EXPECT_EQ(r.fingerprint, ref.fingerprint);
}

TEST(LocalTierTest, ARollbackRemovesTheLocalPiecesOfTheAbandonedTimeline) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), ""));
  ASSERT_TRUE(ref.status.ok());
  TrainConfig c = Tiny(dir.Join("run"), dir.Join("local"));
  ASSERT_TRUE(OpenAndTrain(c).status.ok());  // local pieces 16 and 18 remain
  ASSERT_TRUE(fs::exists(OwnPiece(dir.Join("local"), 18)));
  // Back to iteration 10 by hand, killed at the local save of 14: the pieces of 16 and 18 are of
  // the timeline left behind, so the next start must not take them.
  c.load = dir.Join("run/iter_0000010");
  const RunResult rolled = KilledAtLocalSave(c, 14);
  EXPECT_NE(rolled.log.find("note: local tier: removed " + OwnPiece(dir.Join("local"), 18)),
            std::string::npos)
      << rolled.log;
  EXPECT_FALSE(fs::exists(OwnPiece(dir.Join("local"), 16)));
  c.load.clear();
  const RunResult r = OpenAndTrain(c);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString() << r.log;
  EXPECT_EQ(r.start_iteration, 12) << r.log;
  EXPECT_EQ(r.fingerprint, ref.fingerprint);
}

TEST(LocalTierTest, ARecreatedSaveDirectoryNeverMeetsTheLocalPiecesOfTheRunItReplaced) {
  TempDir dir;
  const TrainConfig c = Tiny(dir.Join("run"), dir.Join("local"));
  KilledAtLocalSave(c, 18);
  fs::remove_all(dir.Join("run"));  // the run is deleted; its local pieces stay behind
  const RunResult r = OpenAndTrain(c);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString() << r.log;
  EXPECT_EQ(r.start_iteration, 0) << r.log;
  EXPECT_EQ(r.log.find("resuming from the local tier"), std::string::npos) << r.log;
}

TEST(LocalTierTest, ALocalSaveFailureIsLoggedAndTrainingGoesOn) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), ""));
  FaultInjectionEnv env(Env::Default());
  env.Arm(FaultInjectionEnv::Fault::kNoSpace, 1, "own/.tmp.", /*persistent=*/true);
  const RunResult r = OpenAndTrain(Tiny(dir.Join("run"), dir.Join("local")), &env);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString() << r.log;
  EXPECT_NE(r.log.find("ERROR: local checkpoint 2 failed"), std::string::npos) << r.log;
  // Local failures never count among the persistent save failures that stop a run.
  EXPECT_EQ(r.log.find("consecutive failures allowed"), std::string::npos) << r.log;
  EXPECT_TRUE(fs::exists(dir.Join("run/iter_0000020")));
  EXPECT_EQ(r.fingerprint, ref.fingerprint);
}

// Ranks as threads: each saves a piece of made-up files; the tier's ring and gather do the rest.
struct Ranks {
  explicit Ranks(int n, const std::string& save, const std::string& local) {
    comms = MakeThreadGroup(n);
    cfg.save = save;
    cfg.non_persistent_save_interval = 1;
    cfg.non_persistent_local_ckpt_dir = local;
    fs::create_directories(save);
    tiers.resize(n);
    logs.resize(n);
  }
  // Runs `fn(rank)` on every rank at once.
  void Each(const std::function<void(int)>& fn) {
    std::vector<std::thread> t;
    for (size_t r = 0; r < comms.size(); ++r) t.emplace_back(fn, static_cast<int>(r));
    for (auto& th : t) th.join();
  }
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<LocalCheckpointTier>> tiers;
  std::vector<std::string> logs;
  TrainConfig cfg;
};

std::vector<CheckpointFile> PieceOf(int rank, int64_t it) {
  std::vector<CheckpointFile> files(rank == 0 ? 2 : 1);
  files[0].name = fmt::format("piece.rank-{}", rank);
  files[0].bytes = fmt::format("rank {} at {}", rank, it);
  if (rank == 0) files[1].name = "state.json", files[1].bytes = fmt::format("{{\"it\": {}}}", it);
  return files;
}

TEST(LocalTierTest, ARankWhoseLocalDirectoryIsLostIsRestoredFromItsReplica) {
  TempDir dir;
  Ranks ranks(3, dir.Join("save"), dir.Join("local"));
  ranks.Each([&](int r) {
    auto log = [&ranks, r](const std::string& l) { ranks.logs[r] += l + "\n"; };
    ASSERT_TRUE(LocalCheckpointTier::Open(Env::Default(), ranks.comms[r].get(), ranks.cfg, log,
                                          &ranks.tiers[r])
                    .ok());
    for (int64_t it : {1, 2, 3}) {
      std::string summary;
      ASSERT_TRUE(ranks.tiers[r]->Save(it, PieceOf(r, it), Status::OK(), &summary).ok());
    }
  });
  // Rank 1's node loses its local storage: its pieces (and its replica of rank 0's) are gone.
  fs::remove_all(ranks.tiers[1]->root());
  std::vector<std::string> dirs(3);
  std::vector<std::vector<std::string>> notes(3);
  ranks.Each([&](int r) {
    ASSERT_TRUE(ranks.tiers[r]->FindResume(/*persistent=*/1, &dirs[r], &notes[r]).ok());
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(dirs[r].empty()) << r;
    EXPECT_NE(dirs[r].find(CheckpointDirName(3)), std::string::npos);
    ASSERT_TRUE(VerifyCheckpointDir(Env::Default(), dirs[r], true, nullptr).ok());
    for (int q = 0; q < 3; ++q) {
      std::ifstream f(dirs[r] + fmt::format("/piece.rank-{}", q));
      std::string text((std::istreambuf_iterator<char>(f)), {});
      EXPECT_EQ(text, fmt::format("rank {} at 3", q)) << r << " " << q;
    }
    ASSERT_FALSE(notes[r].empty());
    EXPECT_NE(notes[r].back().find("rank 1's piece from its replica on rank 2"), std::string::npos)
        << notes[r].back();
  }
  // Rank 2 loses its directory too: rank 1's piece is now nowhere, so no local iteration can be
  // restored and the persistent tier is used (every rank says why).
  fs::remove_all(ranks.tiers[2]->root());
  ranks.Each([&](int r) {
    notes[r].clear();
    ASSERT_TRUE(ranks.tiers[r]->FindResume(/*persistent=*/1, &dirs[r], &notes[r]).ok());
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(dirs[r].empty()) << r;
    bool said = false;
    for (const std::string& n : notes[r])
      said = said || n.find(
                         "rank 1's piece is in neither its own directory nor its replica on "
                         "rank 2") != std::string::npos;
    EXPECT_TRUE(said) << r;
  }
}

// Local pieces written by a job of another number of ranks restore nowhere here; rank 0 says
// so (iteration, rank counts, where the run resumes instead) rather than passing them silently.
TEST(LocalTierTest, APieceWrittenByAJobOfAnotherRankCountIsNotedAndNotUsed) {
  TempDir dir;
  const LocalCheckpointTier::Logger quiet = [](const std::string&) {};
  Ranks three(3, dir.Join("save"), dir.Join("local"));
  three.Each([&](int r) {
    ASSERT_TRUE(LocalCheckpointTier::Open(Env::Default(), three.comms[r].get(), three.cfg, quiet,
                                          &three.tiers[r])
                    .ok());
    for (int64_t it : {1, 2, 3}) {
      std::string summary;
      ASSERT_TRUE(three.tiers[r]->Save(it, PieceOf(r, it), Status::OK(), &summary).ok());
    }
  });
  const std::string piece3 = three.tiers[0]->root() + "/own/" + CheckpointDirName(3);
  // Two ranks: nothing to resume from at their count; rank 0 notes the 3-rank job's piece.
  Ranks two(2, dir.Join("save"), dir.Join("local"));
  std::vector<std::string> dirs(2);
  std::vector<std::vector<std::string>> notes(2);
  two.Each([&](int r) {
    ASSERT_TRUE(
        LocalCheckpointTier::Open(Env::Default(), two.comms[r].get(), two.cfg, quiet, &two.tiers[r])
            .ok());
    ASSERT_TRUE(two.tiers[r]->FindResume(/*persistent=*/1, &dirs[r], &notes[r]).ok());
  });
  EXPECT_TRUE(dirs[0].empty() && dirs[1].empty());
  ASSERT_EQ(notes[0].size(), 1u);
  EXPECT_EQ(
      notes[0][0],
      "local tier: the local checkpoint at iteration 3 (in " +
          fs::path(three.tiers[0]->root()).parent_path().string() +
          "/rank-*-of-3) was written by a job of 3 ranks and is not used by this job of 2 (a local "
          "checkpoint restores only at the number of ranks that wrote it); resuming from "
          "--save instead (iteration 1). To continue from it, rerun with 3 ranks");
  EXPECT_TRUE(notes[1].empty()) << notes[1][0];  // rank 0's note only
  // One process, and --save as new as the other job's pieces: nothing to say.
  auto one = MakeSingleProcessCommunicator();
  std::unique_ptr<LocalCheckpointTier> tier;
  ASSERT_TRUE(LocalCheckpointTier::Open(Env::Default(), one.get(), two.cfg, quiet, &tier).ok());
  std::string d;
  std::vector<std::string> n;
  ASSERT_TRUE(tier->FindResume(/*persistent=*/3, &d, &n).ok());
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(n.empty()) << n[0];
  ASSERT_TRUE(tier->FindResume(/*persistent=*/-1, &d, &n).ok());
  ASSERT_EQ(n.size(), 1u);
  EXPECT_NE(n[0].find("was written by a job of 3 ranks and is not used by this job of 1 "),
            std::string::npos)
      << n[0];
  EXPECT_NE(n[0].find("resuming from --save instead, which holds no valid checkpoint yet"),
            std::string::npos)
      << n[0];
  // The other job's pieces are left alone (a job of 3 ranks may still come back for them).
  EXPECT_TRUE(fs::exists(piece3));
}

// The same through a training run: a run of 1 process finds the local pieces of a 2-process job
// newer than --save's checkpoint, says so in a note and resumes from --save, to the same bits.
TEST(LocalTierTest, ARunResumesFromSaveWithANoteWhenTheLocalTierIsOfAnotherRankCount) {
  TempDir dir;
  const RunResult ref = OpenAndTrain(Tiny(dir.Join("ref"), ""));
  ASSERT_TRUE(ref.status.ok());
  const TrainConfig c = Tiny(dir.Join("run"), dir.Join("local"));
  KilledAtLocalSave(c, 18);  // persistent: iteration 10; local: 14 and 16
  // The pieces as a job of 2 ranks leaves them (rank 1's a copy: only the directory names count).
  const fs::path piece = fs::path(OwnPiece(dir.Join("local"), 16));
  const fs::path run_dir = piece.parent_path().parent_path().parent_path();
  fs::rename(run_dir / "rank-0-of-1", run_dir / "rank-0-of-2");
  fs::copy(run_dir / "rank-0-of-2", run_dir / "rank-1-of-2", fs::copy_options::recursive);
  const RunResult r = OpenAndTrain(c);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString() << r.log;
  EXPECT_EQ(r.start_iteration, 10) << r.log;
  EXPECT_NE(r.log.find("note: local tier: the local checkpoint at iteration 16 (in " +
                       run_dir.string() + "/rank-*-of-2)"),
            std::string::npos)
      << r.log;
  EXPECT_NE(
      r.log.find(") was written by a job of 2 ranks and is not used by this job of 1 (a local "
                 "checkpoint restores only at the number of ranks that wrote it); resuming "
                 "from --save instead (iteration 10). To continue from it, rerun with 2 "
                 "ranks"),
      std::string::npos)
      << r.log;
  EXPECT_EQ(r.fingerprint, ref.fingerprint);
}

TEST(LocalTierTest, PiecesRoundTripThroughTheirEncoding) {
  std::vector<CheckpointFile> in = PieceOf(0, 7), out;
  std::string bytes;
  ASSERT_TRUE(EncodePieceFiles(in, &bytes).ok());
  ASSERT_TRUE(DecodePieceFiles(bytes, &out).ok());
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].name, in[i].name);
    EXPECT_EQ(out[i].bytes, in[i].bytes);
  }
  for (size_t cut : {size_t{0}, size_t{5}, bytes.size() - 1})
    EXPECT_FALSE(DecodePieceFiles(bytes.substr(0, cut), &out).ok()) << cut;
}

}  // namespace
}  // namespace keel
