// `keel plan` as a user runs it: exit codes, the verdict on a ramp-up, JSON for machines.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "keel_process.h"

namespace {

using keel_test::RunKeelShell;
using keel_test::RunShell;

const std::string k13B =
    "plan --num-layers 40 --hidden-size 5120 --num-attention-heads 32 --seq-length 2048 "
    "--micro-batch-size 1 --global-batch-size 1024 --rampup-batch-size 16 16 6000000 "
    "--lr-warmup-samples 216320 --gpus-per-node 4 --tensor-model-parallel-size 2 "
    "--pipeline-model-parallel-size 4 --vocab-size 50257 ";

TEST(PlanCliTest, RampUpTheLayoutCannotRunExitsOneAndSaysWhen) {
  auto r = RunKeelShell("", k13B + "--train-samples 300000000 --num-nodes 64 --iteration-time 32");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("data parallel 32"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: ramp-up batch sizes 16, 48, 80"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at most 16 (32 nodes)"), std::string::npos) << r.out;
  r = RunKeelShell("", k13B + "--train-samples 300000000 --num-nodes 32 --iteration-time 32");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("64 of them runnable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("days at 24 h/day"), std::string::npos) << r.out;
}

TEST(PlanCliTest, JsonTrainTokensAndErrors) {
  auto r = RunKeelShell("", k13B + "--train-tokens 614400000000 --num-nodes 32 --json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);  // only JSON on stdout
  EXPECT_EQ(j["train_samples"].get<int64_t>() / 1000000,
            299);  // 300M samples, last partial batch dropped
  EXPECT_EQ(j["layout"]["data_parallel_size"], 16);
  EXPECT_EQ(j["feasible"], true);
  bool noted = false;
  for (const auto& n : j["notes"])
    noted |= n.get<std::string>().find("--train-samples 300000000") != std::string::npos;
  EXPECT_TRUE(noted) << j["notes"];
  // Impossible layouts and inputs: exit 2 with the rule.
  r = RunKeelShell("", k13B + "--train-samples 300000000 --num-nodes 9");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("36 GPUs is not a multiple of tensor parallel 2 x pipeline parallel 4"),
            std::string::npos)
      << r.out;
  r = RunKeelShell("", k13B + "--train-samples 300000000 --train-tokens 5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("give one"), std::string::npos) << r.out;
  r = RunKeelShell("", "plan --hidden-size 100 --num-attention-heads 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("hidden"), std::string::npos) << r.out;
}

// Llama-2 7B's published shape through the command line: the count from the model's layout (the
// GPT-2 formula does not describe it, and the plan says so instead of comparing), in text and JSON.
TEST(PlanCliTest, Llama2SevenBillionFromTheCommandLine) {
  const std::string llama =
      "plan --num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 "
      "--seq-length 4096 --position-embedding-type rope --normalization RMSNorm --swiglu "
      "--untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 32000 "
      "--micro-batch-size 1 --global-batch-size 1024 --train-iters 500000 --num-nodes 16 "
      "--gpus-per-node 8 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 ";
  auto r = RunKeelShell("", llama + "--iteration-time 10");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("parameters: 6,738,415,616 exact"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("from the model's own layout"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FFN 11008 SwiGLU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RoPE, RMSNorm, untied output layer, no linear biases"), std::string::npos)
      << r.out;
  r = RunKeelShell("", llama + "--json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["parameters"].get<int64_t>(), 6738415616);
  EXPECT_EQ(j["model"]["swiglu"], true);
  EXPECT_EQ(j["model"]["normalization"], "RMSNorm");
  EXPECT_EQ(j["model"]["position_embedding_type"], "rope");
  EXPECT_EQ(j["model"]["num_query_groups"], 32);
  EXPECT_EQ(j["model"]["untie_embeddings_and_output_weights"], true);
  EXPECT_EQ(j["model"]["add_bias_linear"], false);
}

// keel plan and keel train check a layout with one function (config/parallel_layout.h): a layout
// the plan accepts trains, and the rank holding the plan's most loaded stage holds the parameters
// the plan counts for it. A tiny model on the default corpus (its vocabulary, 4096, given to the
// plan), the plan's tensor x pipeline x data layout under mpirun.
TEST(PlanCliTest, ALayoutThePlanAcceptsTrainsWithThePlansParametersPerRank) {
  const std::string model =
      "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
      "--micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr-warmup-iters 1 ";
  auto r = RunKeelShell("", "plan " + model +
                                "--vocab-size 4096 --num-nodes 1 --gpus-per-node 4 "
                                "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                                "--json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto plan = nlohmann::json::parse(r.out);
  ASSERT_EQ(plan["feasible"], true) << plan["problems"];
  const auto& layout = plan["layout"];
  const int tp = layout["tensor_model_parallel_size"], pp = layout["pipeline_model_parallel_size"];
  const int dp = layout["data_parallel_size"], world = layout["world_size"];
  ASSERT_EQ(world, tp * pp * dp);
  const int64_t stage0 = plan["parameters_per_gpu"][0], total = plan["parameters"];
  ASSERT_EQ(plan["most_loaded_stage"], 0);  // the embedding's stage: rank 0's

  r = RunShell(
      keel_test::Mpirun(world, "", 240) + KEEL_BINARY + " train " + model +
      fmt::format("--tensor-model-parallel-size {} --pipeline-model-parallel-size {} ", tp, pp) +
      "--threads 1 --eval-interval 4 --eval-iters 1 --sample-tokens 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(fmt::format("layout: tensor parallel {} x pipeline parallel {} x data "
                                   "parallel {}; this rank is dp 0, pp 0, tp 0",
                                   tp, pp, dp)),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(fmt::format("this rank (dp 0, pp 0, tp 0) holds {} of the {} parameters",
                                   stage0, total)),
            std::string::npos)
      << "keel plan: stage 0 holds " << stage0 << " of " << total << "\n"
      << r.out;
  EXPECT_NE(r.out.find(" iteration        4/       4 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("training finished: iteration 4"), std::string::npos) << r.out;

  // A layout the plan refuses, keel train refuses with the same rule (and exit 2) before any work.
  r = RunKeelShell(
      "", "plan " + model + "--num-nodes 1 --gpus-per-node 3 --tensor-model-parallel-size 3");
  EXPECT_EQ(r.code, 2) << r.out;
  const std::string rule =
      "--tensor-model-parallel-size 3 must divide --num-attention-heads 4 and the FFN size 256";
  EXPECT_NE(r.out.find(rule), std::string::npos) << r.out;
  r = RunShell(keel_test::Mpirun(3, "", 120) + KEEL_BINARY + " train " + model +
               "--tensor-model-parallel-size 3 --threads 1 --sample-tokens 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(rule), std::string::npos) << r.out;
}

}  // namespace
