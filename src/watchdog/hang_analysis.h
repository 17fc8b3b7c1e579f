// The analysis of a hang directory (`keel hangs analyze SAVE/hangs/iter_N`): the ranks grouped by
// where they were, the odd ones out named in a sentence each, the ranks that left no dump, and the
// first collective the ranks disagree on. What the 176B team did by hand with py-spy dumps of 384
// processes and a perl one-liner: find the 1 process in a different state.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "watchdog/hang_dump.h"

namespace keel {

// Where a rank was: what makes two ranks "the same" in a hang.
struct HangState {
  std::string phase;
  int64_t iteration = 0;
  uint64_t seq = 0;  // the collective it was in (in_flight), else the last it finished; 0: none
  std::string kind;
  // The process group whose flight recorder numbers `seq` ("tensor", "data", "pipeline",
  // "pipeline-p2p", "world" beside them); empty: the world's in a dump without groups.
  std::string group;
  bool in_flight = false;
  // The main thread's innermost 3 keel frames, function names only (see MainThreadTopFrames).
  std::vector<std::string> frames;
  bool operator==(const HangState&) const = default;
};

struct HangGroup {
  HangState state;
  std::vector<int> ranks;          // ascending
  std::vector<std::string> hosts;  // of `ranks`, distinct, in rank order
};

struct HangAnalysis {
  int world_size = 0;  // from the dumps
  int dumps = 0;
  std::vector<int> fired;                         // ranks whose own watchdog fired
  std::string fired_reason;                       // the first of them's reason
  std::vector<HangGroup> groups;                  // largest first, ties by lowest rank
  std::string summary;                            // one group: "all N ranks are in ..."; else empty
  std::vector<std::string> odd_ones_out;          // a sentence per group but the largest
  std::vector<int> missing;                       // ranks without a dump
  std::vector<std::pair<int, int>> missing_runs;  // consecutive ranks of `missing`: first, last
  std::vector<std::string> missing_sentences;     // one per run
  std::string mismatch;  // the first disagreement of the flight recorders; empty: none
  // Pipeline parallel (the dumps' pipeline-p2p sections): a sentence per rank in a send or
  // receive to another stage, the stuck one first; `stuck` has the ranks inside a send (receive)
  // whose peer waits in the matching receive (send): a transfer that never went through.
  std::vector<std::string> transfers;
  std::vector<int> stuck;
  // Model parallel (the dumps' mesh coordinates and group sections): who waits for whom. A
  // sentence per rank outside every collective that ranks wait for (`hung`: the ones holding up
  // the job), then one per set of ranks waiting in one collective of one group instance ("the
  // data group of pp 0, tp 0: ranks 0,2"), naming its sequence number and who has not entered.
  std::vector<int> hung;
  struct Wait {
    std::vector<int> ranks;  // waiting, ascending
    std::vector<std::string> hosts;
    std::string group;     // "tensor", "data", "pipeline"; "world"
    std::string group_of;  // the coordinates that pick the instance: "pp 0, tp 0"; "" (world)
    std::vector<int> group_ranks;
    uint64_t seq = 0;  // in the group's own numbering
    std::string kind;
    int64_t iteration = 0;
    std::vector<int> not_entered;  // members not in this collective (dumped or not)
    std::string sentence;
  };
  std::vector<Wait> waits;
  struct Hung {
    int rank = 0;
    std::string host, mesh;
    int stage = 0, stages = 1;
    std::string phase;
    int64_t iteration = 0;
    double phase_seconds = 0;
    std::vector<int> waited_for_by;  // the ranks waiting for it, directly or through another
    std::string sentence;
  };
  std::vector<Hung> hung_details;
};

// The most keel reads of one rank's hang dump (a dump of a thousand threads' stacks is a few MiB).
inline constexpr uint64_t kMaxHangDumpBytes = 64 * kMiB;

// The dumps of `dir` (every rank-RRR.txt), by rank. NotFound: no such path; InvalidArgument: not
// a hang directory, a dump that is not a regular file or is over kMaxHangDumpBytes, or one that
// does not parse (the message names the file and its line).
Status ReadHangDumps(Env* env, const std::string& dir, std::vector<HangDump>* dumps);

// The main thread of a dump: the thread whose TID is the process ID (Linux gives the first
// thread the process's ID, and keel's training loop runs on it), else the first with a frame
// named main, else the first thread not dumping. Null when there is none.
const ThreadStack* MainThread(const HangDump& d);
// Its innermost `n` frames in namespace keel, as function names (offsets and modules dropped,
// so the same code on different ranks compares equal); with no keel frame (no symbols), its
// innermost `n` frames as they are.
std::vector<std::string> MainThreadTopFrames(const HangDump& d, size_t n = 3);

// `dumps` must have distinct ranks below their (equal) world size, as ReadHangDumps gives them.
HangAnalysis AnalyzeHangs(const std::vector<HangDump>& dumps);
std::string FormatHangAnalysis(const HangAnalysis& a);
nlohmann::json HangAnalysisJson(const HangAnalysis& a);

}  // namespace keel
