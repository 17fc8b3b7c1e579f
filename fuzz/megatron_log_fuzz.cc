// Megatron-LM / Megatron-DeepSpeed / keel training logs: parsed, then analysed and reported as
// `keel logs analyze` does (text, JSON, and the metrics.jsonl records of --to-metrics).
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "metrics/log_analysis.h"
#include "metrics/megatron_log.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  keel::ParsedLog log;
  if (!keel::ParseMegatronLog(keel::fuzz::AsString(data, size), "fuzz.log", &log).ok()) return 0;
  keel::LogAnalysis analysis;
  if (!keel::AnalyzeLog(log, keel::LogAnalysisOptions{}, &analysis).ok()) return 0;
  (void)keel::FormatLogAnalysis(log, analysis);
  (void)keel::LogAnalysisJson(log, analysis).dump();
  for (const keel::LogRecord& r : log.records) (void)keel::LogRecordToMetrics(r).dump();
  return 0;
}
