// LogEventScanner: the findings of `keel logs analyze`, record by record, so that a log read at
// once and a log followed while it is written (`keel logs watch`) get the same events from the
// same code. Spikes and divergences go through the guard's InstabilityDetector; restarts, skipped
// and NaN iterations come from the log's own counters; a throughput drop from ThroughputDropScan.
//
// Event kinds (start/end are iterations):
//   spike_recovered   loss or grad-norm spike; end = first record back within recover_z
//   resume_spike      the same, starting within resume_window iterations after a restart; the
//                     first resume_records records after a restart are also judged against the
//                     records before it with the detector's floors scaled by resume_floor_scale
//   spike_unresolved  still open at the end of the log (or of the watch), or at a restart
//   divergence        a slow rise: found early by the trend test (guard/loss_trend_detector.h:
//                     start, size, confidence; it lasts while the median of its last 100
//                     iterations stays above its level at the start), or by the level rule (the detector's median of
//                     divergence_window records > divergence_rel above its lowest); or a spike
//                     whose loss did not come back within recover_iters (a level shift)
//   nan               records with a non-finite iteration (LogRecord::nonfinite)
//   skipped           records whose "number of skipped iterations" is > 0
//   restart           the iteration went back or a process start was logged; start = last
//                     iteration before, end = first after
//   throughput_drop   the median throughput fell by more than drop_threshold and stayed down
//                     (over the records that trained an iteration: LogRecord::gap ones are left
//                     out)
//
// After a restart that went back (a resume from an earlier checkpoint), the detector's windows are
// those it had at the resume point: the records of the abandoned iterations are forgotten, as a
// keel run restores its detector from the checkpoint.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "guard/instability_detector.h"
#include "guard/loss_trend_detector.h"
#include "logs/megatron_log.h"

namespace keel {

struct LogAnalysisOptions {
  DetectorConfig detector;
  LossTrendConfig trend;
  bool trend_enabled = true;    // the trend test of divergence (false: the level rule alone)
  int64_t recover_iters = 50;   // a spike not back by then is a divergence (guard-recover-iters)
  int64_t resume_window = 100;  // a spike this close after a restart is a resume spike
  // The first records after a restart are compared with the level and noise of the records before
  // it, with the detector's floors (2% of the loss, 25% of the grad norm) scaled by this: a restart
  // is when a bump is expected, and the records before it say exactly what the level was.
  int resume_records = 10;
  double resume_floor_scale = 0.25;
  double drop_threshold = 0.03;
  int drop_window = 0;  // records per median window (0: analyze: n/20, between 3 and 50)
};

struct LogEvent {
  std::string kind;
  int64_t start = 0, end = 0;
  std::string signal;  // "lm loss", "grad norm", "TFLOPs", ...
  double value = 0, baseline = 0;
  std::string detail;       // one sentence for people
  double confidence = NAN;  // a divergence found by the trend test (LossTrendDetector): its own
  int64_t found = -1;       // the record that found it (AnalyzeLog: the end of its first update)
};

// A finding as it opens and as it closes. While open, `event.kind` says what was found ("spike",
// "resume_spike", "divergence", "nan", "skipped", "throughput_drop") and `event.end` is the record
// that found it; closed, the event is as `keel logs analyze` reports it. Every update of one
// finding has the same id; a closed divergence can open again when the loss rises again within a
// divergence window (its next closed update replaces the earlier one).
struct LogEventUpdate {
  int64_t id = 0;
  bool open = false;
  LogEvent event;
};

// The signal the throughput drop watches.
enum class ThroughputSignal { kTflops, kSamplesPerSecond, kIterationsPerSecond };
const char* ThroughputSignalName(ThroughputSignal s);

class LogEventScanner {
 public:
  using Sink = std::function<void(const LogEventUpdate&)>;
  // `drop_window`: records per median window of the drop test (> 0). `signal`: what the drop test
  // watches; without one, the first record that trained an iteration decides (TFLOPs where it has
  // them and they are not below its samples per second, which then has more significant digits;
  // else samples per second, else iterations per second).
  LogEventScanner(const LogAnalysisOptions& opt, int drop_window, Sink sink,
                  const ThroughputSignal* signal = nullptr);
  ~LogEventScanner();

  void Add(const LogRecord& r);
  // No more records: what is open closes ("not back by `end_of_what`": "the end of the log").
  void Finish(const std::string& end_of_what);

  int64_t restarts() const { return restarts_; }
  int64_t skipped_iterations() const { return skipped_; }
  int64_t nan_iterations() const { return nan_; }
  bool has_signal() const { return has_signal_; }
  ThroughputSignal signal() const { return signal_; }

 private:
  class Instability;
  class Drops;
  struct Run {  // a run of consecutive records with NaN (or skipped) iterations
    bool active = false;
    int64_t id = 0;
    LogEvent event;
  };
  void CountRun(Run* run, const char* kind, const char* what, bool hit, int64_t from,
                const LogRecord& r, int64_t count);
  void CloseRun(Run* run);
  int64_t NextId() { return next_id_++; }

  LogAnalysisOptions opt_;
  Sink sink_;
  int64_t next_id_ = 1;
  std::unique_ptr<Instability> instability_;
  std::unique_ptr<Drops> drops_;
  int drop_window_;
  bool has_signal_ = false;
  ThroughputSignal signal_ = ThroughputSignal::kTflops;
  Run nan_run_, skipped_run_;
  int64_t prev_ = -1;  // the previous record's iteration (-1: none, or a restart since)
  bool any_ = false;
  int64_t last_iteration_ = 0;
  int64_t restarts_ = 0, skipped_ = 0, nan_ = 0;
};

}  // namespace keel
