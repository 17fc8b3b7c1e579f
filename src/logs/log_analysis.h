// LogAnalysis: the findings `keel logs analyze` reports on a parsed training log: the events of
// LogEventScanner (logs/log_events.h: spikes and divergences by the guard's detector, restarts
// and resume spikes, skipped and NaN iterations, throughput drops), the throughput statistics and
// the ETA.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/env.h"
#include "logs/log_events.h"
#include "logs/megatron_log.h"

namespace keel {

struct SeriesStats {
  int64_t count = 0;
  double min = 0, median = 0, mean = 0, max = 0;
};

// Goodput estimated from a log (the categories and keys of report/goodput.h): iterations that
// stayed in the model, those a restart recomputed, and, where the lines carry timestamps, the
// stalls and the time between runs. An estimate: `notes` say what a log could not show.
struct LogGoodput {
  double wall_seconds = 0;
  std::vector<std::pair<std::string, double>> categories;  // summing to wall_seconds
  bool timestamps = false;                                 // the wall time is the log's own
  std::vector<std::string> notes;
};
LogGoodput EstimateLogGoodput(const ParsedLog& log);

struct LogAnalysis {
  int64_t records = 0, validations = 0;
  int64_t first_iteration = 0, last_iteration = 0;  // of the first and last record
  int64_t min_iteration = -1, max_iteration = 0, train_iters = 0;
  SeriesStats tflops, samples_per_second, iteration_seconds;
  std::string throughput_signal;  // what the drop detector watched
  int64_t skipped_iterations = 0, nan_iterations = 0, restarts = 0;
  double eta_seconds = -1;  // remaining iterations x recent median time (-1: unknown)
  std::string eta_note;     // why it is unknown
  double recent_iteration_seconds = 0;
  std::vector<LogEvent> events;  // by start iteration
  LogGoodput goodput;
};

// Fails only when the log has no iteration records.
Status AnalyzeLog(const ParsedLog& log, const LogAnalysisOptions& opt, LogAnalysis* out);
std::string FormatLogAnalysis(const ParsedLog& log, const LogAnalysis& a);
nlohmann::json LogAnalysisJson(const ParsedLog& log, const LogAnalysis& a);
// A record as a keel metrics.jsonl train record (fields the log does not have are left out; an
// interval that trained nothing has null loss and throughput, as keel writes for it).
nlohmann::json LogRecordToMetrics(const LogRecord& r);

// `keel logs analyze --to-metrics DIR`: the log as a keel run directory, DIR/metrics.jsonl and
// DIR/tensorboard/ as `keel train` writes them (a restart that went back archived the way keel's
// rewinds are), the findings as guard/events text, and DIR/log-analysis.json. Refused when DIR
// holds any of these already. Atomic: everything is built in a hidden directory beside them and
// moved into place at the end (metrics.jsonl last); on an error nothing of it remains. `log_line`
// hears of each archived restart.
Status WriteLogAsRun(Env* env, const std::string& dir, const ParsedLog& log, const LogAnalysis& a,
                     const std::function<void(const std::string&)>& log_line);

constexpr const char* kLogAnalysisFile = "log-analysis.json";

}  // namespace keel
