// The kinds of a training run's journal (SAVE/events.jsonl) and of a checkpoint's history
// (state.json "history"), one struct each: what the guard, the trainer's controllers and the run's
// health checks write, with every field typed. docs/observability.md lists them (checked by
// JournalEventsTest.DocsListEveryKind). `keel launch` writes its own kinds into the same
// events.jsonl (launch/launch_events.h); `keel logs watch` journals in a directory of its own
// (logs/watch_events.h). Values of higher modules (GuardSignals, a GuardDecision) travel here as
// plain values: journal/ includes nothing above core/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "journal/journal_event.h"

namespace keel {

// The guard's signals of one iteration (GuardSignals, as journaled).
struct EventSignals {
  double lm_loss = NAN, grad_norm = NAN, update_ratio = NAN, max_exp_avg_sq = NAN,
         max_attn_logit = NAN, log_z = NAN, loss_scale = NAN;
  bool nonfinite = false;
  template <class F>
  void Fields(F& f) {
    f("lm_loss", lm_loss);
    f("grad_norm", grad_norm);
    f("update_ratio", update_ratio);
    f("max_exp_avg_sq", max_exp_avg_sq);
    f("max_attn_logit", max_attn_logit);
    f("log_z", log_z);
    f("loss_scale", loss_scale);
    f("nonfinite", nonfinite);
  }
};

// A setting's change: the history's "changes" (keel ckpt edit) and "accepted_changes" (a resume).
struct ValueChange {
  std::string key;
  nlohmann::json old_value, new_value;  // as the setting is written (a string, a number)
  template <class F>
  void Fields(F& f) {
    f("key", key);
    f("old", old_value);
    f("new", new_value);
  }
};

// ---- The guard's (guard/guard.cc). Every one carries the guard's mode ("observe", "act"), and
// the run's consumed samples (added by GuardController where the guard does not know them).

// An anomaly opened: a spike, divergence or non-finite value.
struct DetectedEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(DetectedEvent, "detected")
  int64_t iteration = 0, consumed_samples = 0;
  std::string kind_name;  // "spike", "divergence", "non-finite"
  std::string signal;     // "lm loss", "grad norm", ...
  double value = NAN, baseline = NAN, z = NAN;
  int64_t onset = 0;
  bool resume_spike = false;
  NullableString cause;  // "data" or "weights" when the probe could tell
  double probe_lm_loss = NAN;
  EventSignals signals;
  std::string mode;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("consumed_samples", consumed_samples);
    f("kind", kind_name);
    f("signal", signal);
    f("value", value);
    f("baseline", baseline);
    f("z", z);
    f("onset", onset);
    f("resume_spike", resume_spike);
    f("cause", cause);
    f("probe_lm_loss", probe_lm_loss);
    f("signals", signals);
    f("mode", mode);
  }
};

// A slow divergence found by the trend test (guard/loss_trend_detector.h): the loss has been
// climbing since `start`, `size` above its level there. `action`: "notify" (--guard-divergence
// notify, or observe mode), "rollback" (act: a rollback decision follows).
struct SlowDivergenceEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(SlowDivergenceEvent, "slow_divergence")
  int64_t iteration = 0, consumed_samples = 0;
  std::string signal;  // "lm loss", or "lm loss of dataset N" (a mixture's)
  int64_t start = 0;
  double baseline = NAN, value = NAN, size = NAN, above_expected = NAN, z = NAN;
  double confidence = NAN;
  std::string action;
  EventSignals signals;
  std::string mode;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("consumed_samples", consumed_samples);
    f("signal", signal);
    f("start", start);
    f("baseline", baseline);
    f("value", value);
    f("size", size);
    f("above_expected", above_expected);
    f("z", z);
    f("confidence", confidence);
    f("action", action);
    f("signals", signals);
    f("mode", mode);
  }
};

// The loss came back to its pre-onset level: the anomaly closed.
struct RecoveredEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(RecoveredEvent, "recovered")
  int64_t iteration = 0, onset = 0;
  std::string classification;
  int64_t skipped_updates = 0;
  EventSignals signals;
  std::string mode;
  std::optional<int64_t> consumed_samples;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("onset", onset);
    f("classification", classification);
    f("skipped_updates", skipped_updates);
    f("signals", signals);
    f("mode", mode);
    f("consumed_samples", consumed_samples);
  }
};

// Past a rollback's skipped window with no new anomaly.
struct RecoveryConfirmedEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(RecoveryConfirmedEvent, "recovery_confirmed")
  int64_t iteration = 0;
  EventSignals signals;
  std::string mode;
  std::optional<int64_t> consumed_samples;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("signals", signals);
    f("mode", mode);
    f("consumed_samples", consumed_samples);
  }
};

// The same state and batch computed again gave other bits: the arithmetic failed once.
struct TransientFaultEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(TransientFaultEvent, "transient_fault")
  int64_t iteration = 0;
  double lm_loss = NAN, rerun_lm_loss = NAN;
  int64_t transient_faults = 0;
  std::vector<int64_t> ranks;  // whose result differed, when known
  EventSignals signals;
  std::string mode;
  std::optional<int64_t> consumed_samples;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("lm_loss", lm_loss);
    f("rerun_lm_loss", rerun_lm_loss);
    f("transient_faults", transient_faults);
    f("ranks", ranks);
    f("signals", signals);
    f("mode", mode);
    f("consumed_samples", consumed_samples);
  }
};

// One update skipped (or, observing, that would be).
struct SkipUpdateEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(SkipUpdateEvent, "skip_update")
  int64_t iteration = 0, onset = 0;
  std::string mode;
  std::optional<int64_t> consumed_samples;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("onset", onset);
    f("mode", mode);
    f("consumed_samples", consumed_samples);
  }
};

// Observe mode: what the guard would have done.
struct WouldActEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(WouldActEvent, "would_act")
  int64_t iteration = 0, onset = 0;
  std::string action;  // "rollback" or "stop"
  std::string reason;
  std::string mode;
  std::optional<int64_t> consumed_samples;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("onset", onset);
    f("action", action);
    f("reason", reason);
    f("mode", mode);
    f("consumed_samples", consumed_samples);
  }
};

// Attention logits past the threshold: the LR cut in place before the loss moves.
struct LeadingIndicatorEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(LeadingIndicatorEvent, "leading_indicator")
  int64_t iteration = 0;
  std::string signal;
  double value = NAN, threshold = NAN;
  std::string action;  // "lr_cut" or "would_cut_lr"
  double lr_factor = NAN;
  int64_t lr_cuts = 0;
  double next_threshold = NAN;
  std::string recommendation;
  EventSignals signals;
  std::string mode;
  std::optional<int64_t> consumed_samples;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("signal", signal);
    f("value", value);
    f("threshold", threshold);
    f("action", action);
    f("lr_factor", lr_factor);
    f("lr_cuts", lr_cuts);
    f("next_threshold", next_threshold);
    f("recommendation", recommendation);
    f("signals", signals);
    f("mode", mode);
    f("consumed_samples", consumed_samples);
  }
};

// The guard stops the run (a rollback is impossible). A decision about the run: no iteration.
struct GuardStopEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(GuardStopEvent, "stop")
  int64_t onset = 0;
  std::string reason;
  std::string mode;
  std::optional<int64_t> consumed_samples;
  template <class F>
  void Fields(F& f) {
    f("onset", onset);
    f("reason", reason);
    f("mode", mode);
    f("consumed_samples", consumed_samples);
  }
};

// ---- The trainer's controllers (train/).

// The guard rolled the run back (GuardController; also in the checkpoint's history).
struct RollbackEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(RollbackEvent, "rollback")
  int64_t iteration = 0, onset = 0, to_iteration = 0;
  std::string checkpoint;
  std::vector<int64_t> skip_iterations;  // [first, last]
  std::vector<int64_t> skip_samples;     // [first, end)
  double lr_factor = 1, lr_scale = 1;
  bool reseed = false;
  int64_t data_order_salt = 0, level = 0, rollbacks = 0;
  std::string reason;
  int64_t consumed_samples = 0;
  std::vector<std::string> kept;  // the newer checkpoints kept as .rolled-back
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("onset", onset);
    f("to_iteration", to_iteration);
    f("checkpoint", checkpoint);
    f("skip_iterations", skip_iterations);
    f("skip_samples", skip_samples);
    f("lr_factor", lr_factor);
    f("lr_scale", lr_scale);
    f("reseed", reseed);
    f("data_order_salt", data_order_salt);
    f("level", level);
    f("rollbacks", rollbacks);
    f("reason", reason);
    f("consumed_samples", consumed_samples);
    f("kept", kept);
  }
};

// A --skip-train-iteration-range ahead of the run.
struct SkipRangeEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(SkipRangeEvent, "skip_range")
  std::string source;               // "--skip-train-iteration-range"
  std::vector<int64_t> iterations;  // [first, last]
  int64_t iteration = 0;            // where the run starts
  template <class F>
  void Fields(F& f) {
    f("source", source);
    f("iterations", iterations);
    f("iteration", iteration);
  }
};

// --lr-scale-on-resume changed the LR scale (journal and history).
struct LrScaleEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(LrScaleEvent, "lr_scale")
  int64_t iteration = 0;
  std::string at;
  double old_scale = 1, new_scale = 1;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f(kEventAtKey, at);
    f("old", old_scale);
    f("new", new_scale);
  }
};

// fp16: the loss scale fell to --min-loss-scale.
struct LossScaleCollapseEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(LossScaleCollapseEvent, "loss_scale_collapse")
  int64_t iteration = 0;
  std::string at;
  double loss_scale = NAN;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f(kEventAtKey, at);
    f("loss_scale", loss_scale);
  }
};

// ---- The run's health (train/run_health.cc: watchdog, ranks in step, stragglers, replicas).

// The watchdog found a phase past its limit; the job exits `exit_code` (4).
struct HangEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(HangEvent, "hang")
  int64_t iteration = 0;
  std::string dir;  // the stack dumps
  int64_t exit_code = 0;
  // When it fired (Unix seconds) and how long the phase had stood still: where the hang began,
  // for goodput. Absent in journals of keel before they were written.
  std::optional<double> unix_time, stuck_seconds;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("dir", dir);
    f("exit_code", exit_code);
    f("unix_time", unix_time);
    f("stuck_seconds", stuck_seconds);
  }
};

// The ranks entered different collectives.
struct CollectivesOutOfStepEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(CollectivesOutOfStepEvent, "collectives_out_of_step")
  int64_t iteration = 0, exit_code = 0;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("exit_code", exit_code);
  }
};

// A rank slower than the others ("straggler"), or no longer ("straggler_recovered").
struct SlowRankEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT_PAIR(SlowRankEvent, "straggler", "straggler_recovered", recovered)
  bool recovered = false;
  int64_t iteration = 0, rank = 0;
  std::string host;
  double slowdown = 0;
  int64_t since_iteration = 0;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("rank", rank);
    f("host", host);
    f("slowdown", slowdown);
    f("since_iteration", since_iteration);
  }
};

// The job slowed ("throughput_drop"), or is back ("throughput_recovered").
struct JobSlowdownEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT_PAIR(JobSlowdownEvent, "throughput_drop", "throughput_recovered", recovered)
  bool recovered = false;
  int64_t iteration = 0, since_iteration = 0;
  double drop = 0;
  int64_t follows_rank = -1;        // the rank whose own compute time rose; -1: none
  std::optional<std::string> host;  // that rank's host
  // The level against which it is judged (the best sustained one) and the level now, in samples
  // per second; the visible cause of a drop (CPU time against wall time, data wait, saves).
  // Absent in journals of keel before they were written.
  std::optional<double> baseline, level;
  std::optional<std::string> reason;
  // How sure: the drop over its standard error (absent while the run was too short to measure its
  // noise), the relative noise per iteration measured, the iterations the level is the median of.
  std::optional<double> z, noise;
  std::optional<int64_t> window;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("since_iteration", since_iteration);
    f("drop", drop);
    f("follows_rank", follows_rank);
    f("host", host);
    f("baseline", baseline);
    f("level", level);
    f("reason", reason);
    f("z", z);
    f("noise", noise);
    f("window", window);
  }
};

// The replicas' weights differ.
struct ReplicaMismatchEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(ReplicaMismatchEvent, "replica_mismatch")
  int64_t iteration = 0;
  std::string message;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("message", message);
  }
};

// ---- Goodput (train/goodput_clock.h): where each second of the process went, a record at each
// save, before a rollback and at the end (report/goodput.h adds them up across restarts).

// The seconds of one record, by what the loop was doing.
struct GoodputSeconds {
  double compute = 0;    // iterations (their time less the parts below)
  double data_wait = 0;  // the loop waiting for its batch
  double eval = 0, save = 0;
  double guard = 0;   // the guard's reruns and probes
  double resume = 0;  // a rollback's restore
  double other = 0;   // after the loop: the last logs, the sample
  template <class F>
  void Fields(F& f) {
    f("compute", compute);
    f("data_wait", data_wait);
    f("eval", eval);
    f("save", save);
    f("guard", guard);
    f("resume", resume);
    f("other", other);
  }
};

// A process began its loop at `iteration` (the resume point): the time before it was start-up.
struct GoodputStartEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(GoodputStartEvent, "goodput_start")
  int64_t iteration = 0;
  int64_t attempt = 0;       // KEEL_LAUNCH_ATTEMPT (0: not under keel launch)
  double process_start = 0;  // Unix seconds
  double unix_time = 0;      // when the loop began
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f("attempt", attempt);
    f("process_start", process_start);
    f("unix_time", unix_time);
  }
};

// The seconds since the previous record (or goodput_start), the iterations they trained.
struct GoodputEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(GoodputEvent, "goodput")
  int64_t first_iteration = 0, last_iteration = 0;  // none when first > last
  std::string why;                                  // "save", "rollback", "end"
  double unix_time = 0;
  GoodputSeconds seconds;
  template <class F>
  void Fields(F& f) {
    f("first_iteration", first_iteration);
    f("last_iteration", last_iteration);
    f("why", why);
    f("unix_time", unix_time);
    f("seconds", seconds);
  }
};

// The job's breakdown so far (report/goodput.h), at the end of a run or of keel launch.
struct GoodputSummaryEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(GoodputSummaryEvent, "goodput_summary")
  double wall_seconds = 0;
  nlohmann::json categories;  // {"productive": s, ...}
  template <class F>
  void Fields(F& f) {
    f("wall_seconds", wall_seconds);
    f("categories", categories);
  }
};

// ---- A checkpoint's history only (state.json "history"; each carries its own "at").

// A new run from another's weights (--finetune).
struct FinetuneEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(FinetuneEvent, "finetune")
  int64_t iteration = 0;
  std::string at, from;
  int64_t from_iteration = 0;
  std::string keel_version;
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f(kEventAtKey, at);
    f("from", from);
    f("from_iteration", from_iteration);
    f("keel_version", keel_version);
  }
};

// A process continued a run ("resume"), or --load took it back to an older checkpoint
// ("rollback": this shape, with "from", not the guard's RollbackEvent).
struct ResumeEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT_PAIR(ResumeEvent, "resume", "rollback", rollback)
  bool rollback = false;
  int64_t iteration = 0;
  std::string at, from, keel_version;
  std::optional<std::vector<ValueChange>> accepted_changes;  // by --override-* flags
  std::optional<std::vector<std::string>> free_changes;      // "KEY: OLD -> NEW"
  template <class F>
  void Fields(F& f) {
    f("iteration", iteration);
    f(kEventAtKey, at);
    f("from", from);
    f("keel_version", keel_version);
    f("accepted_changes", accepted_changes);
    f("free_changes", free_changes);
  }
};

// `keel ckpt edit`.
struct EditEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(EditEvent, "edit")
  std::string at;
  std::vector<ValueChange> changes;
  std::string reason;
  template <class F>
  void Fields(F& f) {
    f(kEventAtKey, at);
    f("changes", changes);
    f("reason", reason);
  }
};

// `keel ckpt import --hf`: where the weights came from (the provenance a test's import may
// leave out).
struct ImportEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(ImportEvent, "import")
  std::string at, keel_version;
  std::optional<std::string> from;                 // the Hugging Face directory
  std::optional<std::string> model_type;           // its config.json model_type
  std::optional<std::vector<std::string>> files;   // the weight files read
  std::optional<std::vector<std::string>> dtypes;  // of the tensors read
  template <class F>
  void Fields(F& f) {
    f(kEventAtKey, at);
    f("keel_version", keel_version);
    ProvenanceFields(f);
  }
  template <class F>
  void ProvenanceFields(F& f) {
    f("from", from);
    f("model_type", model_type);
    f("files", files);
    f("dtypes", dtypes);
  }
  // The provenance fields alone (state.json's "import" object), and back.
  nlohmann::json ProvenanceToJson() const;
  Status ProvenanceFromJson(const nlohmann::json& provenance, const std::string& where);
};

// The kinds the training process writes to events.jsonl (the guard's, the controllers', the
// health checks'), and those only a checkpoint's history holds (for the docs check). The guard's
// "rollback" and "lr_scale" go to both.
std::vector<EventSchema> RunEventSchemas();
std::vector<EventSchema> HistoryEventSchemas();

}  // namespace keel
