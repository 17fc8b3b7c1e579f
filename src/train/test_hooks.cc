#include "train/test_hooks.h"

#include <cmath>
#include <cstdlib>

#include "backend/backend.h"
#include "config/config.h"
#include "core/log.h"
#include "core/rng.h"

namespace keel {

Status TestHooks::FromEnvironment(Env* base, TestHooks* out) {
  *out = TestHooks{};
  if (const char* spec = std::getenv("KEEL_FAULT_INJECTION"); spec != nullptr && *spec) {
    KEEL_RETURN_IF_ERROR(FaultInjectionEnv::FromSpec(spec, base, &out->fault_env));
    Warn("fault injection active (KEEL_FAULT_INJECTION={}): for testing only", spec);
  }
  if (const char* spec = std::getenv("KEEL_TRAIN_FAULTS"); spec != nullptr && *spec) {
    const std::string text = spec;
    size_t pos = 0;
    while (pos <= text.size()) {
      const size_t comma = std::min(text.find(',', pos), text.size());
      const std::string item = text.substr(pos, comma - pos);
      const size_t eq = item.find('=');
      std::vector<std::pair<int64_t, int64_t>> r;
      const std::string key = item.substr(0, eq);
      if (eq == std::string::npos || (key != "poison" && key != "nan-grad") ||
          !ParseIterationRanges({item.substr(eq + 1)}, &r).ok())
        return Status::InvalidArgument(
            "KEEL_TRAIN_FAULTS=" + text +
            ": expected comma-separated poison=A-B and nan-grad=A-B (iteration ranges)");
      (key == "poison" ? out->poison : out->nan_grad).push_back({r[0].first, r[0].second});
      pos = comma + 1;
    }
    Warn("training faults injected (KEEL_TRAIN_FAULTS={}): for testing only", text);
  }
  return Status::OK();
}

bool TestHooks::Poisoned(int64_t iteration) const {
  for (const IterationRange& r : poison)
    if (r.Contains(iteration)) return true;
  return false;
}

void TestHooks::PoisonSample(uint64_t seed, int64_t index, int seq_length, int vocab,
                             int32_t* tokens) {
  const RngKey key{seed + 77, RngPurpose::kTest, static_cast<uint64_t>(index)};
  for (int t = 0; t <= seq_length; ++t)
    tokens[t] = static_cast<int32_t>(U64At(key, t) % static_cast<uint64_t>(vocab));
}

std::function<void(int64_t, float*, size_t)> TestHooks::GradientFault(Backend* backend) const {
  if (nan_grad.empty()) return nullptr;
  return [ranges = nan_grad, backend](int64_t it, float* g, size_t) {
    for (const IterationRange& r : ranges) {
      if (r.Contains(it)) {
        const float nan = NAN;
        backend->CopyToDevice(g, &nan, 1);
      }
    }
  };
}

}  // namespace keel
