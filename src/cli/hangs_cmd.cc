// `keel hangs analyze DIR`: reads the watchdog's per-rank dumps of one hang (SAVE/hangs/iter_N),
// groups the ranks by where they were, names the odd ones out, the ranks that left no dump and the
// first collective the ranks disagree on.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
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
  analyze
      ->add_option("dir", dir,
                   "a hang directory, SAVE/hangs/iter_N (or a run directory SAVE: its newest)")
      ->required();
  analyze->add_flag("--json", json, "print the analysis as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  Env* env = Env::Default();
  // A run directory (SAVE, with a hangs/ directory and no dumps of its own): its newest hang.
  const std::string hangs = JoinPath(dir, "hangs");
  if (env->IsDirectory(hangs) && !env->FileExists(JoinPath(dir, HangDumpFileName(0)))) {
    std::vector<std::string> names;
    std::string newest;
    int64_t newest_it = -1;
    if (env->GetChildren(hangs, &names).ok())
      for (const std::string& n : names) {
        char* end = nullptr;
        const int64_t it = n.rfind("iter_", 0) == 0 ? std::strtoll(n.c_str() + 5, &end, 10) : -1;
        if (it > newest_it && end != nullptr && *end == '\0' &&
            env->IsDirectory(JoinPath(hangs, n)))
          newest_it = it, newest = n;
      }
    if (!newest.empty()) {
      const std::string chosen = JoinPath(hangs, newest);
      // On stderr: --json's stdout stays JSON.
      std::fprintf(stderr, "note: %s is a run directory: analyzing its newest hang, %s\n",
                   dir.c_str(), chosen.c_str());
      dir = chosen;
    }
  }
  std::vector<HangDump> dumps;
  const Status st = ReadHangDumps(env, dir, &dumps);
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
