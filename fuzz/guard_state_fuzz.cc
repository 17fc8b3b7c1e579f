// The guard's saved state: the "guard" object of a checkpoint's state.json (Guard::FromJson: the
// detector's windows, an open event, the ladder) and the policy of guard.json in the run directory
// (Guard::PolicyFromJson). A state that loads then judges a few iterations, as a resumed run does.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_input.h"
#include "guard/guard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = nlohmann::json::parse(keel::fuzz::AsString(data, size), nullptr,
                                       /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  keel::GuardConfig cfg;
  cfg.detector.min_history = 2;
  keel::Guard guard(cfg, [](const nlohmann::json&, const std::string&) {});
  (void)guard.PolicyFromJson(j, "guard.json: policy");
  if (!guard.FromJson(j, "state.json: guard").ok()) return 0;
  guard.OnRestart(100);
  for (int i = 0; i < 8; ++i) {
    keel::GuardSignals s;
    s.iteration = 101 + i;
    s.consumed_samples = 800 + 8 * i;
    s.loss = i == 4 ? 40.0 : 3.0 - 0.01 * i;
    s.grad_norm = i == 4 ? 1e6 : 0.5;
    s.nonfinite = i == 6;
    if (s.nonfinite) s.loss = NAN;
    (void)guard.OnStep(s);
  }
  (void)guard.ToJson().dump();
  return 0;
}
