// `keel tb rename --map MAP.json DIR`: rename tags in every event file of DIR, one pass per file,
// each file replaced atomically. `keel tb truncate --after-step N DIR`: keep the curves up to
// iteration N; the original files go whole to DIR/tb-archive/ (docs/observability.md).
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "core/log.h"
#include "metrics/tb_tools.h"

namespace keel::cli {

int TbCommand(int argc, const char* const* argv) {
  CLI::App app("TensorBoard event directories", "keel tb");
  app.require_subcommand(1);
  std::string dir, map_path;
  int64_t step = -1;
  CLI::App* rename = app.add_subcommand("rename", "Rename tags in every event file of DIR");
  rename
      ->add_option("--map", map_path,
                   "a JSON file holding an object of old tag -> new tag, e.g. {\"lm loss\": "
                   "\"lm-loss-training/lm loss\"}")
      ->type_name("MAP.json")
      ->required();
  rename->add_option("dir", dir, "directory of events.out.tfevents.* files")->required();
  CLI::App* truncate =
      app.add_subcommand("truncate", "Keep the events up to a step; archive the originals");
  truncate->add_option("--after-step", step, "last iteration kept")
      ->required()
      ->check(CLI::NonNegativeNumber);
  truncate->add_option("dir", dir, "directory of events.out.tfevents.* files")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  Env* env = Env::Default();
  auto fail = [](const Status& st) { return Fail(st, NotFoundIs::kUsageError); };
  if (rename->parsed()) {
    std::string text;
    Status st = env->ReadFileToString(map_path, &text);
    if (!st.ok()) return fail(Status::NotFound("--map " + map_path + ": " + st.message()));
    std::map<std::string, std::string> map;
    st = ParseTagMap(text, "--map " + map_path, &map);
    if (!st.ok()) return fail(st);
    TagRenameReport r;
    st = RenameTags(env, dir, map, &r);
    if (!st.ok()) return fail(st);
    for (const auto& [from, n] : r.renamed) Log("renamed {} events: {} -> {}", n, from, map[from]);
    for (const auto& [from, to] : map)
      if (!r.renamed.count(from)) Warn("no event has the tag '{}'", from);
    Log("{} of {} event files rewritten", r.files_changed, r.files);
    return 0;
  }
  TruncateReport r;
  Status st = TruncateAfterStep(env, dir, step, &r);
  if (!st.ok()) return fail(st);
  if (r.archive.empty())
    Log("nothing follows step {}: no file changed ({} events)", step, r.kept);
  else
    Log("kept {} events up to step {}; the original files ({} more events) are in {}", r.kept, step,
        r.moved, r.archive);
  return 0;
}

}  // namespace keel::cli
