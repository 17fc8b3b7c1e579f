#include "train/guard_controller.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "checkpoint/manifest.h"
#include "core/json_reader.h"
#include "journal/events.h"

namespace keel {

using json = nlohmann::json;

GuardConfig GuardConfigFrom(const TrainConfig& c) {
  GuardConfig g;
  g.mode = c.guard == GuardLevel::kOff       ? GuardMode::kOff
           : c.guard == GuardLevel::kObserve ? GuardMode::kObserve
                                             : GuardMode::kAct;
  g.detector.window = c.guard_window;
  g.detector.min_history = c.guard_min_history;
  g.detector.z_threshold = c.guard_z_threshold;
  g.detector.grad_z_threshold = c.guard_grad_z_threshold;
  g.detector.divergence_window = c.guard_divergence_window;
  g.detector.divergence_rel = c.guard_divergence_rel;
  g.max_skips = c.guard_max_skips;
  g.max_data_skips = c.guard_max_data_skips;
  g.attn_logit_max = c.guard_attn_logit_max;
  g.max_lr_cuts = c.guard_max_lr_cuts;
  g.recover_iters = c.guard_recover_iters;
  g.margin = c.guard_rollback_margin;
  g.skip_before = c.guard_skip_before;
  g.skip_after = c.guard_skip_after;
  g.lr_cut = c.guard_lr_cut;
  g.max_rollbacks = c.guard_max_rollbacks;
  g.escalation_window = c.guard_escalation_window;
  g.trend.z_threshold = c.guard_trend_z;
  g.divergence_act = c.guard_divergence == GuardDivergence::kAct;
  return g;
}

GuardController::GuardController(const TrainConfig& cfg, Env* env, CheckpointStore* store,
                                 Trainer* trainer, CheckpointController* ckpt, RunJournal* journal,
                                 std::function<void(const std::string&)> log)
    : cfg_(cfg),
      env_(env),
      store_(store),
      trainer_(trainer),
      ckpt_(ckpt),
      journal_(journal),
      log_(std::move(log)),
      guard_(GuardConfigFrom(cfg), [this](const json& e, const std::string& sentence) {
        json ev = e;
        ev["consumed_samples"] =
            ev.value("consumed_samples", trainer_->state().counters.consumed_samples);
        if (journal_) journal_->Append(ev, sentence);
        if (ev.value("event", "") == "detected" && guard_.mode() == GuardMode::kAct)
          PinAround(ev.value("onset", int64_t{0}));
        if (ev.value("event", "") == "slow_divergence" && ev.value("action", "") == "rollback")
          PinAround(ev.value("start", int64_t{0}));
      }) {
  if (!log_) log_ = [](const std::string&) {};
}

Status GuardController::Start(const SavedTrainState* saved) {
  if (guard_.mode() == GuardMode::kOff) {
    log_(
        "guard: off (--guard off): spikes and divergence are not watched; non-finite updates "
        "are still never applied");
    return Status::OK();
  }
  if (saved != nullptr) {
    if (saved->guard.is_object()) {
      Status st = guard_.FromJson(saved->guard, saved->dir + "/state.json: guard");
      if (!st.ok()) return Status::Corruption(st.message() + "; " + kDamagedCheckpointFix);
    } else {
      log_(
          "guard: the checkpoint has no guard state (saved with --guard off): its windows "
          "start empty");
    }
    guard_.OnRestart(saved->train.counters.iteration);
  }
  // guard.json: decisions taken after this checkpoint was saved (a rollback, then a crash).
  const std::string gp = store_ ? JoinPath(store_->root(), kGuardPolicyFile) : "";
  if (!gp.empty() && env_->FileExists(gp)) {
    std::string text;
    KEEL_RETURN_IF_ERROR(env_->ReadFileToString(gp, &text));
    const char* fix = "restore it from backup or delete it to forget the guard's past rollbacks";
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("policy") || !j["policy"].is_object())
      return Status::Corruption(gp + " is not a keel guard state: " + fix);
    JsonReader r(gp, j, fix);
    const int64_t decisions = r.root()["policy"].Optional("decisions").Get<int64_t>(0);
    KEEL_RETURN_IF_ERROR(r.status());
    if (decisions > guard_.decisions()) {
      Status st = guard_.PolicyFromJson(j["policy"], gp + ": policy");
      if (!st.ok()) return Status::Corruption(st.message() + "; " + fix);
      TrainState state = trainer_->state();
      state.skip_ranges.clear();
      for (const JsonValue& range : r.root()["skipped_iteration_ranges"].Items())
        state.skip_ranges.push_back({range[0].Get<int64_t>(), range[1].Get<int64_t>()});
      state.lr_scale = r.root()["lr_scale"].Get<double>();
      state.data_salt = r.root()["data_order_salt"].Get<uint64_t>();
      KEEL_RETURN_IF_ERROR(r.status());
      trainer_->Restore(state);
      log_(fmt::format(
          "guard: {} records decisions taken after this checkpoint was saved: {} rollback(s), "
          "{} skipped window(s), LR scale {}, data order salt {}; applied",
          gp, guard_.rollbacks(), state.skip_ranges.size(), state.lr_scale, state.data_salt));
    }
  }
  if (guard_.mode() == GuardMode::kAct && store_ == nullptr)
    log_(
        "WARNING: guard: no --save directory, so the guard can skip anomalous updates but "
        "cannot roll back; a rollback decision will stop the run");
  log_(fmt::format(
      "guard: {} (spike: loss z > {}, grad-norm z > {} over {} iterations; divergence: median "
      "of {} iterations {}% above its lowest, or a slow rise by the trend test (z > {}; "
      "--guard-divergence {}); ladder: skip <= {} updates (<= {} of anomalous "
      "batches), roll back + skip {}..+{} iterations, + LR x{}, + reseed; at most {} rollbacks)",
      GuardModeName(guard_.mode()), cfg_.guard_z_threshold, cfg_.guard_grad_z_threshold,
      cfg_.guard_window, cfg_.guard_divergence_window, 100 * cfg_.guard_divergence_rel,
      cfg_.guard_trend_z, cfg_.guard_divergence == GuardDivergence::kAct ? "act" : "notify",
      cfg_.guard_max_skips, cfg_.guard_max_data_skips, cfg_.guard_skip_before,
      cfg_.guard_skip_after, cfg_.guard_lr_cut, cfg_.guard_max_rollbacks));
  return Status::OK();
}

void GuardController::PinAround(int64_t onset) {
  if (store_ == nullptr) return;
  std::vector<CheckpointInfo> all;
  if (store_->List(&all).ok()) {
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (it->iteration >= onset) continue;
      Status st = store_->Pin(
          it->iteration,
          fmt::format("guard: newest checkpoint before the event at iteration {}", onset));
      if (!st.ok()) log_("WARNING: guard: could not pin " + it->name + ": " + st.message());
      break;
    }
  }
  pin_next_save_after_ = onset;
}

void GuardController::AfterSave(int64_t iteration) {
  if (pin_next_save_after_ < 0 || iteration < pin_next_save_after_) return;
  Status st = store_->Pin(
      iteration,
      fmt::format("guard: first checkpoint after the event at iteration {}", pin_next_save_after_));
  if (!st.ok())
    log_("WARNING: guard: could not pin checkpoint " + std::to_string(iteration) + ": " +
         st.message());
  pin_next_save_after_ = -1;
}

json GuardController::StateForCheckpoint() const {
  if (guard_.mode() == GuardMode::kOff) return nullptr;
  return guard_.ToJson();
}

Status GuardController::WritePolicyFile() {
  if (store_ == nullptr || store_->read_only()) return Status::OK();  // rank 0's file
  const TrainState& state = trainer_->state();
  json j = {{"format", "keel-guard-policy"},      {"iteration", state.counters.iteration},
            {"policy", guard_.PolicyJson()},      {"lr_scale", state.lr_scale},
            {"data_order_salt", state.data_salt}, {"skipped_iteration_ranges", json::array()}};
  for (const IterationRange& r : state.skip_ranges)
    j["skipped_iteration_ranges"].push_back({r.first, r.last});
  return WriteFileAtomic(env_, JoinPath(store_->root(), kGuardPolicyFile), j.dump(2) + "\n");
}

Status GuardController::Rollback(const GuardDecision& d) {
  if (store_ == nullptr || ckpt_ == nullptr)
    return Status::NotFound(
        "there is no --save directory, so no checkpoint to roll "
        "back to; give --save to let the guard roll back");
  std::vector<CheckpointInfo> all;
  KEEL_RETURN_IF_ERROR(store_->List(&all));
  std::unique_ptr<SavedTrainState> target;
  std::vector<std::string> passed;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->iteration > d.latest_target) continue;
    auto saved = std::make_unique<SavedTrainState>();
    Status st = ReadVerifiedCheckpoint(env_, it->path, saved.get());
    if (!st.ok()) {
      passed.push_back(it->name + " (" + st.message() + ")");
      continue;
    }
    if (saved->guard.is_object() && !saved->guard.value("healthy", true)) {
      passed.push_back(it->name + " (saved during an open event: not healthy)");
      continue;
    }
    target = std::move(saved);
    break;
  }
  // Every rank chose from the same files; they must agree before rank 0 changes any of them.
  Communicator* comm = trainer_->comm();
  if (comm->world_size() > 1) {
    std::vector<std::string> all;
    comm->AllGatherBytes(std::to_string(target ? target->train.counters.iteration : -1), &all);
    for (size_t r = 1; r < all.size(); ++r)
      if (all[r] != all[0])
        return Status::IOError(fmt::format(
            "the ranks chose different checkpoints to roll back to (rank 0: iteration {}, rank "
            "{}: {}): every rank must see the same --save directory",
            all[0], r, all[r]));
  }
  if (!target) {
    std::string why = fmt::format(
        "no healthy checkpoint at or before iteration {} (onset {} minus --guard-rollback-margin "
        "{}) in {}",
        d.latest_target, d.onset, cfg_.guard_rollback_margin, store_->root());
    for (const std::string& p : passed) why += "; passed over " + p;
    why += "; save more often (--save-interval) so the guard has a checkpoint to return to";
    return Status::NotFound(why);
  }
  const int64_t to = target->train.counters.iteration;
  // What survives the rollback: the windows already skipped, the LR scale and the data salt.
  const TrainState before = trainer_->state();
  const int64_t from = before.counters.iteration;

  KEEL_RETURN_IF_ERROR(store_->Pin(
      to,
      fmt::format("guard: newest healthy checkpoint before the event at iteration {}", d.onset)));
  std::vector<std::string> kept;
  KEEL_RETURN_IF_ERROR(ckpt_->RollbackTo(*target, &kept));
  // The checkpoint's state, with the guard's memory carried over; iterations up to the target
  // were trained before the onset, so the skipped window starts after it.
  TrainState state = trainer_->state();
  const int64_t skip_first = std::max(d.skip_first, to + 1);
  state.skip_ranges = before.skip_ranges;
  state.skip_ranges.push_back({skip_first, d.skip_last});
  state.lr_scale = before.lr_scale * d.lr_factor;
  state.data_salt = before.data_salt + (d.reseed ? 1 : 0);
  trainer_->Restore(state);
  const double lr_scale = state.lr_scale;
  const uint64_t salt = state.data_salt;
  guard_.OnRolledBack(d, to, target->guard);
  pin_next_save_after_ = -1;  // the post-onset checkpoints are kept as .rolled-back

  const int64_t s0 = trainer_->SamplesBefore(skip_first);
  const int64_t s1 = trainer_->SamplesBefore(d.skip_last + 1);
  std::string changes = d.lr_factor != 1.0
                            ? fmt::format("LR scale x{} -> {}", d.lr_factor, lr_scale)
                            : "LR unchanged";
  if (d.reseed) changes += fmt::format("; data order re-seeded (salt {})", salt);
  RollbackEvent ev;
  ev.iteration = from;
  ev.onset = d.onset;
  ev.to_iteration = to;
  ev.checkpoint = target->dir;
  ev.skip_iterations = {skip_first, d.skip_last};
  ev.skip_samples = {s0, s1};
  ev.lr_factor = d.lr_factor;
  ev.lr_scale = lr_scale;
  ev.reseed = d.reseed;
  ev.data_order_salt = static_cast<int64_t>(salt);
  ev.level = d.level;
  ev.rollbacks = guard_.rollbacks();
  ev.reason = d.reason;
  ev.consumed_samples = trainer_->state().counters.consumed_samples;
  ev.kept = kept;
  const std::string sentence = fmt::format(
      "iteration {}: {}; rolled back to iteration {} (checkpoint pinned{}), skipping iterations "
      "{}..{} (samples {}..{}); {} (rollback {} of at most {})",
      from, d.reason, to,
      kept.empty() ? std::string()
                   : "; newer ones kept as " + fmt::format("{}", fmt::join(kept, ", ")),
      skip_first, d.skip_last, s0, s1 - 1, changes, guard_.rollbacks(), cfg_.guard_max_rollbacks);
  if (journal_) journal_->Append(ev, sentence);
  if (ckpt_ != nullptr) ckpt_->AddHistory(json(ev.ToJson()));
  return WritePolicyFile();
}

StepVerdict GuardController::Judge(const GuardSignals& s) {
  if (guard_.mode() == GuardMode::kOff) return StepVerdict{};
  std::vector<int> ranks;  // filled by the rerun
  const GuardProbes probes{[this, &ranks] { return trainer_->RerunLoss(&ranks); },
                           [this] { return trainer_->PreviousBatchLoss(); },
                           [&ranks] { return ranks; }};
  return guard_.OnStep(s, &probes);
}

bool GuardController::Act(const GuardDecision& d) {
  if (d.kind == GuardDecision::Kind::kContinue) return true;
  if (d.kind == GuardDecision::Kind::kCutLr) {
    // In place: the weights are healthy, only the LR from here on is smaller.
    TrainState state = trainer_->state();
    const double before = state.lr_scale;
    state.lr_scale *= d.lr_factor;
    trainer_->Restore(state);
    log_(fmt::format("guard: iteration {}: {}; LR scale {} -> {}", d.onset, d.reason, before,
                     state.lr_scale));
    Status st = WritePolicyFile();  // a crash before the next checkpoint keeps the cut
    if (!st.ok()) log_("WARNING: guard: could not write its policy file: " + st.message());
    return true;
  }
  if (d.kind == GuardDecision::Kind::kStop) {
    guard_.OnRollbackImpossible(d, d.reason);
    stopped_ = true;
    stop_message_ = "the guard stopped the run: " + d.reason;
    return false;
  }
  Status st = Rollback(d);
  if (!st.ok()) {
    guard_.OnRollbackImpossible(d, st.message());
    stopped_ = true;
    stop_message_ =
        "the guard needed to roll back (" + d.reason + ") but could not: " + st.message();
    return false;
  }
  return true;
}

}  // namespace keel
