#include "health/throughput_cause.h"

#include <fmt/format.h>

namespace keel {

std::string DropCause(const IterationCost& before, const IterationCost& now, int64_t saves,
                      double save_seconds) {
  const double dw = now.wall - before.wall;
  std::string cause;
  auto ms = [](double s) { return 1e3 * s; };
  if (std::isfinite(dw) && dw > 0) {
    const double dd = now.data_wait - before.data_wait, dc = now.cpu - before.cpu;
    if (std::isfinite(dd) && dd >= 0.5 * dw) {
      cause = fmt::format(
          "the loop waited longer for data: {:.1f} ms per iteration for its samples, was {:.1f} "
          "(the data loader does not keep up: more --num-workers, or faster storage)",
          ms(now.data_wait), ms(before.data_wait));
    } else if (std::isfinite(dc) && dc < 0.5 * dw &&
               now.cpu / now.wall < before.cpu / before.wall) {
      cause = fmt::format(
          "the process was off the cores: its CPU time per iteration stayed at {:.1f} ms (was "
          "{:.1f}) while an iteration took {:.1f} ms (was {:.1f}): another process on the cores "
          "(the machine is shared), or a wait outside keel's data loading",
          ms(now.cpu), ms(before.cpu), ms(now.wall), ms(before.wall));
    } else if (std::isfinite(dc) && dc >= 0.5 * dw) {
      cause = fmt::format(
          "the process's own work grew: its CPU time per iteration rose from {:.1f} to {:.1f} ms "
          "(slower or throttled cores, or more work per iteration)",
          ms(before.cpu), ms(now.cpu));
    }
  }
  if (saves > 0) {
    cause += fmt::format(
        "{}{} save{} ({:.1f} s) since it began: a save's writes can slow the "
        "iterations after it",
        cause.empty() ? "" : "; ", saves, saves == 1 ? "" : "s", save_seconds);
  }
  return cause;
}

}  // namespace keel
