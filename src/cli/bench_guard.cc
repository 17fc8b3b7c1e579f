// `keel bench --guard`: what the guard costs per training step. Two trainers of the default model
// (same weights, same data) step alternately, one bare and one with the guard in act mode
// collecting every signal (log Z, update ratio, max of Adam's second moment) and judging every
// step; the figure is the median over pairs of (guarded step time / bare step time), so both see
// the same machine state. A second bare trainer in the same rotation gives the noise floor.
#include <fmt/format.h>

#include <algorithm>

#include "backend/registry.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/log.h"
#include "core/rng.h"
#include "guard/guard.h"
#include "train/guard_controller.h"
#include "train/trainer.h"

namespace keel::cli {
namespace {

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int BenchGuard(int iters, int warmup, int threads) {
  TrainConfig cfg;  // the default model: 4 layers, hidden 256, seq 128, global batch 16
  cfg.model.vocab = 4096;
  cfg.threads = threads;
  cfg.train_iters = std::max(400, 2 * (warmup + iters));  // only the schedule's length
  std::vector<std::string> notes;
  Status st = Validate(&cfg, &notes);
  if (!st.ok()) {
    LogError("error: bench config: " + st.message());
    return 1;
  }
  std::unique_ptr<Backend> backend;
  if (st = MakeBackend(cfg.backend, threads, &backend); !st.ok()) {
    LogError("error: " + st.message());
    return 1;
  }
  auto comm = MakeSingleProcessCommunicator();
  SampleFn fn = [&](int64_t index, int32_t* tokens) {
    const RngKey key{cfg.seed, RngPurpose::kTest, static_cast<uint64_t>(index)};
    for (int t = 0; t <= cfg.seq_length; ++t)
      tokens[t] = static_cast<int32_t>(U64At(key, t) % 4096);
    return 0;
  };
  // The bare trainers do not watch (no log Z, attention logit or kept batches); the guarded one
  // does, and the guard judges each of its iterations as the run's loop does.
  TrainConfig unguarded = cfg;
  unguarded.guard = GuardLevel::kOff;
  cfg.guard = GuardLevel::kAct;
  Trainer bare(unguarded, backend.get(), comm.get(), {fn, SampleFn()});
  Trainer guarded(cfg, backend.get(), comm.get(), {fn, SampleFn()});
  Trainer bare2(unguarded, backend.get(), comm.get(), {fn, SampleFn()});  // noise floor
  bare.InitializeWeights();
  guarded.InitializeWeights();
  bare2.InitializeWeights();
  Guard guard(GuardConfigFrom(cfg), nullptr);
  int judged = 0;
  auto guarded_step = [&] {
    const IterationPlan plan = guarded.PlanIteration();
    StepResult r;
    KEEL_CHECK(guarded.ComputeGradients(plan, &r).ok(), "synthetic samples never fail");
    ++judged;
    guarded.Update(!r.overflow && guard.OnStep(r.signals).apply_update, &r);
    guarded.EndIteration(plan, &r);
    return r;
  };
  Log("backend: {}", backend->Describe());
  Log("guard overhead on the default model ({} parameters, global batch {} x {} tokens): {} "
      "warm-up + {} timed pairs, order alternating",
      bare.model().num_params(), cfg.global_batch_size, cfg.seq_length, warmup, iters);
  std::vector<double> a, b, ratio, floor;
  for (int i = 0; i < warmup + iters; ++i) {
    // Rotate the order so no trainer always inherits a warmer cache.
    double tb = 0, tg = 0, t2 = 0;
    for (int k = 0; k < 3; ++k) {
      switch ((i + k) % 3) {
        case 0:
          tb = bare.TrainStep().step_ms;
          break;
        case 1:
          tg = guarded_step().step_ms;
          break;
        default:
          t2 = bare2.TrainStep().step_ms;
      }
    }
    if (i < warmup) continue;
    a.push_back(tb);
    b.push_back(tg);
    ratio.push_back(tg / tb);
    floor.push_back(t2 / tb);
  }
  const double r = MedianOf(ratio), f = MedianOf(floor);
  Log("step ms: bare median {:.1f}, guarded median {:.1f}; guarded/bare per round: median {:.4f} "
      "(overhead {:+.2f}%); noise floor, a second bare trainer / bare: median {:.4f} ({:+.2f}%); "
      "steps judged by the guard: {}",
      MedianOf(a), MedianOf(b), r, 100.0 * (r - 1.0), f, 100.0 * (f - 1.0), judged);
  return 0;
}

}  // namespace keel::cli
