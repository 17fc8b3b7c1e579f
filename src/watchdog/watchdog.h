// Watchdog: ends a job that stopped moving, and says where every rank was. The 176B run sat in an
// eval deadlock for hours with no timeout firing, and the stacks that found it had to be taken by
// hand with py-spy on every node. Here each rank's watchdog thread watches its own main thread
// (PhaseTracker); when one phase instance outlasts its limit the rank dumps its phase, flight
// recorder and thread stacks to SAVE/hangs/iter_N/rank-RRR.txt, drops a trigger file that makes
// every other rank of the job dump too, waits briefly for their dumps, and exits with code 4.
// `keel hangs analyze SAVE/hangs/iter_N` then groups the ranks and names the odd ones out.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/collective_recorder.h"
#include "core/env.h"
#include "core/exit_code.h"
#include "watchdog/phase_tracker.h"

namespace keel {

// The group name of the pipeline's point-to-point recorder (RecordingCommunicator's
// p2p_recorder): its records are sends and receives between stages, not collectives.
constexpr const char* kPipelineTransfersGroup = "pipeline-p2p";

struct WatchdogOptions {
  std::string hangs_dir;  // SAVE/hangs; empty: the dump goes to stderr only (no trigger, no wait)
  std::string job_id;     // the same string on every rank of one job (names the trigger file)
  int rank = 0, world_size = 1;
  std::string host;  // empty: gethostname()
  std::string mesh;  // the rank's mesh coordinates ("dp 1, pp 0, tp 1"); empty: data parallel only
  // Limits on one phase instance; 0 means none. timeout_us (--distributed-timeout-minutes) holds
  // for every phase without a limit of its own; the others, when 0, fall back to it.
  uint64_t timeout_us = 0;
  uint64_t first_iteration_timeout_us = 0;  // startup and the first iteration of this process
  uint64_t save_timeout_us = 0;             // Phase::kSave
  uint64_t eval_timeout_us = 0;             // Phase::kEval
  uint64_t poll_us = 0;                     // 0: min(1 s, the smallest limit / 10)
  uint64_t join_grace_us = 0;  // 0: min(30 s, max(5 s, timeout_us / 2)): how long a dumping
                               // rank waits for the other ranks' dumps before it exits
  int exit_code = ToInt(ExitCode::kRanksCannotGoOn);
  std::function<void(int)> exit;  // default: flush stdout/stderr and _exit(code) (never returns)
  // Called from the watchdog's thread with the line it logged and the dump's directory, before
  // it waits for the other ranks (the run journals the hang). May be empty.
  std::function<void(const std::string& line, const std::string& dir)> on_dump;
};

// The trigger file of `job_id` in `hangs_dir`: its presence makes every rank of the job dump.
std::string HangTriggerPath(const std::string& hangs_dir, const std::string& job_id);

class Watchdog {
 public:
  // `phases` and `collectives` must outlive the watchdog; `collectives` may be null.
  Watchdog(Env* env, const PhaseTracker* phases, const CollectiveRecorder* collectives,
           WatchdogOptions o);
  ~Watchdog();  // stops and joins the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A process group's flight recorder (tensor, data), dumped after the world's under `name`
  // (kPipelineTransfersGroup: the pipeline's sends and receives, named as transfers). Before Start.
  void AddGroup(std::string name, const CollectiveRecorder* recorder) {
    groups_.emplace_back(std::move(name), recorder);
  }

  // A thread that calls CheckOnce every poll_us until the watchdog fires or is destroyed.
  void Start();
  // One check now: another rank's trigger, then this rank's own limit. True when this call fired
  // (this rank dumped and called exit, which returns only in tests).
  bool CheckOnce();

  const WatchdogOptions& options() const { return o_; }

 private:
  // The limit of the phase instance `s`; 0: none.
  uint64_t LimitFor(const PhaseSnapshot& s) const;
  // Why a rank dumps: its own limit passed (here), or another rank's trigger names the directory.
  struct Firing {
    bool here = true;
    std::string dir_name;   // "iter_N" under hangs_dir
    int trigger_rank = -1;  // the rank the trigger names (joining), -1 if unknown
    uint64_t limit_us = 0;  // the limit that passed (here)
  };
  // Dumps, drops or joins the trigger, logs, waits for the other ranks' dumps and exits. False
  // (nothing done) when the phase instance ended while the stacks were taken.
  bool Fire(const PhaseSnapshot& s, Firing f);
  // Creates the trigger unless another rank's exists, whose directory `dir_name` then becomes.
  Status ClaimTrigger(std::string* dir_name);
  // Sleeps `us` on the Env's clock, returning early when the watchdog is being destroyed.
  void Pause(uint64_t us);

  Env* env_;
  const PhaseTracker* phases_;
  const CollectiveRecorder* collectives_;
  std::vector<std::pair<std::string, const CollectiveRecorder*>> groups_;
  WatchdogOptions o_;
  std::mutex check_mu_;  // one CheckOnce at a time
  bool fired_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace keel
