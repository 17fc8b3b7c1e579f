// The visible cause of a throughput drop, from what each iteration's time went to: "slower
// because the machine is shared" must read differently from "slower because the data loader
// starves". RunHealth keeps one IterationCost per iteration and compares the medians of the
// iterations before a drop's change point with those of the last window.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace keel {

struct IterationCost {
  double wall = NAN;       // seconds from the previous iteration's end to this one's
  double cpu = NAN;        // the process's CPU seconds (every thread) over the same time
  double data_wait = NAN;  // seconds the loop waited for the iteration's samples (Phase::kData)
};

// One sentence naming the cause of a slowdown from `before` to `now` (medians of IterationCost
// per iteration), given `saves` saves (`save_seconds` in all) since the drop began. The rules, on
// the rise of the wall time dW = now.wall - before.wall (nothing to explain when dW <= 0):
//   data      the data wait rose by at least dW / 2: the data loader does not keep up;
//   off-CPU   the CPU time rose by less than dW / 2 and the CPU share (cpu / wall) fell: the
//             process was off the cores: another process on them, or a wait outside keel;
//   own work  the CPU time rose by at least dW / 2: the process's own work per iteration grew or
//             its cores got slower;
// with saves in the drop, a note that a save's writes can slow the iterations after it. Empty
// when none applies.
std::string DropCause(const IterationCost& before, const IterationCost& now, int64_t saves,
                      double save_seconds);

}  // namespace keel
