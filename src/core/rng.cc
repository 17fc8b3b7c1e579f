#include "core/rng.h"

#include <cmath>

namespace keel {

std::array<uint32_t, 4> Philox4x32x10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

std::array<uint32_t, 4> Philox(const RngKey& key, uint64_t counter) {
  // Key words: the seed. Counter words: the counter, then the stream mixed with the purpose.
  const uint32_t purpose = static_cast<uint32_t>(key.purpose);
  return Philox4x32x10({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                        static_cast<uint32_t>(key.stream) ^ (purpose << 24),
                        static_cast<uint32_t>(key.stream >> 32) ^ purpose},
                       {static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32)});
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
