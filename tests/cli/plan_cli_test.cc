// `keel plan` as a user runs it: exit codes, the verdict on a ramp-up, JSON for machines.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "keel_process.h"

namespace {

using keel_test::RunKeelShell;

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

}  // namespace
