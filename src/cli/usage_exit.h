// CLI11's parse errors as keel's exit codes. CLI11 exits --help with 0 and each other parse error
// with a code of its own (105 to 109...), which `keel launch` takes for a failure worth a restart:
// here every one is a usage error, exit 2, with CLI11's message and the command's --help to read.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <string>

#include "core/log.h"

namespace keel::cli {

// The command line of the (sub)command that failed to parse, e.g. "keel data prepare".
inline std::string ParsedCommandName(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* sub = &app;;) {
    const std::vector<CLI::App*> subs = sub->get_subcommands();
    if (subs.empty()) break;
    sub = subs.back();
    name += " " + sub->get_name();
  }
  return name;
}

// `return UsageExit(app, e);` in a `catch (const CLI::ParseError& e)`: help (and the like) printed
// and 0; anything else "error: MESSAGE; run `keel CMD --help` ..." on stderr and 2.
inline int UsageExit(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0) return app.exit(e);
  LogError(
      fmt::format("error: {}; run `{} --help` for its options", e.what(), ParsedCommandName(app)));
  return 2;
}

}  // namespace keel::cli
