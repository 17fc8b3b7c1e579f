// Where a run continues from: the one place that reads --save and --load and decides between a
// fresh start, a resume of the run's own newest valid checkpoint, a rollback to one of its
// checkpoints (--load SAVE/iter_N), and a start from another run's checkpoint. It also applies
// the resume rules to the config's differences from the checkpoint's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "core/env.h"

namespace keel {

// One difference between a checkpoint's config and the new run's.
struct ConfigChange {
  enum class Kind {
    kShape,      // the model's shape: always refused
    kScheduler,  // LR, warmup, decay, optimizer, batch: needs --override-scheduler
    kDataOrder,  // seed, data, split: needs --override-data-order
    kFree,       // lengths, intervals, threads...: logged
  };
  Kind kind;
  std::string key, old_value, new_value;
};
std::vector<ConfigChange> DiffConfigForResume(const TrainConfig& saved, const TrainConfig& now);
// The kind of change a config key makes on resume (warmup and decay lengths are kScheduler;
// settings that only steer the process, like --save, are kFree).
ConfigChange::Kind ResumeKindOfKey(const std::string& key);

// Applies the resume rules to `changes`: an error with the full diff and the accepting flag when
// a change needs a flag that was not given; otherwise `accepted` lists the changes a flag
// accepted and `free` those that need none.
Status CheckResumeChanges(const std::vector<ConfigChange>& changes, const TrainConfig& now,
                          std::vector<ConfigChange>* accepted, std::vector<ConfigChange>* free);
// "KEY: OLD -> NEW".
std::string DescribeChange(const ConfigChange& c);

struct ResumePoint {
  enum class Kind {
    kFresh,     // no checkpoint: fresh weights
    kResume,    // the newest valid checkpoint of --save (or of --load when it is --save)
    kRollback,  // --load SAVE/iter_N: back to N; newer checkpoints are set aside when it starts
    kLoad,      // --load names another run or checkpoint: its state, saved into --save
    kFinetune,  // --finetune, or --load of an imported checkpoint: its model weights only; the
                // run starts at iteration 0 with a fresh optimizer and its own schedule and data
  };
  Kind kind = Kind::kFresh;
  std::unique_ptr<SavedTrainState> saved;  // verified and read; null for kFresh
  std::vector<ConfigChange> accepted;      // changes an override flag accepted
  std::vector<ConfigChange> free_changes;  // changes that need no flag (a precision, ...)
  std::vector<std::string> notes;          // for the log: free changes, what --load means
  // The checkpoint's padded vocabulary when it differs from what this run's tensor-parallel size
  // would pad to and the run takes it (the padded vocabulary is the model's shape); 0: the same.
  int adopted_padded_vocab = 0;
  // kResume from the local tier (--non-persistent-save-interval): `saved` is the local
  // checkpoint assembled from the ranks' pieces, newer than --save's newest valid one.
  bool local_tier = false;
  // The checkpoint lies in --save (a resume or a rollback): later saves continue its numbering.
  bool in_save_dir() const { return kind == Kind::kResume || kind == Kind::kRollback; }
  // The run continues the checkpoint's (its counters, optimizer, schedule position, guard); a
  // fine-tuning run takes only its weights and starts afresh.
  bool continues_run() const { return saved != nullptr && kind != Kind::kFinetune; }
};
const char* ResumeKindName(ResumePoint::Kind kind);

// Decides where the run of `cfg` (validated, with the data's vocabulary) continues from. Reading
// it changes nothing but what a resume must: leftovers of interrupted saves are removed, and
// checkpoints of --save that fail verification are set aside (iter_N.corrupt), each logged.
// --finetune (or a --load of a checkpoint written by `keel ckpt import`) takes the weights only:
// the model's shape must match (every other setting is the run's own); once --save holds the
// fine-tuning run's checkpoints, the same command resumes it (a note says so).
// A --load that does not exist or holds no checkpoint starts fresh, as Megatron does (the first
// launch of a `--save X --load X` script), with a note in `notes` (with --finetune: an error).
// Errors: InvalidArgument for a config that differs from the checkpoint's without the accepting
// flag (for --finetune, a model of another shape), a --load of another run (or an empty one)
// into a --save that has its own checkpoints, --finetune from a --load holding nothing, or a
// --save or --load holding a Megatron-LM/DeepSpeed checkpoint (left untouched); Corruption when
// checkpoints exist but none verifies.
Status ResolveResumePoint(Env* env, const TrainConfig& cfg, const CheckpointStore::Logger& log,
                          ResumePoint* out);
// The resume of `cfg` from checkpoint directory `dir` of the local tier (verified already):
// kResume with local_tier set, under the same resume rules as ResolveResumePoint's.
Status ResolveLocalResumePoint(Env* env, const TrainConfig& cfg, const std::string& dir,
                               ResumePoint* out);

}  // namespace keel
