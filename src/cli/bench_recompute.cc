// `keel bench --recompute`: what activation recomputation costs and saves. One trainer per
// granularity (none, selective, full, and full of the first half of the layers: Megatron-LM's
// --recompute-method block) of the same model, weights and data, their steps
// interleaved so the machine's drift weighs on each alike; per granularity the median step time,
// its median ratio to the step without recomputation over the rounds, and the activation bytes
// the model lays out for one micro-batch (GptModel::ActivationBytes, what its Forward allocates).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "backend/registry.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"

namespace keel::cli {
namespace {

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int BenchRecompute(int iters, int warmup, int threads, int seq_length) {
  // The default job's model at a longer sequence (where attention's T^2 probabilities weigh), as
  // a Llama: 4 x 256, 4 heads over 2 key/value heads, SwiGLU, RMSNorm, RoPE.
  TrainConfig base;
  base.seq_length = seq_length;
  // Every iteration closes its log interval: the fingerprints below hold no wall times.
  base.log_interval = 1;
  base.micro_batch_size = 4;
  base.global_batch_size = 4;
  base.model.vocab = 4096;
  base.threads = threads;
  base.model.SetPosition(PositionEmbedding::kRope);
  base.model.rmsnorm = true;
  base.model.swiglu = true;
  base.model.group_query_attention = true;
  base.model.num_query_groups = 2;
  base.model.bias = false;
  base.train_iters = std::max(400, 2 * (warmup + iters));
  struct Mode {
    Recompute granularity;
    RecomputeMethod method;
    const char* name;
  };
  const std::vector<Mode> modes = {{Recompute::kNone, RecomputeMethod::kUniform, "none"},
                                   {Recompute::kSelective, RecomputeMethod::kUniform, "selective"},
                                   {Recompute::kFull, RecomputeMethod::kUniform, "full"},
                                   {Recompute::kFull, RecomputeMethod::kBlock, "block 2/4"}};
  const int n = static_cast<int>(modes.size());
  struct Run {
    TrainConfig cfg;
    std::unique_ptr<Trainer> trainer;
    std::vector<double> ms, ratio;
  };
  // The backend outlives the trainers whose memory it holds.
  std::unique_ptr<Backend> backend;
  if (Status st = MakeBackend(TrainConfig().backend, threads, &backend); !st.ok()) {
    LogError("error: " + st.message());
    return 1;
  }
  auto comm = MakeSingleProcessCommunicator();
  std::vector<Run> runs(n);
  SampleFn fn = [&](int64_t index, int32_t* tokens) {
    const RngKey key{base.seed, RngPurpose::kTest, static_cast<uint64_t>(index)};
    for (int t = 0; t <= base.seq_length; ++t)
      tokens[t] = static_cast<int32_t>(U64At(key, t) % 4096);
    return 0;
  };
  for (int i = 0; i < n; ++i) {
    runs[i].cfg = base;
    runs[i].cfg.recompute_granularity = modes[i].granularity;
    runs[i].cfg.recompute_method = modes[i].method;
    runs[i].cfg.recompute_num_layers = modes[i].method == RecomputeMethod::kBlock ? 2 : 1;
    std::vector<std::string> notes;
    Status st = Validate(&runs[i].cfg, &notes);
    if (!st.ok()) {
      LogError("error: bench config: " + st.message());
      return 1;
    }
    runs[i].trainer =
        std::make_unique<Trainer>(runs[i].cfg, backend.get(), comm.get(), TrainerData(fn, {}));
    runs[i].trainer->InitializeWeights();
  }
  Log("backend: {}", backend->Describe());
  Log("model: 4 x 256 Llama-shaped (RoPE, RMSNorm, SwiGLU, 4 heads over 2 key/value heads), "
      "micro-batch 4 x {} tokens; steps of the {} granularities interleaved, {} timed each",
      seq_length, n, iters);
  for (int i = 0; i < warmup + iters; ++i) {
    double none_ms = 0;
    for (int k = 0; k < n; ++k) {
      const StepResult r = runs[k].trainer->TrainStep();
      if (k == 0) none_ms = r.step_ms;
      if (i < warmup) continue;
      runs[k].ms.push_back(r.step_ms);
      runs[k].ratio.push_back(r.step_ms / none_ms);
    }
  }
  // The trainers saw the same batches from the same weights: the same bits, or the recomputation
  // is wrong.
  const uint64_t fp = runs[0].trainer->StateFingerprint();
  bool same = true;
  for (int k = 1; k < n; ++k) same &= runs[k].trainer->StateFingerprint() == fp;
  Log("{:<10} {:>12} {:>9} {:>12} {:>10}", "recompute", "activations", "vs none", "step ms",
      "vs none");
  const uint64_t none_bytes = EstimateRunMemory(runs[0].cfg).activations;
  for (int k = 0; k < n; ++k) {
    const uint64_t bytes = EstimateRunMemory(runs[k].cfg).activations;
    Log("{:<10} {:>12} {:>8.2f}x {:>12.1f} {:>9.3f}x", modes[k].name, FormatBytes(bytes),
        static_cast<double>(bytes) / static_cast<double>(none_bytes), MedianOf(runs[k].ms),
        MedianOf(runs[k].ratio));
  }
  Log("weights after {} steps: {}", warmup + iters,
      same ? "the same bits in all" : "DIFFERENT (recomputation changed the math)");
  return same ? 0 : 1;
}

}  // namespace keel::cli
