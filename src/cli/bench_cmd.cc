// `keel bench`: training throughput of the CPU backend for a few model sizes in fp32 and bf16 side
// by side, as tokens/s, achieved GFLOP/s (Megatron's FLOP count) and MFU against this machine's
// measured GEMM rate in the same precision.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <memory>

#include "backend/profiling_backend.h"
#include "backend/registry.h"
#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/flops.h"
#include "train/trainer.h"

namespace keel::cli {
namespace {

struct BenchModel {
  std::string name;
  int layers, hidden, heads, seq, micro_batch, vocab;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The peer: GFLOP/s of one n^3 product through the backend's own matmul in the precision
// compared (fp32 sgemm, or the bf16 GEMM with its weight converted once, as the model's are), the
// best the machine does on dense math in that precision. Measured right before each training
// step it is compared with, so the two share the machine's state (these machines are noisy).
class GemmPeer {
 public:
  GemmPeer(Backend* be, int n, Precision p) : be_(be), n_(n), precision_(p) {
    const size_t sz = static_cast<size_t>(n) * n;
    a_ = be->AllocFloats(sz);
    w_ = be->AllocFloats(sz);
    c_ = be->AllocFloats(sz);
    if (p != Precision::kFp32) {
      w_lowp_ = be->AllocHalves(sz);
      const Precision prev = be->precision();
      be->SetPrecision(p);
      be->ToLowPrecision(w_lowp_, w_, sz);
      be->SetPrecision(prev);
    }
  }
  ~GemmPeer() {
    be_->Free(a_);
    be_->Free(w_);
    be_->Free(c_);
    if (w_lowp_) be_->Free(w_lowp_);
  }
  int n() const { return n_; }
  double Measure() {
    const Precision prev = be_->precision();
    be_->SetPrecision(precision_);
    const auto t0 = std::chrono::steady_clock::now();
    be_->MatmulForward(c_, a_, w_, nullptr, n_, n_, n_, w_lowp_);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    be_->SetPrecision(prev);
    return 2.0 * n_ * n_ * static_cast<double>(n_) / s / 1e9;
  }

 private:
  Backend* be_;
  int n_;
  Precision precision_;
  float *a_, *w_, *c_;
  uint16_t* w_lowp_ = nullptr;
};

// Per op: ms per step, share of the step, calls per step; then what no op accounts for.
void LogProfile(const ProfilingBackend& profiler, const std::vector<double>& step_ms) {
  double total_ms = 0;
  for (double v : step_ms) total_ms += v;
  const double steps = static_cast<double>(step_ms.size());
  std::vector<std::pair<std::string, ProfilingBackend::OpTime>> ops(profiler.times().begin(),
                                                                    profiler.times().end());
  std::sort(ops.begin(), ops.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double in_ops_ms = 0;
  Log("  {:<28} {:>9} {:>7} {:>8}", "op", "ms/step", "share", "calls");
  for (const auto& [name, t] : ops) {
    in_ops_ms += 1e3 * t.seconds;
    if (1e3 * t.seconds / total_ms < 0.001) continue;
    Log("  {:<28} {:>9.1f} {:>6.1f}% {:>8.0f}", name, 1e3 * t.seconds / steps,
        100.0 * 1e3 * t.seconds / total_ms, static_cast<double>(t.calls) / steps);
  }
  Log("  {:<28} {:>9.1f} {:>6.1f}%", "(outside backend ops)", (total_ms - in_ops_ms) / steps,
      100.0 * (total_ms - in_ops_ms) / total_ms);
}

}  // namespace

int BenchCommand(int argc, const char* const* argv) {
  if (argc >= 2 && std::string(argv[1]) == "log-detectors")
    return BenchLogDetectors(argc - 1, argv + 1);
  CLI::App app("Training throughput of the CPU backend against the machine's sgemm peak",
               "keel bench");
  if (argc > 1 && std::string(argv[1]) == "level-shift") return BenchLevelShift(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "parallel") return BenchParallel(argc - 1, argv + 1);
  // The subcommands parse their own flags; --help here names them so they can be found.
  app.footer(
      "Subcommands (each has its own --help):\n"
      "  keel bench log-detectors   the log analyzer's divergence and throughput-drop detectors "
      "on\n                             synthetic Megatron logs: delay and false reports\n"
      "  keel bench level-shift     the throughput level-shift rule: detection delay against the\n"
      "                             shift's size and the noise, false reports on healthy series\n"
      "  keel bench parallel        tensor and pipeline parallelism: bytes moved and the bubble");
  int threads = 0, iters = 5, warmup = 2;
  std::vector<std::string> only;
  app.add_option("--threads", threads,
                 fmt::format("CPU threads (0: all cores; at most {})", MaxThreads()));
  app.add_option("--iters", iters, "timed iterations per model (median reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--warmup", warmup, "untimed iterations first")->check(CLI::Range(0, 100));
  app.add_option("--models", only, "subset of: tiny, small, gpt2-124m");
  int global_batch = 0;
  app.add_option("--global-batch-size", global_batch,
                 "sequences per optimizer step (default: one micro-batch, no accumulation)")
      ->check(CLI::Range(0, 1 << 20));
  bool profile = false;
  app.add_flag("--profile", profile,
               "also print where each model's step time goes: every backend op's share, and the "
               "time outside them");
  std::vector<std::string> precision_names = {"fp32", "bf16"};
  app.add_option("--precisions", precision_names,
                 "precisions to time side by side, each model in each (default: fp32 bf16; fp16 "
                 "is emulated on CPUs, so slower than fp32)");
  bool checkpoint = false;
  std::string ckpt_dir;
  app.add_flag("--checkpoint", checkpoint,
               "instead: save/load GB/s of a ~100M-parameter checkpoint beside dd's write speed");
  app.add_option("--dir", ckpt_dir,
                 "--checkpoint, --data: directory to write in (default: a temp dir)");
  bool async = false;
  app.add_flag("--async", async,
               "--checkpoint: instead the loop's stall per --async-save against the synchronous "
               "save, and iteration time while a background write runs (21M and 124M models)");
  int repeats = 5;
  app.add_option("--repeats", repeats, "--checkpoint: save, dd, load rounds (median reported)")
      ->check(CLI::Range(1, 100));
  bool guard = false;
  app.add_flag("--guard", guard,
               "instead: step time of the default model with and without the guard (paired "
               "ratios; uses --iters, --warmup)");
  bool recompute = false;
  app.add_flag("--recompute", recompute,
               "instead: step time and activation memory of a Llama-shaped model with no, "
               "selective and full activation recomputation (interleaved; uses --iters, --warmup, "
               "--seq-length, default 512 here)");
  bool pipeline = false;
  double forward_ms = 40.0;
  app.add_flag("--pipeline", pipeline,
               "instead: the pipeline schedule's measured bubble against (P-1)/(V m+P-1) for a "
               "few (P, m, V), ranks as threads, sleeps for compute; uses --repeats");
  app.add_option(
         "--forward-ms", forward_ms,
         "--pipeline: forward time per stage and micro-batch (backward twice that; default 40: "
         "shorter sleeps measure the machine's wake-up latency too)")
      ->check(CLI::Range(0.1, 1000.0));
  bool data = false;
  double data_gb = 2.0;
  int seq = 2048;
  app.add_flag("--data", data,
               "instead: sampler tokens/s on one core from a synthetic dataset (written to --dir "
               "or a temp dir, removed after); uses --repeats");
  app.add_option("--data-gb", data_gb, "--data: dataset size in GB (default 2)")
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--seq-length", seq,
                 "--data: tokens per sample (default 2048); --recompute: sequence length")
      ->check(CLI::Range(1, 1 << 20));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  if (Status st = ValidateThreads(threads); !st.ok()) return Fail(st);
  if (checkpoint && async) return BenchCheckpointAsync(ckpt_dir, repeats, threads);
  if (checkpoint) return BenchCheckpoint(ckpt_dir, repeats, threads);
  if (guard) return BenchGuard(iters, warmup, threads);
  if (data) return BenchData(ckpt_dir, data_gb, repeats, seq);
  if (pipeline) return BenchPipeline(repeats, forward_ms);
  if (recompute) {
    const bool seq_given = app.get_option("--seq-length")->count() > 0;
    return BenchRecompute(iters, warmup, threads, seq_given ? seq : 512);
  }
  const std::vector<BenchModel> models = {
      {"tiny", 2, 128, 4, 128, 8, 4096},
      {"small", 6, 512, 8, 256, 8, 8192},
      {"gpt2-124m", 12, 768, 12, 64, 4, 50257},
  };
  std::vector<Precision> precisions;
  for (const std::string& name : precision_names) {
    if (name == "fp32") {
      precisions.push_back(Precision::kFp32);
    } else if (name == "bf16") {
      precisions.push_back(Precision::kBf16);
    } else if (name == "fp16") {
      precisions.push_back(Precision::kFp16);
    } else {
      LogError(
          fmt::format("error: --precisions: unknown precision '{}' (use fp32, bf16, fp16)", name));
      return 2;
    }
  }
  std::unique_ptr<Backend> backend;
  if (Status st = MakeBackend(TrainConfig().backend, threads, &backend); !st.ok()) {
    LogError("error: " + st.message());
    return 1;
  }
  Log("backend: {}", backend->Describe());
  // bf16's peer is larger: its operand conversion (O(n^2)) stays small beside the product.
  std::vector<std::unique_ptr<GemmPeer>> peers;
  for (Precision p : precisions) {
    peers.push_back(
        std::make_unique<GemmPeer>(backend.get(), p == Precision::kBf16 ? 3072 : 1536, p));
    for (int i = 0; i < 3; ++i) peers.back()->Measure();  // warm-up
  }
  Log("each timed step is paired with an n^3 product in its own precision (fp32, fp16: sgemm,");
  Log("n = 1536; bf16: the bf16 GEMM, n = 3072) measured just before it; MFU is the median over");
  Log("pairs of (model GFLOP/s) / (peer GFLOP/s); FLOPs counted as Megatron does");
  Log("{:<10} {:>5} {:>12} {:>5} {:>4} {:>9} {:>10} {:>9} {:>9} {:>7}", "model", "prec", "params",
      "seq", "mbs", "step ms", "tokens/s", "GFLOP/s", "peer", "MFU");
  if (global_batch > 0)
    Log("every model: a global batch of {} sequences per optimizer step (gradients accumulated "
        "over micro-batches)",
        global_batch);
  auto comm = MakeSingleProcessCommunicator();
  for (const BenchModel& m : models) {
    if (!only.empty() && std::find(only.begin(), only.end(), m.name) == only.end()) continue;
    // One trainer (and backend) per precision, their steps interleaved: the machine's drift
    // (memory bandwidth here varies with its neighbours) touches every precision alike, so the
    // ratio between them is a same-run comparison step by step.
    struct PrecisionRun {
      TrainConfig cfg;
      std::unique_ptr<Backend> backend;
      std::unique_ptr<ProfilingBackend> profiler;
      std::unique_ptr<Trainer> trainer;
      std::vector<double> ms, peer_gflops, ratio;
      double flops = 0;
    };
    std::vector<PrecisionRun> runs(precisions.size());
    // Random tokens: throughput does not depend on the data.
    SampleFn fn = [&](int64_t index, int32_t* tokens) {
      const RngKey key{runs[0].cfg.seed, RngPurpose::kTest, static_cast<uint64_t>(index)};
      for (int t = 0; t <= m.seq; ++t)
        tokens[t] = static_cast<int32_t>(U64At(key, t) % static_cast<uint64_t>(m.vocab));
      return 0;
    };
    for (size_t pi = 0; pi < precisions.size(); ++pi) {
      PrecisionRun& run = runs[pi];
      TrainConfig& cfg = run.cfg;
      cfg.model.num_layers = m.layers;
      cfg.model.hidden = m.hidden;
      cfg.model.heads = m.heads;
      cfg.seq_length = m.seq;
      cfg.micro_batch_size = m.micro_batch;
      cfg.global_batch_size = global_batch > 0 ? global_batch : m.micro_batch;
      cfg.model.vocab = m.vocab;
      cfg.train_iters = warmup + iters;
      cfg.lr_warmup_iters = 1;
      cfg.precision = precisions[pi];
      std::vector<std::string> notes;
      Status st = Validate(&cfg, &notes);
      if (!st.ok()) {
        LogError("error: bench config: " + st.message());
        return 1;
      }
      if (st = MakeBackend(cfg.backend, threads, &run.backend); !st.ok()) {
        LogError("error: " + st.message());
        return 1;
      }
      run.profiler = std::make_unique<ProfilingBackend>(run.backend.get());
      run.trainer = std::make_unique<Trainer>(cfg, profile ? run.profiler.get() : run.backend.get(),
                                              comm.get(), TrainerData(fn, SampleFn()));
      run.trainer->InitializeWeights();
      run.flops = run.trainer->FlopsPerIteration(cfg.global_batch_size);
    }
    for (int i = 0; i < warmup + iters; ++i) {
      for (size_t pi = 0; pi < runs.size(); ++pi) {
        PrecisionRun& run = runs[pi];
        const double peak = peers[pi]->Measure();
        if (i == warmup) run.profiler->Reset();
        const StepResult r = run.trainer->TrainStep();
        if (i < warmup) continue;
        run.ms.push_back(r.step_ms);
        run.peer_gflops.push_back(peak);
        run.ratio.push_back(run.flops / (r.step_ms / 1e3) / 1e9 / peak);
      }
    }
    std::vector<double> tokens_per_s;
    for (size_t pi = 0; pi < runs.size(); ++pi) {
      const PrecisionRun& run = runs[pi];
      const double step_ms = Median(run.ms);
      const double tokens = static_cast<double>(run.cfg.global_batch_size) * m.seq;
      tokens_per_s.push_back(tokens / (step_ms / 1e3));
      Log("{:<10} {:>5} {:>12} {:>5} {:>4} {:>9.1f} {:>10.0f} {:>9.1f} {:>9.1f} {:>6.1f}%", m.name,
          PrecisionName(precisions[pi]), run.trainer->model().num_params(), m.seq, m.micro_batch,
          step_ms, tokens_per_s.back(), run.flops / (step_ms / 1e3) / 1e9, Median(run.peer_gflops),
          100.0 * Median(run.ratio));
      if (profile) LogProfile(*run.profiler, run.ms);
    }
    for (size_t pi = 1; pi < precisions.size(); ++pi)
      Log("{:<10} {} tokens/s are {:.2f}x {}'s (same run)", m.name, PrecisionName(precisions[pi]),
          tokens_per_s[pi] / tokens_per_s[0], PrecisionName(precisions[0]));
  }
  return 0;
}

}  // namespace keel::cli
