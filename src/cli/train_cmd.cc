// `keel train`: parse, open, train, map the outcome to an exit code. What a run does (resume,
// rollback, data, the guard, hooks) is library code: train/training_run.h.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/log.h"
#include "train/test_hooks.h"
#include "train/training_run.h"

namespace keel::cli {

int TrainCommand(int argc, const char* const* argv) {
  ParsedConfig parsed;
  Status st = ParseTrainArgs(argc, argv, &parsed);
  if (parsed.help_requested) {
    std::fputs(parsed.help_text.c_str(), stdout);
    return 0;
  }
  if (!st.ok()) return Fail(st);
  Log("keel {} - training", KEEL_VERSION);

  TestHooks test_hooks;  // test-only faults armed through the environment; usually none
  st = TestHooks::FromEnvironment(Env::Default(), &test_hooks);
  if (!st.ok()) return Fail(st);
  auto comm = MakeSingleProcessCommunicator();
  RunOptions options;
  options.env = test_hooks.env(Env::Default());
  options.comm = comm.get();
  options.test_hooks = &test_hooks;

  std::unique_ptr<TrainingRun> run;
  st = TrainingRun::Open(parsed.as_given, options, &run);
  if (!st.ok()) return Fail(st);
  TrainingRun::Outcome outcome;
  st = run->Train(&outcome);
  if (!st.ok()) return Fail(st);
  // Exit 3: the guard stopped the run (its rollback budget was spent, or no checkpoint to return
  // to); the state was not saved, the chronicle says why.
  return outcome == TrainingRun::Outcome::kGuardStopped ? 3 : 0;
}

}  // namespace keel::cli
