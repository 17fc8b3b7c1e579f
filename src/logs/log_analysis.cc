#include "logs/log_analysis.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "guard/robust_window.h"
#include "metrics/run_metrics.h"

namespace keel {
namespace {

// Over the records that trained an iteration: a skipped interval's time and throughput (none, or
// zero, or a near-zero time) say nothing about the machine.
SeriesStats Stats(const std::vector<LogRecord>& recs, double LogRecord::*field) {
  std::vector<double> v;
  for (const LogRecord& r : recs)
    if (!r.gap && std::isfinite(r.*field)) v.push_back(r.*field);
  SeriesStats s;
  s.count = static_cast<int64_t>(v.size());
  if (v.empty()) return s;
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  s.median = MedianOf(v);
  return s;
}

}  // namespace

namespace {

// "2023-03-01 12:34:56" (or with a T): Unix seconds; NaN when it is not such a time.
double TimestampSeconds(const std::string& ts) {
  std::tm tm{};
  char sep = 0;
  if (std::sscanf(ts.c_str(), "%4d-%2d-%2d%c%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &sep, &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 7)
    return NAN;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<double>(timegm(&tm));
}

}  // namespace

LogGoodput EstimateLogGoodput(const ParsedLog& log) {
  static const std::vector<std::string> kKeys = {"productive", "lost",      "save", "eval",
                                                 "startup",    "data_wait", "hang", "restart",
                                                 "guard",      "other"};
  std::map<std::string, double> cat;
  struct Span {
    int64_t first, last;
    double seconds;
  };
  std::vector<Span> spans;
  auto rewind = [&](int64_t to) {  // iterations after `to` were computed again
    std::vector<Span> kept;
    for (const Span& sp : spans) {
      if (sp.last <= to) {
        kept.push_back(sp);
        continue;
      }
      const double n = static_cast<double>(sp.last - sp.first + 1);
      const double gone = static_cast<double>(sp.last - std::max(to, sp.first - 1)) / n;
      cat["lost"] += sp.seconds * gone;
      if (gone < 1) kept.push_back({sp.first, to, sp.seconds * (1 - gone)});
    }
    spans = std::move(kept);
  };
  // The log interval: the most common step between consecutive records of one run.
  std::map<int64_t, int> steps;
  for (size_t i = 1; i < log.records.size(); ++i) {
    const int64_t d = log.records[i].iteration - log.records[i - 1].iteration;
    if (d > 0 && !log.records[i].after_start) ++steps[d];
  }
  int64_t interval = 1;
  int most = 0;
  for (const auto& [d, n] : steps)
    if (n > most) interval = d, most = n;
  LogGoodput g;
  const size_t val_n = log.validations.size();
  size_t val_i = 0;
  double first_ts = NAN, last_ts = NAN, prev_ts = NAN, computed = 0;
  int64_t prev_it = -1;
  bool stamped = !log.records.empty();
  for (size_t i = 0; i < log.records.size(); ++i) {
    const LogRecord& r = log.records[i];
    const bool restart = r.after_start || (prev_it >= 0 && r.iteration <= prev_it);
    const int64_t n =
        (prev_it < 0 || restart) ? std::min(interval, r.iteration) : r.iteration - prev_it;
    if (restart) rewind(r.iteration - n);
    const double secs = r.gap || !std::isfinite(r.iteration_seconds)
                            ? 0.0
                            : static_cast<double>(n) * r.iteration_seconds;
    spans.push_back({r.iteration - n + 1, r.iteration, secs});
    computed += secs;
    const double ts = TimestampSeconds(r.timestamp);
    stamped = stamped && std::isfinite(ts);
    if (std::isfinite(ts)) {
      if (!std::isfinite(first_ts)) first_ts = ts - secs;  // the first interval's start
      if (std::isfinite(prev_ts)) {
        // Between two records: their iterations and a stall (a save, an evaluation, a wait),
        // or, across a restart, the crash's unlogged tail, the downtime and the start-up.
        bool validated = false;
        for (; val_i < val_n && log.validations[val_i].records_before <= i; ++val_i)
          validated = true;
        const double rest = ts - prev_ts - secs;
        cat[restart ? "restart" : validated ? "eval" : "other"] += rest;
      }
      prev_ts = last_ts = ts;
    }
    prev_it = r.iteration;
  }
  for (const Span& sp : spans) cat["productive"] += sp.seconds;
  g.timestamps = stamped && std::isfinite(first_ts);
  if (g.timestamps) {
    g.wall_seconds = last_ts - first_ts;
    double sum = 0;
    for (const auto& [k, v] : cat) sum += v;
    cat["other"] += g.wall_seconds - sum;
  } else {
    cat.erase("restart");
    cat.erase("eval");
    cat.erase("other");
    g.wall_seconds = computed;
    g.notes.push_back(
        "the log's lines carry no timestamps: the wall time is the iterations' own (records x "
        "time per iteration); restarts, start-up, saves and evaluations are not seen");
  }
  for (const std::string& k : kKeys) g.categories.push_back({k, cat.count(k) ? cat[k] : 0.0});
  g.notes.push_back(
      "estimated from the log: a restart's recomputed iterations are those after the new run's "
      "first record less one log interval");
  if (g.timestamps)
    g.notes.push_back(
        "the time between a run's last record and the next run's first is counted as restart: "
        "it holds the crash's unlogged iterations, the downtime and the start-up, which a log "
        "cannot tell apart; a stall between two records is evaluation when a validation line "
        "falls between them, else other (saves among it); timestamps have 1 s resolution");
  g.notes.push_back(
      "a log does not show the wait for data, the guard's reruns or a hang: those are in the "
      "categories around them");
  return g;
}

Status AnalyzeLog(const ParsedLog& log, const LogAnalysisOptions& opt, LogAnalysis* out) {
  if (log.records.empty()) {
    std::string files;
    for (const std::string& f : log.files) files += (files.empty() ? "" : ", ") + f;
    return Status::InvalidArgument(fmt::format(
        "{}: no Megatron iteration lines (\"iteration N/ TOTAL | ... lm loss: ... |\") in {} "
        "lines; is this the training log of rank 0 (the last pipeline stage prints them)?",
        files, log.lines));
  }
  LogAnalysis a;
  const auto& recs = log.records;
  a.records = static_cast<int64_t>(recs.size());
  a.validations = static_cast<int64_t>(log.validations.size());
  a.first_iteration = recs.front().iteration;
  a.last_iteration = recs.back().iteration;
  for (const LogRecord& r : recs) {
    a.min_iteration = std::min(a.min_iteration < 0 ? r.iteration : a.min_iteration, r.iteration);
    a.max_iteration = std::max(a.max_iteration, r.iteration);
  }
  a.train_iters = recs.back().train_iters;
  a.tflops = Stats(recs, &LogRecord::tflops);
  a.samples_per_second = Stats(recs, &LogRecord::samples_per_second);
  a.iteration_seconds = Stats(recs, &LogRecord::iteration_seconds);

  // Throughput: TFLOPs where every record that trained has them, else samples/s, else
  // iterations/s; samples/s before TFLOPs where its median is the larger: both are printed to 2
  // or 3 decimals, so it has more significant digits (a small model's TFLOPs print as 0.00).
  int64_t trained = 0;
  for (const LogRecord& r : recs) trained += !r.gap;
  const bool tflops = a.tflops.count == trained, sps = a.samples_per_second.count == trained;
  const ThroughputSignal signal = tflops && !(sps && a.samples_per_second.median > a.tflops.median)
                                      ? ThroughputSignal::kTflops
                                  : sps ? ThroughputSignal::kSamplesPerSecond
                                        : ThroughputSignal::kIterationsPerSecond;
  a.throughput_signal = ThroughputSignalName(signal);
  int64_t measured = 0;  // the values the drop test sees
  for (const LogRecord& r : recs) {
    if (r.gap) continue;
    const double v = signal == ThroughputSignal::kTflops             ? r.tflops
                     : signal == ThroughputSignal::kSamplesPerSecond ? r.samples_per_second
                                                                     : 1.0 / r.iteration_seconds;
    measured += std::isfinite(v);
  }
  const int window =
      opt.drop_window > 0 ? opt.drop_window : std::clamp(static_cast<int>(measured / 20), 3, 50);
  // Each event as it last closed, in the order they first closed.
  std::vector<LogEvent> events;
  std::map<int64_t, size_t> index;
  std::map<int64_t, int64_t> found;  // by id: the record of its first update
  LogEventScanner scanner(
      opt, window,
      [&](const LogEventUpdate& u) {
        found.emplace(u.id, u.event.end);
        if (u.open) return;
        auto [it, added] = index.emplace(u.id, events.size());
        if (added)
          events.push_back(u.event);
        else
          events[it->second] = u.event;
        events[index[u.id]].found = found[u.id];
      },
      &signal);
  for (const LogRecord& r : recs) scanner.Add(r);
  scanner.Finish("the end of the log");
  a.restarts = scanner.restarts();
  a.skipped_iterations = scanner.skipped_iterations();
  a.nan_iterations = scanner.nan_iterations();

  // ETA from the recent median time per trained iteration.
  if (a.train_iters > 0 && a.last_iteration > a.train_iters) {
    a.eta_note = fmt::format("the last record's iteration {} is past its total of {}",
                             a.last_iteration, a.train_iters);
  } else if (a.train_iters > 0) {
    std::vector<double> recent;
    for (auto it = recs.rbegin(); it != recs.rend() && recent.size() < 20; ++it)
      if (!it->gap && std::isfinite(it->iteration_seconds)) recent.push_back(it->iteration_seconds);
    if (!recent.empty()) {
      a.recent_iteration_seconds = MedianOf(recent);
      a.eta_seconds =
          static_cast<double>(a.train_iters - a.last_iteration) * a.recent_iteration_seconds;
    } else {
      a.eta_note = "the log gives no time per iteration";
    }
  } else {
    a.eta_note = "the log gives no total iterations";
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const LogEvent& x, const LogEvent& y) { return x.start < y.start; });
  a.events = std::move(events);
  a.goodput = EstimateLogGoodput(log);
  *out = std::move(a);
  return Status::OK();
}

std::string FormatLogAnalysis(const ParsedLog& log, const LogAnalysis& a) {
  std::string s;
  std::string files;
  for (const std::string& f : log.files) files += (files.empty() ? "" : ", ") + f;
  s += fmt::format(
      "log: {} ({} lines; {} iteration records, {} of them joined from wrapped "
      "lines; {} validation lines)\n",
      files, log.lines, a.records, log.wrapped, a.validations);
  s += fmt::format("iterations: {} to {}{}{}\n", a.min_iteration, a.max_iteration,
                   a.train_iters > 0 ? fmt::format(" of {}", a.train_iters) : "",
                   a.last_iteration != a.max_iteration
                       ? fmt::format(" (the last record, after restarts: {})", a.last_iteration)
                       : "");
  auto stat = [](const char* name, const SeriesStats& st, const char* unit) {
    if (st.count == 0) return std::string();
    return fmt::format("{}: median {:.4g}{} (min {:.4g}, mean {:.4g}, max {:.4g}; {} records)\n",
                       name, st.median, unit, st.min, st.mean, st.max, st.count);
  };
  s += stat("TFLOPs per GPU", a.tflops, "");
  s += stat("samples per second", a.samples_per_second, "");
  s += stat("time per iteration", a.iteration_seconds, " s");
  s += fmt::format("skipped iterations: {}; NaN iterations: {}; restarts: {}\n",
                   a.skipped_iterations, a.nan_iterations, a.restarts);
  if (a.events.empty()) {
    s += "events: none\n";
  } else {
    s += fmt::format("events ({}):\n", a.events.size());
    for (const LogEvent& e : a.events)
      s += fmt::format("  {:>8}-{:<8} {:<17} {}\n", e.start, e.end, e.kind, e.detail);
  }
  if (a.eta_seconds >= 0) {
    s += fmt::format(
        "ETA: {:.2f} days ({} iterations left at {:.4g} s, the median of the last "
        "records; no downtime counted)\n",
        a.eta_seconds / 86400, a.train_iters - a.last_iteration, a.recent_iteration_seconds);
  } else {
    s += fmt::format("ETA: unknown ({})\n", a.eta_note);
  }
  if (a.goodput.wall_seconds > 0) {
    const double w = a.goodput.wall_seconds;
    s += fmt::format("goodput (an estimate; `keel goodput` measures a keel run): {:.1f} s {}\n", w,
                     a.goodput.timestamps ? "of wall time" : "of iterations' time");
    for (const auto& [k, v] : a.goodput.categories)
      if (v != 0) s += fmt::format("  {:<12} {:>10.1f} s {:>6.1f}%\n", k, v, 100.0 * v / w);
    for (const std::string& n : a.goodput.notes) s += "  note: " + n + "\n";
  }
  if (!log.rejected.empty()) {
    s += fmt::format("refused: {} line{} whose numbers cannot be true (not analyzed):\n",
                     log.rejected.size(), log.rejected.size() == 1 ? "" : "s");
    constexpr size_t kShown = 10;
    for (size_t i = 0; i < log.rejected.size() && i < kShown; ++i)
      s += fmt::format("  {}:{}: {}\n", log.rejected[i].file, log.rejected[i].line,
                       log.rejected[i].reason);
    if (log.rejected.size() > kShown)
      s += fmt::format("  ... and {} more (--json lists them all)\n", log.rejected.size() - kShown);
  }
  return s;
}

namespace {

// {"estimate": true, "wall_seconds": W, "categories": {...}, "notes": [...]}; null without records.
nlohmann::json GoodputJson(const LogGoodput& g) {
  if (g.categories.empty()) return nullptr;
  nlohmann::ordered_json c = nlohmann::ordered_json::object();
  for (const auto& [k, v] : g.categories) c[k] = v;
  nlohmann::ordered_json j = {{"estimate", true},
                              {"wall_seconds", g.wall_seconds},
                              {"timestamps", g.timestamps},
                              {"categories", c},
                              {"notes", g.notes}};
  return nlohmann::json(j);
}

}  // namespace

nlohmann::json LogAnalysisJson(const ParsedLog& log, const LogAnalysis& a) {
  using nlohmann::json;
  auto stat = [](const SeriesStats& st) -> json {
    if (st.count == 0) return nullptr;
    return {{"count", st.count},
            {"min", st.min},
            {"median", st.median},
            {"mean", st.mean},
            {"max", st.max}};
  };
  json rejected = json::array();
  for (const RejectedLine& r : log.rejected)
    rejected.push_back({{"file", r.file}, {"line", r.line}, {"reason", r.reason}});
  json events = json::array();
  for (const LogEvent& e : a.events) {
    events.push_back({{"kind", e.kind},
                      {"start", e.start},
                      {"end", e.end},
                      {"signal", e.signal},
                      {"value", e.value},
                      {"baseline", e.baseline},
                      {"detail", e.detail}});
    if (std::isfinite(e.confidence)) events.back()["confidence"] = e.confidence;
    if (e.found >= 0) events.back()["found"] = e.found;
  }
  return {{"files", log.files},
          {"lines", log.lines},
          {"records", a.records},
          {"wrapped_records", log.wrapped},
          {"validations", a.validations},
          {"first_iteration", a.first_iteration},
          {"min_iteration", a.min_iteration},
          {"max_iteration", a.max_iteration},
          {"last_iteration", a.last_iteration},
          {"train_iters", a.train_iters},
          {"tflops", stat(a.tflops)},
          {"samples_per_second", stat(a.samples_per_second)},
          {"iteration_seconds", stat(a.iteration_seconds)},
          {"throughput_signal", a.throughput_signal},
          {"skipped_iterations", a.skipped_iterations},
          {"nan_iterations", a.nan_iterations},
          {"restarts", a.restarts},
          {"eta_seconds", a.eta_seconds >= 0 ? json(a.eta_seconds) : json(nullptr)},
          {"eta_unknown_because", a.eta_seconds >= 0 ? json(nullptr) : json(a.eta_note)},
          {"rejected_lines", rejected},
          {"events", events},
          {"goodput", GoodputJson(a.goodput)}};
}

nlohmann::json LogRecordToMetrics(const LogRecord& r) {
  nlohmann::json m = {{"kind", "train"}, {"iteration", r.iteration}};
  auto put = [&](const char* key, double v) {
    if (std::isfinite(v)) m[key] = v;
  };
  if (r.train_iters > 0) m["train_iters"] = r.train_iters;
  if (r.consumed_samples >= 0) m["consumed_samples"] = r.consumed_samples;
  if (r.consumed_tokens >= 0) m["consumed_tokens"] = r.consumed_tokens;
  put("iteration_ms", r.iteration_seconds * 1000.0);
  put("learning_rate", r.learning_rate);
  put("global_batch_size", r.global_batch);
  put("lm_loss", r.lm_loss);
  put("loss_scale", r.loss_scale);
  put("grad_norm", r.grad_norm);
  put("num_zeros", r.num_zeros);
  put("samples_per_second", r.samples_per_second);
  put("tflops", r.tflops);
  if (r.gap) {  // nothing was trained: no loss, no throughput (what keel writes then)
    m["lm_loss"] = nullptr;
    m["samples_per_second"] = nullptr;
    m["tflops"] = nullptr;
  }
  m["skipped_iterations"] = r.skipped;
  m["nan_iterations"] = r.nan;
  m["nan"] = r.nonfinite;
  return m;
}

namespace {

// Where the run stood before the first record after a restart (iteration r.iteration - 1), for
// the rewind: its samples and tokens less one batch, clamped (the log's numbers are bounded by
// kMaxLogCount, their products are not).
MetricsPosition PositionBefore(const LogRecord& r) {
  const double gb = std::isfinite(r.global_batch) ? r.global_batch : 0;
  const double samples = static_cast<double>(std::max<int64_t>(r.consumed_samples, 0));
  const double tokens = static_cast<double>(std::max<int64_t>(r.consumed_tokens, 0));
  const double per_sample = samples > 0 ? std::floor(tokens / samples) : 0;
  auto count = [](double v) {
    return static_cast<int64_t>(std::clamp(v, 0.0, static_cast<double>(kMaxLogCount)));
  };
  return {r.iteration - 1, count(samples - gb), count(tokens - gb * per_sample)};
}

// The run directory's files, written into `dir` (a fresh staging directory).
Status BuildRun(Env* env, const std::string& dir, const ParsedLog& log, const LogAnalysis& a,
                const std::function<void(int64_t, const std::string&)>& archived_restart) {
  std::unique_ptr<RunMetrics> metrics;
  KEEL_RETURN_IF_ERROR(RunMetrics::Open(env, dir, &metrics));
  // Each validation goes where it stood in the log: after the records that preceded it.
  size_t v = 0;
  auto write_validations = [&](size_t records_written) -> Status {
    for (; v < log.validations.size() && log.validations[v].records_before <= records_written;
         ++v) {
      const LogValidation& val = log.validations[v];
      nlohmann::json m = {{"kind", "validation"}, {"iteration", val.iteration}};
      if (std::isfinite(val.lm_loss)) m["lm_loss"] = val.lm_loss;
      if (std::isfinite(val.ppl)) m["lm_loss_ppl"] = val.ppl;
      KEEL_RETURN_IF_ERROR(metrics->Append(m));
    }
    return Status::OK();
  };
  for (size_t k = 0; k < log.records.size(); ++k) {
    const LogRecord& r = log.records[k];
    KEEL_RETURN_IF_ERROR(write_validations(k));
    if (k > 0 && r.iteration <= log.records[k - 1].iteration) {
      std::string archived;
      KEEL_RETURN_IF_ERROR(metrics->Rewind(PositionBefore(r), "restart", &archived));
      if (!archived.empty() && archived_restart) archived_restart(r.iteration, archived);
    }
    KEEL_RETURN_IF_ERROR(metrics->Append(LogRecordToMetrics(r)));
  }
  KEEL_RETURN_IF_ERROR(write_validations(log.records.size()));
  for (const LogEvent& e : a.events) {
    KEEL_RETURN_IF_ERROR(
        metrics->AppendText(e.start, "guard/events", fmt::format("{}: {}", e.kind, e.detail)));
  }
  metrics.reset();  // closes the event file
  return WriteFileAtomic(
      env, JoinPath(dir, kLogAnalysisFile),
      LogAnalysisJson(log, a).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace

Status WriteLogAsRun(Env* env, const std::string& dir_in, const ParsedLog& log,
                     const LogAnalysis& a,
                     const std::function<void(const std::string&)>& log_line) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  // What it writes; metrics.jsonl last, so a directory that has it has everything.
  const char* outputs[] = {kLogAnalysisFile, kTensorBoardDir, kMetricsArchiveDir, kMetricsFile};
  const bool exists = env->FileExists(dir);
  if (exists && !env->IsDirectory(dir))
    return Status::InvalidArgument(fmt::format("--to-metrics {}: not a directory", dir));
  if (exists) {
    for (const char* o : {kMetricsFile, kTensorBoardDir, kMetricsArchiveDir, kLogAnalysisFile}) {
      if (env->FileExists(JoinPath(dir, o))) {
        return Status::InvalidArgument(
            fmt::format("--to-metrics {}: the directory already holds {}; give a new directory "
                        "(nothing in it is touched)",
                        dir, o));
      }
    }
  }
  // Built in a hidden directory on the same filesystem (inside DIR when it exists, beside it when
  // not), so moving it into place is a rename.
  const std::string tag = fmt::format(".keel-to-metrics-{}.partial", ::getpid());
  std::string parent = ".", staging;
  if (exists) {
    staging = JoinPath(dir, tag);
  } else {
    const size_t slash = dir.rfind('/');
    if (slash != std::string::npos) parent = slash == 0 ? "/" : dir.substr(0, slash);
    staging = JoinPath(parent, "." + dir.substr(slash + 1) + tag);
    KEEL_RETURN_IF_ERROR(env->CreateDirs(parent));
  }
  if (env->FileExists(staging)) KEEL_RETURN_IF_ERROR(env->RemoveDirRecursive(staging));
  Status st = env->CreateDirs(staging);
  if (st.ok()) {
    st = BuildRun(env, staging, log, a, [&](int64_t iteration, const std::string& archived) {
      if (log_line)
        log_line(fmt::format("the restart at iteration {}: the records after it go to {}",
                             iteration, JoinPath(dir, archived.substr(staging.size() + 1))));
    });
  }
  if (st.ok() && !exists) {
    st = env->RenameFile(staging, dir);
    if (st.ok()) {
      st = env->SyncDir(parent);
      if (st.ok()) return st;
      (void)env->RenameFile(dir, staging);  // not durable: take it back rather than half-trust it
    }
  } else if (st.ok()) {
    std::vector<const char*> moved;
    for (const char* o : outputs) {
      if (!env->FileExists(JoinPath(staging, o))) continue;
      st = env->RenameFile(JoinPath(staging, o), JoinPath(dir, o));
      if (!st.ok()) break;
      moved.push_back(o);
    }
    if (st.ok()) st = env->SyncDir(dir);
    if (!st.ok()) {  // put back what moved, so that DIR is as it was
      for (auto it = moved.rbegin(); it != moved.rend(); ++it)
        (void)env->RenameFile(JoinPath(dir, *it), JoinPath(staging, *it));
    }
  }
  (void)env->RemoveDirRecursive(staging);  // empty after a success; the partial output if not
  return st;
}

}  // namespace keel
