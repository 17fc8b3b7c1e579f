// `keel logs analyze FILE...`: findings on Megatron-LM / Megatron-DeepSpeed (and keel) training
// logs: iteration range, throughput, spikes and divergences by the guard's detector, skipped and
// NaN iterations, restarts, a sustained throughput drop, ETA. `--to-metrics DIR` writes the log as
// a keel run directory (metrics.jsonl, TensorBoard, log-analysis.json) for `keel report`.
// `keel logs watch FILE`: the same findings, live, on a log another framework is writing, into a
// journal (events.jsonl, CHRONICLE.md), with a kill switch and a command hook.
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "core/env.h"
#include "core/log.h"
#include "logs/event_command.h"
#include "logs/log_analysis.h"
#include "logs/log_watcher.h"
#include "logs/megatron_log.h"
#include "metrics/run_metrics.h"

namespace keel::cli {
namespace {

volatile sig_atomic_t g_stop_signal = 0;

void OnStop(int sig) {
  g_stop_signal = sig;
}

// The detector options both subcommands take.
void AddDetectorOptions(CLI::App* app, LogAnalysisOptions* opt, const std::string& drop_window) {
  app->add_option("--z-threshold", opt->detector.z_threshold, "loss spike: robust z above this")
      ->capture_default_str();
  app->add_option("--grad-z-threshold", opt->detector.grad_z_threshold,
                  "grad-norm spike: robust z above this")
      ->capture_default_str();
  app->add_option("--min-history", opt->detector.min_history,
                  "records before spikes are judged (short excerpts need fewer)")
      ->capture_default_str();
  app->add_option("--divergence-window", opt->detector.divergence_window,
                  "records whose median is compared with the lowest level")
      ->capture_default_str();
  app->add_option("--recover-iters", opt->recover_iters,
                  "a spike not back within this many iterations is a divergence")
      ->capture_default_str();
  app->add_option("--resume-records", opt->resume_records,
                  "records after a restart judged against the records before it")
      ->capture_default_str();
  app->add_option("--resume-floor-scale", opt->resume_floor_scale,
                  "the detector's floors (2% of the loss, 25% of the grad norm) times this, for "
                  "those records")
      ->capture_default_str();
  app->add_option("--drop-threshold", opt->drop_threshold,
                  "a throughput drop of more than this fraction that lasts a window")
      ->capture_default_str();
  app->add_option("--drop-window", opt->drop_window, drop_window)->capture_default_str();
  app->add_option("--trend-z", opt->trend.z_threshold,
                  "slow divergence (the trend test): standard errors of a rise (raised for "
                  "records closer than 10 iterations apart)")
      ->capture_default_str();
  app->add_flag("--no-trend{false}", opt->trend_enabled,
                "slow divergence by the level rule alone (no trend test)");
}

std::string CheckDetectorOptions(const LogAnalysisOptions& opt) {
  if (opt.detector.min_history < 1 || opt.detector.divergence_window < 2 ||
      !(opt.drop_threshold > 0 && opt.drop_threshold < 1) || opt.recover_iters < 1 ||
      opt.drop_window < 0 || opt.resume_records < 0 ||
      !(opt.resume_floor_scale > 0 && opt.resume_floor_scale <= 1) || !(opt.trend.z_threshold > 0))
    return "--min-history must be >= 1, --divergence-window >= 2, --recover-iters >= 1, "
           "--drop-threshold in (0, 1), --drop-window >= 0, --resume-records >= 0, "
           "--resume-floor-scale in (0, 1] and --trend-z > 0";
  return "";
}

int Analyze(const std::vector<std::string>& files, const std::string& to_metrics, bool json,
            const LogAnalysisOptions& opt) {
  Env* env = Env::Default();
  ParsedLog log;
  for (const std::string& f : files) {
    // Streamed: a log of any length is read in pieces, its lines capped (kMaxLogLineBytes).
    Status st = ReadMegatronLog(env, f, &log);
    if (!st.ok()) {
      LogError(fmt::format("error: cannot read the log {}: {}", f, st.message()));
      return 2;
    }
  }
  LogAnalysis analysis;
  Status st = AnalyzeLog(log, opt, &analysis);
  if (!st.ok()) {
    LogError("error: " + st.message());
    return 2;
  }
  if (json) {
    std::printf("%s\n", LogAnalysisJson(log, analysis)
                            .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                            .c_str());
  } else {
    std::printf("%s", FormatLogAnalysis(log, analysis).c_str());
  }
  std::fflush(stdout);
  if (!to_metrics.empty()) {
    st = WriteLogAsRun(env, to_metrics, log, analysis,
                       [](const std::string& line) { Log("logs: {}", line); });
    if (!st.ok()) return Fail(st);
    Log("logs: wrote {}/{}, {}/{}/ and {}/{}; `keel report {}` shows them", to_metrics,
        kMetricsFile, to_metrics, kTensorBoardDir, to_metrics, kLogAnalysisFile, to_metrics);
  }
  return 0;
}

int Watch(LogWatchOptions opt, bool from_start, bool from_end, const std::string& kill_on,
          bool drop_window_given) {
  if (opt.poll_seconds <= 0 || opt.until_idle_seconds < 0 || opt.on_event_timeout_s <= 0) {
    LogError(
        "error: --poll-seconds and --on-event-timeout must be > 0 and --until-idle >= 0 "
        "(0: until SIGINT or SIGTERM)");
    return 2;
  }
  if (opt.max_running_hooks < 1 || opt.max_queued_hooks < 0) {
    LogError(fmt::format(
        "error: --max-running-hooks {} must be at least 1 and --max-queued-hooks {} at least 0 "
        "(0: an entry that finds every command slot taken runs none)",
        opt.max_running_hooks, opt.max_queued_hooks));
    return 2;
  }
  if (from_start && from_end) {
    LogError("error: --from-start and --from-end exclude each other: choose one");
    return 2;
  }
  if (!kill_on.empty() && opt.kill_switch.empty()) {
    LogError("error: --kill-on needs --kill-switch PATH (the file to create)");
    return 2;
  }
  std::string kinds = kill_on.empty() ? "divergence,nan" : kill_on;
  std::istringstream list(kinds);
  for (std::string k; std::getline(list, k, ',');) {
    if (k.empty()) continue;
    if (!LogEventKinds().count(k)) {
      std::string known;
      for (const std::string& n : LogEventKinds()) known += (known.empty() ? "" : ", ") + n;
      LogError(fmt::format("error: --kill-on {}: no finding is called '{}' (kinds: {})", kill_on, k,
                           known));
      return 2;
    }
    opt.kill_on.insert(k);
  }
  opt.from_end = from_end;
  opt.append_to_journal = from_start || from_end;
  if (opt.out_dir.empty()) {
    opt.out_dir = opt.log + ".watch";
    Log("note: the journal goes to {}/ (--out DIR to choose)", opt.out_dir);
  }
  if (drop_window_given && opt.analysis.drop_window == 0) {
    LogError(
        "error: --drop-window 0 means records/20 for a whole log; a live log needs a window "
        "of records (> 0; the default is 20)");
    return 2;
  }
  if (!drop_window_given) {
    opt.analysis.drop_window = 20;
    Log("note: throughput drops are judged on windows of 20 records (--drop-window; a live log "
        "has no length to divide, keel logs analyze uses records/20, 3 to 50)");
  }
  if (!opt.kill_switch.empty() && kill_on.empty())
    Log("note: the kill switch {} is created on the first divergence or NaN (--kill-on KINDS to "
        "choose)",
        opt.kill_switch);
  Env* env = Env::Default();
  std::unique_ptr<EventCommandRunner> runner;
  if (!opt.on_event.empty()) runner = NewPosixEventCommandRunner(env);
  LogWatcher watcher(env, opt, runner.get(), [](const std::string& line) { LogLine(line); });
  Status st = watcher.Open();
  if (!st.ok()) return Fail(st);
  struct sigaction sa = {};
  sa.sa_handler = OnStop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  Log("watch: following {} ({}; every {:g} s{}); SIGINT or SIGTERM stops it with a summary",
      opt.log, from_end ? "from its end: what is there primes the detectors" : "from its start",
      opt.poll_seconds,
      opt.until_idle_seconds > 0
          ? fmt::format(", until it is quiet for {:g} s", opt.until_idle_seconds)
          : "");
  std::string why;
  st = watcher.Run(
      [] {
        const int sig = g_stop_signal;
        return sig == 0 ? std::string()
                        : fmt::format("{} received", sig == SIGINT ? "SIGINT" : "SIGTERM");
      },
      &why);
  if (!st.ok()) {
    watcher.Finish("an error: " + st.message());
    return Fail(st);
  }
  watcher.Finish(why);
  return 0;
}

}  // namespace

int LogsCommand(int argc, const char* const* argv) {
  CLI::App app("Training logs of Megatron-LM, Megatron-DeepSpeed or keel", "keel logs");
  app.require_subcommand(1);
  CLI::App* analyze = app.add_subcommand(
      "analyze",
      "Iteration range, throughput (and any sustained drop), spikes and divergences (the guard's "
      "detector), skipped/NaN iterations, restarts and the ETA of one run's log files, in order");
  std::vector<std::string> files;
  std::string to_metrics;
  bool json = false;
  LogAnalysisOptions opt;
  analyze->add_option("files", files, "log files of one run, oldest first")->required();
  analyze->add_flag("--json", json, "print the findings as JSON");
  analyze->add_option("--to-metrics", to_metrics,
                      "also write DIR/metrics.jsonl, DIR/tensorboard/ and DIR/log-analysis.json "
                      "(keel report DIR reads them)");
  AddDetectorOptions(analyze, &opt,
                     "records per median window of the drop test (0: records/20, 3 to 50)");

  CLI::App* watch = app.add_subcommand(
      "watch",
      "Follow a log another framework is writing (appends, partial lines, rotation, truncation, "
      "a file not there yet) and journal the findings of `keel logs analyze` as they happen: "
      "DIR/events.jsonl and DIR/CHRONICLE.md, one line each on stdout, a kill-switch file, a "
      "command");
  LogWatchOptions wopt;
  bool from_start = false, from_end = false;
  std::string kill_on;
  watch->add_option("file", wopt.log, "the log file (it may not exist yet)")->required();
  watch->add_option("--out", wopt.out_dir,
                    "directory for events.jsonl and CHRONICLE.md (default: FILE.watch)");
  watch->add_flag("--from-start", from_start,
                  "journal the whole log, from its first line (the default; with a DIR that "
                  "holds an earlier watch's journal: append to it)");
  watch->add_flag("--from-end", from_end,
                  "the lines already there prime the detectors and are not journaled; what is "
                  "written from now on is (with an earlier watch's journal in DIR: append)");
  watch->add_option("--kill-switch", wopt.kill_switch,
                    "create this file on the first finding of a --kill-on kind (runs started "
                    "with --kill-switch-path PATH save and stop when it appears)");
  watch->add_option("--kill-on", kill_on,
                    "comma-separated finding kinds that create the kill switch (default: "
                    "divergence,nan; also spike, resume_spike, spike_recovered, "
                    "spike_unresolved, skipped, restart, throughput_drop)");
  watch->add_option("--on-event", wopt.on_event,
                    "shell command run for every journal entry, with KEEL_EVENT, "
                    "KEEL_EVENT_KIND, KEEL_EVENT_OPEN, KEEL_EVENT_START, KEEL_EVENT_END, "
                    "KEEL_EVENT_ITERATION, KEEL_EVENT_SENTENCE, KEEL_EVENT_LOG, KEEL_EVENT_JSON "
                    "set and the entry's JSON on stdin (the log's text reaches it only there, "
                    "never in CMD); never waited for, in a session of its own");
  watch
      ->add_option("--max-running-hooks", wopt.max_running_hooks,
                   "at most this many --on-event commands at once; an entry beyond them waits "
                   "in the queue (--max-queued-hooks)")
      ->capture_default_str();
  watch
      ->add_option("--max-queued-hooks", wopt.max_queued_hooks,
                   "entries waiting for a --on-event slot; beyond this many their commands are "
                   "not run, and the count is journaled (\"event\": \"hooks_dropped\")")
      ->capture_default_str();
  watch
      ->add_option("--on-event-timeout", wopt.on_event_timeout_s,
                   "seconds after which a --on-event command is ended (SIGTERM, SIGKILL 5 s later)")
      ->capture_default_str();
  watch->add_option("--poll-seconds", wopt.poll_seconds, "seconds between looks at the file")
      ->capture_default_str();
  watch
      ->add_option("--until-idle", wopt.until_idle_seconds,
                   "stop once the file has been quiet this many seconds (0: until SIGINT or "
                   "SIGTERM)")
      ->capture_default_str();
  AddDetectorOptions(watch, &wopt.analysis,
                     "records per median window of the drop test (default 20)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  const bool watching = watch->parsed();
  const std::string bad = CheckDetectorOptions(watching ? wopt.analysis : opt);
  if (!bad.empty()) {
    LogError("error: " + bad);
    return 2;
  }
  if (watching)
    return Watch(wopt, from_start, from_end, kill_on, watch->count("--drop-window") > 0);
  return Analyze(files, to_metrics, json, opt);
}

}  // namespace keel::cli
