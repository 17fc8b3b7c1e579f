// `keel hangs analyze DIR`: reads the watchdog's per-rank dumps of one hang (SAVE/hangs/iter_N),
// groups the ranks by where they were, names the odd ones out, the ranks that left no dump and the
// first collective the ranks disagree on.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "core/env.h"
#include "core/log.h"
#include "watchdog/hang_analysis.h"

namespace keel::cli {

int HangsCommand(int argc, const char* const* argv) {
  CLI::App app("Hang dumps of the watchdog (SAVE/hangs/iter_N/rank-RRR.txt)", "keel hangs");
  app.require_subcommand(1);
  CLI::App* analyze = app.add_subcommand(
      "analyze",
      "Group the ranks of one hang by phase, collective and main-thread frames; name the odd "
      "ones out, the ranks without a dump and the first collective the ranks disagree on");
  std::string dir;
  bool json = false;
  analyze->add_option("dir", dir, "a hang directory, SAVE/hangs/iter_N")->required();
  analyze->add_flag("--json", json, "print the analysis as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  std::vector<HangDump> dumps;
  const Status st = ReadHangDumps(Env::Default(), dir, &dumps);
  if (!st.ok()) return Fail(st, NotFoundIs::kUsageError);
  const HangAnalysis a = AnalyzeHangs(dumps);
  if (json) {
    nlohmann::json j = HangAnalysisJson(a);
    j["dir"] = dir;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s", FormatHangAnalysis(a).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace keel::cli
