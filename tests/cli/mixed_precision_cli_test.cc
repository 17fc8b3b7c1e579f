// `keel train --fp16 / --bf16` end to end: injected overflows (KEEL_TRAIN_FAULTS=overflow=A-B)
// show in the iteration line as skipped iterations (not NaN iterations) with the loss scale
// lowered, in metrics.jsonl per iteration, and in the checkpoint; the log names the precision;
// a run resumed in another precision is told so.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "keel_process.h"

namespace {

using keel_test::FreshTempDir;
using keel_test::ReadText;
using keel_test::RunKeelShell;
using json = nlohmann::json;

const std::string kModel =
    "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 10 "
    "--eval-interval 1000 --eval-iters 1 --sample-tokens 0 --threads 1 --save-interval 20 "
    "--train-iters 20";

// hysteresis 2, window 5: overflows at 3 and 4 halve 1024 once (at 4); iterations 5..9 clean
// double it back at 9; the overflow at 12 is absorbed by the restored hysteresis.
TEST(MixedPrecisionCliTest, Fp16OverflowsAreSkippedCountedAndTheScaleFollowsMegatron) {
  const std::string dir = FreshTempDir("fp16_overflow");
  const auto r = RunKeelShell("KEEL_TRAIN_FAULTS=overflow=3-4,overflow=12-12",
                              kModel + " --fp16 --initial-loss-scale 1024 --loss-scale-window 5 " +
                                  "--save " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("backend: cpu fp16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loss scale: 2048.0 | grad norm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("number of skipped iterations:   2 | number of nan iterations:   0"),
            std::string::npos)
      << r.out;
  std::vector<double> scale;
  std::vector<bool> skipped;
  std::istringstream in(ReadText(dir + "/run/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json m = json::parse(line);
    if (m["kind"] != "train") continue;
    scale.push_back(m["loss_scale"].get<double>());
    skipped.push_back(m["skipped"].get<bool>());
  }
  ASSERT_EQ(scale.size(), 20u);
  // 1024; overflows at 3, 4: the second halves it; 5..9 clean: doubled at 9; the overflow at 12
  // is absorbed by the restored hysteresis; 13..17 clean: doubled at 17.
  const std::vector<double> expect = {1024, 1024, 1024, 512,  512,  512,  512,  512,  1024, 1024,
                                      1024, 1024, 1024, 1024, 1024, 1024, 2048, 2048, 2048, 2048};
  EXPECT_EQ(scale, expect);
  for (size_t i = 0; i < skipped.size(); ++i)
    EXPECT_EQ(skipped[i], i == 2 || i == 3 || i == 11) << "iteration " << i + 1;
  const json state = json::parse(ReadText(dir + "/run/iter_0000020/state.json"));
  EXPECT_EQ(state["precision"]["recipe"], "fp16");
  EXPECT_EQ(state["precision"]["loss_scale"], 2048.0);
  EXPECT_EQ(state["precision"]["overflow_skipped_samples"], 3 * 8);
  // keel report charts the scale (it is not 1 throughout).
  const auto rep = RunKeelShell("", "report " + dir + "/run");
  ASSERT_EQ(rep.code, 0) << rep.out;
  EXPECT_NE(
      ReadText(dir + "/run/report.html").find("\"loss_scale\":[1024.0,1024.0,1024.0,512.0,512.0"),
      std::string::npos);
}

TEST(MixedPrecisionCliTest, ResumingInAnotherPrecisionIsAFreeChangeAndSaysSo) {
  const std::string dir = FreshTempDir("precision_switch");
  auto r = RunKeelShell("", kModel + " --bf16 --save " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("backend: cpu bf16"), std::string::npos) << r.out;
  std::string more = kModel;
  more.replace(more.find("--train-iters 20"), 16, "--train-iters 30");
  r = RunKeelShell("", more + " --override-scheduler --fp16 --save " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("changed on resume: bf16: true -> false"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("changed on resume: fp16: false -> true"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the checkpoint was trained in bf16: the fp16 loss scaler starts at 65536"),
            std::string::npos)
      << r.out;
  const std::string journal = ReadText(dir + "/run/CHRONICLE.md");
  EXPECT_NE(journal.find("at iteration 20; changed: train-iters: 20 -> 30, bf16: true -> false, "
                         "fp16: false -> true"),
            std::string::npos)
      << journal;
}

TEST(MixedPrecisionCliTest, BothRecipesAreRefusedWithTheFix) {
  const auto r = RunKeelShell("", kModel + " --bf16 --fp16");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--bf16 and --fp16 are both set"), std::string::npos) << r.out;
}

// keel bench puts the recipes side by side in one run: a row per precision (step time, tokens/s,
// its own GEMM peer), then a ratio line per precision against the first; an unknown precision is
// refused with the list of known ones.
TEST(MixedPrecisionCliTest, BenchReportsEachPrecisionSideBySide) {
  const auto r = RunKeelShell("",
                              "bench --models tiny --iters 2 --warmup 1 --threads 1 "
                              "--precisions fp32 bf16 fp16");
  ASSERT_EQ(r.code, 0) << r.out;
  std::map<std::string, double> peer;  // per precision
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string model, prec;
    double params, seq, mbs, ms, tps, gflops, peer_gflops;
    if (f >> model >> prec >> params >> seq >> mbs >> ms >> tps >> gflops >> peer_gflops &&
        model == "tiny") {
      EXPECT_GT(ms, 0) << line;
      EXPECT_GT(tps, 0) << line;
      peer[prec] = peer_gflops;
    }
  }
  ASSERT_EQ(peer.size(), 3u) << r.out;
  EXPECT_NE(r.out.find("tiny       bf16 tokens/s are"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tiny       fp16 tokens/s are"), std::string::npos) << r.out;
  const auto bad = RunKeelShell("", "bench --models tiny --precisions fp8");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("unknown precision 'fp8' (use fp32, bf16, fp16)"), std::string::npos)
      << bad.out;
}

}  // namespace
