// A hang dump: what one rank was doing when the job stopped moving, one text file per rank in
// SAVE/hangs/iter_N/rank-RRR.txt. People read it (the collectives, the stacks) and
// `keel hangs analyze` reads every rank's back to group them, so the text is also the format:
// FormatHangDump and ParseHangDump round-trip exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/collective_recorder.h"
#include "core/status.h"
#include "watchdog/stack_trace.h"

namespace keel {

// One collective of the flight recorder, with its times relative to the dump (ranks' clocks are
// not comparable, seconds before the dump are).
struct DumpedCollective {
  uint64_t seq = 0;
  std::string kind;  // no whitespace ("reduce-scatter")
  uint64_t bytes = 0;
  uint64_t began_us_ago = 0;  // how long before the dump it began
  uint64_t duration_us = 0;   // how long it took; 0 while in flight
  bool in_flight = false;
};

// The flight recorder of one process group (tensor, data) under model parallelism: its own
// sequence numbers, among the group's ranks.
struct GroupCollectives {
  std::string name;  // one word: "tensor", "data"
  CollectiveDigest digest;
  std::vector<DumpedCollective> collectives;  // oldest first
};

struct HangDump {
  int rank = 0;
  int world_size = 1;
  std::string host;
  std::string mesh;  // "dp 1, pp 0, tp 1" under tensor parallelism; empty otherwise
  int64_t pid = 0;
  bool fired_here = false;  // this rank's watchdog fired (else it joined another rank's dump)
  std::string reason;       // one sentence
  std::string phase;        // PhaseName
  int64_t iteration = 0;
  double phase_seconds = 0;  // how long the main thread had been in `phase`
  int64_t unix_time = 0;     // seconds since the epoch when the dump was taken
  CollectiveDigest digest;
  std::vector<DumpedCollective> collectives;  // oldest first
  std::vector<GroupCollectives> groups;       // tensor-parallel runs only
  std::vector<ThreadStack> threads;
};

// The flight recorder's records as a dump holds them, `now_us` being the dump's Env::NowMicros.
std::vector<DumpedCollective> DumpCollectives(const std::vector<CollectiveRecord>& records,
                                              uint64_t now_us);

// "rank-007.txt": the file of `rank` in a hang directory.
std::string HangDumpFileName(int rank);
// The rank of a file named like HangDumpFileName, or -1 (temporaries, other files).
int RankOfHangDumpFile(const std::string& name);

// The text file. Line breaks inside host, reason, kinds, thread names and frames become spaces
// (and whitespace in kinds '_'), so what ParseHangDump reads back equals what was given.
std::string FormatHangDump(const HangDump& d);
// Reads FormatHangDump's text. Anything else (truncated, garbage, out-of-range numbers) is
// InvalidArgument "line N: what is wrong"; the caller adds the file's name.
Status ParseHangDump(const std::string& text, HangDump* out);

}  // namespace keel
