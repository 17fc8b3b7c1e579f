// How many seeds a statistical test sweeps. The Release suite runs the whole sweep (the figures
// the docs quote); under the sanitizers (CI's second suite, 5-10x slower) the first seeds run the
// same code paths, and the rest would only repeat them at a minute a test.
#pragma once

#include <algorithm>
#include <cstdint>

namespace keel_test {

inline uint64_t SweepSeeds(uint64_t full, uint64_t sanitized = 2) {
#if defined(KEEL_SANITIZED_BUILD)
  return std::min(full, sanitized);
#else
  return full;
#endif
}

}  // namespace keel_test
