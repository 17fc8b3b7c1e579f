// The analysis of a hang directory on synthetic dumps: groups, the odd ones out in a sentence,
// missing ranks, collectives the ranks disagree on; and the reading of a directory.
#include "watchdog/hang_analysis.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using keel::DumpedCollective;
using keel::HangAnalysis;
using keel::HangDump;

// Collectives 1..done finished, alternating reduce-scatter and all-gather (the last 64 kept, as
// the flight recorder keeps them), then `in_flight` if given.
std::vector<DumpedCollective> History(uint64_t done, const std::string& in_flight = "",
                                      uint64_t bytes = 4096) {
  std::vector<DumpedCollective> cs;
  for (uint64_t s = done > 64 ? done - 63 : 1; s <= done; ++s)
    cs.push_back({s, s % 2 ? "reduce-scatter" : "all-gather", 4096, 1000 + s, 10, false});
  if (!in_flight.empty()) cs.push_back({done + 1, in_flight, bytes, 5, 0, true});
  return cs;
}

HangDump Dump(int rank, int world, const std::string& phase, int64_t iteration,
              std::vector<DumpedCollective> cs, std::vector<std::string> main_frames) {
  HangDump d;
  d.rank = rank;
  d.world_size = world;
  d.host = rank < 4 ? "h1" : "h2";
  d.pid = 1000 + rank;
  d.fired_here = rank == 0;
  d.reason = d.fired_here ? "the main thread has been in reduce of iteration 20 for 601.0 s, "
                            "over its limit of 600 s"
                          : "rank 0's watchdog fired (iter_20); this rank dumped where it was";
  d.phase = phase;
  d.iteration = iteration;
  d.phase_seconds = 601;
  d.unix_time = 1714530000;
  d.collectives = std::move(cs);
  d.digest.count = d.collectives.empty() ? 0 : d.collectives.back().seq;
  d.digest.hash = d.digest.count * 7919;
  // A reducer thread first (lower TID than nothing: the rule must not pick it by order).
  keel::ThreadStack reducer{static_cast<int>(d.pid) + 1,
                            "keel-reduce",
                            false,
                            {"keel::GradientReducer::Worker()+0x10 (keel+0x100)"}};
  keel::ThreadStack main_thread{static_cast<int>(d.pid), "keel", false, {}};
  for (const std::string& f : main_frames) main_thread.frames.push_back(f + "+0x10 (keel+0x20)");
  main_thread.frames.push_back("main+0x40 (keel+0x30)");
  keel::ThreadStack watchdog{static_cast<int>(d.pid) + 2,
                             "keel-watchdog",
                             true,
                             {"keel::Watchdog::Fire()+0x10 (keel+0x200)"}};
  d.threads = {reducer, main_thread, watchdog};
  return d;
}

const std::vector<std::string> kInReduce = {
    "ompi_coll_base_alltoallv", "keel::MpiComm::Alltoallv()", "keel::GradientReducer::Finish()",
    "keel::Trainer::AccumulateGradients()", "keel::Trainer::TrainStep()"};
const std::vector<std::string> kInData = {"pthread_cond_wait", "keel::SamplePrefetcher::Get(long)",
                                          "keel::Trainer::AccumulateGradients()",
                                          "keel::Trainer::TrainStep()"};

TEST(HangAnalysisTest, TheOddOneOutAmongThreeRanks) {
  const std::vector<HangDump> dumps = {
      Dump(0, 3, "reduce", 20, History(1234, "reduce-scatter"), kInReduce),
      Dump(1, 3, "data wait", 20, History(1234), kInData),
      Dump(2, 3, "reduce", 20, History(1234, "reduce-scatter"), kInReduce)};
  const HangAnalysis a = keel::AnalyzeHangs(dumps);
  ASSERT_EQ(a.groups.size(), 2u);
  EXPECT_EQ(a.groups[0].ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(a.groups[0].state.seq, 1235u);
  EXPECT_TRUE(a.groups[0].state.in_flight);
  EXPECT_EQ(
      a.groups[0].state.frames,
      (std::vector<std::string>{"keel::MpiComm::Alltoallv()", "keel::GradientReducer::Finish()",
                                "keel::Trainer::AccumulateGradients()"}));
  EXPECT_EQ(a.groups[1].ranks, std::vector<int>{1});
  EXPECT_EQ(a.summary, "");
  ASSERT_EQ(a.odd_ones_out.size(), 1u);
  EXPECT_EQ(a.odd_ones_out[0],
            "rank 1 (host h1) is in data wait of iteration 20 after collective #1234; the other 2 "
            "ranks are in reduce-scatter #1235");
  EXPECT_TRUE(a.missing.empty());
  EXPECT_EQ(a.mismatch, "");
  EXPECT_EQ(a.fired, std::vector<int>{0});
}

TEST(HangAnalysisTest, TheOddOneOutAmongEightRanks) {
  std::vector<HangDump> dumps;
  for (int r = 0; r < 8; ++r)
    dumps.push_back(r == 5 ? Dump(r, 8, "data wait", 20, History(1234), kInData)
                           : Dump(r, 8, "reduce", 20, History(1234, "reduce-scatter"), kInReduce));
  const HangAnalysis a = keel::AnalyzeHangs(dumps);
  ASSERT_EQ(a.odd_ones_out.size(), 1u);
  EXPECT_EQ(a.odd_ones_out[0],
            "rank 5 (host h2) is in data wait of iteration 20 after collective #1234; the other 7 "
            "ranks are in reduce-scatter #1235");
  const std::string text = keel::FormatHangAnalysis(a);
  EXPECT_NE(text.find("  7 ranks 0-4,6,7: in reduce-scatter #1235 (reduce of iteration 20)\n"
                      "      main thread: keel::MpiComm::Alltoallv() <- "
                      "keel::GradientReducer::Finish() <- keel::Trainer::AccumulateGradients()\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  1 rank 5: in data wait of iteration 20 after collective #1234\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("collectives: the ranks' flight recorders agree"), std::string::npos);
  const auto j = keel::HangAnalysisJson(a);
  EXPECT_EQ(j["groups"][0]["ranks"].size(), 7u);
  EXPECT_EQ(j["groups"][1]["collective"]["seq"], 1234);
  EXPECT_EQ(j["groups"][1]["collective"]["in_flight"], false);
  EXPECT_EQ(j["odd_ones_out"][0], a.odd_ones_out[0]);
  EXPECT_TRUE(j["mismatch"].is_null());
}

TEST(HangAnalysisTest, ThreeGroupsSayHowManyOfTheOthersAreWhere) {
  std::vector<HangDump> dumps;
  for (int r = 0; r < 8; ++r) {
    if (r == 6 || r == 7)
      dumps.push_back(Dump(r, 8, "eval", 20, History(1234), {"keel::Evaluate()"}));
    else if (r == 1)
      dumps.push_back(Dump(r, 8, "data wait", 20, History(1234), kInData));
    else
      dumps.push_back(Dump(r, 8, "reduce", 20, History(1234, "reduce-scatter"), kInReduce));
  }
  const HangAnalysis a = keel::AnalyzeHangs(dumps);
  ASSERT_EQ(a.odd_ones_out.size(), 2u);
  EXPECT_EQ(a.odd_ones_out[0],
            "ranks 6,7 (host h2) are in eval of iteration 20 after collective #1234; 5 of the "
            "other 6 ranks are in reduce-scatter #1235");
  EXPECT_EQ(a.odd_ones_out[1].rfind("rank 1 (host h1) is in data wait", 0), 0u);
}

TEST(HangAnalysisTest, GroupsThatDifferOnlyInFramesAreToldApartByTheirFrames) {
  // The 176B eval deadlock: every rank in eval, one still loading a batch, the others in a
  // broadcast of the previous one.
  std::vector<HangDump> dumps;
  for (int r = 0; r < 4; ++r)
    dumps.push_back(Dump(r, 4, "eval", 45000, {},
                         r == 2
                             ? std::vector<std::string>{"keel::LoadEvalBatch()", "keel::Evaluate()"}
                             : std::vector<std::string>{"keel::Broadcast()", "keel::Evaluate()"}));
  const HangAnalysis a = keel::AnalyzeHangs(dumps);
  ASSERT_EQ(a.odd_ones_out.size(), 1u);
  EXPECT_EQ(a.odd_ones_out[0],
            "rank 2 (host h1) is in eval of iteration 45000 before any collective at "
            "keel::LoadEvalBatch(); the other 3 ranks are in eval of iteration 45000 before any "
            "collective at keel::Broadcast()");
  // Both waiting in the same place, for different reasons: the first frame that differs.
  for (HangDump& d : dumps)
    d.threads[1].frames.insert(d.threads[1].frames.begin(), "keel::Wait()+0x1 (keel+0x1)");
  const HangAnalysis b = keel::AnalyzeHangs(dumps);
  ASSERT_EQ(b.odd_ones_out.size(), 1u);
  EXPECT_NE(b.odd_ones_out[0].find("before any collective at keel::LoadEvalBatch(); the other"),
            std::string::npos)
      << b.odd_ones_out[0];
}

TEST(HangAnalysisTest, AllRanksTheSame) {
  std::vector<HangDump> dumps;
  for (int r = 0; r < 4; ++r)
    dumps.push_back(Dump(r, 4, "reduce", 20, History(1234, "reduce-scatter"), kInReduce));
  const HangAnalysis a = keel::AnalyzeHangs(dumps);
  ASSERT_EQ(a.groups.size(), 1u);
  EXPECT_TRUE(a.odd_ones_out.empty());
  EXPECT_EQ(a.summary,
            "all 4 ranks are in reduce-scatter #1235 (reduce of iteration 20), main thread at "
            "keel::MpiComm::Alltoallv()");
  EXPECT_NE(keel::FormatHangAnalysis(a).find(a.summary), std::string::npos);
}

// A lost host's ranks are one sentence, not one each; a dump claiming a huge world stays short.
TEST(HangAnalysisTest, ConsecutiveMissingRanksAreOneSentence) {
  std::vector<HangDump> dumps;
  for (int r : {0, 5})
    dumps.push_back(Dump(r, 1 << 20, "reduce", 20, History(1234, "reduce-scatter"), kInReduce));
  const HangAnalysis a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.missing.size(), (1u << 20) - 2);
  ASSERT_EQ(a.missing_sentences.size(), 2u);
  EXPECT_EQ(a.missing_sentences[0],
            "ranks 1-4: no dump — their processes did not answer (stopped, or their hosts are "
            "gone)");
  EXPECT_EQ(a.missing_sentences[1].rfind("ranks 6-1048575: no dump", 0), 0u);
  const nlohmann::json j = keel::HangAnalysisJson(a);
  ASSERT_EQ(j["missing"].size(), 2u);
  EXPECT_EQ(j["missing"][1]["first"], 6);
  EXPECT_EQ(j["missing"][1]["last"], (1 << 20) - 1);
  EXPECT_LT(keel::FormatHangAnalysis(a).size(), 4096u);
}

TEST(HangAnalysisTest, RanksWithoutADumpAreNamed) {
  std::vector<HangDump> dumps;
  for (int r : {0, 1, 2})
    dumps.push_back(Dump(r, 4, "reduce", 20, History(1234, "reduce-scatter"), kInReduce));
  const HangAnalysis a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.world_size, 4);
  EXPECT_EQ(a.missing, std::vector<int>{3});
  ASSERT_EQ(a.missing_sentences.size(), 1u);
  EXPECT_EQ(a.missing_sentences[0],
            "rank 3: no dump — its process did not answer (stopped, or its host is gone)");
  EXPECT_EQ(a.summary.rfind("the 3 ranks that dumped are in reduce-scatter #1235", 0), 0u)
      << a.summary;
  const std::string text = keel::FormatHangAnalysis(a);
  EXPECT_NE(text.find("hang dumps of 3 of 4 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("missing dumps:\n  rank 3: no dump"), std::string::npos) << text;
}

TEST(HangAnalysisTest, TheFirstCollectiveTheRanksDisagreeOnIsNamed) {
  std::vector<HangDump> dumps = {
      Dump(0, 3, "reduce", 20, History(1234, "all-reduce-sum", 16), kInReduce),
      Dump(1, 3, "reduce", 20, History(1234, "all-gather", 4096), kInReduce),
      Dump(2, 3, "reduce", 20, History(1234, "all-reduce-sum", 16), kInReduce)};
  HangAnalysis a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.mismatch,
            "collective #1235 does not match: ranks 0,2 ran all-reduce-sum (16 B), rank 1 ran "
            "all-gather (4096 B): a rank skipped or added a collective");
  EXPECT_NE(keel::FormatHangAnalysis(a).find("collectives: " + a.mismatch), std::string::npos);
  // An earlier difference inside the window is the one named.
  dumps[2].collectives[10].bytes = 8;
  a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.mismatch.rfind(fmt::format("collective #{} does not match: ranks 0,1 ran ",
                                         dumps[2].collectives[10].seq),
                             0),
            0u)
      << a.mismatch;
}

// A plain gather sends each rank's own list (checkpoint file names, host names): sizes that
// differ there are not a mismatch.
TEST(HangAnalysisTest, PlainGathersOfDifferentSizesMatch) {
  std::vector<HangDump> dumps = {
      Dump(0, 2, "reduce", 20, History(1234, "all-gather-bytes", 230), kInReduce),
      Dump(1, 2, "reduce", 20, History(1234, "all-gather-bytes", 65), kInReduce)};
  EXPECT_EQ(keel::AnalyzeHangs(dumps).mismatch, "");
  dumps[1].collectives.back().kind = "all-reduce-sum";
  EXPECT_NE(keel::AnalyzeHangs(dumps).mismatch, "");
}

TEST(HangAnalysisTest, DifferentCountsWhileNoRankIsInACollective) {
  std::vector<HangDump> dumps = {Dump(0, 3, "data wait", 20, History(100), kInData),
                                 Dump(1, 3, "data wait", 20, History(99), kInData),
                                 Dump(2, 3, "data wait", 20, History(100), kInData)};
  HangAnalysis a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.mismatch,
            "the ranks ran different numbers of collectives and none is in one (ranks 0,2 100, "
            "rank 1 99): a rank skipped or added a collective");
  // With a rank inside a collective, different counts are what a hang looks like: no mismatch.
  dumps[1].collectives = History(99, "reduce-scatter");
  dumps[1].digest.count = 100;
  dumps[1].digest.hash = dumps[0].digest.hash;
  dumps[1].collectives.back().kind = "all-gather";  // what #100 is on the others
  a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.mismatch, "");
  // The same count with different digests: a difference before the window.
  dumps[1].digest.hash += 1;
  a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.mismatch.rfind("the collective digests differ after the same 100 collectives", 0), 0u)
      << a.mismatch;
}

// T=2 x P=2: rank 2 (stage 1) is stuck inside its send of a gradient to stage 0, whose rank 0
// waits in the matching receive; ranks 1 and 3 wait in their tensor groups' all-reduces. The
// pipeline-p2p sections name rank 2, its coordinates and stage, and the send.
TEST(HangAnalysisTest, RankStuckInsideAPipelineSendIsNamedWithItsStage) {
  const std::vector<std::string> meshes = {"dp 0, pp 0, tp 0", "dp 0, pp 0, tp 1",
                                           "dp 0, pp 1, tp 0", "dp 0, pp 1, tp 1"};
  const std::vector<std::string> p2p = {"recv-from-1", "", "send-to-0", ""};
  std::vector<HangDump> dumps;
  for (int r = 0; r < 4; ++r) {
    // Rank 0 waits inside MPI's receive; rank 2 never reached MPI's send.
    const std::vector<std::string> frames =
        r == 0   ? std::vector<std::string>{"PMPI_Recv", "keel::RecordingCommunicator::Recv()"}
        : r == 2 ? std::vector<std::string>{"nanosleep", "keel::RecordingCommunicator::Send()"}
                 : kInReduce;
    HangDump d = Dump(r, 4, r % 2 ? "backward" : "reduce", 5, History(41), frames);
    d.mesh = meshes[r];
    keel::GroupCollectives tensor{"tensor", {}, History(126, r % 2 ? "all-reduce-sum-floats" : "")};
    keel::GroupCollectives pipe{"pipeline-p2p", {}, {{57, "send-to-1", 4096, 900, 5, false}}};
    if (!p2p[r].empty()) pipe.collectives.push_back({58, p2p[r], 4096, 4200000, 0, true});
    d.groups = {tensor, pipe};
    dumps.push_back(d);
  }
  HangAnalysis a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.stuck, std::vector<int>{2});
  ASSERT_EQ(a.transfers.size(), 1u);
  EXPECT_EQ(a.transfers[0],
            "rank 2 (host h1; dp 0, pp 1, tp 0: pipeline stage 1 of 2) is stuck inside the "
            "pipeline group's send-to-0 of iteration 5 (for 4.2 s): rank 0 (stage 0) waits in the "
            "matching recv-from-1, so the data never left rank 2; it holds up the job (its "
            "stacks: rank-002.txt)");
  EXPECT_NE(keel::FormatHangAnalysis(a).find("pipeline transfers:\n  rank 2 (host h1; dp 0, "
                                             "pp 1, tp 0: pipeline stage 1 of 2) is stuck"),
            std::string::npos);
  EXPECT_EQ(keel::HangAnalysisJson(a)["stuck"], nlohmann::json::array({2}));

  // The stacks the other way round: rank 0 is stuck inside its receive, rank 2 waits in MPI.
  std::vector<HangDump> swapped = dumps;
  std::swap(swapped[0].threads[1].frames, swapped[2].threads[1].frames);  // main threads
  a = keel::AnalyzeHangs(swapped);
  EXPECT_EQ(a.stuck, std::vector<int>{0});
  ASSERT_EQ(a.transfers.size(), 1u);
  EXPECT_NE(a.transfers[0].find("rank 0 (host h1; dp 0, pp 0, tp 0: pipeline stage 0 of 2) is "
                                "stuck inside the pipeline group's recv-from-1 of iteration 5"),
            std::string::npos)
      << a.transfers[0];
  EXPECT_NE(a.transfers[0].find("so the data never reached rank 0"), std::string::npos);

  // Both inside MPI: the transfer itself does not complete; both are named.
  swapped[0].threads = dumps[0].threads;
  a = keel::AnalyzeHangs(swapped);
  EXPECT_EQ(a.stuck, (std::vector<int>{2, 0}));
  ASSERT_EQ(a.transfers.size(), 1u);
  EXPECT_NE(a.transfers[0].find("and the transfer does not complete"), std::string::npos)
      << a.transfers[0];

  // Rank 0 waits in its receive, but rank 2 is elsewhere (not sending): rank 0 waits for it,
  // nobody is stuck inside a transfer.
  dumps[2].groups[1].collectives.pop_back();
  a = keel::AnalyzeHangs(dumps);
  EXPECT_TRUE(a.stuck.empty());
  ASSERT_EQ(a.transfers.size(), 1u);
  EXPECT_NE(a.transfers[0].find("rank 0 (host h1; dp 0, pp 0, tp 0: pipeline stage 0 of 2) "
                                "waits in the pipeline group's recv-from-1 of iteration 5 (for "
                                "4.2 s) for rank 2 (stage 1), which is not sending to it: in "
                                "reduce of iteration 5"),
            std::string::npos)
      << a.transfers[0];

  // Without mesh coordinates (a data-parallel run) there is no pipeline to read.
  for (HangDump& d : dumps) d.mesh.clear();
  EXPECT_TRUE(keel::AnalyzeHangs(dumps).transfers.empty());
}

// A group's flight recorder: collectives 1..done of `kind` finished, then `in_flight` if given,
// begun 4.4 s before the dump.
keel::GroupCollectives Group(const std::string& name, uint64_t done, const std::string& kind,
                             const std::string& in_flight = "") {
  keel::GroupCollectives g{name, {done, done * 31}, {}};
  for (uint64_t s = done > 64 ? done - 63 : 1; s <= done; ++s)
    g.collectives.push_back({s, kind, 16384, 4500000 + s, 10, false});
  if (!in_flight.empty()) g.collectives.push_back({done + 1, in_flight, 16384, 4400000, 0, true});
  return g;
}

// T=2 on 2 ranks: rank 1 hangs in its forward's compute at iteration 5, so rank 0 waits in the
// tensor group's all-reduce #127 it never joins. The analysis names rank 1 (host, coordinates)
// as inside no collective, and rank 0's wait by its group instance, its ranks and the sequence
// number: not a world collective (the world's recorder has nothing in flight).
TEST(HangAnalysisTest, TensorParallelRankHungInComputeIsNamedAndItsPeerWaitsInTheTensorGroup) {
  std::vector<HangDump> dumps;
  for (int r = 0; r < 2; ++r) {
    const std::vector<std::string> frames =
        r == 0 ? std::vector<std::string>{"PMPI_Allreduce",
                                          "keel::RecordingCommunicator::AllReduceSum()",
                                          "keel::Trainer::ComputeGradients()"}
               : std::vector<std::string>{"keel::Attention::Forward()",
                                          "keel::Trainer::ComputeGradients()"};
    HangDump d = Dump(r, 2, "forward", 5, History(41), frames);
    d.mesh = r == 0 ? "dp 0, pp 0, tp 0" : "dp 0, pp 0, tp 1";
    d.groups = {
        Group("tensor", 126, "all-reduce-sum-floats", r == 0 ? "all-reduce-sum-floats" : ""),
        Group("data", 3, "all-reduce-max")};
    dumps.push_back(d);
  }
  const HangAnalysis a = keel::AnalyzeHangs(dumps);
  ASSERT_EQ(a.groups.size(), 2u);
  EXPECT_NE(
      keel::FormatHangAnalysis(a).find("  1 rank 0: in the tensor group's "
                                       "all-reduce-sum-floats #127 (forward of iteration 5)\n"),
      std::string::npos)
      << keel::FormatHangAnalysis(a);
  ASSERT_EQ(a.odd_ones_out.size(), 1u);
  EXPECT_EQ(a.odd_ones_out[0],
            "rank 1 (host h1; dp 0, pp 0, tp 1) is in forward of iteration 5 after collective #41; "
            "the other rank is in the tensor group's all-reduce-sum-floats #127");
  EXPECT_EQ(a.hung, std::vector<int>{1});
  ASSERT_EQ(a.hung_details.size(), 1u);
  EXPECT_EQ(a.hung_details[0].sentence,
            "rank 1 (host h1; dp 0, pp 0, tp 1) is inside no collective: in forward of iteration 5 "
            "after collective #41 (for 601.0 s), main thread at keel::Attention::Forward(); rank 0 "
            "waits for it, directly or through another rank's wait: it holds up the job (its "
            "stacks: rank-001.txt)");
  ASSERT_EQ(a.waits.size(), 1u);
  EXPECT_EQ(a.waits[0].sentence,
            "rank 0 (host h1; dp 0, pp 0, tp 0) waits in the tensor group of pp 0, dp 0 (ranks "
            "0,1) in its all-reduce-sum-floats #127 of iteration 5 (for 4.4 s): rank 1 has not "
            "entered it: it is in forward of iteration 5 after collective #41");
  const std::string text = keel::FormatHangAnalysis(a);
  EXPECT_NE(text.find("who waits for whom:\n  rank 1 (host h1; dp 0, pp 0, tp 1) is inside no "
                      "collective"),
            std::string::npos)
      << text;
  // --json carries the same facts.
  const nlohmann::json j = keel::HangAnalysisJson(a);
  EXPECT_EQ(j["hung"], nlohmann::json::array({1}));
  EXPECT_EQ(j["hung_ranks"][0]["mesh"], "dp 0, pp 0, tp 1");
  EXPECT_EQ(j["hung_ranks"][0]["host"], "h1");
  EXPECT_EQ(j["hung_ranks"][0]["phase"], "forward");
  EXPECT_EQ(j["hung_ranks"][0]["waited_for_by"], nlohmann::json::array({0}));
  EXPECT_EQ(j["waits"][0]["group"], "tensor");
  EXPECT_EQ(j["waits"][0]["group_of"], "pp 0, dp 0");
  EXPECT_EQ(j["waits"][0]["group_ranks"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(j["waits"][0]["seq"], 127);
  EXPECT_EQ(j["waits"][0]["not_entered"], nlohmann::json::array({1}));
  EXPECT_EQ(j["groups"][0]["collective"]["group"], "tensor");
  EXPECT_EQ(j["groups"][1]["collective"]["group"], "world");  // its last: the world's #41

  // Both inside the all-reduce and it does not complete: nobody is hung, the wait says so.
  std::vector<HangDump> both = dumps;
  both[1].groups[0] = Group("tensor", 126, "all-reduce-sum-floats", "all-reduce-sum-floats");
  const HangAnalysis b = keel::AnalyzeHangs(both);
  EXPECT_TRUE(b.hung.empty());
  ASSERT_EQ(b.waits.size(), 1u);
  EXPECT_EQ(b.waits[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_NE(b.waits[0].sentence.find("ranks 0,1 (host h1) wait in the tensor group of pp 0, dp 0 "
                                     "(ranks 0,1) in its all-reduce-sum-floats #127 of iteration "
                                     "5 (for 4.4 s): every rank of the group is inside it, and it "
                                     "does not complete"),
            std::string::npos)
      << b.waits[0].sentence;

  // A garbled dump's coordinates far outside the world are no mesh (and no overflow).
  both[1].mesh = "dp 0, pp 2000000000, tp 2000000000";
  EXPECT_TRUE(keel::AnalyzeHangs(both).waits.empty());
}

// T=2 x D=2 on 4 ranks (as `mpirun -np 4` dumps it): rank 2 (dp 1) stops after its backward.
// Rank 0, its peer in the data group of pp 0, tp 0, waits in that group's reduce-scatter #11;
// ranks 1 and 3 finished their data group's and wait in the world's all-reduce #25 for ranks 0
// and 2. The analysis names rank 2 as the one holding up all three, and each wait by its group.
TEST(HangAnalysisTest, DataGroupWaitIsNamedByItsGroupAndLeadsToTheHungRank) {
  std::vector<HangDump> dumps;
  for (int r = 0; r < 4; ++r) {
    const bool hung = r == 2, in_world = r % 2 == 1;
    HangDump d = Dump(
        r, 4, hung ? "backward" : "reduce", 3, History(24, in_world ? "all-reduce-sum" : "", 32),
        hung ? std::vector<std::string>{"keel::Trainer::ComputeGradients()"} : kInReduce);
    d.mesh = fmt::format("dp {}, pp 0, tp {}", r / 2, r % 2);
    d.groups = {
        Group("tensor", 220, "all-reduce-sum-floats"),
        Group("data", in_world ? 11 : 10, "reduce-scatter", r == 0 ? "reduce-scatter" : "")};
    dumps.push_back(d);
  }
  HangAnalysis a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.hung, std::vector<int>{2});
  ASSERT_EQ(a.hung_details.size(), 1u);
  EXPECT_EQ(a.hung_details[0].sentence.rfind(
                "rank 2 (host h1; dp 1, pp 0, tp 0) is inside no collective: in backward of "
                "iteration 3 after collective #24 (for 601.0 s), main thread at "
                "keel::Trainer::ComputeGradients(); ranks 0,1,3 wait for it",
                0),
            0u)
      << a.hung_details[0].sentence;
  ASSERT_EQ(a.waits.size(), 2u);
  EXPECT_EQ(a.waits[0].sentence,
            "rank 0 (host h1; dp 0, pp 0, tp 0) waits in the data group of pp 0, tp 0 (ranks 0,2) "
            "in its reduce-scatter #11 of iteration 3 (for 4.4 s): rank 2 has not entered it: it "
            "is in backward of iteration 3 after collective #24");
  EXPECT_EQ(a.waits[1].sentence,
            "ranks 1,3 (host h1) wait in the world (ranks 0-3) in its all-reduce-sum #25 of "
            "iteration 3 (for 0.0 s): ranks 0,2 have not entered it: rank 0 is in the data "
            "group's reduce-scatter #11 (reduce of iteration 3); rank 2 is in backward of "
            "iteration 3 after collective #24");
  const nlohmann::json j = keel::HangAnalysisJson(a);
  EXPECT_EQ(j["waits"][0]["group"], "data");
  EXPECT_EQ(j["waits"][0]["group_of"], "pp 0, tp 0");
  EXPECT_EQ(j["waits"][0]["group_ranks"], nlohmann::json::array({0, 2}));
  EXPECT_EQ(j["waits"][0]["seq"], 11);
  EXPECT_EQ(j["waits"][1]["group"], "world");
  EXPECT_EQ(j["waits"][1]["not_entered"], nlohmann::json::array({0, 2}));
  EXPECT_EQ(j["hung_ranks"][0]["waited_for_by"], nlohmann::json::array({0, 1, 3}));

  // Rank 3 waits instead in its tensor group (rank 2 never reached that all-reduce): the tensor
  // group of pp 0, dp 1 is named with its ranks, and rank 2 still holds up every other rank.
  dumps[3].collectives.pop_back();
  dumps[3].groups[0] = Group("tensor", 220, "all-reduce-sum-floats", "all-reduce-sum-floats");
  a = keel::AnalyzeHangs(dumps);
  EXPECT_EQ(a.hung, std::vector<int>{2});
  EXPECT_EQ(a.hung_details[0].waited_for_by, (std::vector<int>{0, 1, 3}));
  ASSERT_EQ(a.waits.size(), 3u);
  EXPECT_EQ(a.waits[1].sentence.rfind("rank 3 (host h1; dp 1, pp 0, tp 1) waits in the tensor "
                                      "group of pp 0, dp 1 (ranks 2,3) in its "
                                      "all-reduce-sum-floats #221 of iteration 3",
                                      0),
            0u)
      << a.waits[1].sentence;

  // Rank 2 left no dump: the waits name it, the missing dumps say why; nobody dumped is hung.
  dumps.erase(dumps.begin() + 2);
  a = keel::AnalyzeHangs(dumps);
  EXPECT_TRUE(a.hung.empty());
  EXPECT_NE(a.waits[0].sentence.find("rank 2 has not entered it: it is without a dump"),
            std::string::npos)
      << a.waits[0].sentence;
  ASSERT_EQ(a.missing, std::vector<int>{2});

  // Without mesh coordinates (a data-parallel run) there are no groups to name.
  for (HangDump& d : dumps) d.mesh.clear();
  a = keel::AnalyzeHangs(dumps);
  EXPECT_TRUE(a.waits.empty());
  EXPECT_TRUE(a.hung.empty());
}

TEST(HangAnalysisTest, TheMainThreadIsTheOneWhoseTidIsThePid) {
  HangDump d = Dump(0, 1, "reduce", 1, {}, kInReduce);
  EXPECT_EQ(keel::MainThread(d)->name, "keel");
  d.pid = 1;  // no thread has the pid: the one with main in its frames
  EXPECT_EQ(keel::MainThread(d)->name, "keel");
  d.threads[1].frames.pop_back();  // nor main: the first thread not dumping
  EXPECT_EQ(keel::MainThread(d)->name, "keel-reduce");
  // Without keel frames (no symbols): the innermost frames as they are.
  d = Dump(0, 1, "reduce", 1, {}, {});
  d.threads[1].frames = {"/opt/keel+0x10", "/opt/keel+0x20", "/lib/libc.so.6+0x30", "x"};
  EXPECT_EQ(keel::MainThreadTopFrames(d),
            (std::vector<std::string>{"/opt/keel+0x10", "/opt/keel+0x20", "/lib/libc.so.6+0x30"}));
}

class HangAnalysisReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/keel_hang_analysis_" + std::to_string(getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/hangs/iter_20");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/hangs/iter_20/" + name) << text;
  }
  keel::Status Read(const std::string& dir, std::vector<HangDump>* out) {
    return keel::ReadHangDumps(keel::Env::Default(), dir, out);
  }
  std::string dir_;
};

TEST_F(HangAnalysisReadTest, ReadsEveryRankFileAndNothingElse) {
  Write("rank-001.txt", keel::FormatHangDump(Dump(1, 2, "reduce", 20, {}, kInReduce)));
  Write("rank-000.txt", keel::FormatHangDump(Dump(0, 2, "reduce", 20, {}, kInReduce)));
  Write("rank-002.txt.tmp", "half a dump");  // an unfinished atomic write
  Write("notes.md", "mine");
  std::vector<HangDump> dumps;
  ASSERT_TRUE(Read(dir_ + "/hangs/iter_20", &dumps).ok());
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_EQ(dumps[0].rank, 0);
  EXPECT_EQ(dumps[1].rank, 1);
}

TEST_F(HangAnalysisReadTest, ErrorsNameThePathAndTheLine) {
  std::vector<HangDump> dumps;
  keel::Status st = Read(dir_ + "/nope", &dumps);
  EXPECT_EQ(st.code(), keel::Status::Code::kNotFound);

  // An empty iter_20 (or a run directory's checkpoints, iter_NNNNNNN) is no hang directory.
  st = Read(dir_ + "/hangs", &dumps);
  EXPECT_EQ(st.code(), keel::Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("it is not a hang directory"), std::string::npos) << st.message();
  st = Read(dir_ + "/hangs/iter_20", &dumps);  // empty
  EXPECT_NE(st.message().find("it is not a hang directory"), std::string::npos) << st.message();

  Write("rank-000.txt", "keel hang dump 1\nrank: 0\n");
  st = Read(dir_ + "/hangs", &dumps);  // the parent of the iteration directories
  EXPECT_EQ(st.code(), keel::Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("holds no rank-RRR.txt dumps but the hang directories iter_20"),
            std::string::npos)
      << st.message();
  st = Read(dir_ + "/hangs/iter_20", &dumps);
  EXPECT_EQ(st.code(), keel::Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), dir_ +
                              "/hangs/iter_20/rank-000.txt: line 3: the hang dump ends early "
                              "(no 'end of hang dump' line): truncated");
  Write("rank-000.txt", keel::FormatHangDump(Dump(3, 4, "reduce", 20, {}, kInReduce)));
  st = Read(dir_ + "/hangs/iter_20", &dumps);
  EXPECT_NE(st.message().find("rank-000.txt: the dump is rank 3's, not rank 0's"),
            std::string::npos)
      << st.message();
  Write("rank-000.txt", keel::FormatHangDump(Dump(0, 4, "reduce", 20, {}, kInReduce)));
  Write("rank-001.txt", keel::FormatHangDump(Dump(1, 2, "reduce", 20, {}, kInReduce)));
  st = Read(dir_ + "/hangs/iter_20", &dumps);
  EXPECT_NE(st.message().find("the dumps come from different jobs"), std::string::npos)
      << st.message();
  st = Read(dir_ + "/hangs/iter_20/rank-000.txt", &dumps);
  EXPECT_EQ(st.code(), keel::Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("is a file, not a hang directory"), std::string::npos);
}

}  // namespace
