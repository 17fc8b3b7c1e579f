// AsyncCheckpointWriter: writes one checkpoint on a background thread while the training loop
// goes on (--async-save). The loop builds the checkpoint's files from staging copies
// (CheckpointStaging with copy set), so nothing the loop changes afterwards reaches the files;
// the writer then writes, checksums and fsyncs them, and either commits them itself (one
// process: CheckpointStore::Save, then retention) or leaves the commit to the caller (data
// parallel: the ranks agree on every rank's outcome on the loop thread, where their collectives
// run, and rank 0 commits). At most one checkpoint is in flight; Wait() is the one place the loop
// blocks for it. A crash at any moment leaves what a crash inside a synchronous save leaves: the
// previous committed checkpoint newest, the temporary directory removed by the next Recover().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/train_checkpoint.h"
#include "core/env.h"
#include "core/status.h"

namespace keel {

class AsyncCheckpointWriter {
 public:
  struct Job {
    int64_t iteration = 0;
    // The tensors point into the caller's staging copies, which must stay unchanged until Wait().
    std::vector<CheckpointFile> files;
    // true: write and commit (Save), then retention keeping `keep_last`; false: only write the
    // files into the temporary directory BeginSave made (the caller commits or aborts).
    bool commit = true;
    int keep_last = 0;
    // Made first, before any file is written (CheckpointStaging::deferred): the staging copies of
    // live memory the loop leaves unchanged until WaitStaged() returns.
    std::vector<CheckpointStaging::DeferredCopy> copies;
    // > 0: first (after the copies) the retention a previous save's commit left due, keeping
    // the newest `retention_first` committed checkpoints (data parallel: rank 0 commits on the
    // loop thread, and the deletions need not stall it).
    int retention_first = 0;
  };
  struct Result {
    int64_t iteration = -1;
    Status status;
    SaveStats stats;                     // of a committed save
    std::vector<ManifestEntry> written;  // of a write-only job
    double seconds = 0;                  // the background work, retention included
    std::vector<std::string> log;        // what the store logged on the background thread
  };

  // The writer's store is its own (same root), so its log lines are kept for the loop thread to
  // print (Result::log) instead of interleaving with the loop's output.
  AsyncCheckpointWriter(Env* env, std::string root, bool read_only);
  ~AsyncCheckpointWriter();  // waits for the job in flight (nothing is committed on its behalf)
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Starts `job` on a background thread. None may be in flight.
  void Start(Job job);
  // A job was started and Wait() has not collected it yet.
  bool in_flight() const { return thread_.joinable(); }
  // The job in flight has finished its work (Wait() would not block).
  bool done() const { return done_.load(std::memory_order_acquire); }
  int64_t iteration() const { return job_.iteration; }
  // Blocks until the job in flight is done and returns its result; nothing is in flight after.
  Result Wait();
  // Blocks until the job in flight has made its staging copies (at once when none is in flight).
  void WaitStaged();

 private:
  void Run();

  Env* env_;
  std::string root_;
  bool read_only_;
  Job job_;
  Result result_;
  std::atomic<bool> done_{false};
  std::mutex staged_mu_;
  std::condition_variable staged_cv_;
  bool staged_ = true;
  std::thread thread_;
};

}  // namespace keel
