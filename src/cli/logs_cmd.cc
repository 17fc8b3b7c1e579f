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
namespace {

constexpr const char* kLogAnalysisFile = "log-analysis.json";

// Writes the log's records (restarts archived the way keel's own rollbacks are) and findings.
Status WriteMetrics(Env* env, const std::string& dir, const ParsedLog& log, const LogAnalysis& a) {
  if (env->FileExists(JoinPath(dir, kMetricsFile))) {
    return Status::InvalidArgument(
        fmt::format("--to-metrics {}: the directory already holds {}; give a new directory (the "
                    "existing metrics are not touched)",
                    dir, kMetricsFile));
  }
  KEEL_RETURN_IF_ERROR(env->CreateDirs(dir));
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
      const int64_t gb = std::isfinite(r.global_batch) ? static_cast<int64_t>(r.global_batch) : 0;
      const int64_t samples = std::max<int64_t>(r.consumed_samples, 0);
      const int64_t per_sample =
          samples > 0 && r.consumed_tokens > 0 ? r.consumed_tokens / samples : 0;
      std::string archived;
      KEEL_RETURN_IF_ERROR(
          metrics->Rewind({r.iteration - 1, samples - gb,
                           std::max<int64_t>(r.consumed_tokens, 0) - gb * per_sample},
                          "restart", &archived));
      if (!archived.empty())
        Log("logs: the restart at iteration {}: the records after it moved to {}", r.iteration,
            archived);
    }
    KEEL_RETURN_IF_ERROR(metrics->Append(LogRecordToMetrics(r)));
  }
  KEEL_RETURN_IF_ERROR(write_validations(log.records.size()));
  for (const LogEvent& e : a.events) {
    KEEL_RETURN_IF_ERROR(
        metrics->AppendText(e.start, "guard/events", fmt::format("{}: {}", e.kind, e.detail)));
  }
  return WriteFileAtomic(env, JoinPath(dir, kLogAnalysisFile),
                         LogAnalysisJson(log, a).dump(2) + "\n");
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
    std::printf("%s\n", LogAnalysisJson(log, analysis).dump(2).c_str());
  } else {
    std::printf("%s", FormatLogAnalysis(log, analysis).c_str());
  }
  std::fflush(stdout);
  if (!to_metrics.empty()) {
    st = WriteMetrics(env, to_metrics, log, analysis);
    if (!st.ok()) return Fail(st);
    Log("logs: wrote {}/{}, {}/{}/ and {}/{}; `keel report {}` shows them", to_metrics,
        kMetricsFile, to_metrics, kTensorBoardDir, to_metrics, kLogAnalysisFile, to_metrics);
  }
  return 0;
}

}  // namespace keel::cli
