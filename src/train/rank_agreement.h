// What the ranks of a data-parallel job must agree on before any work. A rank started with other
// flags (an MPMD section, a per-rank variable in a launch script) would otherwise corrupt memory
// (a different model in the gradient reducer), hang (another size or length), or train a different
// run without a word; two jobs on one --save directory would interleave their checkpoints.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "core/env.h"

namespace keel {

// Settings that may differ between ranks: how many threads a rank computes or reads ahead with
// changes how fast it runs, not what it computes.
bool MayDifferBetweenRanks(const std::string& setting);

// Collective. Every rank's resolved settings (model, data, optimizer, schedule, precision, save
// directory, ...) and keel version are compared; a difference is InvalidArgument on every rank,
// naming each differing setting with which ranks hold which value.
Status AgreeOnConfig(Communicator* comm, const TrainConfig& cfg);

// One run per --save directory. Every rank holds an advisory lock (flock) on
// SAVE/locks/rank-NNN.lock for the run's life: a second job on the directory, or ranks orphaned by
// a killed launcher that still train into it, are refused naming the holder's host and pid. A lock
// left by a process that ended without releasing it is taken over with a note. Rank 0's lock file
// also proves that the ranks see one directory: it holds a token every other rank must read back.
class RunDirectoryLock {
 public:
  // Collective. `notes` gets the take-overs of stale locks.
  static Status Acquire(Env* env, Communicator* comm, const std::string& save_dir,
                        std::unique_ptr<RunDirectoryLock>* out, std::vector<std::string>* notes);
  // The lock file of `rank` under `save_dir`.
  static std::string LockPath(const std::string& save_dir, int rank);

 private:
  explicit RunDirectoryLock(std::unique_ptr<FileLock> lock) : lock_(std::move(lock)) {}
  std::unique_ptr<FileLock> lock_;
};

}  // namespace keel
