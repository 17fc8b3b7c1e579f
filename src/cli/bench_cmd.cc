// `keel bench`: training throughput of the CPU backend for a few model sizes, as tokens/s,
// achieved GFLOP/s (Megatron's FLOP count) and MFU against this machine's measured sgemm peak.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/log.h"
#include "core/rng.h"
#include "train/flops.h"
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

// Best sgemm GFLOP/s over square-ish shapes typical of the models, via the backend's own matmul.
double MeasureSgemmPeak(Backend* be, int reps) {
  double best = 0.0;
  for (int n : {1024, 2048}) {
    const size_t sz = static_cast<size_t>(n) * n;
    float *a = be->AllocFloats(sz), *w = be->AllocFloats(sz), *c = be->AllocFloats(sz);
    for (int r = 0; r < reps + 1; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      be->MatmulForward(c, a, w, nullptr, n, n, n);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s / 1e9);
    }
    be->Free(a);
    be->Free(w);
    be->Free(c);
  }
  return best;
}

}  // namespace

int BenchCommand(int argc, const char* const* argv) {
  CLI::App app("Training throughput of the CPU backend against the machine's sgemm peak", "keel bench");
  int threads = 0, iters = 5, warmup = 2;
  std::vector<std::string> only;
  app.add_option("--threads", threads, "CPU threads (0: all cores)");
  app.add_option("--iters", iters, "timed iterations per model (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", warmup, "untimed iterations first")->check(CLI::Range(0, 100));
  app.add_option("--models", only, "subset of: tiny, small, gpt2-124m");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::vector<BenchModel> models = {
      {"tiny", 2, 128, 4, 128, 8, 4096},
      {"small", 6, 512, 8, 256, 8, 8192},
      {"gpt2-124m", 12, 768, 12, 64, 4, 50257},
  };
  auto backend = MakeCpuBackend(threads);
  Log("backend: {}", backend->Describe());
  const double peak = MeasureSgemmPeak(backend.get(), 5);
  Log("sgemm peak (best of 1024^3, 2048^3): {:.1f} GFLOP/s", peak);
  Log("{:<10} {:>12} {:>6} {:>6} {:>12} {:>12} {:>10} {:>8}", "model", "params", "seq", "mbs",
      "step ms", "tokens/s", "GFLOP/s", "MFU");
  auto comm = MakeSingleProcessCommunicator();
  for (const BenchModel& m : models) {
    if (!only.empty() && std::find(only.begin(), only.end(), m.name) == only.end()) continue;
    TrainConfig cfg;
    cfg.num_layers = m.layers;
    cfg.hidden_size = m.hidden;
    cfg.num_attention_heads = m.heads;
    cfg.seq_length = m.seq;
    cfg.micro_batch_size = m.micro_batch;
    cfg.global_batch_size = m.micro_batch;
    cfg.vocab_size = m.vocab;
    cfg.train_iters = warmup + iters;
    cfg.lr_warmup_iters = 1;
    std::vector<std::string> notes;
    Status st = Validate(&cfg, &notes);
    if (!st.ok()) {
      LogError("error: bench config: " + st.message());
      return 1;
    }
    // Random tokens: throughput does not depend on the data.
    SampleFn fn = [&](int64_t index, int32_t* tokens) {
      const RngKey key{cfg.seed, RngPurpose::kTest, static_cast<uint64_t>(index)};
      for (int t = 0; t <= cfg.seq_length; ++t)
        tokens[t] = static_cast<int32_t>(U64At(key, t) % static_cast<uint64_t>(m.vocab));
    };
    Trainer trainer(cfg, backend.get(), comm.get(), Env::Default(), fn, SampleFn());
    trainer.InitializeWeights();
    std::vector<double> ms;
    for (int i = 0; i < warmup + iters; ++i) {
      const StepResult r = trainer.TrainStep();
      if (i >= warmup) ms.push_back(r.step_ms);
    }
    const double step_ms = Median(ms);
    const double tokens = static_cast<double>(cfg.global_batch_size) * cfg.seq_length;
    const double gflops = trainer.FlopsPerIteration(cfg.global_batch_size) / (step_ms / 1e3) / 1e9;
    Log("{:<10} {:>12} {:>6} {:>6} {:>12.1f} {:>12.0f} {:>10.1f} {:>7.1f}%", m.name,
        trainer.model().num_params(), m.seq, m.micro_batch, step_ms, tokens / (step_ms / 1e3), gflops,
        100.0 * gflops / peak);
  }
  return 0;
}

}  // namespace keel::cli
