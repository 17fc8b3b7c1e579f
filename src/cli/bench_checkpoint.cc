// `keel bench --checkpoint`: save and load a ~100M-parameter training state through the real
// checkpoint path (BuildTrainCheckpoint + CheckpointStore::Save; FindNewestValid + restore) and,
// alternating with it in the same run and directory, the disk's own sequential write speed: dd
// writing the same number of bytes twice, once through the page cache and once with O_DIRECT, both
// with conv=fsync (so, like the save, they include the flush to disk). The save is compared with
// the faster of the two. Before each load the checkpoint's files are dropped from the page cache
// (posix_fadvise DONTNEED after the save's fsyncs), so the load reads them back from the disk.
// Medians are reported.
//
// `keel bench --checkpoint --async`: per model (the 21M "small" and GPT-2 124M's transformer),
// the synchronous save's time against an --async-save's stall of the loop (the snapshot into the
// staging copies and the writer's start), the background write's time, and the training
// iteration time while a background write runs against iterations without one.
#include <fcntl.h>
#include <fmt/ranges.h>
#include <spawn.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "backend/registry.h"
#include "checkpoint/async_checkpoint_writer.h"
#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "checkpoint/train_checkpoint.h"
#include "cli/commands.h"
#include "cli/exit_code.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/log.h"
#include "train/checkpoint_controller.h"
#include "train/trainer.h"

extern char** environ;

namespace keel::cli {
namespace {

namespace fs = std::filesystem;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// dd writing exactly `bytes` zeros to `path` in 64 MiB blocks and fsyncing the file before it
// exits; `direct` bypasses the page cache (GNU dd writes a final partial block without O_DIRECT).
std::vector<std::string> DdArgv(const std::string& path, uint64_t bytes, bool direct) {
  std::vector<std::string> a = {"dd",
                                "if=/dev/zero",
                                "of=" + path,
                                "bs=64M",
                                fmt::format("count={}", bytes),
                                "iflag=count_bytes",
                                "conv=fsync",
                                "status=none"};
  if (direct) a.push_back("oflag=direct");
  return a;
}

// Runs argv[0] (searched in PATH) with no shell; OK when it exits with status 0.
Status RunProcess(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ);
  if (err != 0) return Status::IOError(fmt::format("cannot run {}: {}", argv[0], strerror(err)));
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0)
    if (errno != EINTR) return Status::IOError(fmt::format("waitpid: {}", strerror(errno)));
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
    return Status::IOError(fmt::format("`{}` failed (status {})", fmt::join(argv, " "), wstatus));
  return Status::OK();
}

// Drops the (clean, already fsynced) pages of every file in `dir` from the page cache.
void EvictFromPageCache(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Removes what the bench wrote; the directory itself too when the bench created it.
struct Cleanup {
  std::string dir;
  bool created = false;
  ~Cleanup() {
    std::error_code ec;
    if (created) {
      fs::remove_all(dir, ec);
    } else {
      for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
    }
  }
};

// The bench's scratch directory: --dir (which must be new or empty) or a new temporary one
// named `prefix`-PID, into *dir; `cleanup` removes what the bench writes there. 0, or the exit
// code of the refusal (logged).
int OpenBenchDir(const std::string& dir_arg, const std::string& prefix, std::string* dir,
                 Cleanup* cleanup) {
  *dir = dir_arg.empty()
             ? (fs::temp_directory_path() / (prefix + std::to_string(getpid()))).string()
             : dir_arg;
  std::error_code ec;
  if (fs::exists(*dir, ec) && !fs::is_empty(*dir, ec)) {
    LogError("error: --dir " + *dir + " exists and is not empty; give a new or empty directory");
    return 2;
  }
  cleanup->dir = *dir;
  cleanup->created = !fs::exists(*dir, ec);
  if (!fs::create_directories(*dir, ec) && ec) {
    cleanup->created = false;
    return LogError("error: cannot create " + *dir + ": " + ec.message()), 1;
  }
  return 0;
}

}  // namespace

int BenchCheckpoint(const std::string& dir_arg, int repeats, int threads) {
  std::string dir;
  Cleanup cleanup;
  if (const int refused = OpenBenchDir(dir_arg, "keel-bench-ckpt-", &dir, &cleanup)) return refused;
  std::error_code ec;
  // GPT-2 124M's transformer with a 16k vocabulary: about 98M parameters.
  TrainConfig cfg;
  cfg.model.num_layers = 12;
  cfg.model.hidden = 768;
  cfg.model.heads = 12;
  cfg.seq_length = 64;
  cfg.micro_batch_size = 1;
  cfg.global_batch_size = 1;
  cfg.model.vocab = 16384;
  cfg.train_iters = 10;
  cfg.lr_warmup_iters = 1;
  cfg.threads = threads;
  std::vector<std::string> notes;
  Status st = Validate(&cfg, &notes);
  if (!st.ok()) return Fail(st);
  std::unique_ptr<Backend> backend;
  if (st = MakeBackend(cfg.backend, threads, &backend); !st.ok()) return Fail(st);
  auto comm = MakeSingleProcessCommunicator();
  Trainer trainer(cfg, backend.get(), comm.get(), {SampleFn(), SampleFn()});
  trainer.InitializeWeights();
  // Nonzero moments, so nothing compresses or is special-cased.
  const size_t n = trainer.model().num_params();
  std::vector<float> fill(n);
  for (size_t i = 0; i < n; ++i) fill[i] = 1e-3f * static_cast<float>((i * 2654435761u) % 1000);
  backend->CopyToDevice(trainer.optimizer().exp_avg(), fill.data(), n);
  backend->CopyToDevice(trainer.optimizer().exp_avg_sq(), fill.data(), n);
  RunInfo run;
  run.meta.tokenizer = "none";

  // Three checkpoints' worth of room: the checkpoint and the dd file, with slack.
  const double state_bytes = 12.0 * static_cast<double>(n);
  struct statvfs sv {};
  if (statvfs(dir.c_str(), &sv) == 0 &&
      static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize) < 3 * state_bytes) {
    LogError(fmt::format("error: {} has less than {:.1f} GB free; give another --dir", dir,
                         3 * state_bytes / 1e9));
    return 1;
  }
  // In-memory hashing speed, for reference: the save hashes every byte it writes.
  auto t0 = std::chrono::steady_clock::now();
  const uint64_t h = Xxh3(reinterpret_cast<const char*>(fill.data()), n * sizeof(float));
  const double xxh3_gbs = static_cast<double>(n * sizeof(float)) / 1e9 / Seconds(t0);

  Log("checkpoint bench: {} parameters ({:.0f} MB of weights and Adam moments), {} repeats in {}",
      n, state_bytes / 1e6, repeats, dir);
  Log("xxh3 in memory: {:.1f} GB/s ({:016x})", xxh3_gbs, h);
  Log("peers: `dd if=/dev/zero of={}/dd.bin bs=64M count=<checkpoint bytes> iflag=count_bytes "
      "conv=fsync` (page cache) and the same with oflag=direct; save/dd uses the faster",
      dir);
  Log("loads read from the disk: the files are dropped from the page cache after the save");
  Log("{:>3} | {:>8} | {:>9} | {:>9} | {:>9} | {:>7} | {:>9} | {:>9}", "rep", "MB", "save GB/s",
      "dd GB/s", "dd direct", "save/dd", "load GB/s", "verify");
  std::vector<double> save_r, dd_r, ddd_r, ratio_r, load_r, verify_r;
  CheckpointStaging staging;  // kept across saves, as CheckpointController does
  for (int rep = 0; rep < repeats; ++rep) {
    CheckpointStore store(Env::Default(), dir, nullptr);
    TrainState state = trainer.state();
    state.counters.iteration = rep + 1;
    trainer.Restore(state);
    std::vector<CheckpointFile> files;
    t0 = std::chrono::steady_clock::now();
    st = BuildTrainCheckpoint(Env::Default(), CheckpointSourceOf(trainer), run,
                              nlohmann::json::array(), &staging, &files);
    SaveStats stats;
    if (st.ok()) st = store.Save(rep + 1, files, &stats);
    const double save_s = Seconds(t0);
    if (!st.ok()) return Fail(st);
    const double gb = static_cast<double>(stats.bytes) / 1e9;
    EvictFromPageCache(stats.path);

    // The peers: dd writing the same bytes into the same directory, flushed before it exits.
    double dd_s[2] = {0, 0};
    for (int direct = 0; direct < 2; ++direct) {
      t0 = std::chrono::steady_clock::now();
      st = RunProcess(DdArgv(dir + "/dd.bin", stats.bytes, direct != 0));
      dd_s[direct] = Seconds(t0);
      fs::remove(dir + "/dd.bin", ec);
      if (!st.ok()) return Fail(st);
    }

    // Load: verify every checksum (FindNewestValid), then read the state into the model.
    t0 = std::chrono::steady_clock::now();
    CheckpointInfo info;
    st = store.FindNewestValid(false, &info);
    const double verify_s = Seconds(t0);
    SavedTrainState saved;
    if (st.ok()) st = ReadSavedTrainState(Env::Default(), info.path, &saved);
    if (st.ok()) st = RestoreTrainer(Env::Default(), saved, &trainer);
    const double load_s = Seconds(t0);
    if (!st.ok()) return Fail(st);
    fs::remove_all(info.path, ec);  // one checkpoint on disk at a time

    save_r.push_back(gb / save_s);
    dd_r.push_back(gb / dd_s[0]);
    ddd_r.push_back(gb / dd_s[1]);
    ratio_r.push_back(save_r.back() / std::max(dd_r.back(), ddd_r.back()));
    load_r.push_back(gb / load_s);
    verify_r.push_back(gb / verify_s);
    Log("{:>3} | {:>8.0f} | {:>9.2f} | {:>9.2f} | {:>9.2f} | {:>7.2f} | {:>9.2f} | {:>9.2f}",
        rep + 1, gb * 1e3, save_r.back(), dd_r.back(), ddd_r.back(), ratio_r.back(), load_r.back(),
        verify_r.back());
  }
  Log("median | save {:.2f} GB/s | dd {:.2f} GB/s | dd direct {:.2f} GB/s | save/dd {:.2f} | "
      "load {:.2f} GB/s (verify included, read from the disk) | verify {:.2f} GB/s",
      Median(save_r), Median(dd_r), Median(ddd_r), Median(ratio_r), Median(load_r),
      Median(verify_r));
  return 0;
}

namespace {

struct AsyncBenchModel {
  const char* name;
  int layers, hidden, heads, seq, micro_batch, vocab;
};

}  // namespace

int BenchCheckpointAsync(const std::string& dir_arg, int repeats, int threads) {
  std::string dir;
  Cleanup cleanup;
  if (const int refused = OpenBenchDir(dir_arg, "keel-bench-async-", &dir, &cleanup))
    return refused;
  std::error_code ec;
  const AsyncBenchModel models[] = {{"small (21M)", 6, 512, 8, 256, 4, 4096},
                                    {"gpt2-124m (16k vocab)", 12, 768, 12, 64, 1, 16384}};
  Log("async checkpoint bench: {} repeats per model in {}; sync = BuildTrainCheckpoint + Save "
      "(zero-copy views); stall = the loop's snapshot into reused staging copies + the writer's "
      "start; iterations timed while the background write runs and without one",
      repeats, dir);
  for (const AsyncBenchModel& m : models) {
    TrainConfig cfg;
    cfg.model.num_layers = m.layers;
    cfg.model.hidden = m.hidden;
    cfg.model.heads = m.heads;
    cfg.seq_length = m.seq;
    cfg.micro_batch_size = m.micro_batch;
    cfg.global_batch_size = m.micro_batch;
    cfg.model.vocab = m.vocab;
    cfg.train_iters = 100000;
    cfg.lr_warmup_iters = 1;
    cfg.threads = threads;
    std::vector<std::string> notes;
    Status st = Validate(&cfg, &notes);
    if (!st.ok()) return Fail(st);
    std::unique_ptr<Backend> backend;
    if (st = MakeBackend(cfg.backend, threads, &backend); !st.ok()) return Fail(st);
    auto comm = MakeSingleProcessCommunicator();
    const int seq = m.seq, vocab = m.vocab;
    SampleFn data = [seq, vocab](int64_t index, int32_t* tokens) {
      uint64_t x = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull + 1;
      for (int t = 0; t <= seq; ++t) {
        x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 29;
        tokens[t] = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
      }
      return 0;
    };
    Trainer trainer(cfg, backend.get(), comm.get(), {data, SampleFn()});
    trainer.InitializeWeights();
    // The loop's wait for a background save's copies before the update (the controller's
    // WaitForSnapshot), added to that save's stall.
    AsyncCheckpointWriter* staging_writer = nullptr;
    double staged_wait = 0;
    auto step = [&]() -> double {
      const auto t0 = std::chrono::steady_clock::now();
      const IterationPlan plan = trainer.PlanIteration();
      StepResult r;
      Status s = trainer.ComputeGradients(plan, &r);
      KEEL_CHECK(s.ok(), "bench iteration failed");
      if (staging_writer != nullptr) {
        const auto w0 = std::chrono::steady_clock::now();
        staging_writer->WaitStaged();
        staged_wait += Seconds(w0);
      }
      trainer.Update(true, &r);
      trainer.EndIteration(plan, &r);
      return Seconds(t0) * 1e3;
    };
    step();  // warm-up: the moments are nonzero from here on
    RunInfo run;
    run.meta.tokenizer = "none";
    CheckpointStaging zero_copy, copies;
    copies.copy = true;
    copies.defer = true;  // as the controller: the writer copies while the loop computes
    // Allocated up front, as CheckpointController does when --async-save is on.
    copies.params_copy.resize(trainer.model().num_params());
    copies.exp_avg_copy.resize(trainer.optimizer().shard().size());
    copies.exp_avg_sq_copy.resize(trainer.optimizer().shard().size());
    std::vector<double> sync_r, stall_r, bg_r, base_r, during_r;
    Log("{}: {} parameters; rep | sync save s | stall s | stall/sync | background write s | "
        "iteration ms without | while writing",
        m.name, trainer.model().num_params());
    for (int rep = 0; rep < repeats; ++rep) {
      CheckpointStore store(Env::Default(), dir, nullptr);
      // The synchronous save.
      const int64_t sync_it = 2 * rep + 1, async_it = 2 * rep + 2;
      std::vector<CheckpointFile> files;
      auto t0 = std::chrono::steady_clock::now();
      st = BuildTrainCheckpoint(Env::Default(), CheckpointSourceOf(trainer), run,
                                nlohmann::json::array(), &zero_copy, &files);
      SaveStats stats;
      if (st.ok()) st = store.Save(sync_it, files, &stats);
      sync_r.push_back(Seconds(t0));
      if (!st.ok()) return Fail(st);
      fs::remove_all(stats.path, ec);
      // Iterations without a background write.
      std::vector<double> base;
      for (int i = 0; i < 3; ++i) base.push_back(step());
      // The asynchronous save: the loop's stall, then iterations while the write runs.
      AsyncCheckpointWriter writer(Env::Default(), dir, false);
      t0 = std::chrono::steady_clock::now();
      AsyncCheckpointWriter::Job job;
      job.iteration = async_it;
      st = BuildTrainCheckpoint(Env::Default(), CheckpointSourceOf(trainer), run,
                                nlohmann::json::array(), &copies, &job.files);
      if (!st.ok()) return Fail(st);
      job.copies = std::move(copies.deferred);
      writer.Start(std::move(job));
      const double started = Seconds(t0);
      staging_writer = &writer;
      staged_wait = 0;
      std::vector<double> during;
      while (!writer.done()) during.push_back(step());
      staging_writer = nullptr;
      stall_r.push_back(started + staged_wait);
      AsyncCheckpointWriter::Result r = writer.Wait();
      if (!r.status.ok()) return Fail(r.status);
      fs::remove_all(r.stats.path, ec);
      bg_r.push_back(r.seconds);
      base_r.push_back(Median(base));
      during_r.push_back(Median(during));
      Log("{:>3} | {:>6.3f} | {:>6.4f} | {:>6.3f} | {:>6.3f} | {:>7.1f} | {:>7.1f} ({} iterations)",
          rep + 1, sync_r.back(), stall_r.back(), stall_r.back() / sync_r.back(), bg_r.back(),
          base_r.back(), during_r.back(), during.size());
    }
    Log("{} median | sync save {:.3f} s | stall {:.4f} s | stall/sync {:.3f} | background write "
        "{:.3f} s | iteration {:.1f} ms without, {:.1f} ms while writing ({:.2f}x)",
        m.name, Median(sync_r), Median(stall_r), Median(stall_r) / Median(sync_r), Median(bg_r),
        Median(base_r), Median(during_r), Median(during_r) / Median(base_r));
  }
  return 0;
}

}  // namespace keel::cli
