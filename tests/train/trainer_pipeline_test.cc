// The trainer at pipeline parallel P (ranks as threads, MakeThreadGroup, cut by ProcessMesh as
// `keel train` cuts the MPI world): P=2, P=4, P=2 interleaved (V=2), T=2 x P=2 (with and without
// sequence parallelism) and P=2 x D=2 train the losses of the one-rank trainer within fp32
// tolerance over 30 iterations, in GPT-2's shape (tied embeddings: two copies on the first and
// last stage) and Llama's (grouped-query attention, untied, RoPE, RMSNorm, SwiGLU); every rank of
// the world sees the same loss, gradient norm and update ratio bits; each layout is the same bits
// run after run; a fresh model's fingerprint is the one-rank model's at every layout; Llama's
// untied model at T=1 is the one-rank run bit for bit. The guard's rerun probe gives the
// iteration's own loss bits, validation the one-rank losses; the replica check compares each
// stage's tensors among that stage's ranks and names a drifted tied-embedding copy; the
// fingerprint holds about one whole tensor on any rank, and the sample generated through the
// stages is the one-rank sample; the memory estimate is what the ranks of each stage allocate.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../run_compare.h"
#include "backend/backend.h"
#include "comm/communicator.h"
#include "comm/process_mesh.h"
#include "mesh_threads.h"
#include "model/generate.h"
#include "pattern_data.h"
#include "train/memory_estimate.h"
#include "train/replica_check.h"
#include "train/trainer.h"

namespace keel {
namespace {

using keel_test::RunOnMesh;
using test_data::PatternData;

constexpr int kIters = 30;

TrainConfig Gpt2Config() {
  TrainConfig c;
  c.model.num_layers = 4;  // P=4 and P=2 x V=2 need 4
  c.model.hidden = 32;
  c.model.heads = 4;
  c.model.ffn_hidden = 128;
  c.model.vocab = 50;
  c.make_vocab_size_divisible_by = 32;  // 64 rows at T = 1 and at T = 2: the same model
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 8;  // 4 micro-batches at D = 1, 2 at D = 2
  c.train_iters = kIters;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.lr_warmup_iters = 5;
  c.log_interval = 10;
  c.eval_iters = 3;  // Validate's batches (the loop itself never evaluates here)
  c.threads = 1;
  return c;
}

TrainConfig LlamaConfig() {
  TrainConfig c = Gpt2Config();
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

struct Layout {
  int tensor = 1, pipeline = 1, data = 1;
  int virtual_chunks = 1;  // interleaved: chunks per stage
  bool sp = false;
  const char* name = "one rank";
  int world() const { return tensor * pipeline * data; }
};

// What every rank saw, per iteration, and the end state.
struct RankRun {
  std::vector<double> loss, grad_norm, update_ratio;
  uint64_t fingerprint = 0, fresh_fingerprint = 0;
  double valid_loss = NAN;  // Validate (eval_iters batches) after training
  double eval_loss = NAN;   // Evaluate(2) after training
};

// Trains `cfg` at layout `l` (threads) for `iters` iterations; every rank's record, world order.
// `after(trainer, rank)` runs on every rank at the end (a collective there is every rank's).
std::vector<RankRun> Train(TrainConfig cfg, const Layout& l, int iters = kIters,
                           const std::function<void(Trainer&, int)>& after = nullptr) {
  cfg.tensor_model_parallel_size = l.tensor;
  cfg.pipeline_model_parallel_size = l.pipeline;
  cfg.num_layers_per_virtual_pipeline_stage =
      l.virtual_chunks > 1 ? cfg.model.num_layers / (l.pipeline * l.virtual_chunks) : 0;
  cfg.sequence_parallel = l.sp;
  cfg.data_parallel_size = l.data;
  std::vector<std::string> notes;
  const Status v = Validate(&cfg, &notes);
  EXPECT_TRUE(v.ok()) << l.name << ": " << v.ToString();
  std::vector<RankRun> out(l.world());
  RunOnMesh(l.world(), l.tensor, l.pipeline, [&](int r, const TrainerGroups& g, Backend* be) {
    Trainer tr(cfg, be, g, {PatternData(1), PatternData(2)});
    tr.InitializeWeights();
    out[r].fresh_fingerprint = tr.StateFingerprint();
    for (int i = 0; i < iters; ++i) {
      const StepResult s = tr.TrainStep();
      out[r].loss.push_back(s.loss);
      out[r].grad_norm.push_back(s.grad_norm);
      out[r].update_ratio.push_back(s.signals.update_ratio);
    }
    out[r].fingerprint = tr.StateFingerprint();
    ValidationResult v;
    EXPECT_TRUE(tr.Validate(&v).ok());
    out[r].valid_loss = v.loss;
    out[r].eval_loss = tr.Evaluate(2);
    if (after) after(tr, r);
  });
  return out;
}

using keel_test::MaxDiff;
using keel_test::SameBits;

bool SameBits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Every rank of a run saw the same bits (the guard would decide the same everywhere).
void ExpectRanksAgree(const std::vector<RankRun>& run, const char* what) {
  for (size_t r = 1; r < run.size(); ++r) {
    EXPECT_TRUE(SameBits(run[r].loss, run[0].loss)) << what << " rank " << r;
    EXPECT_TRUE(SameBits(run[r].grad_norm, run[0].grad_norm)) << what << " rank " << r;
    EXPECT_TRUE(SameBits(run[r].update_ratio, run[0].update_ratio)) << what << " rank " << r;
    EXPECT_EQ(run[r].fingerprint, run[0].fingerprint) << what << " rank " << r;
    EXPECT_TRUE(SameBits(run[r].valid_loss, run[0].valid_loss)) << what << " rank " << r;
    EXPECT_TRUE(SameBits(run[r].eval_loss, run[0].eval_loss)) << what << " rank " << r;
  }
}

const Layout kLayouts[] = {
    {1, 2, 1, 1, false, "P=2"},
    {1, 4, 1, 1, false, "P=4"},
    {1, 2, 1, 2, false, "P=2 interleaved (V=2)"},
    {2, 2, 1, 1, false, "T=2 x P=2"},
    {2, 2, 1, 1, true, "T=2 x P=2 with SP"},
    {2, 2, 1, 2, false, "T=2 x P=2 interleaved (V=2)"},
    {1, 2, 2, 1, false, "P=2 x D=2"},
};

// Every layout against the one-rank run; `bit_exact(layout)`: where the one-rank bits must hold.
void CompareLayouts(const TrainConfig& cfg, const char* shape,
                    const std::function<bool(const Layout&)>& bit_exact) {
  const std::vector<RankRun> one = Train(cfg, Layout{});
  EXPECT_LT(one[0].loss.back(), one[0].loss.front());  // it learns
  for (const Layout& l : kLayouts) {
    SCOPED_TRACE(testing::Message() << shape << " " << l.name);
    // Every rank's replica check passes on the trained model (each stage's tensors among its
    // ranks; the tied embedding's two copies alike).
    std::vector<Status> replicas(l.world());
    const std::vector<RankRun> run = Train(cfg, l, kIters, [&](Trainer& tr, int r) {
      size_t checked = 0;
      replicas[r] =
          CheckReplicas(tr, tr.comm(), std::vector<std::string>(l.world(), "h"), &checked);
    });
    for (const Status& s : replicas) EXPECT_TRUE(s.ok()) << s.ToString();
    ExpectRanksAgree(run, l.name);
    const double dl = MaxDiff(one[0].loss, run[0].loss);
    const double dg = MaxDiff(one[0].grad_norm, run[0].grad_norm);
    const double dv = std::max(std::fabs(one[0].valid_loss - run[0].valid_loss),
                               std::fabs(one[0].eval_loss - run[0].eval_loss));
    EXPECT_TRUE(std::isfinite(run[0].valid_loss) && std::isfinite(run[0].eval_loss));
    std::printf(
        "%s %s: max |loss - one rank's| = %.3g, max |grad norm - one rank's| = %.3g over %d "
        "iterations; validation after them differs by %.3g\n",
        shape, l.name, dl, dg, kIters, dv);
    // Only the order of fp32 sums differs (the tied embedding's two gradients, the row-parallel
    // partial products, the vocabulary split of the cross-entropy, the data-parallel sum).
    EXPECT_LT(dl, 1e-4);
    EXPECT_LT(dg, 1e-3);
    EXPECT_LT(dv, 1e-4);
    // The whole tensors at the start are the one-rank model's, bit for bit.
    EXPECT_EQ(run[0].fresh_fingerprint, one[0].fresh_fingerprint);
    if (bit_exact(l)) {
      EXPECT_TRUE(SameBits(run[0].loss, one[0].loss));
      EXPECT_EQ(run[0].fingerprint, one[0].fingerprint);  // weights, moments, state
      // The gradient norm is each stage's sum of squares added over the stages: the same
      // gradients, the double sum in another order (a few ulps).
      for (size_t i = 0; i < one[0].grad_norm.size(); ++i)
        EXPECT_NEAR(run[0].grad_norm[i], one[0].grad_norm[i], 1e-13 * one[0].grad_norm[i]);
      EXPECT_TRUE(SameBits(run[0].valid_loss, one[0].valid_loss));
      EXPECT_TRUE(SameBits(run[0].eval_loss, one[0].eval_loss));
    }
    // The same layout again: the same bits.
    const std::vector<RankRun> again = Train(cfg, l);
    EXPECT_TRUE(SameBits(again[0].loss, run[0].loss));
    EXPECT_TRUE(SameBits(again[0].grad_norm, run[0].grad_norm));
    EXPECT_TRUE(SameBits(again[0].update_ratio, run[0].update_ratio));
    EXPECT_EQ(again[0].fingerprint, run[0].fingerprint);
    EXPECT_TRUE(SameBits(again[0].valid_loss, run[0].valid_loss));
  }
}

TEST(TrainerPipelineTest, Gpt2LossesMatchOneRank) {
  CompareLayouts(Gpt2Config(), "GPT-2", [](const Layout&) { return false; });
}

// Untied, at T=1: every stage computes exactly what the one-rank model does on its layers, and
// the gradients of each micro-batch add up in the same order, so the losses, the weights and the
// moments are the one-rank run's bits. (P x D sums the data ranks' gradients in another order.)
TEST(TrainerPipelineTest, LlamaGqaLossesMatchOneRank) {
  CompareLayouts(LlamaConfig(), "Llama (8 heads, 4 key/value groups)",
                 [](const Layout& l) { return l.tensor == 1 && l.data == 1; });
}

// The guard's rerun probe at P=2: the current weights on the iteration's batch again, through
// the stages, give the iteration's own loss bits (a healthy pass is never taken for a fault).
TEST(TrainerPipelineTest, GuardRerunGivesTheIterationsOwnLossBits) {
  for (const TrainConfig& base : {Gpt2Config(), LlamaConfig()}) {
    TrainConfig cfg = base;
    cfg.guard = GuardLevel::kObserve;
    cfg.pipeline_model_parallel_size = 2;
    std::vector<std::string> notes;
    ASSERT_TRUE(Validate(&cfg, &notes).ok());
    std::vector<std::vector<double>> loss(2), rerun(2), previous(2);
    RunOnMesh(2, 1, 2, [&](int r, const TrainerGroups& g, Backend* be) {
      Trainer tr(cfg, be, g, {PatternData(1), PatternData(2)});
      tr.InitializeWeights();
      for (int i = 0; i < 4; ++i) {
        const IterationPlan plan = tr.PlanIteration();
        StepResult s;
        ASSERT_TRUE(tr.ComputeGradients(plan, &s).ok());
        loss[r].push_back(s.loss);
        rerun[r].push_back(tr.RerunLoss());
        previous[r].push_back(tr.PreviousBatchLoss());
        tr.Update(true, &s);
        tr.EndIteration(plan, &s);
      }
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(SameBits(rerun[r], loss[r])) << "rank " << r;
      EXPECT_TRUE(std::isnan(previous[r][0]));
      for (size_t i = 1; i < previous[r].size(); ++i) EXPECT_TRUE(std::isfinite(previous[r][i]));
      EXPECT_TRUE(SameBits(previous[r], previous[0])) << "rank " << r;
    }
  }
}

// The replica check across the mesh: at P=2 x D=2 each stage's tensors are compared among the
// ranks of that stage (stages hold different tensors: the old check called every healthy run
// "a different set of tensors"), and the last stage's copy of the tied word embeddings against
// the first stage's; one rank's drifted copy is named, its coordinates too.
TEST(TrainerPipelineTest, ReplicaCheckNamesADriftedTiedEmbeddingCopy) {
  const Layout l{1, 2, 2, 1, false, "P=2 x D=2"};
  const std::vector<std::string> hosts = {"a", "b", "c", "d"};
  std::vector<Status> healthy(4), drifted(4);
  Train(Gpt2Config(), l, 3, [&](Trainer& tr, int r) {
    size_t checked = 0;
    healthy[r] = CheckReplicas(tr, tr.comm(), hosts, &checked);
    // Rank 3 (dp 1, pp 1): its copy of the tied embedding drifts.
    if (r == 3) {
      const ParamInfo* p = tr.model().FindParam("embedding.word_embeddings.weight");
      ASSERT_NE(p, nullptr);
      ASSERT_TRUE(p->tied_copy);
      tr.model().mutable_param_data()[p->offset + 5] += 1e-3f;
    }
    drifted[r] = CheckReplicas(tr, tr.comm(), hosts, &checked);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(healthy[r].ok()) << healthy[r].ToString();
    ASSERT_FALSE(drifted[r].ok());
    const std::string& m = drifted[r].message();
    EXPECT_NE(m.find("rank 3 (host d) differs in 1 of"), std::string::npos) << m;
    EXPECT_NE(m.find(" tensors (dp 1, pp 1, tp 0): embedding"), std::string::npos) << m;
    // keel launch's blame reads "rank R (host H) differs" (launch/blame.cc): the host alone.
    std::smatch named;
    ASSERT_TRUE(std::regex_search(m, named, std::regex(R"(rank (\d+) \(host ([^)]*)\) differs)")));
    EXPECT_EQ(named[2].str(), "d");
    EXPECT_NE(m.find("embedding.word_embeddings.weight (the last stage's tied copy)"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find("rank 0 "), std::string::npos) << m;  // 3 of 4 copies agree
    EXPECT_EQ(m.find("rank 2 "), std::string::npos) << m;
    EXPECT_EQ(m.find("no majority"), std::string::npos) << m;
  }
  // At P=2 alone the two copies are the only holders: the last stage's is named, with the
  // warning that either may be the damaged one; a drifted layer of stage 1 at T=2 x P=2 is
  // named among its stage's tensor ranks.
  std::vector<Status> two(2);
  Train(Gpt2Config(), Layout{1, 2, 1, 1, false, "P=2"}, 2, [&](Trainer& tr, int r) {
    if (r == 0) {
      const ParamInfo* p = tr.model().FindParam("embedding.word_embeddings.weight");
      ASSERT_NE(p, nullptr);
      ASSERT_FALSE(p->tied_copy);
      tr.model().mutable_param_data()[p->offset] += 1e-3f;
    }
    size_t checked = 0;
    two[r] = CheckReplicas(tr, tr.comm(), {"a", "b"}, &checked);
  });
  for (const Status& s : two) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("rank 1 (host b) differs in 1 of"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("no majority: either may be the damaged one"), std::string::npos);
    EXPECT_NE(s.message().find(" tensors (dp 0, pp 1, tp 0): "), std::string::npos);
  }
  std::vector<Status> tp(4);
  Train(Gpt2Config(), Layout{2, 2, 1, 1, false, "T=2 x P=2"}, 2, [&](Trainer& tr, int r) {
    if (r == 3) {  // tp 1 of stage 1
      const ParamInfo* p = tr.model().FindParam("layers.3.post_attention_layernorm.weight");
      ASSERT_NE(p, nullptr);
      ASSERT_TRUE(p->split.replicated());
      tr.model().mutable_param_data()[p->offset] += 1e-3f;
    }
    size_t checked = 0;
    tp[r] = CheckReplicas(tr, tr.comm(), hosts, &checked);
  });
  for (const Status& s : tp) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("rank 3 (host d) differs in 1 of"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("layers.3.post_attention_layernorm.weight"), std::string::npos);
    EXPECT_NE(s.message().find(" tensors (dp 0, pp 1, tp 1): "), std::string::npos);
    EXPECT_EQ(s.message().find("rank 0 "), std::string::npos) << s.message();
  }
}

// The end of run's fingerprint streams the whole tensors one at a time to one rank instead of
// joining the model (and both moments) on every rank, which at 176B parameters is 2 TB a rank:
// the most host bytes any rank holds for it is about one whole tensor (a slice and the joined
// tensor at T = 2), far under the model; the value is the one-rank model's on the same state
// (a fresh one), and the same on every rank, with ZeRO-1's sharded moments (P = 2 x D = 2) too.
TEST(TrainerPipelineTest, FingerprintHoldsAboutOneWholeTensorNotTheModel) {
  const uint64_t fresh = Train(Gpt2Config(), Layout{}, 0)[0].fresh_fingerprint;
  for (const Layout& l : {Layout{}, Layout{2, 2, 1, 1, false, "T=2 x P=2"},
                          Layout{1, 2, 2, 1, false, "P=2 x D=2 (ZeRO-1)"},
                          Layout{2, 2, 1, 2, false, "T=2 x P=2 interleaved (V=2)"}}) {
    SCOPED_TRACE(l.name);
    std::vector<size_t> peak(l.world());
    size_t largest = 0, model = 0;
    const std::vector<RankRun> run = Train(Gpt2Config(), l, 2, [&](Trainer& tr, int r) {
      EXPECT_EQ(tr.sharded_optimizer(), l.data > 1);
      peak[r] = tr.fingerprint_peak_bytes();
      if (r != 0) return;
      for (const ParamInfo& p : GptModel::ParamLayout(tr.model().spec(), 1)) {
        largest = std::max(largest, p.numel * sizeof(float));
        model += p.numel * sizeof(float);
      }
    });
    EXPECT_EQ(run[0].fresh_fingerprint, fresh);
    ExpectRanksAgree(run, l.name);
    ASSERT_GT(model, 8 * largest);  // a model of many tensors: the bound below means something
    for (int r = 0; r < l.world(); ++r) {
      std::printf(
          "%s rank %d: the fingerprint held at most %zu bytes (largest tensor %zu, model %zu)\n",
          l.name, r, peak[r], largest, model);
      // Rank 0 always receives or joins whole tensors; the others may only send slices.
      if (r == 0) {
        EXPECT_GE(peak[r], largest);
      }
      EXPECT_LE(peak[r], l.tensor > 1 ? largest + largest / l.tensor : largest) << "rank " << r;
    }
  }
}

// The end of run's sample at P > 1 without joining the model anywhere: each token's forward runs
// through the stages (the window padded to the sequence length; causal attention keeps the
// padding out of the last real position's logits) and the last stage's choice goes back to every
// stage. The text is the one-rank run's at P = 2, T = 2 x P = 2 and interleaved, on every rank,
// in GPT-2's shape and Llama's, the window sliding past the sequence length.
TEST(TrainerPipelineTest, SampleThroughTheStagesIsTheOneRankSample) {
  GenerateOptions go;
  go.max_new_tokens = 24;
  go.seed = 7;
  go.window = Gpt2Config().seq_length;  // 16: the prompt and 24 tokens slide past it
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  for (const TrainConfig& cfg : {Gpt2Config(), LlamaConfig()}) {
    auto sample = [&](const Layout& l) {
      std::vector<std::vector<int32_t>> out(l.world());
      Train(cfg, l, 10, [&](Trainer& tr, int r) { out[r] = tr.Generate(prompt, go); });
      return out;
    };
    const std::vector<int32_t> one = sample(Layout{})[0];
    ASSERT_EQ(one.size(), 24u);
    std::string text;
    for (int32_t t : one) text += std::to_string(t) + " ";
    std::printf("%s one rank: %s\n", cfg.model.rope ? "Llama" : "GPT-2", text.c_str());
    EXPECT_GT(std::set<int32_t>(one.begin(), one.end()).size(), 2u);  // not one token repeated
    for (const Layout& l :
         {Layout{1, 2, 1, 1, false, "P=2"}, Layout{2, 2, 1, 1, false, "T=2 x P=2"},
          Layout{1, 2, 1, 2, false, "P=2 interleaved (V=2)"}}) {
      const std::vector<std::vector<int32_t>> run = sample(l);
      for (int r = 0; r < l.world(); ++r) EXPECT_EQ(run[r], one) << l.name << " rank " << r;
    }
  }
}

// The memory keel train checks (and keel plan prints) at P > 1 is what the ranks of a stage
// allocate: their chunks' parameters, gradients and moments, the activations of the micro-batches
// the 1F1B schedule has them hold at once (stage 0 of 2: two of four, stage 1: one), the
// iteration's micro-batches. Summed over the ranks, against the process's heap.
TEST(TrainerPipelineTest, MemoryEstimateIsWhatTheRanksOfEachStageAllocate) {
#if defined(KEEL_SANITIZED_BUILD)
  GTEST_SKIP() << "AddressSanitizer replaces malloc, so mallinfo2 counts nothing";
#endif
  auto heap = [] {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  // Every buffer under 2 MiB: larger ones are 2 MiB-aligned (huge pages), which costs malloc up to
  // 2 MiB more per buffer, noise at the sizes that matter and not in the estimate.
  for (const Layout& l : {Layout{1, 2, 1, 1, false, "P=2"}, Layout{2, 2, 1, 1, false, "T=2 x P=2"},
                          Layout{1, 2, 1, 2, false, "P=2 interleaved (V=2)"}}) {
    TrainConfig cfg = Gpt2Config();
    cfg.model.num_layers = 2 * l.virtual_chunks;
    cfg.num_layers_per_virtual_pipeline_stage = l.virtual_chunks > 1 ? 1 : 0;
    cfg.model.hidden = 128;
    cfg.model.ffn_hidden = 512;
    cfg.model.vocab = l.virtual_chunks > 1 ? 500 : 1000;  // a stage's buffers under 2 MiB
    cfg.micro_batch_size = 8;
    cfg.global_batch_size = 32;  // 4 micro-batches
    cfg.tensor_model_parallel_size = l.tensor;
    cfg.pipeline_model_parallel_size = l.pipeline;
    std::vector<std::string> notes;
    ASSERT_TRUE(Validate(&cfg, &notes).ok());
    size_t before = 0, after = 0;
    RunOnMesh(l.world(), l.tensor, l.pipeline, [&](int r, const TrainerGroups& g, Backend* be) {
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
    double counted = 0, boundary = 0;
    for (int s = 0; s < l.pipeline; ++s) {
      const MemoryEstimate e = EstimateRunMemory(cfg, s);
      // The run's read-ahead ring belongs to TrainingRun, not the trainer measured here.
      const double rank = static_cast<double>(e.total() - e.data);
      boundary += static_cast<double>(e.boundary) * l.tensor * l.data;
      std::printf(
          "%s stage %d: estimate %.0f bytes per rank (params %llu, %d micro-batches held, "
          "activations %llu, boundary %llu)\n",
          l.name, s, rank, static_cast<unsigned long long>(e.params), e.micro_batches_held,
          static_cast<unsigned long long>(e.activations),
          static_cast<unsigned long long>(e.boundary));
      counted += rank * l.tensor * l.data;
      // 1F1B over 4 micro-batches: stage 0 holds two, stage 1 one. Interleaved: the schedule's
      // warm-up holds more, per chunk.
      if (l.virtual_chunks == 1) {
        EXPECT_EQ(e.micro_batches_held, s == 0 ? 2 : 1);
      }
    }
    const double allocated = static_cast<double>(after - before);
    // The boundary buffers live only during the step (the heap is read after it): the rest is
    // what the ranks keep, and all of it is the peak within 10%.
    const double kept = counted - boundary;
    std::printf(
        "%s: estimate %.0f bytes over the %d ranks (%.0f without the step's boundary buffers), "
        "allocated and kept after the step %.0f (%+.1f%% of the estimate, %+.1f%% of the kept "
        "part)\n",
        l.name, counted, l.world(), kept, allocated, 100 * (allocated / counted - 1),
        100 * (allocated / kept - 1));
    EXPECT_NEAR(allocated, counted, 0.1 * counted) << l.name;
    EXPECT_NEAR(allocated, kept, 0.02 * kept) << l.name;
    // The default is the stage that needs the most: every rank checks the same figure.
    const MemoryEstimate most = EstimateRunMemory(cfg);
    EXPECT_EQ(most.total(),
              std::max(EstimateRunMemory(cfg, 0).total(), EstimateRunMemory(cfg, 1).total()));
    // A stage holds about half the model, not all of it (the old estimate's figure).
    TrainConfig one = cfg;
    one.tensor_model_parallel_size = 1;
    one.pipeline_model_parallel_size = 1;
    one.sequence_parallel = false;
    EXPECT_LT(most.params, GptModel::ParamCount(one.model) * 7 / 10 / l.tensor);
    EXPECT_NE(DescribeMemoryEstimate(cfg, most).find("pipeline stage"), std::string::npos)
        << DescribeMemoryEstimate(cfg, most);
  }
}

}  // namespace
}  // namespace keel
