// Blame with evidence: after a failed attempt, what the job left says which host failed it, if
// anything does. Sources, strongest first:
//   - the watchdog's hang dumps of this attempt (the "hang" line of events.jsonl names them): the
//     odd one out, when its ranks are on one host (`keel hangs analyze` shows the same groups);
//   - events.jsonl lines this attempt wrote: replica_mismatch naming one rank's host,
//     transient_fault naming ranks on one host (hosts from the ranks' lock files);
//   - the launcher's report of a rank's death on its stderr ("mpirun noticed that process rank 1
//     with PID 123 on node n2 exited on signal 9", "srun: error: n2: task 1: Killed").
// A failure no evidence pins on one host is pinned on none: nothing is excluded for it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/env.h"

namespace keel {

enum class BlameKind { kNone, kHang, kReplicaMismatch, kTransientFault, kCrash, kStraggler };
// "hang", "replica_mismatch", "transient_fault", "crash", "straggler", "none".
const char* BlameKindName(BlameKind k);

struct Blame {
  BlameKind kind = BlameKind::kNone;
  std::string host;      // empty: not pinned
  int rank = -1;         // the rank named, when one is
  std::string source;    // the file or stream the evidence is from
  std::string evidence;  // one sentence
};

// rank -> host as the ranks recorded it: SAVE/locks/rank-NNN.lock (JSON with "host", "rank",
// "world_size"), limited to the world size of rank 0's lock (an older, larger attempt's files
// may remain).
std::map<int, std::string> RankHosts(Env* env, const std::string& run_dir);

// The events.jsonl lines written from byte `from` on.
std::vector<std::string> EventLinesSince(Env* env, const std::string& run_dir, uint64_t from);

// What the failed attempt left: its events.jsonl lines, its launcher's stderr (the tail), and
// the run directory (hang dumps, lock files).
Blame BlameFailure(Env* env, const std::string& run_dir, const std::vector<std::string>& events,
                   const std::string& launcher_stderr);

// The launcher's report of a dead rank in `text` (mpirun's "noticed that process rank N with PID
// P on node H exited on signal S", srun's "srun: error: H: task N: ..."); kind none when absent.
Blame BlameFromLauncherOutput(const std::string& text);

}  // namespace keel
