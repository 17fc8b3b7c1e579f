// GuardController: connects the Guard (which decides) to the training loop (which acts). It
// hands each iteration's signals to the Guard (Judge: whether its update is applied, and a
// decision), and after the iteration executes what the Guard decided (Act): a rollback to the
// newest healthy checkpoint before the onset (pinned), a skipped data window, an LR cut, a
// re-seeded data order, or a stop. Every decision goes to the run journal (events.jsonl,
// CHRONICLE.md).
//
// The ladder and budget outlive rollbacks: a rollback rewinds the model and counters but not the
// guard's memory of it. They are written to SAVE/guard.json at each rollback (atomically) and
// into every later checkpoint; on start, guard.json wins when it records more decisions than the
// checkpoint (a crash after a rollback and before the next save).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "core/env.h"
#include "guard/guard.h"
#include "journal/run_journal.h"
#include "train/checkpoint_controller.h"
#include "train/trainer.h"

namespace keel {

constexpr const char* kGuardPolicyFile = "guard.json";

// The guard settings of a run config.
GuardConfig GuardConfigFrom(const TrainConfig& cfg);

class GuardController {
 public:
  // `store` and `ckpt` may be null (no --save): then rollbacks are impossible and a rollback
  // decision stops the run.
  GuardController(const TrainConfig& cfg, Env* env, CheckpointStore* store, Trainer* trainer,
                  CheckpointController* ckpt, RunJournal* journal,
                  std::function<void(const std::string&)> log);

  // The guard's state at start: from the resumed checkpoint (may be null) and SAVE/guard.json.
  Status Start(const SavedTrainState* saved);
  // Between an iteration's gradients and its update: the guard's verdict on its signals
  // (whether to apply the update, and what to do after the iteration). Anomalies are probed by
  // rerunning the batch (a collective: every rank judges together). With the guard off: apply.
  StepVerdict Judge(const GuardSignals& signals);
  // After the iteration: carries out `decision` (a rollback, an LR cut, a stop); false stops the
  // run (see stop_message()).
  bool Act(const GuardDecision& decision);
  // The guard slot of a checkpoint saved now.
  nlohmann::json StateForCheckpoint() const;
  // After every save: the first checkpoint after a spike's onset is pinned.
  void AfterSave(int64_t iteration);

  bool stopped() const { return stopped_; }
  const std::string& stop_message() const { return stop_message_; }
  Guard& guard() { return guard_; }

 private:
  Status Rollback(const GuardDecision& d);
  // A spike or divergence was detected with onset `onset`: pin the newest checkpoint before it
  // now, and the first one saved after it (AfterSave), so both can be studied.
  void PinAround(int64_t onset);
  Status WritePolicyFile();

  TrainConfig cfg_;
  Env* env_;
  CheckpointStore* store_;
  Trainer* trainer_;
  CheckpointController* ckpt_;
  RunJournal* journal_;
  std::function<void(const std::string&)> log_;
  Guard guard_;
  int64_t pin_next_save_after_ = -1;  // onset of the last event whose post-onset save is unpinned
  bool stopped_ = false;
  std::string stop_message_;
};

}  // namespace keel
