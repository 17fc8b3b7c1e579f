// A run's metrics.jsonl, read by `keel report` (BuildRunReport) and by RunMetrics::Rewind when a
// resume or rollback moves the records after an iteration aside.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_input.h"
#include "mem_env.h"
#include "metrics/run_metrics.h"
#include "report/run_report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = keel::fuzz::AsString(data, size);
  keel::fuzz::MemEnv env;
  env.Put("/run/metrics.jsonl", text);
  std::string html;
  keel::ReportSummary summary;
  (void)keel::BuildRunReport(&env, "/run", keel::ReportAssets{}, &html, &summary);

  std::unique_ptr<keel::RunMetrics> metrics;
  if (!keel::RunMetrics::Open(&env, "/run", &metrics).ok()) return 0;
  std::string archived;
  keel::MetricsPosition at;
  at.iteration = 20;
  at.samples = 320;
  at.tokens = 40960;
  (void)metrics->Rewind(at, "fuzz", &archived);
  return 0;
}
