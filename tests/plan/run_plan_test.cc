#include "plan/run_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/gpt.h"
#include "train/memory_estimate.h"

namespace keel {
namespace {

// A PlanInput from `keel train` flags, as `keel plan` builds it.
PlanInput Input(std::vector<std::string> flags, int vocab, int nodes, int gpus, int tp, int pp) {
  std::vector<const char*> argv{"plan"};
  for (const std::string& f : flags) argv.push_back(f.c_str());
  ParsedConfig parsed;
  Status st = ParseTrainArgs(static_cast<int>(argv.size()), argv.data(), &parsed);
  EXPECT_TRUE(st.ok()) << st.message();
  PlanInput in;
  in.cfg = parsed.config;
  in.cfg.model.vocab = vocab;
  in.num_nodes = nodes;
  in.gpus_per_node = gpus;
  in.tensor_parallel = tp;
  in.pipeline_parallel = pp;
  return in;
}

// BLOOM-176B as the seeds describe it (tr11): 70 layers, hidden 14336, 112 heads, ALiBi, embedding
// LayerNorm, vocab 250880, 48 nodes x 8 GPUs, TP 4, PP 12, micro 2, global 2048 ramped from 192.
PlanInput Bloom176B() {
  PlanInput in = Input({"--num-layers",
                        "70",
                        "--hidden-size",
                        "14336",
                        "--num-attention-heads",
                        "112",
                        "--seq-length",
                        "2048",
                        "--position-embedding-type",
                        "alibi",
                        "--embed-layernorm",
                        "--micro-batch-size",
                        "2",
                        "--global-batch-size",
                        "2048",
                        "--rampup-batch-size",
                        "192",
                        "16",
                        "9765625",
                        "--train-samples",
                        "220000000",
                        "--lr-warmup-samples",
                        "183105"},
                       250880, 48, 8, 4, 12);
  in.recompute_activations = true;
  in.iteration_seconds = 105;
  return in;
}

// tr1-13B: 40 layers, hidden 5120, 32 heads, 4 GPUs per node, TP 2, PP 4, micro 1, global 1024
// ramped up by 16 from 16.
PlanInput Tr13B(int nodes) {
  return Input({"--num-layers",
                "40",
                "--hidden-size",
                "5120",
                "--num-attention-heads",
                "32",
                "--seq-length",
                "2048",
                "--micro-batch-size",
                "1",
                "--global-batch-size",
                "1024",
                "--rampup-batch-size",
                "16",
                "16",
                "6000000",
                "--train-samples",
                "300000000",
                "--lr-warmup-samples",
                "216320"},
               50257, nodes, 4, 2, 4);
}

TEST(RunPlanTest, Bloom176BMatchesItsPublishedSizeIterationsAndTflops) {
  const PlanInput in = Bloom176B();
  RunPlan p;
  ASSERT_TRUE(MakeRunPlan(in, &p).ok());
  EXPECT_EQ(p.params_total, 176247271424);  // BLOOM's model card
  EXPECT_EQ(p.dp, 8);
  EXPECT_EQ(p.train_iters, 115311);  // the seed's log: "iteration 12695/ 115311"
  EXPECT_TRUE(p.problems.empty());
  EXPECT_EQ(p.max_rampup_dp, 8);  // gcd(192, 16) / micro 2
  // The log's 105 s iterations at 149-150 TFLOPs (BLOOM counts the recomputed forward).
  EXPECT_GT(p.tflops_per_gpu, 148.0);
  EXPECT_LT(p.tflops_per_gpu, 151.0);
  // Days: every sample costs 105 s / 2048.
  EXPECT_NEAR(p.seconds, 105.0 * static_cast<double>(p.train_samples) / 2048, 1e-6 * p.seconds);
  EXPECT_NEAR(p.days, p.seconds / 86400, 1e-9);
}

// Llama-2 as Meta published it (Touvron et al. 2023, the HF config.json files): RoPE, RMSNorm,
// SwiGLU with FFN 11008 / 28672, untied output layer, no linear biases, vocab 32000; 70B shares
// 8 key/value heads among its 64 query heads.
PlanInput Llama2(bool big) {
  std::vector<std::string> flags = {"--num-layers",
                                    big ? "80" : "32",
                                    "--hidden-size",
                                    big ? "8192" : "4096",
                                    "--ffn-hidden-size",
                                    big ? "28672" : "11008",
                                    "--num-attention-heads",
                                    big ? "64" : "32",
                                    "--seq-length",
                                    "4096",
                                    "--position-embedding-type",
                                    "rope",
                                    "--normalization",
                                    "RMSNorm",
                                    "--swiglu",
                                    "--untie-embeddings-and-output-weights",
                                    "--disable-bias-linear",
                                    "--micro-batch-size",
                                    "1",
                                    "--global-batch-size",
                                    "1024",
                                    "--train-iters",
                                    "500000"};
  if (big) {
    // Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by x TP: 16 x 8 =
    // 128 keeps Meta's 32000 rows (the default 128 x 8 would pad to 32768).
    for (const char* f : {"--group-query-attention", "--num-query-groups", "8",
                          "--make-vocab-size-divisible-by", "16"})
      flags.push_back(f);
  }
  return Input(flags, 32000, big ? 64 : 8, 8, big ? 8 : 1, big ? 4 : 1);
}

TEST(RunPlanTest, Llama2ParameterCountsAreThePublishedOnes) {
  RunPlan p7, p70;
  ASSERT_TRUE(MakeRunPlan(Llama2(false), &p7).ok());
  ASSERT_TRUE(MakeRunPlan(Llama2(true), &p70).ok());
  // The parameter counts of the published checkpoints (meta-llama/Llama-2-7b-hf, -70b-hf).
  EXPECT_EQ(p7.params_total, 6738415616);
  EXPECT_EQ(p70.params_total, 68976648192);
  EXPECT_EQ(p7.padded_vocab, 32000);  // 32000 is a multiple of 128
  EXPECT_EQ(p70.padded_vocab, 32000);
  // 70B over TP 8 x PP 4: a stage of 20 layers holds 1/8 of each layer's matrices (8 key/value
  // heads, one per TP rank) and its RMSNorm weights whole; the first stage adds 1/8 of the word
  // embedding, the last 1/8 of the output layer (untied: no copy of the embedding) and the final
  // norm.
  const int64_t h = 8192, F = 28672, kv = 1024, V = 32000;
  const int64_t layer = (h * h + 2 * h * kv + h * h + 3 * h * F) / 8 + 2 * h;
  ASSERT_EQ(p70.params_per_stage.size(), 4u);
  EXPECT_EQ(p70.params_per_stage[0], 20 * layer + V * h / 8);
  EXPECT_EQ(p70.params_per_stage[1], 20 * layer);
  EXPECT_EQ(p70.params_per_stage[3], 20 * layer + V * h / 8 + h);
  // FLOPs: QKV 2h(h + 2kv), projection 2h^2, SwiGLU 6hF, attention 4sh per layer; head 2hV.
  const double s = 4096;
  const double fwd7 =
      32 * (2.0 * 4096 * 3 * 4096 + 2.0 * 4096 * 4096 + 6.0 * 4096 * 11008 + 4 * s * 4096) +
      2.0 * 4096 * V;
  EXPECT_DOUBLE_EQ(p7.flops_per_iteration, 3 * fwd7 * 1024 * s);
}

// A key/value head cannot be split across tensor-parallel ranks.
TEST(RunPlanTest, TensorParallelMustDivideTheKeyValueHeads) {
  PlanInput in = Llama2(true);
  in.tensor_parallel = 16;
  in.num_nodes = 128;
  RunPlan p;
  const Status st = MakeRunPlan(in, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--num-query-groups 8"), std::string::npos) << st.message();
}

TEST(RunPlanTest, ParameterCountIsTheClosedFormAndShardsAddUp) {
  // L=4, h=64, 4 heads, F=4h, s=32, V=1000 -> padded to a multiple of 128 x TP 2 = 1024.
  const PlanInput in = Input(
      {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length",
       "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "100"},
      1000, 1, 4, 2, 2);
  RunPlan p;
  ASSERT_TRUE(MakeRunPlan(in, &p).ok());
  const int64_t h = 64, F = 256, s = 32, V = 1024, L = 4;
  EXPECT_EQ(p.padded_vocab, V);
  EXPECT_EQ(p.params_total, L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h);
  EXPECT_EQ(p.params_formula, p.params_total);
  // One layer on one TP rank: LayerNorms and the row-parallel biases whole, the rest halved.
  const int64_t layer =
      4 * h + (3 * h * h + 3 * h) / 2 + h * h / 2 + h + (F * h + F) / 2 + h * F / 2 + h;
  ASSERT_EQ(p.params_per_stage.size(), 2u);
  EXPECT_EQ(p.params_per_stage[0], V * h / 2 + s * h + 2 * layer);
  // The last stage keeps its own copy of the (tied) word embedding for the output layer.
  EXPECT_EQ(p.params_per_stage[1], V * h / 2 + 2 * layer + 2 * h);
  EXPECT_EQ(p.dp, 1);
  // Memory of the most loaded GPU: bf16 mixed is 2 + 4 + 12 bytes per parameter.
  const double most = static_cast<double>(std::max(p.params_per_stage[0], p.params_per_stage[1]));
  ASSERT_EQ(p.memory.size(), 4u);
  EXPECT_EQ(p.memory[1].recipe, "bf16 mixed");
  EXPECT_NEAR(p.memory[1].total_gib, most * 18 / (1024.0 * 1024 * 1024), 1e-12);
  EXPECT_NEAR(p.memory[0].total_gib, most * 16 / (1024.0 * 1024 * 1024), 1e-12);
  // FLOPs per iteration: 3 x forward of 8 sequences of 32 tokens.
  const double fwd = L * (8.0 * h * h + 4.0 * h * F + 4.0 * s * h) + 2.0 * h * V;
  EXPECT_DOUBLE_EQ(p.flops_per_iteration, 3 * fwd * 8 * 32);
}

// keel plan's figure for a rank of keel train is keel train's own check at that layout (the same
// function): a tensor rank's slice, its share of the activations, the moments over D under
// ZeRO-1; with and without sequence parallelism.
TEST(RunPlanTest, KeelTrainsPerRankMemoryIsTheTrainersOwnEstimate) {
  for (bool sp : {false, true}) {
    std::vector<std::string> flags = {"--num-layers",          "2",   "--hidden-size",       "64",
                                      "--num-attention-heads", "4",   "--seq-length",        "32",
                                      "--micro-batch-size",    "2",   "--global-batch-size", "8",
                                      "--train-iters",         "100", "--lr-warmup-iters",   "2"};
    if (sp) flags.push_back("--sequence-parallel");
    PlanInput in = Input(flags, 1000, 1, 4, 2, 1);
    ASSERT_EQ(in.cfg.sequence_parallel, sp);
    in.zero_stage = 1;
    RunPlan p;
    ASSERT_TRUE(MakeRunPlan(in, &p).ok());
    TrainConfig rank = in.cfg;
    rank.tensor_model_parallel_size = 2;
    rank.data_parallel_size = 2;
    rank.use_distributed_optimizer = true;
    rank.model.padded_vocab = 1024;  // 1000 padded to a multiple of 128 x 2
    EXPECT_EQ(p.padded_vocab, 1024);
    const MemoryEstimate e = EstimateRunMemory(rank);
    EXPECT_EQ(p.train_rank_bytes, e.total()) << sp;
    EXPECT_EQ(static_cast<int64_t>(e.params), p.params_per_stage[0]) << sp;
    EXPECT_LT(e.params, GptModel::ParamCount(rank.model) * 6 / 10) << sp;
    EXPECT_NE(FormatRunPlan(in, p).find("keel train on CPU ranks: " + FormatBytes(e.total()) +
                                        " per rank"),
              std::string::npos);
  }
}

// At pipeline parallel P > 1 the figure is keel train's check too: a rank of the stage that
// needs the most (its chunks' layers, the micro-batches the schedule has it hold), not 0 (the
// plan printed none) and not the whole model.
TEST(RunPlanTest, KeelTrainsPerRankMemoryAtPipelineParallelIsTheLargestStages) {
  PlanInput in = Input({"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size",
                        "16", "--train-iters", "100", "--lr-warmup-iters", "2"},
                       1000, 1, 4, 1, 2);
  RunPlan p;
  ASSERT_TRUE(MakeRunPlan(in, &p).ok());
  EXPECT_EQ(p.dp, 2);
  TrainConfig rank = in.cfg;
  rank.pipeline_model_parallel_size = 2;
  rank.data_parallel_size = 2;
  rank.model.padded_vocab = static_cast<int>(p.padded_vocab);
  const MemoryEstimate e = EstimateRunMemory(rank);
  ASSERT_GT(p.train_rank_bytes, 0u);
  EXPECT_EQ(p.train_rank_bytes, e.total());
  EXPECT_EQ(e.total(),
            std::max(EstimateRunMemory(rank, 0).total(), EstimateRunMemory(rank, 1).total()));
  EXPECT_EQ(e.micro_batches_held, e.pipeline_stage == 0 ? 2 : 1);  // 4 micro-batches, 1F1B
  EXPECT_LT(e.params, GptModel::ParamCount(rank.model) * 7 / 10);
  EXPECT_NE(FormatRunPlan(in, p).find("keel train on CPU ranks: " + FormatBytes(e.total()) +
                                      " per rank (weights"),
            std::string::npos);
  EXPECT_NE(p.train_rank_terms.find("pipeline stage"), std::string::npos) << p.train_rank_terms;
}

TEST(RunPlanTest, ABillionLayersArePlannedWithoutListingThem) {
  // The plan used to list every layer's tensors: 2^30 layers took memory until it was killed.
  const PlanInput in =
      Input({"--num-layers", "1073741824", "--hidden-size", "32", "--num-attention-heads", "2",
             "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
             "--train-iters", "100"},
            1000, 1, 4, 1, 4);
  RunPlan p;
  ASSERT_TRUE(MakeRunPlan(in, &p).ok());
  EXPECT_EQ(p.params_total, p.params_formula);
  const int64_t layer = 12 * 32 * 32 + 13 * 32;
  ASSERT_EQ(p.params_per_stage.size(), 4u);
  EXPECT_EQ(p.params_per_stage[1], (int64_t{1} << 28) * layer);
}

TEST(RunPlanTest, Tr13BCannotUse64NodesUntilTheBatchReaches1024) {
  RunPlan p;
  ASSERT_TRUE(MakeRunPlan(Tr13B(64), &p).ok());
  EXPECT_EQ(p.dp, 32);
  ASSERT_EQ(p.stages.size(), 64u);  // 16, 32, ..., 1024
  int runnable = 0;
  for (const PlanRampStage& s : p.stages) {
    EXPECT_EQ(s.feasible, s.batch % 32 == 0) << s.batch;
    runnable += s.feasible;
  }
  EXPECT_EQ(runnable, 32);
  EXPECT_EQ(p.max_rampup_dp, 16);  // "limits us to DP_SIZE=16 ... so we can do 32 nodes"
  ASSERT_GE(p.all_feasible_from, 0);
  EXPECT_EQ(p.stages[p.all_feasible_from].batch, 1024);
  ASSERT_EQ(p.problems.size(), 1u);
  EXPECT_NE(p.problems[0].find("at most 16 (32 nodes)"), std::string::npos) << p.problems[0];
  EXPECT_NE(p.problems[0].find("when the global batch reaches 1024"), std::string::npos);

  RunPlan at32;
  ASSERT_TRUE(MakeRunPlan(Tr13B(32), &at32).ok());
  EXPECT_EQ(at32.dp, 16);
  EXPECT_TRUE(at32.problems.empty());
  EXPECT_EQ(at32.all_feasible_from, 0);
}

TEST(RunPlanTest, ImpossibleLayoutsAreErrorsThatNameTheRule) {
  RunPlan p;
  // 9 nodes x 4 GPUs = 36 is not a multiple of TP 2 x PP 4.
  Status st = MakeRunPlan(Tr13B(9), &p);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a multiple of tensor parallel 2 x pipeline parallel 4"),
            std::string::npos)
      << st.message();
  // TP 3 does not divide 32 heads.
  PlanInput tp3 = Tr13B(6);
  tp3.tensor_parallel = 3;
  tp3.pipeline_parallel = 1;
  st = MakeRunPlan(tp3, &p);
  EXPECT_NE(st.message().find("must divide --num-attention-heads 32"), std::string::npos)
      << st.message();
  // More stages than layers.
  PlanInput pp = Tr13B(16);
  pp.pipeline_parallel = 64;
  pp.tensor_parallel = 1;
  st = MakeRunPlan(pp, &p);
  EXPECT_NE(st.message().find("larger than --num-layers 40"), std::string::npos) << st.message();
  // A global batch the data-parallel ranks cannot split: 1000 over micro 1 x DP 16.
  PlanInput gb = Input({"--num-layers", "40", "--hidden-size", "5120", "--num-attention-heads",
                        "32", "--micro-batch-size", "1", "--global-batch-size", "1000"},
                       50257, 32, 4, 2, 4);
  st = MakeRunPlan(gb, &p);
  EXPECT_NE(st.message().find("--global-batch-size 1000 is not divisible"), std::string::npos)
      << st.message();
  PlanInput bad = Tr13B(32);
  bad.hours_per_day = 0;
  EXPECT_FALSE(MakeRunPlan(bad, &p).ok());
}

TEST(RunPlanTest, AssumedTflopsGiveTheDays) {
  PlanInput in = Tr13B(32);
  in.tflops_per_gpu = 100;
  in.hours_per_day = 20;
  RunPlan p;
  ASSERT_TRUE(MakeRunPlan(in, &p).ok());
  EXPECT_NEAR(p.seconds, p.total_flops / (100e12 * 128), 1e-6 * p.seconds);
  EXPECT_NEAR(p.days, p.seconds / (20 * 3600.0), 1e-9);
  const nlohmann::json j = RunPlanJson(in, p);
  EXPECT_EQ(j["layout"]["data_parallel_size"], 16);
  EXPECT_EQ(j["feasible"], true);
  EXPECT_EQ(j["rampup_stages"].size(), 64u);
  EXPECT_EQ(j["parameters"], p.params_total);
}

}  // namespace
}  // namespace keel
