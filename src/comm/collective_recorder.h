// CollectiveRecorder: the flight recorder of this rank's collectives. Every collective gets the
// next sequence number; the last 64 are kept with their kind, size and timing, so a hang dump says
// which collective each rank was in (or had last finished) when the job stopped moving. It also
// keeps a running hash of every (kind, size) so far: ranks that ran the same collectives in the
// same order have the same (count, hash), a cheap cross-rank consistency check.
//
// Any thread may call Begin/End (the gradient reducer's worker does); any thread may read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/env.h"

namespace keel {

struct CollectiveRecord {
  uint64_t seq = 0;       // 1-based, in the order this rank began them
  std::string kind;       // "reduce-scatter", "all-gather", "all-reduce-sum", ...
  size_t bytes = 0;       // this rank's payload
  uint64_t start_us = 0;  // Env::NowMicros at Begin
  uint64_t end_us = 0;    // at End; 0 while in flight
  bool in_flight() const { return end_us == 0; }
};

// The running digest of a rank's collectives: equal on every rank unless one skipped, added or
// resized a collective.
struct CollectiveDigest {
  uint64_t count = 0;
  uint64_t hash = 0;
};

class CollectiveRecorder {
 public:
  static constexpr size_t kCapacity = 64;
  explicit CollectiveRecorder(Env* env);
  // A collective begins: returns its sequence number. `same_size`: every rank sends this many
  // bytes (false for a gather of each rank's own list: only its kind enters the digest).
  uint64_t Begin(const std::string& kind, size_t bytes, bool same_size = true);
  void End(uint64_t seq);
  // The newest records (at most kCapacity), oldest first.
  std::vector<CollectiveRecord> Recent() const;
  CollectiveDigest digest() const;

 private:
  Env* env_;
  mutable std::mutex mu_;
  std::vector<CollectiveRecord> ring_;  // kCapacity slots, seq % kCapacity
  CollectiveDigest digest_;
};

}  // namespace keel
