// The run journal as `keel report` reads it: events.jsonl, CHRONICLE.md and the log-analysis.json
// of `keel logs analyze --to-metrics` (the input's three parts, see fuzz_input.h), beside a valid
// metrics.jsonl.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "mem_env.h"
#include "report/run_report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = keel::fuzz::SplitInput(data, size, 3);
  keel::fuzz::MemEnv env;
  env.Put("/run/metrics.jsonl",
          "{\"kind\":\"train\",\"iteration\":10,\"lm_loss\":9.5,\"learning_rate\":0.001}\n"
          "{\"kind\":\"train\",\"iteration\":20,\"lm_loss\":8.25,\"learning_rate\":0.002}\n"
          "{\"kind\":\"validation\",\"iteration\":20,\"lm_loss\":8.5}\n");
  env.Put("/run/events.jsonl", parts[0]);
  if (!parts[1].empty()) env.Put("/run/CHRONICLE.md", parts[1]);
  if (!parts[2].empty()) env.Put("/run/log-analysis.json", parts[2]);
  std::string html;
  keel::ReportSummary summary;
  (void)keel::BuildRunReport(&env, "/run", keel::ReportAssets{}, &html, &summary);
  return 0;
}
