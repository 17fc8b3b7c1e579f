#include "core/rng.h"

#include <cmath>

namespace keel {

std::array<uint32_t, 4> Philox(const RngKey& key, uint64_t counter) {
  // Key: the seed; counter: (counter, purpose, stream). Ten rounds of Philox4x32.
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(key.stream) ^ (static_cast<uint32_t>(key.purpose) << 24);
  uint32_t c3 = static_cast<uint32_t>(key.stream >> 32) ^ static_cast<uint32_t>(key.purpose);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = static_cast<uint32_t>(p1);
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

float UniformAt(const RngKey& key, uint64_t index) {
  return static_cast<float>(Philox(key, index)[0] >> 8) * (1.0f / 16777216.0f);
}

float NormalAt(const RngKey& key, uint64_t index) {
  auto r = Philox(key, index);
  // u1 in (0, 1] so log() is finite; computed in double so the result is the same on every libm.
  double u1 = (static_cast<double>(r[0] >> 8) + 1.0) / 16777216.0;
  double u2 = static_cast<double>(r[1] >> 8) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

uint64_t U64At(const RngKey& key, uint64_t index) {
  auto r = Philox(key, index);
  return (static_cast<uint64_t>(r[0]) << 32) | r[1];
}

}  // namespace keel
