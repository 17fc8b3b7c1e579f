// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). Every random value keel draws
// is a pure function of (seed, purpose, stream, counter), so a value never depends on how many
// values were drawn before it: resumes, thread counts and ranks cannot change the bits.
#pragma once

#include <array>
#include <cstdint>

namespace keel {

// What the numbers are for; part of the key so streams never overlap.
enum class RngPurpose : uint32_t {
  kInit = 1,       // parameter initialisation; stream = parameter index
  kDataOrder = 2,  // shuffling of samples; stream = epoch
  kDropout = 3,    // stream = (step, rank) packed by the caller
  kSampling = 4,   // text generation
  kTest = 99,
};

struct RngKey {
  uint64_t seed = 0;
  RngPurpose purpose = RngPurpose::kTest;
  uint64_t stream = 0;
};

// The raw Philox4x32-10 bijection (Random123's philox4x32 with 10 rounds).
std::array<uint32_t, 4> Philox4x32x10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key);

// Four 32-bit random words for one 64-bit counter.
std::array<uint32_t, 4> Philox(const RngKey& key, uint64_t counter);

// Uniform in [0, 1) with 24 random bits (exactly representable in float).
float UniformAt(const RngKey& key, uint64_t index);
// Standard normal N(0, 1) via Box-Muller on one Philox block.
float NormalAt(const RngKey& key, uint64_t index);
// Uniform 64-bit integer.
uint64_t U64At(const RngKey& key, uint64_t index);

}  // namespace keel
