// `keel logs analyze FILE...`: findings on Megatron-LM / Megatron-DeepSpeed (and keel) training
// logs: iteration range, throughput, spikes and divergences by the guard's detector, skipped and
// NaN iterations, restarts, a sustained throughput drop, ETA. `--to-metrics DIR` writes the log as
// a keel run directory (metrics.jsonl, TensorBoard, log-analysis.json) for `keel report`.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "core/env.h"
#include "core/log.h"
#include "metrics/log_analysis.h"
#include "metrics/megatron_log.h"
#include "metrics/run_metrics.h"

namespace keel::cli {

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
  analyze->add_option("--z-threshold", opt.detector.z_threshold, "loss spike: robust z above this")
      ->capture_default_str();
  analyze
      ->add_option("--grad-z-threshold", opt.detector.grad_z_threshold,
                   "grad-norm spike: robust z above this")
      ->capture_default_str();
  analyze
      ->add_option("--min-history", opt.detector.min_history,
                   "records before spikes are judged (short excerpts need fewer)")
      ->capture_default_str();
  analyze
      ->add_option("--divergence-window", opt.detector.divergence_window,
                   "records whose median is compared with the lowest level")
      ->capture_default_str();
  analyze
      ->add_option("--recover-iters", opt.recover_iters,
                   "a spike not back within this many iterations is a divergence")
      ->capture_default_str();
  analyze
      ->add_option("--drop-threshold", opt.drop_threshold,
                   "a throughput drop of more than this fraction that lasts a window")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (opt.detector.min_history < 1 || opt.detector.divergence_window < 2 ||
      !(opt.drop_threshold > 0 && opt.drop_threshold < 1) || opt.recover_iters < 1) {
    LogError(
        "error: --min-history must be >= 1, --divergence-window >= 2, --recover-iters >= 1 "
        "and --drop-threshold in (0, 1)");
    return 2;
  }
  Env* env = Env::Default();
  ParsedLog log;
  for (const std::string& f : files) {
    std::string text;
    Status st = env->ReadFileToString(f, &text);
    if (!st.ok()) {
      LogError(fmt::format("error: cannot read the log {}: {}", f, st.message()));
      return 2;
    }
    st = ParseMegatronLog(text, f, &log);
    if (!st.ok()) {
      LogError("error: " + st.message());
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

}  // namespace keel::cli
