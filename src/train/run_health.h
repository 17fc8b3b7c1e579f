// RunHealth: what keeps a many-rank run out of limbo, in one place the loop calls.
//   - the communicator the loop uses: every collective in the flight recorder and checked for
//     ranks out of step (comm/recording_communicator.h);
//   - the phase tracker the trainer reports to, and the watchdog thread that turns a phase
//     lasting past its limit into stack dumps of every rank and exit 4 (watchdog/watchdog.h);
//   - stragglers (many ranks), from every rank's compute time per iteration
//     (health/straggler_detector.h), and throughput drops (every run, one process included), from
//     the samples per second of every iteration, through the detector `keel logs analyze` uses
//     (health/throughput_drop_detector.h) with the visible cause (health/throughput_cause.h):
//     logged, journaled (CHRONICLE.md too) and written to TensorBoard;
//   - replica checks every --check-replicas-interval iterations and before every save
//     (train/replica_check.h).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/recording_communicator.h"
#include "config/config.h"
#include "core/env.h"
#include "health/straggler_detector.h"
#include "health/throughput_cause.h"
#include "health/throughput_drop_detector.h"
#include "journal/run_journal.h"
#include "metrics/run_metrics.h"
#include "train/test_hooks.h"
#include "train/trainer.h"
#include "watchdog/phase_tracker.h"
#include "watchdog/watchdog.h"

namespace keel {

class RunHealth {
 public:
  // `base`: the process's communicator; `hooks` may be null.
  RunHealth(Env* env, Communicator* base, const TestHooks* hooks);
  ~RunHealth();

  Communicator* comm() { return &comm_; }
  PhaseTracker* phases() { return &phases_; }
  const std::vector<std::string>& hosts() const { return hosts_; }

  // Before Start: a process group of comm() (a RecordingCommunicator from its Split) whose
  // flight recorder hang dumps show under `name` ("tensor", "data"); out-of-step reports in it
  // are journaled as the world's are.
  void AddGroup(const std::string& name, Communicator* group);
  // Once the config is final: the ranks agree on a job id and learn each other's hosts (two
  // collectives), and the watchdog starts (phase: startup).
  Status Start(const TrainConfig& cfg);
  // Once the trainer, the journal and the metrics exist: the phase tracker goes to the trainer,
  // the test-only skipped collective to the communicator; stragglers and drops are journaled
  // from now on.
  void Attach(Trainer* trainer, RunJournal* journal, RunMetrics* metrics);
  // After every iteration's update, with its result: the straggler and throughput detectors.
  void OnStep(const StepResult& r);
  // A save took `seconds` (a cause a throughput drop may name).
  void OnSave(double seconds);
  // After every iteration: a replica check when one is due. An error stops the run unsaved.
  Status AfterIteration();
  // Every rank, at the same point (before a save): Corruption when the replicas differ.
  Status CheckReplicas(const std::string& why);
  // The run's loop is over: the watchdog stops.
  void Stop();

 private:
  void Journal(const JournalEvent& event, const std::string& sentence);
  std::string RankText(int rank) const;
  void WatchThroughput(const StepResult& r, int64_t it);
  std::string ThroughputCause(int64_t since) const;

  Env* env_;
  const TestHooks* hooks_;
  TrainConfig cfg_;
  PhaseTracker phases_;
  RecordingCommunicator comm_;
  std::vector<RecordingCommunicator*> groups_;
  std::vector<std::string> hosts_;
  std::string job_id_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<StragglerDetector> stragglers_;
  std::unique_ptr<ThroughputDropDetector> drops_;
  Trainer* trainer_ = nullptr;
  std::atomic<RunJournal*> journal_{nullptr};  // also read by the watchdog's thread
  RunMetrics* metrics_ = nullptr;
  int64_t steps_seen_ = 0;
  int64_t last_global_batch_ = -1;
  int64_t last_iteration_ = -1;
  int64_t anchor_iteration_ = 0;  // where the throughput baseline was last set anew
  // What each recent iteration's time went to (at most the last 200), and the saves.
  struct Cost {
    int64_t iteration;
    IterationCost cost;
  };
  std::deque<Cost> costs_;
  struct SaveTime {
    int64_t after_iteration;
    double seconds;
  };
  std::deque<SaveTime> saves_;
  uint64_t last_step_us_ = 0;
  double last_cpu_seconds_ = NAN;
  bool first_replica_check_ = true;
};

}  // namespace keel
