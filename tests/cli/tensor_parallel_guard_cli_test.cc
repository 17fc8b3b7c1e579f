// The guard, the fp16 loss scaler and the text sample under tensor parallelism, end to end:
// `mpirun -np 2 keel train --tensor-model-parallel-size 2` against the one-process run. The
// poisoned data window (KEEL_TRAIN_FAULTS=poison, planted on every rank) is detected, rolled back
// and skipped as on one process, both ranks deciding the same; injected fp16 overflows move the
// loss scale as on one process; --sample-tokens generates with both tensor ranks. Every mpirun
// runs under `timeout`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../run_compare.h"
#include "keel_process.h"

namespace {

using keel_test::FreshTempDir;
using keel_test::KeelResult;
using keel_test::Mpirun;
using keel_test::ReadText;
using keel_test::RunShell;
using json = nlohmann::json;
namespace fs = std::filesystem;

// GuardCliTest's model and schedule (2 heads split over 2 ranks).
const std::string kGuardModel =
    "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 10 "
    "--eval-interval 1000 --eval-iters 1 --sample-tokens 0 --threads 1 --save-interval 20 "
    "--train-iters 150 --lr 5e-3 --guard-max-data-skips 3";

KeelResult Train(int np, const std::string& env, const std::string& args) {
  const std::string keel = std::string(KEEL_BINARY) + " " + args;
  if (np == 1) return RunShell(env + " " + keel);
  return RunShell(env + " " + Mpirun(np, "", 240) + keel + " --tensor-model-parallel-size 2");
}

// Each train line's field `key` from metrics.jsonl.
std::vector<json> MetricsField(const std::string& run, const std::string& key) {
  std::vector<json> v;
  std::istringstream in(ReadText(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.value("kind", "") == "train") v.push_back(j[key]);
  }
  return v;
}

std::vector<std::string> GuardEvents(const std::string& run) {
  return keel_test::GuardDecisionEvents(ReadText(run + "/events.jsonl"));
}

TEST(TensorParallelGuardCliTest, PoisonedWindowIsHandledAsOnOneProcess) {
  const std::string dir = FreshTempDir("tp_guard_poison");
  const std::string env = "KEEL_TRAIN_FAULTS=poison=61-72";
  const KeelResult one = Train(1, env, kGuardModel + " --save " + dir + "/one");
  const KeelResult tp = Train(2, env, kGuardModel + " --save " + dir + "/tp");
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(tp.code, 0) << tp.out;
  for (const KeelResult* r : {&one, &tp}) {
    EXPECT_NE(r->out.find("guard: iteration 61: lm loss jumped from"), std::string::npos) << r->out;
    EXPECT_NE(r->out.find("rolled back to iteration 60 (checkpoint pinned), skipping iterations "
                          "61..111 (samples 480..887)"),
              std::string::npos)
        << r->out;
  }
  // The same decisions, journaled at the same points, and the same end state.
  EXPECT_EQ(GuardEvents(dir + "/tp"), GuardEvents(dir + "/one"));
  for (const char* run : {"/one", "/tp"}) {
    const json state = json::parse(ReadText(dir + run + "/iter_0000150/state.json"));
    EXPECT_EQ(state["guard"]["healthy"], true) << run;
    EXPECT_EQ(state["data"]["skipped_iteration_ranges"], json::parse("[[61, 111]]")) << run;
    EXPECT_EQ(state["counters"]["data_skipped_iterations"], 51) << run;
  }
  // Both tensor ranks took the decisions (each rank's log says so).
  const std::string rank1 = ReadText(dir + "/tp/logs/rank-001.log");
  EXPECT_NE(rank1.find("rolled back to iteration 60"), std::string::npos) << rank1;
  // The losses agree with the one-process run's within fp32 tolerance, rollback included (the
  // skipped iterations have none on either).
  const std::vector<json> l1 = MetricsField(dir + "/one", "lm_loss"),
                          l2 = MetricsField(dir + "/tp", "lm_loss");
  ASSERT_EQ(l1.size(), 150u);
  ASSERT_EQ(l2.size(), 150u);
  double d = 0;
  for (size_t i = 0; i < l1.size(); ++i) {
    ASSERT_EQ(l1[i].is_number(), l2[i].is_number()) << "iteration " << i + 1;
    if (l1[i].is_number()) d = std::max(d, std::fabs(l1[i].get<double>() - l2[i].get<double>()));
  }
  std::printf("poisoned window at T=2: max |loss - one process's| = %.3g over 150 iterations\n", d);
  EXPECT_LT(d, 1e-3);
  fs::remove_all(dir);
}

TEST(TensorParallelGuardCliTest, Fp16LossScaleFollowsTheOneProcessRun) {
  const std::string dir = FreshTempDir("tp_fp16");
  const std::string env = "KEEL_TRAIN_FAULTS=overflow=3-4,overflow=12-12";
  const std::string args =
      "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
      "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 10 "
      "--eval-interval 1000 --eval-iters 0 --sample-tokens 0 --threads 1 --save-interval 20 "
      "--train-iters 20 --fp16 --initial-loss-scale 1024 --loss-scale-window 5 --save " +
      dir;
  const KeelResult one = Train(1, env, args + "/one");
  const KeelResult tp = Train(2, env, args + "/tp");
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(tp.code, 0) << tp.out;
  EXPECT_NE(tp.out.find("number of skipped iterations:   2 | number of nan iterations:   0"),
            std::string::npos)
      << tp.out;
  const std::vector<json> s1 = MetricsField(dir + "/one", "loss_scale");
  ASSERT_EQ(s1.size(), 20u);
  EXPECT_EQ(MetricsField(dir + "/tp", "loss_scale"), s1);
  EXPECT_EQ(MetricsField(dir + "/tp", "skipped"), MetricsField(dir + "/one", "skipped"));
  fs::remove_all(dir);
}

TEST(TensorParallelGuardCliTest, SampleTokensGeneratesWithBothTensorRanks) {
  const std::string args =
      "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
      "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 2 --log-interval 5 "
      "--eval-interval 1000 --eval-iters 0 --threads 1 --train-iters 5 --sample-tokens 8";
  const KeelResult one = Train(1, "", args);
  const KeelResult tp = Train(2, "", args);
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(tp.code, 0) << tp.out;
  // The line after "sample (temperature ...):" holds the text.
  auto sample = [](const std::string& out) {
    const size_t at = out.find("sample (temperature");
    if (at == std::string::npos) return std::string("(none)");
    const size_t from = out.find('\n', at) + 1;
    return out.substr(from, out.find('\n', from) - from);
  };
  EXPECT_NE(sample(tp.out), "(none)") << tp.out;
  // Each layout is the same bits run after run and differs from one process only in the order of
  // fp32 sums: this short greedy-enough sample is the same text.
  EXPECT_EQ(sample(tp.out), sample(one.out)) << tp.out;
  std::printf("one process: %s\nT=2:         %s\n", sample(one.out).c_str(),
              sample(tp.out).c_str());
}

}  // namespace
