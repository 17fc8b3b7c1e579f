// TEST-ONLY. The fault hooks that tests, soaks and demos arm through the environment, parsed and
// applied in this one module so that nothing else in keel reads them:
//
//   KEEL_FAULT_INJECTION=crash-at=N[:PATH] | enospc-at=... | fail-sync-at=... | fail-rename-at=...
//       one fault in the filesystem seam (core/fault_injection_env.h)
//   KEEL_TRAIN_FAULTS=poison=A-B,nan-grad=C-D
//       iterations A..B read uniformly random tokens instead of their data; the all-reduced
//       gradients of iterations C..D get a NaN (the guard's end-to-end tests and demos)
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

struct TestHooks {
  std::unique_ptr<FaultInjectionEnv> fault_env;  // KEEL_FAULT_INJECTION, wrapping the base Env
  std::vector<IterationRange> poison;            // KEEL_TRAIN_FAULTS poison=A-B
  std::vector<IterationRange> nan_grad;          // KEEL_TRAIN_FAULTS nan-grad=A-B

  // Reads KEEL_FAULT_INJECTION and KEEL_TRAIN_FAULTS; InvalidArgument for a malformed value.
  static Status FromEnvironment(Env* base, TestHooks* out);

  // The Env a run should use: the fault-injecting one when armed, else `base`.
  Env* env(Env* base) const { return fault_env ? fault_env.get() : base; }
  // Whether iteration `iteration` reads poison instead of data.
  bool Poisoned(int64_t iteration) const;
  // Uniformly random tokens below `vocab` for sample `index` (seq_length + 1 of them).
  static void PoisonSample(uint64_t seed, int64_t index, int seq_length, int vocab,
                           int32_t* tokens);
  // The trainer's gradient-fault seam: a NaN in the gradients of the nan-grad iterations; empty
  // when none are armed.
  std::function<void(int64_t, float*, size_t)> GradientFault(Backend* backend) const;
};

}  // namespace keel
