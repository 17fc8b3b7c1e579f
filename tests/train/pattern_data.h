// A learnable stream for trainer tests: token t+1 = (token t * 7 + 3) mod 50, from a random start
// per sample (17 tokens: sequence 16 plus the last target).
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "train/trainer.h"

namespace keel::test_data {

inline SampleFn PatternData(uint64_t seed) {
  return [seed](int64_t index, int32_t* tokens) {
    int32_t v = static_cast<int32_t>(U64At({seed, RngPurpose::kTest, 0}, index) % 50);
    for (int t = 0; t <= 16; ++t) {
      tokens[t] = v;
      v = (v * 7 + 3) % 50;
    }
    return 0;
  };
}

}  // namespace keel::test_data
