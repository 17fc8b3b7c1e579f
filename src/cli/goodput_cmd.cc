// `keel goodput RUN [--json]`: where every second of a job went (report/goodput.h), and the
// summary a run's end writes to its chronicle.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "core/env.h"
#include "core/log.h"
#include "journal/events.h"
#include "journal/run_journal.h"
#include "report/goodput.h"

namespace keel::cli {

int GoodputCommand(int argc, const char* const* argv) {
  CLI::App app(
      "Where every second of a job went, across keel launch's restarts: productive iterations, "
      "iterations lost to crashes and rollbacks, save stalls, evaluation, start-up and resume, "
      "waiting for data, hangs, restart backoff, the guard's reruns (docs/observability.md)",
      "keel goodput");
  std::string dir;
  bool json = false;
  app.add_option("run", dir, "a run directory (keel train --save DIR)")->required();
  app.add_flag("--json", json,
               "print {\"wall_seconds\": W, \"categories\": {\"productive\": s, ...}}");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  GoodputBreakdown g;
  const Status st = ComputeGoodput(Env::Default(), dir, &g);
  if (!st.ok()) return Fail(st, NotFoundIs::kUsageError);
  if (json)
    std::printf("%s\n", g.ToJson().dump(2).c_str());
  else
    std::printf("%s", FormatGoodputTable(g).c_str());
  std::fflush(stdout);
  return 0;
}

void JournalGoodputSummary(const std::string& run_dir, const std::string& who) {
  if (run_dir.empty()) return;
  GoodputBreakdown g;
  if (!ComputeGoodput(Env::Default(), run_dir, &g).ok()) return;  // no records: nothing to sum
  GoodputSummaryEvent ev;
  ev.wall_seconds = g.wall_seconds;
  ev.categories = nlohmann::json(g.ToJson()["categories"]);
  RunJournal journal(
      Env::Default(), run_dir, [](const std::string& line) { LogLine(line); }, who);
  journal.Append(ev, GoodputSentence(g) + " (`keel goodput " + run_dir + "`)");
}

}  // namespace keel::cli
