// TEST-ONLY. The fault hooks that tests, soaks and demos arm through the environment, parsed and
// applied in this one module so that nothing else in keel reads them:
//
//   KEEL_FAULT_INJECTION=crash-at=N[:PATH] | enospc-at=... | fail-sync-at=... | fail-rename-at=...
//       one fault in the filesystem seam (core/fault_injection_env.h)
//   KEEL_TRAIN_FAULTS=poison=A-B,nan-grad=C-D,overflow=E-F,lr=G-H*X
//       iterations A..B read uniformly random tokens instead of their data; the all-reduced
//       gradients of iterations C..D get a NaN (the guard's end-to-end tests and demos), those
//       of iterations E..F an inf (an fp16 overflow: the loss scaler's tests); the updates of
//       iterations G..H use X times the scheduled LR (the guard's scenario benchmark: a spike
//       that does not recover by itself)
//   KEEL_TRAIN_FAULTS=hang=N:rank=R,kill=N:rank=R,slow=F:rank=R,bitflip=N:rank=R,
//                     skip-collective=N:rank=R[:kind=K],corrupt=N:rank=R
//       per-rank faults of data-parallel runs (rank 0 when no rank= is given): after the
//       backward of iteration N the rank stops (sleeps for ever, no collective) or kills itself
//       with SIGKILL; `slow` makes it sleep fraction F of its compute time every iteration (with
//       :iters=A-B only in iterations A..B: `slow=1:iters=1-60,slow=0.1:iters=141-200` slows one
//       process twice, the throughput watching's tests);
//       `bitflip` flips one bit of one weight after iteration N's update; `skip-collective`
//       skips the first collective of kind K (default all-reduce-sum) of iteration N; `corrupt`
//       runs iteration N's forward and backward once on a corrupted weight (a transient fault
//       that leaves no trace in the state: what the guard's rerun must tell from data). Any item
//       may end with :attempt=A: armed only when KEEL_LAUNCH_ATTEMPT is A (keel launch sets it),
//       so a restarted job does not fail the same way again, and with :host=H: armed only in a
//       process on host H, whatever its rank (unless :rank=R is given too): a bad machine,
//       wherever keel launch places the ranks.
//   KEEL_TRAIN_FAULTS=hang-send=N:rank=R,hang-recv=N:rank=R
//       pipeline parallel runs: the rank's first send (receive) to another stage in iteration N
//       hangs inside the transfer (recorded in the flight recorder's pipeline-p2p section, never
//       sent or received): a stage stuck in a pipeline send, for the watchdog and `keel hangs
//       analyze`
//   KEEL_TEST_HOSTNAME=H
//       this process plays host H: ThisHostName (hang dumps, straggler events, lock files, the
//       host= key above) says H, so ranks on one machine play ranks on several hosts
//   KEEL_TRAIN_FAULTS=save-delay=S
//       each checkpoint commit (the rename of .tmp.iter_N) waits S seconds first: a save that
//       takes seconds, for the tests of stopping a job by signal
//
// keel warns on stderr whenever one is set. A run receives the parsed hooks (TrainingRun's
// options), never the environment variables.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/train_state.h"
#include "core/env.h"
#include "core/fault_injection_env.h"

namespace keel {

class Backend;
class TrainerFaults;

struct RankFault {
  enum class Kind {
    kHang,
    kKill,
    kSlow,
    kBitFlip,
    kSkipCollective,
    kCorrupt,
    kHangSend,
    kHangRecv
  };
  Kind kind = Kind::kHang;
  int rank = 0;                               // -1: any (:host=H without :rank=)
  int64_t iteration = 0;                      // every kind but slow
  double fraction = 0;                        // slow
  IterationRange iterations{1, INT64_MAX};    // slow: the iterations it slows (:iters=A-B)
  std::string collective = "all-reduce-sum";  // skip-collective
};

struct TestHooks {
  std::unique_ptr<FaultInjectionEnv> fault_env;  // KEEL_FAULT_INJECTION, wrapping the base Env
  std::vector<IterationRange> poison;            // KEEL_TRAIN_FAULTS poison=A-B
  std::vector<IterationRange> nan_grad;          // KEEL_TRAIN_FAULTS nan-grad=A-B
  std::vector<IterationRange> overflow;          // KEEL_TRAIN_FAULTS overflow=A-B
  std::vector<RankFault> rank_faults;            // KEEL_TRAIN_FAULTS hang=, kill=, slow=, ...
  struct LrFactor {
    IterationRange range;
    double factor = 1;
  };
  std::vector<LrFactor> lr;       // KEEL_TRAIN_FAULTS lr=A-B*X
  double save_delay_seconds = 0;  // KEEL_TRAIN_FAULTS save-delay=S (applied through fault_env)

  // Reads KEEL_FAULT_INJECTION and KEEL_TRAIN_FAULTS; InvalidArgument for a malformed value.
  static Status FromEnvironment(Env* base, TestHooks* out);

  // The Env a run should use: the fault-injecting one when armed, else `base`.
  Env* env(Env* base) const { return fault_env ? fault_env.get() : base; }
  // Whether iteration `iteration` reads poison instead of data.
  bool Poisoned(int64_t iteration) const;
  // Uniformly random tokens below `vocab` for sample `index` (seq_length + 1 of them).
  static void PoisonSample(uint64_t seed, int64_t index, int seq_length, int vocab,
                           int32_t* tokens);
  // The trainer's faults on rank `rank` (nan-grad, overflow, lr, corrupt, hang, kill, slow);
  // null when none is armed for it. `slow` sleeps through `env` where given (the run's clock).
  std::unique_ptr<TrainerFaults> TrainerFaultsFor(int rank, Backend* backend,
                                                  Env* env = nullptr) const;
  // Whether rank `rank` flips a weight bit after iteration `iteration`.
  bool BitFlipAt(int rank, int64_t iteration) const;
  // The communicator's skip seam for rank `rank` (`iteration` says which iteration is under
  // way); empty when none.
  std::function<bool(const std::string&)> SkipCollectiveFault(
      int rank, std::function<int64_t()> iteration) const;
  // The pipeline group's point-to-point seam for rank `rank` (hang-send, hang-recv): called with
  // each transfer's kind ("send-to-P", "recv-from-P"); empty when none is armed for it.
  std::function<void(const std::string&)> PointToPointFault(
      int rank, std::function<int64_t()> iteration) const;
};

}  // namespace keel
