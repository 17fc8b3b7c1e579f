// `keel train`: parse, open, train, map the outcome to an exit code. What a run does (resume,
// rollback, data, the guard, hooks) is library code: train/training_run.h. Under mpirun or srun
// this process is one data-parallel rank; a rank that fails ends every rank (no limbo).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "comm/mpi_communicator.h"
#include "config/config.h"
#include "core/log.h"
#include "train/test_hooks.h"
#include "train/training_run.h"

namespace keel::cli {
namespace {

int Train(const ParsedConfig& parsed, Communicator* comm) {
  TestHooks test_hooks;  // test-only faults armed through the environment; usually none
  Status st = TestHooks::FromEnvironment(Env::Default(), &test_hooks);
  if (!st.ok()) return Fail(st);
  RunOptions options;
  options.env = test_hooks.env(Env::Default());
  options.comm = comm;
  options.test_hooks = &test_hooks;

  std::unique_ptr<TrainingRun> run;
  st = TrainingRun::Open(parsed.as_given, options, &run);
  if (!st.ok()) return Fail(st);
  TrainingRun::Outcome outcome;
  st = run->Train(&outcome);
  if (!st.ok()) return Fail(st);
  const std::string save = run->config().save;
  run.reset();  // its last goodput record is written as it closes
  // Under keel launch the supervisor sums the whole job when it ends.
  if (comm->rank() == 0 && std::getenv("KEEL_LAUNCH") == nullptr) JournalGoodputSummary(save, "");
  // Exit 3: the guard stopped the run (its rollback budget was spent, or no checkpoint to return
  // to); the state was not saved, the chronicle says why.
  return ToInt(outcome == TrainingRun::Outcome::kGuardStopped ? ExitCode::kGuardStopped
                                                              : ExitCode::kSuccess);
}

}  // namespace

int TrainCommand(int argc, const char* const* argv) {
  ParsedConfig parsed;
  Status st = ParseTrainArgs(argc, argv, &parsed);
  if (parsed.help_requested) {
    std::fputs(parsed.help_text.c_str(), stdout);
    return 0;
  }
  if (!st.ok()) return Fail(st);
  std::unique_ptr<Communicator> comm;
  st = MakeCommunicatorFromEnvironment(&comm);
  if (!st.ok()) return Fail(st);
  if (comm->world_size() > 1)  // one terminal for the job: rank 0's lines, every rank's errors
    SetLogCopy(nullptr, /*mute_stdout=*/comm->rank() != 0, fmt::format("[rank {}] ", comm->rank()));
  if (comm->rank() == 0) {
    Log("keel {} - training", KEEL_VERSION);
    for (const std::string& n : parsed.source_notes) Log("note: {}", n);
  }
  if (comm->world_size() == 1) return Train(parsed, comm.get());

  // Every rank reaches the same outcome through collectives; a rank that fails alone (an error,
  // an exception, no memory) would leave the others waiting in one, so it ends the whole job.
  int rc = ToInt(ExitCode::kRuntimeFailure);
  try {
    rc = Train(parsed, comm.get());
  } catch (const std::bad_alloc&) {
    LogError("error: out of memory: reduce --micro-batch-size, --seq-length or the model");
  } catch (const std::exception& e) {
    LogError(std::string("error: ") + e.what());
  }
  // A guard stop is reached by every rank together (its decisions are agreed): no abort.
  if (rc != ToInt(ExitCode::kSuccess) && rc != ToInt(ExitCode::kGuardStopped)) {
    LogError(fmt::format("error: rank {} failed (exit {}); ending every rank of the job",
                         comm->rank(), rc));
    comm->Abort(rc);
  }
  comm->Barrier();  // then MPI_Finalize, when comm goes
  return rc;
}

}  // namespace keel::cli
