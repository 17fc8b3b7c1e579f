// TFRecord framing carries two CRCs per record, which random mutations almost never get right.
// FixRecordCrcs recomputes every CRC the input reaches, so a fuzz target can parse both the input
// as given (the CRC checks) and its repaired copy (the lengths and the Event protos behind them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "metrics/tf_event.h"

namespace keel::fuzz {

inline std::string FixRecordCrcs(std::string b) {
  auto put = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  size_t off = 0;
  while (b.size() - off >= 12) {
    uint64_t len = 0;
    for (int i = 0; i < 8; ++i)
      len |= static_cast<uint64_t>(static_cast<uint8_t>(b[off + i])) << (8 * i);
    put(off + 8, MaskedCrc32c(std::string_view(b).substr(off, 8)));
    if (len > b.size() - off - 12 || b.size() - off - 12 - len < 4) break;
    put(off + 12 + len, MaskedCrc32c(std::string_view(b).substr(off + 12, len)));
    off += 12 + len + 4;
  }
  return b;
}

}  // namespace keel::fuzz
