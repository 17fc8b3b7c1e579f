// The hang dump file: what FormatHangDump writes, ParseHangDump reads back exactly; anything else
// is an error naming the line, never a crash.
#include "watchdog/hang_dump.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using keel::HangDump;
using keel::Status;

HangDump Sample() {
  HangDump d;
  d.rank = 5;
  d.world_size = 8;
  d.host = "node-h2";
  d.pid = 4242;
  d.fired_here = true;
  d.reason =
      "the main thread has been in data wait of iteration 20 for 612.5 s, over its limit "
      "of 600 s";
  d.phase = "data wait";
  d.iteration = 20;
  d.phase_seconds = 612.503125;
  d.unix_time = 1714530000;
  d.digest = {1235, 0x0123456789abcdefULL};
  d.collectives = {{1233, "reduce-scatter", 16777216, 12345678, 1234, false},
                   {1234, "all-gather", 4096, 500000, 0, false},
                   {1235, "all-reduce-sum", 16, 1, 0, true}};
  keel::ThreadStack main_thread;
  main_thread.tid = 4242;
  main_thread.name = "keel";
  main_thread.frames = {"keel::SamplePrefetcher::Get(long)+0x4f (/opt/keel/bin/keel+0x1a2b3c)",
                        "keel::Trainer::TrainStep()+0x210 (/opt/keel/bin/keel+0x1b0000)",
                        "/usr/lib/x86_64-linux-gnu/libc.so.6+0x271ca", ""};
  keel::ThreadStack watchdog;
  watchdog.tid = 4250;
  watchdog.name = "keel (x) [y]";  // names may hold spaces and brackets
  watchdog.is_caller = true;
  watchdog.frames = {"keel::Watchdog::Fire(keel::PhaseSnapshot const&)+0x33 (keel+0x10)"};
  keel::ThreadStack deaf;
  deaf.tid = 4251;
  deaf.name = "";
  deaf.frames = {keel::kNoReplyFrame};
  d.threads = {main_thread, watchdog, deaf};
  return d;
}

void ExpectEqual(const HangDump& a, const HangDump& b) {
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.host, b.host);
  EXPECT_EQ(a.pid, b.pid);
  EXPECT_EQ(a.fired_here, b.fired_here);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.phase, b.phase);
  EXPECT_EQ(a.iteration, b.iteration);
  EXPECT_EQ(a.phase_seconds, b.phase_seconds);
  EXPECT_EQ(a.unix_time, b.unix_time);
  EXPECT_EQ(a.digest.count, b.digest.count);
  EXPECT_EQ(a.digest.hash, b.digest.hash);
  ASSERT_EQ(a.collectives.size(), b.collectives.size());
  for (size_t i = 0; i < a.collectives.size(); ++i) {
    const auto &x = a.collectives[i], &y = b.collectives[i];
    EXPECT_EQ(x.seq, y.seq);
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.bytes, y.bytes);
    EXPECT_EQ(x.began_us_ago, y.began_us_ago);
    EXPECT_EQ(x.duration_us, y.duration_us);
    EXPECT_EQ(x.in_flight, y.in_flight);
  }
  ASSERT_EQ(a.threads.size(), b.threads.size());
  for (size_t i = 0; i < a.threads.size(); ++i) {
    EXPECT_EQ(a.threads[i].tid, b.threads[i].tid);
    EXPECT_EQ(a.threads[i].name, b.threads[i].name);
    EXPECT_EQ(a.threads[i].is_caller, b.threads[i].is_caller);
    EXPECT_EQ(a.threads[i].frames, b.threads[i].frames);
  }
}

TEST(HangDumpTest, RoundTripsExactly) {
  const HangDump d = Sample();
  const std::string text = keel::FormatHangDump(d);
  HangDump back;
  const Status st = keel::ParseHangDump(text, &back);
  ASSERT_TRUE(st.ok()) << st.message() << "\n" << text;
  ExpectEqual(d, back);
  EXPECT_EQ(keel::FormatHangDump(back), text);
  // What people read.
  EXPECT_NE(text.find("\nphase: data wait\n"), std::string::npos) << text;
  EXPECT_NE(
      text.find("\ncollectives (oldest first):\n"
                "  #1233 reduce-scatter 16777216 B, began 12.345678 s ago, took 0.001234 s\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("  #1235 all-reduce-sum 16 B, began 0.000001 s ago, in flight\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nthread 4250 (keel (x) [y]) [dumping]\n  #0 keel::Watchdog::Fire("),
            std::string::npos)
      << text;

  // Nothing recorded yet, and an empty dump of the startup phase, round-trip too.
  HangDump empty;
  ASSERT_TRUE(keel::ParseHangDump(keel::FormatHangDump(empty), &back).ok());
  ExpectEqual(empty, back);
}

// Tensor parallel: the dump names the rank's mesh coordinates, on a line of its own that
// dumps of data-parallel runs do not have.
TEST(HangDumpTest, MeshCoordinatesRoundTripWhenPresent) {
  HangDump d = Sample();
  d.mesh = "dp 1, pp 0, tp 1";
  const std::string text = keel::FormatHangDump(d);
  EXPECT_NE(text.find("\nmesh: dp 1, pp 0, tp 1\npid: "), std::string::npos) << text;
  HangDump back;
  ASSERT_TRUE(keel::ParseHangDump(text, &back).ok()) << text;
  EXPECT_EQ(back.mesh, d.mesh);
  EXPECT_EQ(keel::FormatHangDump(back), text);
  EXPECT_EQ(keel::FormatHangDump(Sample()).find("\nmesh: "), std::string::npos);
}

// Tensor parallel: each process group's flight recorder after the world's, with its own
// sequence numbers; a dump without groups has no such lines.
TEST(HangDumpTest, GroupFlightRecordersRoundTripWhenPresent) {
  HangDump d = Sample();
  keel::GroupCollectives tensor;
  tensor.name = "tensor";
  tensor.digest = {7, 0xabcdef0123456789ull};
  keel::DumpedCollective c;
  c.seq = 7;
  c.kind = "all-reduce-sum-floats";
  c.bytes = 4096;
  c.began_us_ago = 3000000;
  c.in_flight = true;
  tensor.collectives.push_back(c);
  keel::GroupCollectives data;
  data.name = "data";
  d.groups = {tensor, data};
  const std::string text = keel::FormatHangDump(d);
  EXPECT_NE(text.find("\ngroup tensor: collective count 7, hash 0xabcdef0123456789, oldest "
                      "first:\n  #7 all-reduce-sum-floats 4096 B, began 3.000000 s ago, in "
                      "flight\ngroup data: collective count 0, hash 0x0000000000000000, oldest "
                      "first:\nthread "),
            std::string::npos)
      << text;
  HangDump back;
  const Status st = keel::ParseHangDump(text, &back);
  ASSERT_TRUE(st.ok()) << st.message() << "\n" << text;
  ASSERT_EQ(back.groups.size(), 2u);
  EXPECT_EQ(back.groups[0].name, "tensor");
  EXPECT_EQ(back.groups[0].digest.hash, 0xabcdef0123456789ull);
  ASSERT_EQ(back.groups[0].collectives.size(), 1u);
  EXPECT_TRUE(back.groups[0].collectives[0].in_flight);
  EXPECT_EQ(back.collectives.size(), d.collectives.size());  // the world's stay the world's
  EXPECT_EQ(keel::FormatHangDump(back), text);
  EXPECT_EQ(keel::FormatHangDump(Sample()).find("\ngroup "), std::string::npos);
}

TEST(HangDumpTest, LineBreaksInFieldsCannotForgeLines) {
  HangDump d = Sample();
  d.reason = "two\nlines";
  d.threads[0].frames[0] = "frame\nthread 1 (forged)";
  d.collectives[0].kind = "all gather";
  HangDump back;
  ASSERT_TRUE(keel::ParseHangDump(keel::FormatHangDump(d), &back).ok());
  EXPECT_EQ(back.reason, "two lines");
  EXPECT_EQ(back.threads.size(), d.threads.size());
  EXPECT_EQ(back.threads[0].frames[0], "frame thread 1 (forged)");
  EXPECT_EQ(back.collectives[0].kind, "all_gather");
}

TEST(HangDumpTest, FileNamesCarryTheRank) {
  EXPECT_EQ(keel::HangDumpFileName(7), "rank-007.txt");
  EXPECT_EQ(keel::HangDumpFileName(1234), "rank-1234.txt");
  EXPECT_EQ(keel::RankOfHangDumpFile("rank-007.txt"), 7);
  EXPECT_EQ(keel::RankOfHangDumpFile("rank-1234.txt"), 1234);
  EXPECT_EQ(keel::RankOfHangDumpFile("rank-7.txt"), -1);
  EXPECT_EQ(keel::RankOfHangDumpFile("rank-007.txt.tmp"), -1);  // WriteFileAtomic's temporary
  EXPECT_EQ(keel::RankOfHangDumpFile("rank-0x7.txt"), -1);
  EXPECT_EQ(keel::RankOfHangDumpFile("rank--01.txt"), -1);
}

TEST(HangDumpTest, TruncatedAndGarbledDumpsAreErrorsNamingTheLine) {
  const std::string text = keel::FormatHangDump(Sample());
  HangDump out;
  // Every truncation at a line boundary or inside a line is refused: the end marker is missing.
  for (size_t cut = 0; cut + 1 < text.size(); cut += 7) {
    const Status st = keel::ParseHangDump(text.substr(0, cut), &out);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << cut;
    EXPECT_EQ(st.message().rfind("line ", 0), 0u) << st.message();
  }
  struct Case {
    std::string from, to, message;
  };
  const Case cases[] = {
      {"keel hang dump 1", "hello", "line 1: not a keel hang dump"},
      {"rank: 5", "rank: -5", "line 2: bad rank: '-5'"},
      {"world size: 8", "world size: 4", "line 3: rank 5 is not below the world size 4"},
      {"world size: 8", "world size: 99999999999", "line 3: bad world size"},
      {"world size: 8", "world size: 0", "line 3: bad world size: '0'"},
      {"pid: 4242", "pid: 42x", "line 5: bad pid"},
      {"pid: 4242", "pid: -1", "line 5: bad pid"},
      {"fired here: yes", "fired here: maybe", "line 6: bad fired here"},
      {"phase seconds: 612.503125", "phase seconds: nan", "line 10: bad phase seconds"},
      {"collective hash: 0x0123456789abcdef", "collective hash: 12",
       "line 13: bad collective hash"},
      {"iteration: 20", "iterations: 20", "line 9: expected 'iteration: ...'"},
      {"  #1234 all-gather 4096 B", "  #1232 all-gather 4096 B",
       "line 16: collective #1232 is not"},
      {"began 0.500000 s ago", "began 0.5 s ago", "line 16: bad collective"},
      {"thread 4242 (keel)", "thread x (keel)", "line 18: bad thread line"},
      {"  #1 keel::Trainer", "  #3 keel::Trainer", "line 20: expected frame #1"},
      {"end of hang dump", "end of hang dump\ntrailing", "line 28: text after"},
      {"end of hang dump", "something else", "line 27: expected a collective"},
  };
  for (const Case& c : cases) {
    std::string bad = text;
    const size_t at = bad.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    bad.replace(at, c.from.size(), c.to);
    const Status st = keel::ParseHangDump(bad, &out);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << c.to;
    EXPECT_EQ(st.message().rfind(c.message, 0), 0u) << st.message();
  }
  // Binary garbage.
  std::string garbage(4096, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 131 + 7);
  EXPECT_FALSE(keel::ParseHangDump(garbage, &out).ok());
  EXPECT_FALSE(keel::ParseHangDump("keel hang dump 1\n" + garbage, &out).ok());
}

}  // namespace
