// `keel report RUN_DIR [-o FILE]`: the run as one self-contained HTML page (report/run_report.h).
// uPlot comes from the pinned npm assets and is inlined, so the page works offline.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "core/env.h"
#include "core/log.h"
#include "report/run_report.h"

namespace keel::cli {

int ReportCommand(int argc, const char* const* argv) {
  CLI::App app(
      "Write one self-contained HTML page of a run: loss (raw and rolling mean), per-dataset and "
      "validation loss, LR, batch size, grad norm, loss scale, throughput and TFLOPs, with guard "
      "events, restarts and rollbacks marked, and CHRONICLE.md below",
      "keel report");
  std::string dir, output;
  app.add_option("run_dir", dir,
                 "a `keel train --save` directory or `keel logs analyze --to-metrics` output")
      ->required();
  app.add_option("-o,--output", output, "HTML file to write (default RUN_DIR/report.html)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  Env* env = Env::Default();
  if (!env->IsDirectory(dir)) {
    LogError(
        fmt::format("error: {} is not a directory; give a run directory (keel train --save)", dir));
    return 2;
  }
  const std::string assets_dir = JoinPath(AssetsDir(), "uplot/dist");
  ReportAssets assets;
  Status st = env->ReadFileToString(JoinPath(assets_dir, "uPlot.iife.min.js"), &assets.uplot_js);
  if (st.ok()) st = env->ReadFileToString(JoinPath(assets_dir, "uPlot.min.css"), &assets.uplot_css);
  if (!st.ok()) {
    LogError(
        fmt::format("error: uPlot is not installed in {} ({}); run scripts/setup.sh (it "
                    "installs the pinned npm assets) or set KEEL_ASSETS_DIR",
                    assets_dir, st.message()));
    return 1;
  }
  std::string html;
  ReportSummary summary;
  st = BuildRunReport(env, dir, assets, &html, &summary);
  if (!st.ok()) return Fail(st, NotFoundIs::kUsageError);  // no metrics: not a run directory
  if (output.empty()) output = JoinPath(dir, "report.html");
  st = WriteFileAtomic(env, output, html);
  if (!st.ok()) {
    LogError(fmt::format("error: cannot write {}: {}", output, st.message()));
    return 1;
  }
  Log("report: {} ({} iterations, {} evaluations, {} marked events, {:.0f} KB)", output,
      summary.train_records, summary.validation_records, summary.markers, html.size() / 1024.0);
  return 0;
}

}  // namespace keel::cli
