#include "logs/log_analysis.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
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
          {"events", events}};
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
