// The arithmetic a run computes in: fp32 throughout, or one of the two mixed-precision recipes of
// the seeds' runs (Megatron's --bf16 and --fp16). Master weights, optimizer moments and gradient
// accumulation stay fp32 in every recipe.
#pragma once

#include <string_view>

namespace keel {

enum class Precision { kFp32, kBf16, kFp16 };

inline std::string_view PrecisionName(Precision p) {
  switch (p) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kFp32:
      break;
  }
  return "fp32";
}

}  // namespace keel
