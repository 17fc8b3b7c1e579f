// `keel bench --checkpoint`: save and load a ~100M-parameter training state through the real
// checkpoint path (BuildTrainCheckpoint + CheckpointStore::Save; FindNewestValid + restore) and,
// alternating with it in the same run, the disk's own sequential write speed with dd writing the
// same number of bytes with conv=fsync (so both include the flush to disk). Medians are reported.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "core/log.h"
#include "train/checkpoint_controller.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace keel::cli {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int BenchCheckpoint(const std::string& dir_arg, int repeats, int threads) {
  namespace fs = std::filesystem;
  const std::string dir =
      dir_arg.empty()
          ? (fs::temp_directory_path() / ("keel-bench-ckpt-" + std::to_string(getpid()))).string()
          : dir_arg;
  if (fs::exists(dir) && !fs::is_empty(dir)) {
    LogError("error: --dir " + dir + " exists and is not empty; give a new directory");
    return 2;
  }
  fs::create_directories(dir);
  // GPT-2 124M's transformer with a 16k vocabulary: about 98M parameters.
  TrainConfig cfg;
  cfg.num_layers = 12;
  cfg.hidden_size = 768;
  cfg.num_attention_heads = 12;
  cfg.seq_length = 64;
  cfg.micro_batch_size = 1;
  cfg.global_batch_size = 1;
  cfg.vocab_size = 16384;
  cfg.train_iters = 10;
  cfg.lr_warmup_iters = 1;
  cfg.threads = threads;
  std::vector<std::string> notes;
  Status st = Validate(&cfg, &notes);
  if (!st.ok()) return LogError("error: " + st.message()), 1;
  auto backend = MakeCpuBackend(threads);
  auto comm = MakeSingleProcessCommunicator();
  Trainer trainer(cfg, backend.get(), comm.get(), Env::Default(), SampleFn(), SampleFn());
  trainer.InitializeWeights();
  // Nonzero moments, so nothing compresses or is special-cased.
  const size_t n = trainer.model().num_params();
  std::vector<float> fill(n);
  for (size_t i = 0; i < n; ++i) fill[i] = 1e-3f * static_cast<float>((i * 2654435761u) % 1000);
  backend->CopyToDevice(trainer.optimizer().exp_avg(), fill.data(), n);
  backend->CopyToDevice(trainer.optimizer().exp_avg_sq(), fill.data(), n);
  RunInfo run;
  run.meta.tokenizer = "none";

  Log("checkpoint bench: {} parameters ({:.0f} MB of weights and Adam moments), {} repeats in {}",
      n, 12.0 * static_cast<double>(n) / 1e6, repeats, dir);
  Log("{:>3} | {:>9} | {:>9} | {:>9} | {:>6} | {:>9} | {:>9}", "rep", "bytes MB", "save GB/s",
      "dd GB/s", "ratio", "load GB/s", "verify");
  std::vector<double> save_r, dd_r, ratio_r, load_r, verify_r;
  for (int rep = 0; rep < repeats; ++rep) {
    CheckpointStore store(Env::Default(), dir, nullptr);
    trainer.counters().iteration = rep + 1;
    std::vector<float> staging;
    std::vector<CheckpointFile> files;
    auto t0 = std::chrono::steady_clock::now();
    st = BuildTrainCheckpoint(Env::Default(), trainer, run, nlohmann::json::array(), &staging,
                              &files);
    SaveStats stats;
    if (st.ok()) st = store.Save(rep + 1, files, &stats);
    const double save_s = Seconds(t0);
    if (!st.ok()) return LogError("error: " + st.message()), 1;
    const double gb = static_cast<double>(stats.bytes) / 1e9;

    // The peer: dd writing the same bytes, flushed to disk before it exits.
    const std::string dd =
        fmt::format("dd if=/dev/zero of={}/dd.bin bs=16M count={} conv=fsync status=none", dir,
                    (stats.bytes + (16u << 20) - 1) / (16u << 20));
    t0 = std::chrono::steady_clock::now();
    if (std::system(dd.c_str()) != 0) return LogError("error: dd failed: " + dd), 1;
    const double dd_s = Seconds(t0);
    const double dd_gb =
        static_cast<double>((stats.bytes + (16u << 20) - 1) / (16u << 20) * (16u << 20)) / 1e9;
    fs::remove(dir + "/dd.bin");

    // Load: verify every checksum (FindNewestValid), then read the state into the model.
    t0 = std::chrono::steady_clock::now();
    CheckpointInfo info;
    st = store.FindNewestValid(false, &info);
    const double verify_s = Seconds(t0);
    SavedTrainState saved;
    if (st.ok()) st = ReadSavedTrainState(Env::Default(), info.path, &saved);
    if (st.ok()) st = RestoreTrainCheckpoint(Env::Default(), saved, trainer);
    const double load_s = Seconds(t0);
    if (!st.ok()) return LogError("error: " + st.message()), 1;
    fs::remove_all(info.path);

    save_r.push_back(gb / save_s);
    dd_r.push_back(dd_gb / dd_s);
    ratio_r.push_back(save_r.back() / dd_r.back());
    load_r.push_back(gb / load_s);
    verify_r.push_back(gb / verify_s);
    Log("{:>3} | {:>9.0f} | {:>9.2f} | {:>9.2f} | {:>6.2f} | {:>9.2f} | {:>9.2f}", rep + 1,
        gb * 1e3, save_r.back(), dd_r.back(), ratio_r.back(), load_r.back(), verify_r.back());
  }
  Log("median | save {:.2f} GB/s | dd {:.2f} GB/s | save/dd {:.2f} | load {:.2f} GB/s (verify "
      "included; reads come from the page cache) | verify {:.2f} GB/s",
      Median(save_r), Median(dd_r), Median(ratio_r), Median(load_r), Median(verify_r));
  fs::remove_all(dir);
  return 0;
}

}  // namespace keel::cli
