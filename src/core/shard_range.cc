#include "core/shard_range.h"

#include <algorithm>

namespace keel {

ShardRange ShardOf(size_t n, int rank, int world) {
  constexpr size_t kAlign = 16;  // floats per 64-byte cache line
  const size_t w = static_cast<size_t>(world);
  const size_t chunk = ((n + w - 1) / w + kAlign - 1) / kAlign * kAlign;
  const size_t begin = std::min(n, chunk * static_cast<size_t>(rank));
  return {begin, std::min(n, begin + chunk)};
}

}  // namespace keel
