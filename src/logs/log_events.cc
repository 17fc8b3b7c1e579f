#include "logs/log_events.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

#include "logs/throughput_drop_scan.h"

namespace keel {

const char* ThroughputSignalName(ThroughputSignal s) {
  switch (s) {
    case ThroughputSignal::kTflops:
      return "TFLOPs";
    case ThroughputSignal::kSamplesPerSecond:
      return "samples per second";
    case ThroughputSignal::kIterationsPerSecond:
      return "iterations per second";
  }
  return "?";
}

namespace {

// What changed the detector on the current branch of the log, so that a restart that went back
// can rebuild it as it stood at the resume point: a log of the changes, with a copy of the
// detector every kSnapshotEvery changes. Bounded: beyond kMaxSnapshots copies the oldest becomes
// the base, and a resume point older than the base starts with empty windows.
class DetectorHistory {
 public:
  enum class Op { kAccept, kResetDivergence, kResetAll };

  explicit DetectorHistory(const DetectorConfig& cfg) : cfg_(cfg), base_(cfg) {}

  // `after`: the detector once `op` was applied to it.
  void Record(Op op, const GuardSignals& s, const InstabilityDetector& after) {
    ops_.push_back({op, s});
    const size_t seq = first_ + ops_.size();
    if (seq % kSnapshotEvery != 0) return;
    snapshots_.push_back({seq, after});
    if (snapshots_.size() <= kMaxSnapshots) return;
    // The oldest copy becomes the base: the changes before it are no longer needed.
    base_ = std::move(snapshots_.front().detector);
    const size_t base_seq = snapshots_.front().seq;
    snapshots_.pop_front();
    while (first_ < base_seq) {
      base_last_iteration_ = ops_.front().signals.iteration;
      ops_.pop_front();
      ++first_;
    }
  }

  // The detector as it was before the first change at `iteration` or later; those changes are
  // forgotten (that branch of the run was abandoned).
  InstabilityDetector Rewind(int64_t iteration) {
    while (!ops_.empty() && ops_.back().signals.iteration >= iteration) ops_.pop_back();
    const size_t end = first_ + ops_.size();
    while (!snapshots_.empty() && snapshots_.back().seq > end) snapshots_.pop_back();
    if (base_last_iteration_ >= iteration) {  // older than the history kept: start afresh
      base_ = InstabilityDetector(cfg_);
      base_last_iteration_ = kNone;
      snapshots_.clear();
      ops_.clear();
      first_ = end;
      return base_;
    }
    InstabilityDetector det = snapshots_.empty() ? base_ : snapshots_.back().detector;
    for (size_t k = snapshots_.empty() ? first_ : snapshots_.back().seq; k < end; ++k) {
      const Change& c = ops_[k - first_];
      if (c.op == Op::kAccept) det.Accept(c.signals);
      if (c.op == Op::kResetDivergence) det.ResetDivergence();
      if (c.op == Op::kResetAll) det = InstabilityDetector(cfg_);
    }
    return det;
  }

  // The iteration of the last record the detector took in, or -1.
  int64_t LastAccepted() const {
    for (auto it = ops_.rbegin(); it != ops_.rend(); ++it)
      if (it->op == Op::kAccept) return it->signals.iteration;
    return base_last_iteration_ == kNone ? -1 : base_last_iteration_;
  }

 private:
  static constexpr size_t kSnapshotEvery = 64, kMaxSnapshots = 256;
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  struct Change {
    Op op;
    GuardSignals signals;
  };
  struct Snapshot {
    size_t seq;  // changes applied
    InstabilityDetector detector;
  };
  DetectorConfig cfg_;
  InstabilityDetector base_;  // the detector before change number first_
  int64_t base_last_iteration_ = kNone;
  size_t first_ = 0;
  std::deque<Change> ops_;
  std::deque<Snapshot> snapshots_;
};

}  // namespace

// Spikes and divergences through the guard's detector, record by record.
class LogEventScanner::Instability {
 public:
  Instability(const LogAnalysisOptions& opt, LogEventScanner* owner)
      : opt_(opt), owner_(owner), det_(opt.detector), history_(opt.detector), trend_(opt.trend) {}

  void Restart(int64_t last_before, int64_t resumed_at) {
    if (open_) {
      cur_.kind = "spike_unresolved";
      cur_.end = last_before;
      cur_.detail =
          Onset() + "; " + Peaks() +
          fmt::format("; the run restarted (at iteration {}) before it recovered", resumed_at);
      Emit(false);
      open_ = false;
    }
    // A resume from an earlier checkpoint: judge what follows against the records up to it.
    if (resumed_at <= last_before) det_ = history_.Rewind(resumed_at);
    // The trend test forgets the abandoned iterations and lets the bump after the resume pass.
    trend_.Restart(std::min(last_before, resumed_at - 1));
    if (div_open_ && div_by_trend_) {
      div_open_ = false;
      owner_->sink_({div_id_, false, div_});
    }
    resumed_at_ = resumed_at;
    since_restart_ = 0;
    reference_end_ = history_.LastAccepted();
    resume_det_.reset();
    if (opt_.resume_records > 0 &&
        det_.history() >= static_cast<size_t>(opt_.detector.min_history)) {
      DetectorConfig c = opt_.detector;
      c.loss_rel_floor *= opt_.resume_floor_scale;
      c.grad_rel_floor *= opt_.resume_floor_scale;
      auto d = std::make_unique<InstabilityDetector>(c);
      if (d->FromJson(det_.ToJson(), "detector").ok()) resume_det_ = std::move(d);
    }
  }

  void Feed(const LogRecord& r) {
    GuardSignals s;
    s.iteration = r.iteration;
    s.consumed_samples = std::max<int64_t>(r.consumed_samples, 0);
    s.loss = r.lm_loss;
    // A log without grad norms: a constant never spikes, and the loss decides alone.
    s.grad_norm = std::isnan(r.grad_norm) ? 0.0 : r.grad_norm;
    s.nonfinite = r.nonfinite;
    if (s.nonfinite || !std::isfinite(s.loss)) return;  // NaN events are counted by the caller
    const bool resume_period = resume_det_ && since_restart_ < opt_.resume_records &&
                               r.iteration - resumed_at_ <= opt_.resume_window;
    ++since_restart_;
    if (open_) {
      if (s.loss > peak_loss_) peak_loss_ = s.loss, peak_loss_at_ = r.iteration;
      peak_grad_ = std::max(peak_grad_, s.grad_norm);
      // Back when the loss is within recover_z of its median, and the grad norm within the same
      // fraction of its own threshold (judged by the detector that found the spike).
      const InstabilityDetector& judge = by_resume_ ? *resume_det_ : det_;
      const DetectorConfig& d = opt_.detector;
      const bool loss_back = judge.LossZ(s.loss) < d.recover_z;
      const bool grad_back =
          judge.GradZ(s.grad_norm) < d.recover_z * d.grad_z_threshold / d.z_threshold;
      if (loss_back && grad_back) {
        cur_.kind = resume_ ? "resume_spike" : "spike_recovered";
        cur_.end = r.iteration;
        cur_.detail =
            Onset() + fmt::format("; {}; back by iteration {} (lm loss {:.6g}, grad norm {:.4g})",
                                  Peaks(), r.iteration, s.loss, s.grad_norm);
        Emit(false);
        open_ = false;
        Accept(s);
      } else if (r.iteration - cur_.start > opt_.recover_iters) {
        cur_.kind = "divergence";
        cur_.end = r.iteration;
        cur_.detail = Onset() + fmt::format(
                                    "; {}; not back within {} iterations: the loss level shifted "
                                    "(lm loss {:.6g} at iteration {})",
                                    Peaks(), opt_.recover_iters, s.loss, r.iteration);
        Emit(false);
        open_ = false;
        det_ = InstabilityDetector(opt_.detector);  // judge what follows against the new level
        history_.Record(DetectorHistory::Op::kResetAll, s, det_);
        resume_det_.reset();
        Accept(s);
      }
      return;
    }
    if (!resume_period) resume_det_.reset();
    // A new global batch size (a batch ramp-up step): the loss's course changes, the trend test
    // starts its history afresh. (An LR warm-up needs nothing: the loss falls then, and the test
    // has no reference before reference / 2 iterations.)
    if (std::isfinite(r.global_batch) && std::isfinite(batch_) && r.global_batch != batch_)
      trend_.Rebaseline();
    if (std::isfinite(r.global_batch)) batch_ = r.global_batch;
    // A divergence lasts while the loss stays above its pre-onset level (the trend test's: while
    // that test says so).
    if (div_open_ && div_by_trend_) {
      if (trend_.diverging()) {
        div_.end = std::max(div_.end, r.iteration);
        div_.value = std::max(div_.value, s.loss);
      } else {
        div_open_ = false;
        owner_->sink_({div_id_, false, div_});
      }
    } else if (div_open_) {
      if (s.loss > div_.baseline * (1 + opt_.detector.divergence_rel)) {
        div_.end = std::max(div_.end, r.iteration);
      } else {
        div_open_ = false;
        owner_->sink_({div_id_, false, div_});
      }
    }
    Anomaly a = det_.Check(s);
    bool by_resume = false;
    if (resume_period) {
      // Right after a restart the records before it set the level: a smaller bump counts.
      const Anomaly ra = resume_det_->Check(s);
      if (ra.kind == AnomalyKind::kSpike) a = ra, by_resume = true;
    }
    if (a.kind == AnomalyKind::kSpike) {
      open_ = true;
      by_resume_ = by_resume;
      resume_ = by_resume || (resumed_at_ >= 0 && r.iteration >= resumed_at_ &&
                              r.iteration - resumed_at_ <= opt_.resume_window);
      z_ = a.z;
      id_ = owner_->NextId();
      cur_ = LogEvent();
      cur_.kind = resume_ ? "resume_spike" : "spike";
      cur_.start = cur_.end = r.iteration;
      cur_.signal = a.signal;
      cur_.value = a.value;
      cur_.baseline = a.baseline;
      cur_.detail = Onset();
      peak_loss_ = s.loss;
      peak_loss_at_ = r.iteration;
      peak_grad_ = s.grad_norm;
      Emit(true);
      return;
    }
    if (a.kind == AnomalyKind::kDivergence) {
      const bool reopen =
          div_exists_ && !div_open_ && a.onset <= div_.end + opt_.detector.divergence_window;
      if (div_open_ && div_by_trend_) {  // the trend test found it first: its report stands
        div_.end = r.iteration;
        det_.ResetDivergence();
        history_.Record(DetectorHistory::Op::kResetDivergence, s, det_);
        Accept(s);
        return;
      }
      if (div_exists_ && (div_open_ || reopen)) {
        div_.end = r.iteration;
        div_.value = std::max(div_.value, a.value);
      } else {
        div_ = LogEvent();
        div_.kind = "divergence";
        div_.start = a.onset;
        div_.end = r.iteration;
        div_.signal = "lm loss";
        div_.value = a.value;
        div_.baseline = a.baseline;
        div_id_ = owner_->NextId();
        div_exists_ = true;
        div_by_trend_ = false;
      }
      div_.detail = fmt::format(
          "the median lm loss of the last {} records rose from {:.6g} (iteration {}) to {:.6g} "
          "(iteration {}), more than {:.0f}% above its lowest level",
          opt_.detector.divergence_window, div_.baseline, div_.start, div_.value, div_.end,
          100 * opt_.detector.divergence_rel);
      if (!div_open_) owner_->sink_({div_id_, true, div_});
      div_open_ = true;
      det_.ResetDivergence();
      history_.Record(DetectorHistory::Op::kResetDivergence, s, det_);
    }
    Accept(s);
  }

  // The trend test, on the records the spike test judged normal.
  void FeedTrend(const GuardSignals& s) {
    if (!opt_.trend_enabled || !trend_.Add(s.iteration, s.loss) || div_open_) return;
    const LossTrend& t = trend_.current();
    div_ = LogEvent();
    div_.kind = "divergence";
    div_.start = t.start;
    div_.end = s.iteration;
    div_.signal = "lm loss";
    div_.value = t.base * (1 + t.size);
    div_.baseline = t.base;
    div_.confidence = t.confidence;
    div_.detail = fmt::format(
        "the lm loss has been climbing since iteration {}: {:+.1f}% above its level there "
        "({:.6g}) and {:+.1f}% above its expected curve by iteration {} (z {:.1f}, confidence "
        "{:.4f})",
        t.start, 100 * t.size, t.base, 100 * t.above_expected, t.found, t.z, t.confidence);
    div_id_ = owner_->NextId();
    div_exists_ = div_open_ = div_by_trend_ = true;
    owner_->sink_({div_id_, true, div_});
  }

  void Finish(int64_t last_iteration, const std::string& end_of_what) {
    if (open_) {
      cur_.kind = "spike_unresolved";
      cur_.end = last_iteration;
      cur_.detail = Onset() + "; " + Peaks() + "; not back by " + end_of_what;
      Emit(false);
      open_ = false;
    }
    if (div_open_) {
      div_open_ = false;
      owner_->sink_({div_id_, false, div_});
    }
  }

 private:
  void Accept(const GuardSignals& s) {
    FeedTrend(s);
    det_.Accept(s);
    history_.Record(DetectorHistory::Op::kAccept, s, det_);
    if (resume_det_) resume_det_->Accept(s);
  }
  void Emit(bool open) { owner_->sink_({id_, open, cur_}); }
  std::string Onset() const {
    std::string s =
        fmt::format("{} spike at iteration {}: {:.6g} against a median of {:.6g} (z {:.1f})",
                    cur_.signal, cur_.start, cur_.value, cur_.baseline, z_);
    if (resume_)
      s += fmt::format(", {} iterations after the restart at {}", cur_.start - resumed_at_,
                       resumed_at_);
    if (by_resume_)
      s += fmt::format(
          " (judged against the records before the restart, to iteration {}, with floors of "
          "{:g}% of the loss and {:g}% of the grad norm)",
          reference_end_, 100 * opt_.detector.loss_rel_floor * opt_.resume_floor_scale,
          100 * opt_.detector.grad_rel_floor * opt_.resume_floor_scale);
    return s;
  }
  std::string Peaks() const {
    return fmt::format("peak lm loss {:.6g} (iteration {}), peak grad norm {:.4g}", peak_loss_,
                       peak_loss_at_, peak_grad_);
  }

  const LogAnalysisOptions& opt_;
  LogEventScanner* owner_;
  InstabilityDetector det_;
  DetectorHistory history_;
  // The detector with smaller floors, for the first records after a restart (null otherwise).
  std::unique_ptr<InstabilityDetector> resume_det_;
  int since_restart_ = 0;
  int64_t reference_end_ = -1;  // the last record before the restart the detector holds
  bool open_ = false, by_resume_ = false, resume_ = false;
  int64_t id_ = 0;
  LogEvent cur_;
  double z_ = 0;
  double peak_loss_ = 0, peak_grad_ = 0;
  int64_t peak_loss_at_ = 0;
  int64_t resumed_at_ = -1;
  LogEvent div_;  // the last divergence
  int64_t div_id_ = 0;
  bool div_exists_ = false;
  bool div_open_ = false;      // ... and the loss is still above its level
  bool div_by_trend_ = false;  // ... found by the trend test
  LossTrendDetector trend_;
  double batch_ = NAN;  // of the previous record
};

// The throughput drop test, its findings as events.
class LogEventScanner::Drops {
 public:
  Drops(const LogAnalysisOptions& opt, int window, LogEventScanner* owner)
      : owner_(owner),
        scan_(opt.drop_threshold, window, [this](const ThroughputDrop& d) { OnChange(d); }) {}

  // `global_batch`: NaN where the log does not say; a new size is new work per iteration.
  void Add(int64_t iteration, double v, double global_batch) {
    if (std::isfinite(global_batch) && std::isfinite(batch_) && global_batch != batch_)
      Rebaseline("the global batch size changed");
    if (std::isfinite(global_batch)) batch_ = global_batch;
    scan_.Add(iteration, v);
  }
  // A restart: the next process's pace is its own (the live detector starts afresh too).
  void Rebaseline(const std::string& why) {
    end_of_what_ = why;
    scan_.Rebaseline();
  }
  void Finish(const std::string& end_of_what) {
    end_of_what_ = end_of_what;
    scan_.Finish();
  }

 private:
  void OnChange(const ThroughputDrop& d) {
    if (d.open) id_ = owner_->NextId();
    const std::string signal = ThroughputSignalName(owner_->signal_);
    LogEvent e;
    e.kind = "throughput_drop";
    e.start = d.start;
    e.end = d.end;
    e.signal = signal;
    e.value = d.level;
    e.baseline = d.baseline;
    // How sure: the drop over its standard error, against the noise the records themselves show.
    const std::string sure =
        std::isfinite(d.z)
            ? fmt::format("z = {:.1f} over the median of {} records, noise {:.2f}% a record", d.z,
                          d.window, 100 * d.noise)
            : std::string("z not measured: too few records before it");
    e.detail = fmt::format(
        "{} fell from {:.4g} ({}) to {:.4g} ({:+.1f}%) at iteration {} (found at "
        "iteration {}, {})",
        signal, d.baseline,
        d.sustained ? "its median level before, a sustained shift" : "its best sustained level",
        d.level, 100 * (d.level / d.baseline - 1), d.start, d.found, sure);
    if (!d.open)
      e.detail += d.back
                      ? fmt::format(" and was back by iteration {}", d.end)
                      : fmt::format(" and stayed down to {} (iteration {})", end_of_what_, d.end);
    owner_->sink_({id_, d.open, e});
  }

  LogEventScanner* owner_;
  ThroughputDropScan scan_;
  double batch_ = NAN;
  int64_t id_ = 0;
  std::string end_of_what_;
};

LogEventScanner::LogEventScanner(const LogAnalysisOptions& opt, int drop_window, Sink sink,
                                 const ThroughputSignal* signal)
    : opt_(opt), sink_(std::move(sink)), drop_window_(std::max(drop_window, 1)) {
  instability_ = std::make_unique<Instability>(opt_, this);
  drops_ = std::make_unique<Drops>(opt_, drop_window_, this);
  if (signal) has_signal_ = true, signal_ = *signal;
}

LogEventScanner::~LogEventScanner() = default;

void LogEventScanner::CloseRun(Run* run) {
  if (!run->active) return;
  run->active = false;
  sink_({run->id, false, run->event});
}

void LogEventScanner::CountRun(Run* run, const char* kind, const char* what, bool hit, int64_t from,
                               const LogRecord& r, int64_t count) {
  auto describe = [&](LogEvent* e) {
    e->detail = fmt::format("{} {} iterations between iterations {} and {}", e->value, what,
                            e->start, e->end);
  };
  if (hit && run->active && prev_ >= 0 && run->event.end == prev_) {
    run->event.end = r.iteration;
    run->event.value += static_cast<double>(count);
    describe(&run->event);
    return;
  }
  CloseRun(run);
  if (!hit) return;
  run->active = true;
  run->id = NextId();
  run->event = LogEvent();
  run->event.kind = kind;
  run->event.start = from;
  run->event.end = r.iteration;
  run->event.value = static_cast<double>(count);
  run->event.signal = std::string(what) + " iterations";
  describe(&run->event);
  sink_({run->id, true, run->event});
}

void LogEventScanner::Add(const LogRecord& r) {
  if (prev_ >= 0 && (r.iteration <= prev_ || r.after_start)) {
    LogEvent e;
    e.kind = "restart";
    e.start = prev_;
    e.end = r.iteration;
    e.signal = "iteration";
    e.value = static_cast<double>(r.iteration);
    e.baseline = static_cast<double>(prev_);
    e.detail = r.iteration <= prev_
                   ? fmt::format(
                         "the log went back from iteration {} to {} ({}:{}): a resume "
                         "from an earlier checkpoint; iterations {}-{} were run again",
                         prev_, r.iteration, r.file, r.line, r.iteration, prev_)
                   : fmt::format("a new process started ({}:{}) and resumed at iteration {}",
                                 r.file, r.line, r.iteration);
    ++restarts_;
    CloseRun(&nan_run_);
    CloseRun(&skipped_run_);
    sink_({NextId(), false, e});
    instability_->Restart(prev_, r.iteration);
    drops_->Rebaseline("the restart");
    prev_ = -1;  // counters of the first record after a restart cover an unknown interval
  }
  const int64_t from = prev_ >= 0 ? prev_ + 1 : r.iteration;
  CountRun(&nan_run_, "nan", "NaN", r.nonfinite, from, r, std::max<int64_t>(r.nan, 1));
  if (r.nonfinite) nan_ += std::max<int64_t>(r.nan, 1);
  CountRun(&skipped_run_, "skipped", "skipped", r.skipped > 0, from, r, r.skipped);
  skipped_ += r.skipped;
  instability_->Feed(r);
  // Throughput: intervals that trained nothing are left out (a skipped window is not a slow
  // machine).
  if (!r.gap) {
    if (!has_signal_) {
      has_signal_ = true;
      const bool sps = std::isfinite(r.samples_per_second);
      signal_ = std::isfinite(r.tflops) && !(sps && r.samples_per_second > r.tflops)
                    ? ThroughputSignal::kTflops
                : sps ? ThroughputSignal::kSamplesPerSecond
                      : ThroughputSignal::kIterationsPerSecond;
    }
    const double v = signal_ == ThroughputSignal::kTflops             ? r.tflops
                     : signal_ == ThroughputSignal::kSamplesPerSecond ? r.samples_per_second
                                                                      : 1.0 / r.iteration_seconds;
    if (std::isfinite(v)) drops_->Add(r.iteration, v, r.global_batch);
  }
  prev_ = r.iteration;
  last_iteration_ = r.iteration;
  any_ = true;
}

void LogEventScanner::Finish(const std::string& end_of_what) {
  CloseRun(&nan_run_);
  CloseRun(&skipped_run_);
  if (any_) instability_->Finish(last_iteration_, end_of_what);
  drops_->Finish(end_of_what);
}

}  // namespace keel
