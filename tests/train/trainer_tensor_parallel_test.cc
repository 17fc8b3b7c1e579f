// The trainer at tensor parallel T (ranks as threads, MakeThreadGroup, cut by ProcessMesh as
// `keel train` cuts the MPI world): T=2, T=2 with sequence parallelism and T=2 x D=2 train the
// losses of the one-rank trainer within fp32 tolerance over 30 iterations, in GPT-2's and Llama's
// shapes (grouped-query attention, T dividing the key/value groups); every rank of the world sees
// the same loss, gradient norm and update ratio bits (the guard decides the same everywhere); each
// layout is the same bits run after run; the fingerprint is over the whole tensors (a fresh model
// has the one-rank fingerprint at any T); the replica check names a replicated norm that drifted
// on one tensor rank.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../run_compare.h"
#include "backend/backend.h"
#include "comm/communicator.h"
#include "comm/process_mesh.h"
#include "mesh_threads.h"
#include "pattern_data.h"
#include "train/memory_estimate.h"
#include "train/replica_check.h"
#include "train/trainer.h"

namespace keel {
namespace {

using keel_test::RunOnMesh;
using test_data::PatternData;

constexpr int kIters = 30;

TrainConfig Gpt2Config(int tensor) {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden = 32;
  c.model.heads = 4;
  c.model.ffn_hidden = 128;
  c.model.vocab = 50;
  c.make_vocab_size_divisible_by = 32;  // 64 rows at T = 1 and at T = 2: the same model
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.train_iters = kIters;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.lr_warmup_iters = 5;
  c.log_interval = 10;
  c.eval_iters = 0;
  c.threads = 1;
  c.tensor_model_parallel_size = tensor;
  return c;
}

TrainConfig LlamaConfig(int tensor) {
  TrainConfig c = Gpt2Config(tensor);
  c.model.hidden = 64;
  c.model.heads = 8;
  c.model.SetKvHeads(4);
  c.model.ffn_hidden = 96;
  c.model.rope = true;
  c.model.rmsnorm = true;
  c.model.swiglu = true;
  c.model.bias = false;
  c.model.untie_embeddings = true;
  return c;
}

// What every rank saw, per iteration, and the end state.
struct RankRun {
  std::vector<double> loss, grad_norm, update_ratio;
  uint64_t fingerprint = 0, fresh_fingerprint = 0;
};

// Trains `cfg` on T x D ranks (threads) for `iters` iterations; every rank's record, world order.
std::vector<RankRun> Train(TrainConfig cfg, int tensor, int data, bool sp, int iters = kIters,
                           const std::function<void(Trainer&, int)>& after = nullptr) {
  cfg.tensor_model_parallel_size = tensor;
  cfg.sequence_parallel = sp;
  cfg.data_parallel_size = data;
  std::vector<std::string> notes;
  const Status v = Validate(&cfg, &notes);
  EXPECT_TRUE(v.ok()) << v.ToString();
  const int world = tensor * data;
  std::vector<RankRun> out(world);
  RunOnMesh(world, tensor, 1, [&](int r, const TrainerGroups& g, Backend* be) {
    Trainer tr(cfg, be, g, {PatternData(1), PatternData(2)});
    tr.InitializeWeights();
    out[r].fresh_fingerprint = tr.StateFingerprint();
    for (int i = 0; i < iters; ++i) {
      const StepResult s = tr.TrainStep();
      out[r].loss.push_back(s.loss);
      out[r].grad_norm.push_back(s.grad_norm);
      out[r].update_ratio.push_back(tr.state().counters.iteration > 0 ? s.signals.update_ratio
                                                                      : NAN);
    }
    out[r].fingerprint = tr.StateFingerprint();
    if (after) after(tr, r);
  });
  return out;
}

using keel_test::MaxDiff;
using keel_test::SameBits;

// Every rank of a run saw the same bits (the guard would decide the same everywhere).
void ExpectRanksAgree(const std::vector<RankRun>& run) {
  for (size_t r = 1; r < run.size(); ++r) {
    EXPECT_TRUE(SameBits(run[r].loss, run[0].loss)) << "rank " << r;
    EXPECT_TRUE(SameBits(run[r].grad_norm, run[0].grad_norm)) << "rank " << r;
    EXPECT_TRUE(SameBits(run[r].update_ratio, run[0].update_ratio)) << "rank " << r;
    EXPECT_EQ(run[r].fingerprint, run[0].fingerprint) << "rank " << r;
  }
}

void CompareLayouts(const std::function<TrainConfig(int)>& config, const char* shape) {
  const std::vector<RankRun> one = Train(config(1), 1, 1, false);
  struct Layout {
    int tensor, data;
    bool sp;
    const char* name;
  };
  for (const Layout& l : {Layout{2, 1, false, "T=2"}, Layout{2, 1, true, "T=2 with SP"},
                          Layout{2, 2, false, "T=2 x D=2"}}) {
    const std::vector<RankRun> run = Train(config(l.tensor), l.tensor, l.data, l.sp);
    ExpectRanksAgree(run);
    const double dl = MaxDiff(one[0].loss, run[0].loss);
    const double dg = MaxDiff(one[0].grad_norm, run[0].grad_norm);
    std::printf(
        "%s %s: max |loss - loss(T=1)| = %.3g, max |grad norm - T=1's| = %.3g over %d "
        "iterations\n",
        shape, l.name, dl, dg, kIters);
    // Only the order of fp32 sums differs (the row-parallel partial products, the vocabulary
    // split of the cross-entropy).
    EXPECT_LT(dl, 1e-4) << shape << " " << l.name;
    EXPECT_LT(dg, 1e-3) << shape << " " << l.name;
    // The whole tensors at the start are the one-rank model's, bit for bit.
    EXPECT_EQ(run[0].fresh_fingerprint, one[0].fresh_fingerprint) << shape << " " << l.name;
  }
  EXPECT_LT(one[0].loss.back(), one[0].loss.front());  // it learns
}

TEST(TrainerTensorParallelTest, Gpt2LossesMatchOneRank) {
  CompareLayouts(Gpt2Config, "GPT-2");
}

TEST(TrainerTensorParallelTest, LlamaGqaLossesMatchOneRank) {
  CompareLayouts(LlamaConfig, "Llama (8 heads, 4 key/value groups)");
}

TEST(TrainerTensorParallelTest, EachLayoutIsTheSameBitsRunAfterRun) {
  for (bool sp : {false, true}) {
    const std::vector<RankRun> a = Train(Gpt2Config(2), 2, 2, sp, 10);
    const std::vector<RankRun> b = Train(Gpt2Config(2), 2, 2, sp, 10);
    EXPECT_TRUE(SameBits(a[0].loss, b[0].loss)) << "sp " << sp;
    EXPECT_EQ(a[0].fingerprint, b[0].fingerprint) << "sp " << sp;
  }
}

TEST(TrainerTensorParallelTest, ReplicaCheckComparesReplicatedTensorsAcrossTensorRanks) {
  std::vector<Status> healthy(2), drifted(2);
  Train(Gpt2Config(2), 2, 1, false, 3, [&](Trainer& tr, int r) {
    size_t checked = 0;
    healthy[r] = CheckReplicas(tr, tr.comm(), {"a", "b"}, &checked);
    // Split tensors differ across tensor ranks by design; a replicated LayerNorm must not.
    if (r == 1) {
      const ParamInfo* p = tr.model().FindParam("layers.1.post_attention_layernorm.weight");
      ASSERT_NE(p, nullptr);
      ASSERT_TRUE(p->split.replicated());
      tr.model().mutable_param_data()[p->offset] += 1e-3f;
    }
    drifted[r] = CheckReplicas(tr, tr.comm(), {"a", "b"}, &checked);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(healthy[r].ok()) << healthy[r].ToString();
    ASSERT_FALSE(drifted[r].ok());
    EXPECT_NE(drifted[r].message().find("rank 1 (host b) differs in 1 of"), std::string::npos)
        << drifted[r].message();
    EXPECT_NE(drifted[r].message().find("layers.1.post_attention_layernorm.weight"),
              std::string::npos)
        << drifted[r].message();
  }
}

// The memory check keel train (and keel plan) makes on a tensor rank is what the rank allocates:
// its slice of the weights, gradients and moments, and its share of the activations (the whole
// model's figure would refuse runs that fit, or pass runs that do not, at large T).
TEST(TrainerTensorParallelTest, MemoryEstimateIsWhatARankAllocates) {
#if defined(KEEL_SANITIZED_BUILD)
  GTEST_SKIP() << "AddressSanitizer replaces malloc, so mallinfo2 counts nothing";
#endif
  auto heap = [] {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  // Every buffer under 2 MiB: larger ones are 2 MiB-aligned (huge pages), which costs malloc up to
  // 2 MiB more per buffer, noise at the sizes that matter and not in the estimate.
  const int tensor = 2;
  for (bool sp : {false, true}) {
    TrainConfig cfg = Gpt2Config(tensor);
    cfg.model.hidden = 128;
    cfg.model.ffn_hidden = 512;
    cfg.model.vocab = 1000;
    cfg.micro_batch_size = 8;
    cfg.sequence_parallel = sp;
    std::vector<std::string> notes;
    ASSERT_TRUE(Validate(&cfg, &notes).ok());
    size_t before = 0, after = 0;
    RunOnMesh(tensor, tensor, 1, [&](int r, const TrainerGroups& g, Backend* be) {
      {
        // The process's first products make the backend's own scratch (not the run's).
        Trainer warm(cfg, be, g, {PatternData(1), PatternData(2)});
        warm.TrainStep();
      }
      g.world->Barrier();
      if (r == 0) before = heap();
      g.world->Barrier();
      {
        Trainer tr(cfg, be, g, {PatternData(1), PatternData(2)});
        tr.InitializeWeights();
        tr.TrainStep();
        g.world->Barrier();
        if (r == 0) after = heap();
        g.world->Barrier();
      }
    });
    const MemoryEstimate e = EstimateRunMemory(cfg);
    // The run's read-ahead ring belongs to TrainingRun, not the trainer measured here.
    const double counted = static_cast<double>(e.total() - e.data);
    const double allocated = static_cast<double>(after - before) / tensor;
    std::printf("T=2%s: estimate %.0f bytes (params %llu), a rank allocated %.0f\n",
                sp ? " with SP" : "", counted, static_cast<unsigned long long>(e.params),
                allocated);
    EXPECT_NEAR(allocated, counted, 0.1 * counted) << "sequence parallel " << sp;
    TrainConfig one = cfg;
    one.tensor_model_parallel_size = 1;
    one.sequence_parallel = false;
    EXPECT_LT(e.params, GptModel::ParamCount(one.model) * 6 / 10);
  }
}

}  // namespace
}  // namespace keel
