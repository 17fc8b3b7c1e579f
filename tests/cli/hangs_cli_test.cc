// `keel hangs analyze DIR` as a user runs it on a hang directory: the groups and the odd one out,
// --json, and clear refusals of paths that are not hang directories and of garbled dumps; and on
// the dumps of a real tensor x pipeline parallel job under mpirun (one rank hung, who waits for
// it where).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "keel_process.h"
#include "watchdog/hang_dump.h"

namespace {

namespace fs = std::filesystem;
using keel_test::RunKeelShell;

keel::HangDump Dump(int rank, bool odd) {
  keel::HangDump d;
  d.rank = rank;
  d.world_size = 4;
  d.host = rank < 2 ? "node1" : "node2";
  d.pid = 500 + rank;
  d.fired_here = rank == 0;
  d.reason = "why";
  d.phase = odd ? "data wait" : "reduce";
  d.iteration = 20;
  d.phase_seconds = 700;
  for (uint64_t s = 1; s <= 9; ++s) d.collectives.push_back({s, "all-gather", 64, 100, 1, false});
  if (!odd) d.collectives.push_back({10, "reduce-scatter", 4096, 600, 0, true});
  d.digest = {d.collectives.back().seq, 99};
  d.threads = {{500 + rank,
                "keel",
                false,
                {odd ? "keel::SamplePrefetcher::Get(long)+0x1 (keel+0x2)"
                     : "keel::MpiCommunicator::ReduceScatter()+0x1 (keel+0x2)",
                 "keel::Trainer::TrainStep()+0x1 (keel+0x3)", "main+0x1 (keel+0x4)"}}};
  return d;
}

class HangsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = keel_test::FreshTempDir("hangs_cli") + "/hangs/iter_20";
    fs::create_directories(dir_);
    for (int r : {0, 1, 3})  // rank 2 left no dump
      std::ofstream(dir_ + "/" + keel::HangDumpFileName(r))
          << keel::FormatHangDump(Dump(r, r == 1));
  }
  void TearDown() override { fs::remove_all(fs::path(dir_).parent_path().parent_path()); }
  std::string dir_;
};

TEST_F(HangsCliTest, AnalyzeNamesTheOddOneOutAndTheMissingRank) {
  auto r = RunKeelShell("", "hangs analyze " + dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("hang dumps of 3 of 4 ranks; the watchdog fired on rank 0: why"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  2 ranks 0,3: in reduce-scatter #10 (reduce of iteration 20)\n"
                       "      main thread: keel::MpiCommunicator::ReduceScatter() <- "
                       "keel::Trainer::TrainStep()\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("odd ones out:\n  rank 1 (host node1) is in data wait of iteration 20 "
                       "after collective #9; the other 2 ranks are in reduce-scatter #10\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("missing dumps:\n  rank 2: no dump"), std::string::npos) << r.out;

  r = RunKeelShell("", "hangs analyze --json " + dir_ + " 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dir"], dir_);
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["groups"].size(), 2u);
  EXPECT_EQ(j["groups"][1]["ranks"], nlohmann::json::array({1}));
  EXPECT_EQ(j["missing"][0]["first"], 2);
  EXPECT_EQ(j["missing"][0]["last"], 2);

  r = RunKeelShell("", "--help");
  EXPECT_NE(r.out.find("\n  hangs "), std::string::npos) << r.out;
}

TEST_F(HangsCliTest, BadPathsAndGarbledDumpsAreRefusedByName) {
  auto r = RunKeelShell("", "hangs analyze " + dir_ + "/missing");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: no hang directory " + dir_ + "/missing"), std::string::npos)
      << r.out;

  r = RunKeelShell("", "hangs analyze " + fs::path(dir_).parent_path().string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("`keel hangs analyze " + dir_ + "`"), std::string::npos) << r.out;

  std::ofstream(dir_ + "/rank-002.txt") << "\x7f"
                                           "ELF\x02\x01 garbage\n\n";
  r = RunKeelShell("", "hangs analyze " + dir_);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: " + dir_ + "/rank-002.txt: line 1: not a keel hang dump"),
            std::string::npos)
      << r.out;

  r = RunKeelShell("", "hangs");
  EXPECT_NE(r.code, 0) << r.out;
}

// T=2 x P=2 under `mpirun -np 4` (tiny model, one thread per rank, a 4 s watchdog): rank 3
// (dp 0, pp 1, tp 1: the last stage) stops after its backward of iteration 3 without entering
// another collective. Every rank dumps and the job exits 4; `keel hangs analyze` names rank 3
// with its host, coordinates and stage as inside no collective, holding up ranks 0-2, and where
// those wait: the world's gradient-norm all-reduce (its sequence number, its ranks, rank 3 not
// in it), not a generic "all-reduce-sum". --json has the same facts.
TEST(HangsMeshCliTest, RankHungUnderTensorAndPipelineParallelismIsNamedWithWhereTheOthersWait) {
  const std::string save = keel_test::FreshTempDir("hangs_tp2pp2");
  const keel_test::KeelResult r = keel_test::RunShell(
      "KEEL_TRAIN_FAULTS=hang=3:rank=3 " + keel_test::Mpirun(4, "", 60) + KEEL_BINARY + " " +
      keel_test::kDataParallelModel +
      " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --train-iters 6 "
      "--save-interval 0 --save " +
      save + " --distributed-timeout-minutes 0.0667 --first-iteration-timeout-minutes 1");
  EXPECT_EQ(r.code, 4) << r.out;
  const std::string dir = save + "/hangs/iter_3";
  for (int rank = 0; rank < 4; ++rank)
    ASSERT_TRUE(fs::exists(dir + "/" + keel::HangDumpFileName(rank)))
        << "rank " << rank << " wrote no dump\n"
        << r.out;

  const keel_test::KeelResult a = RunKeelShell("", "hangs analyze " + dir);
  EXPECT_EQ(a.code, 0) << a.out;
  EXPECT_TRUE(std::regex_search(
      a.out, std::regex(R"(who waits for whom:\n  rank 3 \(host [^;]+; dp 0, pp 1, tp 1: )"
                        R"(pipeline stage 1 of 2\) is inside no collective: in backward of )"
                        R"(iteration 3 after collective #\d+ .*; ranks 0-2 wait for it)")))
      << a.out;
  EXPECT_TRUE(std::regex_search(
      a.out, std::regex(R"(\n  ranks 0-2 \(host [^)]+\) wait in the world \(ranks 0-3\) in its )"
                        R"(all-reduce-sum #\d+ of iteration 3 \(for [0-9.]+ s\): rank 3 has not )"
                        R"(entered it: it is in backward of iteration 3)")))
      << a.out;
  EXPECT_NE(a.out.find("3 ranks 0-2: in the world's all-reduce-sum #"), std::string::npos) << a.out;

  const keel_test::KeelResult j = RunKeelShell("", "hangs analyze --json " + dir + " 2>/dev/null");
  ASSERT_EQ(j.code, 0) << j.out;
  const nlohmann::json v = nlohmann::json::parse(j.out);
  EXPECT_EQ(v["hung"], nlohmann::json::array({3})) << j.out;
  EXPECT_EQ(v["hung_ranks"][0]["mesh"], "dp 0, pp 1, tp 1") << j.out;
  EXPECT_EQ(v["hung_ranks"][0]["stage"], 1) << j.out;
  EXPECT_EQ(v["hung_ranks"][0]["waited_for_by"], nlohmann::json::array({0, 1, 2})) << j.out;
  ASSERT_EQ(v["waits"].size(), 1u) << j.out;
  EXPECT_EQ(v["waits"][0]["group"], "world") << j.out;
  EXPECT_EQ(v["waits"][0]["ranks"], nlohmann::json::array({0, 1, 2})) << j.out;
  EXPECT_EQ(v["waits"][0]["not_entered"], nlohmann::json::array({3})) << j.out;
  EXPECT_EQ(v["groups"][0]["collective"]["group"], "world") << j.out;
  fs::remove_all(save);
}

}  // namespace
