// Megatron-LM / Megatron-DeepSpeed / keel training logs: parsed, then analysed and reported as
// `keel logs analyze` does (text, JSON, and the metrics.jsonl records of --to-metrics).
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "logs/log_analysis.h"
#include "logs/megatron_log.h"
#include "mem_env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  keel::ParsedLog log;
  const std::string text = keel::fuzz::AsString(data, size);
  if (!keel::ParseMegatronLog(text, "fuzz.log", &log).ok()) return 0;
  // `keel logs analyze` streams the file (ReadMegatronLog): it must read what the whole text gives.
  keel::fuzz::MemEnv env;
  env.Put("/fuzz.log", text);
  keel::ParsedLog streamed;
  if (!keel::ReadMegatronLog(&env, "/fuzz.log", &streamed).ok() ||
      streamed.records.size() != log.records.size() || streamed.lines != log.lines ||
      streamed.rejected.size() != log.rejected.size() ||
      streamed.validations.size() != log.validations.size())
    __builtin_trap();
  for (size_t i = 0; i < log.records.size(); ++i)
    if (streamed.records[i].iteration != log.records[i].iteration ||
        streamed.records[i].line != log.records[i].line)
      __builtin_trap();
  keel::LogAnalysis analysis;
  if (!keel::AnalyzeLog(log, keel::LogAnalysisOptions{}, &analysis).ok()) return 0;
  (void)keel::FormatLogAnalysis(log, analysis);
  (void)keel::LogAnalysisJson(log, analysis).dump();
  for (const keel::LogRecord& r : log.records) (void)keel::LogRecordToMetrics(r).dump();
  return 0;
}
