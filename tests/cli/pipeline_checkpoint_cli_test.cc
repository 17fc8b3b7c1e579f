// Tensor x pipeline parallelism end to end under `mpirun -np 4` (T=2 x P=2, oversubscribed, one
// thread per rank): the end of run's sample and fingerprint as one process's (no whole-model
// join); a checkpoint saved at (T=2, P=2, D=1) resumed at (1,1,1), (1,2,2), (2,1,2)
// and (4,1,1) with the reshard note; a missing or damaged piece refused naming it; the ckpt tools
// and `ckpt import --hf` on that layout; a rank killed with SIGKILL (the job ends, the resume is
// bit-exact); a rank hung inside a pipeline send (every rank dumps, exit 4, `keel hangs analyze`
// names it and its stage); the guard's poisoned window as on one process. Every mpirun runs
// under `timeout`.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
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
using keel_test::WithoutTimings;
using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kModel = keel_test::kDataParallelModel;  // 2 layers: one per stage at P=2
const std::string kTp2Pp2 = " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 ";
const std::string kKeel = std::string(KEEL_BINARY);

KeelResult Train(int np, const std::string& args, const std::string& env = "") {
  const std::string keel = kKeel + " " + kModel + " " + args;
  return RunShell(env + (np == 1 ? keel : Mpirun(np) + keel));
}

std::string Fingerprint(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("state fingerprint: ([0-9a-f]{16})"))) return "(none)";
  return m[1].str();
}

// The iteration lines without their timings, and their losses.
std::vector<std::string> IterationLines(const std::string& out) {
  std::vector<std::string> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(" iteration ", 0) == 0) v.push_back(WithoutTimings(line));
  return v;
}

std::vector<double> Losses(const std::string& out) {
  std::vector<double> v;
  const std::regex re(R"(iteration +\d+/ +\d+ \|.*\| lm loss: ([0-9.E+-]+) \|)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it)
    v.push_back(std::stod((*it)[1]));
  return v;
}

// The train lines' losses in metrics.jsonl (full precision), the last `n` of them.
std::vector<double> MetricsLosses(const std::string& run, size_t n) {
  std::vector<double> v;
  std::istringstream in(ReadText(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.value("kind", "") == "train") v.push_back(j["lm_loss"].get<double>());
  }
  if (v.size() > n) v.erase(v.begin(), v.end() - static_cast<std::ptrdiff_t>(n));
  return v;
}

using keel_test::MaxDiff;

// The end of run at P = 2 and T = 2 x P = 2 joins the model on no rank: the sample is generated
// through the stages, each token sent back to all, and is the text the one-process run prints;
// the fingerprint is streamed to one rank tensor by tensor, and on an untied model at T = 1 (the
// same arithmetic bits) is the one-process value. Each is printed once.
TEST(PipelineCheckpointCliTest, EndOfRunSampleAndFingerprintAreTheOneProcessRuns) {
  const std::string args =
      " --untie-embeddings-and-output-weights --train-iters 4 --sample-tokens 16 ";
  auto sample = [](const std::string& out) {
    std::smatch m;
    if (!std::regex_search(out, m, std::regex(R"(sample \(temperature [^\n]*\n([^\n]*))")))
      return std::string("(none)");
    return m[1].str();
  };
  auto count = [](const std::string& out, const std::string& what) {
    size_t n = 0;
    for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
    return n;
  };
  const KeelResult one = Train(1, args);
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_NE(sample(one.out), "(none)") << one.out;
  ASSERT_NE(Fingerprint(one.out), "(none)") << one.out;
  const KeelResult pp = Train(2, "--pipeline-model-parallel-size 2" + args);
  ASSERT_EQ(pp.code, 0) << pp.out;
  EXPECT_EQ(sample(pp.out), sample(one.out)) << pp.out;
  EXPECT_EQ(Fingerprint(pp.out), Fingerprint(one.out)) << pp.out;
  const KeelResult tp = Train(4, kTp2Pp2 + args);
  ASSERT_EQ(tp.code, 0) << tp.out;
  EXPECT_EQ(sample(tp.out), sample(one.out)) << tp.out;
  for (const KeelResult* r : {&pp, &tp}) {
    EXPECT_EQ(count(r->out, "state fingerprint: "), 1u) << r->out;
    EXPECT_EQ(count(r->out, "sample (temperature"), 1u) << r->out;
  }
}

TEST(PipelineCheckpointCliTest, SavedAtTp2Pp2ResumesAtEveryOtherLayoutWithTheReshardNote) {
  const std::string dir = FreshTempDir("pp_resume");
  const std::string args = "--train-iters 8 --save-interval 4 --save ";
  const KeelResult full = Train(4, kTp2Pp2 + args + dir + "/full");
  ASSERT_EQ(full.code, 0) << full.out;
  const std::vector<double> ref = Losses(full.out);
  ASSERT_EQ(ref.size(), 8u) << full.out;
  ASSERT_EQ(Train(4, kTp2Pp2 + "--exit-interval 4 " + args + dir + "/a").code, 0);
  const std::string ck = dir + "/a/iter_0000004/";
  for (const char* f : {"model.tp-01-of-02.pp-001-of-002.safetensors",
                        "optimizer.tp-00-of-02.pp-001-of-002.dp-000-of-001.safetensors"})
    ASSERT_TRUE(fs::exists(ck + f)) << f;
  struct Resume {
    int np;
    std::string flags, layout;
  };
  const std::vector<Resume> resumes = {{1, "", "T=1 x P=1 x D=1"},
                                       {4, "--pipeline-model-parallel-size 2 ", "T=1 x P=2 x D=2"},
                                       {4, "--tensor-model-parallel-size 2 ", "T=2 x P=1 x D=2"},
                                       {4, "--tensor-model-parallel-size 4 ", "T=4 x P=1 x D=1"}};
  for (size_t i = 0; i < resumes.size(); ++i) {
    const Resume& r = resumes[i];
    const std::string run = dir + "/r" + std::to_string(i);
    fs::copy(dir + "/a", run, fs::copy_options::recursive);
    const KeelResult res = Train(r.np, r.flags + args + run);
    ASSERT_EQ(res.code, 0) << res.out;
    EXPECT_NE(res.out.find("note: " + run + "/iter_0000004 was saved at T=2 x P=2 x D=1 and is " +
                           "loaded at " + r.layout),
              std::string::npos)
        << res.out;
    ASSERT_EQ(Losses(res.out).size(), 4u) << res.out;
    const double d = MaxDiff(MetricsLosses(dir + "/full", 4), MetricsLosses(run, 4));
    std::printf("saved at T=2 x P=2, resumed at %s: max |loss - uninterrupted run's| = %.3g\n",
                r.layout.c_str(), d);
    EXPECT_LT(d, 2e-4);
  }
  // A missing moment piece and a damaged weights piece: refused naming the file (exit 1, as any
  // unusable checkpoint), at another layout (--load: no fallback to an older one) and at the
  // same (the newest checkpoint set aside, none older to fall back to).
  fs::copy(dir + "/a", dir + "/m", fs::copy_options::recursive);
  fs::copy(dir + "/a", dir + "/d", fs::copy_options::recursive);
  const std::string moments = "optimizer.tp-01-of-02.pp-001-of-002.dp-000-of-001.safetensors";
  const std::string weights = "model.tp-00-of-02.pp-001-of-002.safetensors";
  fs::remove(dir + "/m/iter_0000004/" + moments);
  {
    std::fstream f(dir + "/d/iter_0000004/" + weights,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-8, std::ios::end);
    f.write("garbage!", 8);
  }
  KeelResult r =
      Train(1, "--train-iters 8 --load " + dir + "/m/iter_0000004 --save " + dir + "/m1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(moments + " is missing"), std::string::npos) << r.out;
  r = Train(4, kTp2Pp2 + "--train-iters 8 --save " + dir + "/d");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(weights + ": xxh3 checksum"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/d/iter_0000008"));
  fs::remove_all(dir);
}

// verify / inspect / diff / export --hf on checkpoints a T=2 x P=2 job wrote. Iterations 1-2 get
// a NaN gradient (skipped, no update) at both layouts, so the checkpoints of iteration 2 hold the
// initial weights, which are the same at every layout: exporting either gives the same bytes.
TEST(PipelineCheckpointCliTest, CkptToolsReadTp2Pp2AndImportTrainsAtTp2Pp2) {
  const std::string dir = FreshTempDir("pp_tools");
  const std::string env = "KEEL_TRAIN_FAULTS=nan-grad=1-2 ";
  const std::string args = "--train-iters 4 --save-interval 2 --save ";
  ASSERT_EQ(Train(1, args + dir + "/one", env).code, 0);
  const KeelResult pp = Train(4, kTp2Pp2 + args + dir + "/pp", env);
  ASSERT_EQ(pp.code, 0) << pp.out;
  const std::string ck = dir + "/pp/iter_0000002", one = dir + "/one/iter_0000002";
  KeelResult r = RunShell(kKeel + " ckpt verify " + dir + "/pp");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("saved at T=2 x P=2 x D=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 of 2 checkpoints verified"), std::string::npos) << r.out;
  r = RunShell(kKeel + " ckpt inspect " + ck + " model.layers.1.mlp.dense_h_to_4h.weight");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("model.layers.1.mlp.dense_h_to_4h.weight: F32 [256,64]"), std::string::npos)
      << r.out;
  // The same tensors, whole; only the layout's config and state values differ (exit 1 for them).
  r = RunShell(kKeel + " ckpt diff " + one + " " + ck);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("state optimizer.tensor_parallel_size: 1 -> 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: layout T=1 x P=1 x D=1 -> T=2 x P=2 x D=1"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("0 of 84 tensors differ"), std::string::npos) << r.out;
  r = RunShell(kKeel + " ckpt diff " + ck + " " + dir + "/pp/iter_0000004");
  EXPECT_EQ(r.code, 1) << r.out;  // two trained iterations later
  EXPECT_NE(r.out.find("tensor layers.1.mlp.dense_h_to_4h.weight: max |a-b|"), std::string::npos)
      << r.out;
  ASSERT_EQ(RunShell(kKeel + " ckpt export " + ck + " --hf " + dir + "/hf_pp").code, 0);
  ASSERT_EQ(RunShell(kKeel + " ckpt export " + one + " --hf " + dir + "/hf_one").code, 0);
  const std::string exported = ReadText(dir + "/hf_pp/model.safetensors");
  EXPECT_GT(exported.size(), 1000000u);
  EXPECT_TRUE(exported == ReadText(dir + "/hf_one/model.safetensors"));

  // The Hugging Face folder imported, then trained at T=2 x P=2 and on one process: the same
  // losses within fp32 tolerance.
  r = RunShell(kKeel + " ckpt import --hf " + dir + "/hf_pp --save " + dir + "/imp");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string from = "--config " + dir + "/imp/model.toml --load " + dir +
                           "/imp --train-iters 6 --save-interval 3 --save ";
  const KeelResult a = Train(4, kTp2Pp2 + from + dir + "/imp_pp");
  const KeelResult b = Train(1, from + dir + "/imp_one");
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(a.out.find("was imported from Hugging Face"), std::string::npos) << a.out;
  ASSERT_EQ(Losses(a.out).size(), 6u) << a.out;
  const double d = MaxDiff(MetricsLosses(dir + "/imp_one", 6), MetricsLosses(dir + "/imp_pp", 6));
  std::printf("imported, T=2 x P=2 vs one process: max |loss difference| = %.3g\n", d);
  EXPECT_LT(d, 2e-4);
  EXPECT_EQ(RunShell(kKeel + " ckpt verify " + dir + "/imp_pp/iter_0000006").code, 0);
  fs::remove_all(dir);
}

// Rank 2 (stage 1, tp 0) kills itself with SIGKILL at iteration 6: mpirun ends the whole job
// (non-zero, promptly), and the same command resumes from iteration 4 with the same iteration
// lines and state fingerprint as a run that was never interrupted.
TEST(PipelineCheckpointCliTest, KilledRankEndsTheJobAndTheResumeIsBitExact) {
  const std::string dir = FreshTempDir("pp_kill");
  const std::string args = kTp2Pp2 + "--train-iters 10 --save-interval 4 --save ";
  const auto t0 = std::chrono::steady_clock::now();
  const KeelResult killed = Train(4, args + dir + "/k", "KEEL_TRAIN_FAULTS=kill=6:rank=2 ");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(killed.code, 0) << killed.out;
  EXPECT_NE(killed.code, 124) << "the job did not end by itself\n" << killed.out;  // timeout's
  EXPECT_LT(secs, 60) << killed.out;
  EXPECT_NE(killed.out.find("fault: rank 2 kills itself (SIGKILL) at iteration 6"),
            std::string::npos)
      << killed.out;
  ASSERT_TRUE(fs::exists(dir + "/k/iter_0000004"));
  EXPECT_FALSE(fs::exists(dir + "/k/iter_0000008"));
  const KeelResult resumed = Train(4, args + dir + "/k");
  const KeelResult full = Train(4, args + dir + "/full");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  ASSERT_EQ(full.code, 0) << full.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  const std::vector<std::string> all = IterationLines(full.out), tail = IterationLines(resumed.out);
  ASSERT_EQ(all.size(), 10u) << full.out;
  EXPECT_EQ(tail, std::vector<std::string>(all.begin() + 4, all.end()));
  EXPECT_EQ(Fingerprint(resumed.out), Fingerprint(full.out));
  EXPECT_NE(Fingerprint(full.out), "(none)");
  fs::remove_all(dir);
}

// Rank 2 (stage 1) hangs inside its first pipeline send of iteration 5 (KEEL_TRAIN_FAULTS
// hang-send): every rank dumps, the job exits 4, and `keel hangs analyze` names rank 2, its
// coordinates and stage, and the send.
TEST(PipelineCheckpointCliTest, RankHungInsideAPipelineSendIsNamedWithItsStage) {
  const std::string dir = FreshTempDir("pp_hang");
  const KeelResult r = Train(4,
                             kTp2Pp2 + "--train-iters 10 --save-interval 0 --save " + dir +
                                 " --distributed-timeout-minutes 0.0667 "
                                 "--first-iteration-timeout-minutes 1",
                             "KEEL_TRAIN_FAULTS=hang-send=5:rank=2 ");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("fault: rank 2 hangs inside the pipeline send-to-0 in iteration 5"),
            std::string::npos)
      << r.out;
  const std::string hangs = dir + "/hangs/iter_5";
  for (int rank = 0; rank < 4; ++rank) {
    const std::string dump = ReadText(hangs + "/rank-00" + std::to_string(rank) + ".txt");
    ASSERT_FALSE(dump.empty()) << "rank " << rank << " wrote no dump\n" << r.out;
    EXPECT_NE(dump.find("group pipeline-p2p:"), std::string::npos) << dump;
  }
  EXPECT_NE(ReadText(hangs + "/rank-002.txt").find("mesh: dp 0, pp 1, tp 0"), std::string::npos);
  // Given the run directory, it analyzes the newest hang and says which.
  const KeelResult a = RunShell(kKeel + " hangs analyze " + dir);
  EXPECT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("note: " + dir + " is a run directory: analyzing its newest hang, " + hangs),
            std::string::npos)
      << a.out;
  EXPECT_TRUE(std::regex_search(
      a.out, std::regex(R"(rank 2 \(host [^;]+; dp 0, pp 1, tp 0: pipeline stage 1 of 2\) is )"
                        R"(stuck inside the pipeline group's send-to-0 of iteration 5)")))
      << a.out;
  const KeelResult j = RunShell(kKeel + " hangs analyze --json " + hangs + " 2>/dev/null");
  ASSERT_EQ(j.code, 0) << j.out;
  EXPECT_EQ(json::parse(j.out)["stuck"], json::array({2})) << j.out;
  fs::remove_all(dir);
}

// The guard's model of GuardCliTest with 2 layers (one per stage).
const std::string kGuardModel =
    "train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 10 "
    "--eval-interval 1000 --eval-iters 1 --sample-tokens 0 --threads 1 --save-interval 20 "
    "--train-iters 150 --lr 5e-3 --guard-max-data-skips 3";

std::vector<std::string> GuardEvents(const std::string& run) {
  return keel_test::GuardDecisionEvents(ReadText(run + "/events.jsonl"));
}

std::vector<json> LossFields(const std::string& run) {
  std::vector<json> v;
  std::istringstream in(ReadText(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.value("kind", "") == "train") v.push_back(j["lm_loss"]);
  }
  return v;
}

TEST(PipelineCheckpointCliTest, PoisonedWindowAtTp2Pp2IsHandledAsOnOneProcess) {
  const std::string dir = FreshTempDir("pp_guard_poison");
  const std::string env = "KEEL_TRAIN_FAULTS=poison=61-72 ";
  const KeelResult one = RunShell(env + kKeel + " " + kGuardModel + " --save " + dir + "/one");
  const KeelResult pp = RunShell(env + Mpirun(4, "", 240) + kKeel + " " + kGuardModel + kTp2Pp2 +
                                 " --save " + dir + "/pp");
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(pp.code, 0) << pp.out;
  for (const KeelResult* r : {&one, &pp}) {
    EXPECT_NE(r->out.find("guard: iteration 61: lm loss jumped from"), std::string::npos) << r->out;
    EXPECT_NE(r->out.find("rolled back to iteration 60 (checkpoint pinned), skipping iterations "
                          "61..111 (samples 480..887)"),
              std::string::npos)
        << r->out;
  }
  // The same decisions, journaled at the same points, and the same end state.
  EXPECT_EQ(GuardEvents(dir + "/pp"), GuardEvents(dir + "/one"));
  for (const char* run : {"/one", "/pp"}) {
    const json state = json::parse(ReadText(dir + run + "/iter_0000150/state.json"));
    EXPECT_EQ(state["guard"]["healthy"], true) << run;
    EXPECT_EQ(state["data"]["skipped_iteration_ranges"], json::parse("[[61, 111]]")) << run;
    EXPECT_EQ(state["counters"]["data_skipped_iterations"], 51) << run;
  }
  // Every rank took the decisions, the last stage's second tensor rank too.
  const std::string rank3 = ReadText(dir + "/pp/logs/rank-003.log");
  EXPECT_NE(rank3.find("rolled back to iteration 60"), std::string::npos) << rank3;
  const std::vector<json> l1 = LossFields(dir + "/one"), l2 = LossFields(dir + "/pp");
  ASSERT_EQ(l1.size(), 150u);
  ASSERT_EQ(l2.size(), 150u);
  double d = 0;
  for (size_t i = 0; i < l1.size(); ++i) {
    ASSERT_EQ(l1[i].is_number(), l2[i].is_number()) << "iteration " << i + 1;
    if (l1[i].is_number()) d = std::max(d, std::fabs(l1[i].get<double>() - l2[i].get<double>()));
  }
  std::printf(
      "poisoned window at T=2 x P=2: max |loss - one process's| = %.3g over 150 "
      "iterations\n",
      d);
  EXPECT_LT(d, 1e-3);
  fs::remove_all(dir);
}

}  // namespace
