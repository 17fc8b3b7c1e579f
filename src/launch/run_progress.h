// What `keel launch` reads of the run directory it supervises, as files only (it never opens the
// run): how far training got (metrics.jsonl, written by rank 0 after every iteration), where a
// restart continues from (the checkpoint marker) and the newest hang dump of the watchdog.
#pragma once

#include <cstdint>
#include <string>

#include "core/env.h"

namespace keel {

constexpr const char* kHangsDir = "hangs";

struct MetricsProgress {
  int64_t newest_iteration = -1;  // of the newest train record; -1: none
  // The train records after iteration `after` (see ReadMetricsProgress): how many, and the sum
  // of their iteration_ms (the compute a restart from `after` loses).
  int64_t records_after = 0;
  double ms_after = 0;
};

// Reads RUN_DIR/metrics.jsonl from its end (mapped, so only the tail is touched), skipping a line
// being written and records that are not "train". A missing file is no progress, not an error.
MetricsProgress ReadMetricsProgress(Env* env, const std::string& run_dir, int64_t after);

// The iteration in RUN_DIR/latest_checkpointed_iteration.txt; -1 when there is none (or it is
// unreadable: the restarted run decides what to load, this is for the record).
int64_t ReadCheckpointMarker(Env* env, const std::string& run_dir);

// RUN_DIR/hangs/iter_N with the largest N (the watchdog's newest dump), or "" when none.
std::string NewestHangDump(Env* env, const std::string& run_dir);

}  // namespace keel
