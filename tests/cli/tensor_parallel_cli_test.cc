// Tensor parallelism end to end: `keel train --tensor-model-parallel-size 2` under `mpirun -np 2`
// and `-np 4` (T=2 x D=2, oversubscribed, one thread per rank) against the one-process run;
// checkpoints saved at T=2 resumed at T=1 and at T=2 x D=2 (the reshard note); a missing or
// damaged piece refused naming it; layouts the rules refuse (exit 2 before any work). Every mpirun
// runs under `timeout`.
#include <gtest/gtest.h>

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
namespace fs = std::filesystem;

const std::string kModel = keel_test::kDataParallelModel;
const std::string kTp2 = " --tensor-model-parallel-size 2 ";

KeelResult Train(int np, const std::string& args) {
  const std::string keel = std::string(KEEL_BINARY) + " " + kModel + " " + args;
  if (np == 1) return RunShell(keel);
  return RunShell(Mpirun(np) + keel);
}

std::string Fingerprint(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("state fingerprint: ([0-9a-f]{16})"))) return "(none)";
  return m[1].str();
}

std::vector<double> Losses(const std::string& out) {
  std::vector<double> v;
  const std::regex re(R"(iteration +\d+/ +\d+ \|.*\| lm loss: ([0-9.E+-]+) \|)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it)
    v.push_back(std::stod((*it)[1]));
  return v;
}

std::vector<double> MetricsLosses(const std::string& run) {
  std::vector<double> v;
  std::istringstream in(ReadText(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "train") v.push_back(j["lm_loss"].get<double>());
  }
  return v;
}

using keel_test::MaxDiff;

TEST(TensorParallelCliTest, LossesMatchOneProcessAtTp2AndTp2TimesDp2) {
  const std::string dir = FreshTempDir("tp_losses");
  const std::string args = "--train-iters 30 --save-interval 1000 --save " + dir;
  const KeelResult one = Train(1, args + "/one");
  const KeelResult tp = Train(2, kTp2 + args + "/tp");
  const KeelResult again = Train(2, kTp2 + "--train-iters 30");
  const KeelResult sp = Train(2, kTp2 + "--sequence-parallel " + args + "/sp");
  const KeelResult tpdp = Train(4, kTp2 + args + "/tpdp");
  for (const KeelResult* r : {&one, &tp, &again, &sp, &tpdp}) ASSERT_EQ(r->code, 0) << r->out;
  const std::vector<double> l1 = MetricsLosses(dir + "/one");
  ASSERT_EQ(l1.size(), 30u) << one.out;
  const double d_tp = MaxDiff(l1, MetricsLosses(dir + "/tp"));
  const double d_sp = MaxDiff(l1, MetricsLosses(dir + "/sp"));
  const double d_tpdp = MaxDiff(l1, MetricsLosses(dir + "/tpdp"));
  std::printf(
      "max |loss(1 process) - loss|: TP=2 %.3g, TP=2 with SP %.3g, TP=2 x DP=2 %.3g over "
      "30 iterations\n",
      d_tp, d_sp, d_tpdp);
  EXPECT_LT(d_tp, 1e-4);
  EXPECT_LT(d_sp, 1e-4);
  EXPECT_LT(d_tpdp, 1e-4);
  EXPECT_EQ(Fingerprint(tp.out), Fingerprint(again.out));  // the same bits run after run
  EXPECT_NE(tp.out.find("layout: tensor parallel 2 x pipeline parallel 1 x data parallel 1"),
            std::string::npos)
      << tp.out;
  // ZeRO-1 (on by default) with one data-parallel rank has nothing to shard: the line says so,
  // not "replicated (--use-distributed-optimizer=false)", which the config does not say.
  EXPECT_NE(tp.out.find("optimizer: ZeRO-1 on (--use-distributed-optimizer) but one data-parallel "
                        "rank, so nothing to shard: "),
            std::string::npos)
      << tp.out;
  EXPECT_EQ(tp.out.find("replicated (--use-distributed-optimizer=false)"), std::string::npos);
  EXPECT_NE(tpdp.out.find("optimizer: ZeRO-1 (--use-distributed-optimizer): "), std::string::npos)
      << tpdp.out;
  // A rank's log names its mesh coordinates.
  const std::string rank3 = ReadText(dir + "/tpdp/logs/rank-003.log");
  EXPECT_NE(
      rank3.find("layout: tensor parallel 2 x pipeline parallel 1 x data parallel 2; this rank is "
                 "dp 1, pp 0, tp 1"),
      std::string::npos)
      << rank3;
  // Each tensor rank writes its pieces; each (tp, dp) its moments; one manifest.
  const std::string ck = dir + "/tpdp/iter_0000030/";
  for (const char* f : {"model.tp-00-of-02.pp-000-of-001.safetensors",
                        "model.tp-01-of-02.pp-000-of-001.safetensors",
                        "optimizer.tp-01-of-02.pp-000-of-001.dp-001-of-002.safetensors"})
    EXPECT_TRUE(fs::exists(ck + f)) << f;
  EXPECT_FALSE(fs::exists(ck + "model.safetensors"));
  const KeelResult verify = RunShell(std::string(KEEL_BINARY) + " ckpt verify " + ck);
  EXPECT_EQ(verify.code, 0) << verify.out;
}

TEST(TensorParallelCliTest, SavedAtTp2ResumesAtOtherLayoutsWithTheReshardNote) {
  const std::string dir = FreshTempDir("tp_resume");
  const std::string args = "--train-iters 20 --save-interval 10 --save ";
  const KeelResult full = Train(2, kTp2 + args + dir + "/full");
  ASSERT_EQ(full.code, 0) << full.out;
  const std::vector<double> ref = Losses(full.out);
  ASSERT_EQ(ref.size(), 20u);
  ASSERT_EQ(Train(2, kTp2 + "--exit-interval 10 " + args + dir + "/a").code, 0);
  fs::copy(dir + "/a", dir + "/b", fs::copy_options::recursive);
  fs::copy(dir + "/a", dir + "/c", fs::copy_options::recursive);
  struct Resume {
    int np;
    std::string flags, run, layout;
  };
  for (const Resume& r :
       {Resume{1, "", "/a", "T=1 x P=1 x D=1"}, Resume{4, kTp2, "/b", "T=2 x P=1 x D=2"}}) {
    const KeelResult res = Train(r.np, r.flags + args + dir + r.run);
    ASSERT_EQ(res.code, 0) << res.out;
    EXPECT_NE(res.out.find("note: " + dir + r.run +
                           "/iter_0000010 was saved at T=2 x P=1 x D=1 "
                           "and is loaded at " +
                           r.layout),
              std::string::npos)
        << res.out;
    const std::vector<double> l = Losses(res.out);
    ASSERT_EQ(l.size(), 10u) << res.out;
    const double d = MaxDiff(std::vector<double>(ref.begin() + 10, ref.end()), l);
    std::printf("resumed at %s: max |loss - uninterrupted T=2's| = %.3g\n", r.layout.c_str(), d);
    EXPECT_LT(d, 2e-4);
  }
  // The same layout: the same bits as the uninterrupted run.
  const KeelResult same = Train(2, kTp2 + args + dir + "/c");
  ASSERT_EQ(same.code, 0) << same.out;
  EXPECT_EQ(Fingerprint(same.out), Fingerprint(full.out));
}

TEST(TensorParallelCliTest, AMissingOrDamagedPieceIsRefusedNamingIt) {
  const std::string dir = FreshTempDir("tp_damaged");
  const std::string args = "--train-iters 4 --save-interval 2 --save ";
  ASSERT_EQ(Train(2, kTp2 + "--exit-interval 2 " + args + dir + "/a").code, 0);
  fs::copy(dir + "/a", dir + "/b", fs::copy_options::recursive);
  const std::string piece = "model.tp-01-of-02.pp-000-of-001.safetensors";
  fs::remove(dir + "/a/iter_0000002/" + piece);
  {
    std::fstream f(dir + "/b/iter_0000002/" + piece,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-8, std::ios::end);
    f.write("garbage!", 8);
  }
  for (const char* run : {"/a", "/b"}) {
    // --load names the checkpoint: no fallback to an older one.
    const KeelResult r = Train(1, "--train-iters 4 --load " + dir + run + "/iter_0000002 --save " +
                                      dir + run + "-resumed");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(piece), std::string::npos) << run << ": " << r.out;
  }
}

// The padded vocabulary depends on T (a multiple of --make-vocab-size-divisible-by x T) but is
// the model's shape: a resume at another T keeps the checkpoint's padding when the new T splits
// it evenly (a note says so), and is refused naming the fix when it does not.
TEST(TensorParallelCliTest, ResumeAtAnotherTKeepsTheCheckpointsPaddedVocabulary) {
  const std::string dir = FreshTempDir("tp_padded_vocab");
  // The default corpus's 4096 tokens: 5994 rows at T=2 (multiple of 999 x 2), 4995 at T=1.
  const std::string args = "--make-vocab-size-divisible-by 999 --train-iters 4 --save ";
  ASSERT_EQ(Train(2, kTp2 + "--exit-interval 2 --save-interval 2 " + args + dir + "/a").code, 0);
  fs::copy(dir + "/a", dir + "/b", fs::copy_options::recursive);
  const KeelResult one = Train(1, args + dir + "/a");
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_NE(one.out.find("note: " + dir +
                         "/a/iter_0000002 pads the vocabulary of 4096 tokens to 5994 rows (saved "
                         "at tensor parallel 2); tensor parallel 1 would pad to 4995: keeping "
                         "the checkpoint's 5994"),
            std::string::npos)
      << one.out;
  EXPECT_NE(one.out.find("vocab 4096 (padded 5994)"), std::string::npos) << one.out;
  // T=4 cannot split 5994 rows: refused before any work, naming what to do.
  const KeelResult four = Train(4, "--tensor-model-parallel-size 4 " + args + dir + "/b");
  EXPECT_EQ(four.code, 2) << four.out;
  EXPECT_NE(four.out.find("which tensor parallel 4 cannot split evenly (5994 is not a multiple "
                          "of 4)"),
            std::string::npos)
      << four.out;
  EXPECT_NE(four.out.find("--pad-vocab-size-to"), std::string::npos) << four.out;
  EXPECT_FALSE(fs::exists(dir + "/b/iter_0000004"));
}

TEST(TensorParallelCliTest, LayoutsTheRulesRefuseExit2BeforeAnyWork) {
  // 3 heads do not split across 2 ranks.
  KeelResult r = Train(2, kTp2 + "--num-attention-heads 3 --hidden-size 66 --train-iters 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--tensor-model-parallel-size 2 must divide --num-attention-heads 3"),
            std::string::npos)
      << r.out;
  // 3 ranks are not a multiple of T=2.
  r = Train(3, kTp2 + "--train-iters 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the 3 MPI ranks is not a multiple of tensor parallel 2"), std::string::npos)
      << r.out;
  // One process, T=2.
  r = Train(1, kTp2 + "--train-iters 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the 1 MPI rank is not a multiple of tensor parallel 2"), std::string::npos)
      << r.out;
  // One process, P=2: a stage needs ranks of its own.
  r = Train(1, "--pipeline-model-parallel-size 2 --train-iters 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the 1 MPI rank is not a multiple of tensor parallel 1 x pipeline "
                       "parallel 2 = 2"),
            std::string::npos)
      << r.out;
}

}  // namespace
