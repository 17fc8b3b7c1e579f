// Hang dumps (SAVE/hangs/iter_N/rank-RRR.txt) as `keel hangs analyze` reads them: two ranks'
// files parsed, each written back and parsed again (the format must round-trip), then analysed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_input.h"
#include "mem_env.h"
#include "watchdog/hang_analysis.h"
#include "watchdog/hang_dump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<keel::HangDump> dumps;
  for (const std::string& part : keel::fuzz::SplitInput(data, size, 2)) {
    keel::HangDump d;
    if (!keel::ParseHangDump(part, &d).ok()) continue;
    const std::string text = keel::FormatHangDump(d);
    keel::HangDump again;
    if (!keel::ParseHangDump(text, &again).ok() || keel::FormatHangDump(again) != text)
      std::abort();  // what FormatHangDump writes must read back as the same dump
    // ReadHangDumps hands the analysis distinct ranks of one world.
    if (!dumps.empty() && (d.rank == dumps[0].rank || d.world_size != dumps[0].world_size))
      continue;
    dumps.push_back(std::move(d));
  }
  // As `keel hangs analyze` reads them: the files of a directory, through the Env's capped read.
  {
    keel::fuzz::MemEnv env;
    const std::vector<std::string> parts = keel::fuzz::SplitInput(data, size, 2);
    env.Put("/hang/rank-000.txt", parts[0]);
    env.Put("/hang/rank-001.txt", parts[1]);
    std::vector<keel::HangDump> read;
    (void)keel::ReadHangDumps(&env, "/hang", &read);
  }
  if (dumps.empty()) return 0;
  const keel::HangAnalysis a = keel::AnalyzeHangs(dumps);
  (void)keel::FormatHangAnalysis(a);
  (void)keel::HangAnalysisJson(a).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
